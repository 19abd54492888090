// Sessions: run, record and replay a guest. Each owns the machine and the one run loop all three share.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "vmm/engine.h"
#include "vmm/loader.h"
#include "vmm/machine.h"

namespace deja {

// How a session places asynchronous events: the progress mode, and in exact mode what counts.
struct ProgressChoice {
  ProgressMode mode = ProgressMode::kExact;
  bool automatic = false;                 // KVM record: exact with a usable PMU, else exit-sync
  std::optional<uint64_t> emulated_skid;  // interp: emulate a PMU whose overflow lands up to N branches late
  std::optional<uint64_t> emulated_seed;  // its random generator's seed (default: fresh)
};
// Parses --progress: "exact", "exit-sync", "emulated-pmu:SKID" or "emulated-pmu:SKID:SEED".
Result<ProgressChoice> parse_progress(const std::string& spec);

struct SessionOptions {
  MachineConfig machine;
  std::string image_path;
  LoadOptions load;
  std::string serial_in;         // "" = none, "-" = stdin, else a file
  std::string serial_out = "-";  // "-" = stdout
  bool stats = false;
  bool print_digest = false;
  ProgressChoice progress;
  std::string trace_path;        // record: output file
  uint64_t digest_interval = 16384;  // record a full state digest every N events
};

struct ReplayOptions {
  std::string trace_path;
  std::string backend;       // "" = the backend the trace was recorded on, if available here
  std::string image_path;    // "" = the path recorded in the trace
  std::string serial_out = "-";
  bool stats = false;
  bool print_digest = false;
  bool quiet = false;        // no summary line
  std::string test_device_semantics;  // test-only: replay with perturbed device semantics
  std::string progress;      // "" = as recorded; "exact" or "emulated-pmu:SKID[:SEED]" to override the counter
};

// Each returns the process exit status (the guest's, or one of vmm/exit_status.h) and prints
// deja's own messages to stderr prefixed "deja:".
int run_guest(const SessionOptions& options);     // plain run
int record_guest(const SessionOptions& options);  // run + write options.trace_path
int replay_trace(const ReplayOptions& options);

}  // namespace deja
