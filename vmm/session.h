// Sessions: run, record and replay a guest. Each owns the machine and the one run loop all three share.
#pragma once

#include <string>
#include <vector>

#include "vmm/engine.h"
#include "vmm/loader.h"
#include "vmm/machine.h"

namespace deja {

struct SessionOptions {
  MachineConfig machine;
  std::string image_path;
  LoadOptions load;
  std::string serial_in;         // "" = none, "-" = stdin, else a file
  std::string serial_out = "-";  // "-" = stdout
  bool stats = false;
  bool print_digest = false;
  ProgressMode progress = ProgressMode::kExact;
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
};

// Each returns the process exit status (the guest's, or one of vmm/exit_status.h) and prints
// deja's own messages to stderr prefixed "deja:".
int run_guest(const SessionOptions& options);     // plain run
int record_guest(const SessionOptions& options);  // run + write options.trace_path
int replay_trace(const ReplayOptions& options);

}  // namespace deja
