// Opening a trace for a steppable replay (deja debug, deja query): checks, image, machine, session with a rewindable cursor.
#pragma once

#include <array>
#include <memory>
#include <string>
#include <vector>

#include "logging/output_file.h"
#include "logging/trace.pb.h"
#include "snapshot/checkpoint.h"
#include "replay/session.h"

namespace deja {

struct ReplaySetupOptions {
  std::string trace_path;
  std::string backend;      // "" = the recording's, if usable here
  std::string image_path;   // "" = the path recorded in the trace
  std::string initrd_path;  // "" = the path recorded in the trace
  std::vector<std::string> disk_paths;  // replaces the recorded disk images' paths, in order ("" keeps one)
  std::vector<std::string> module_paths;  // replaces the recorded boot modules' paths, in order ("" keeps one)
  std::string serial_out = "/dev/null";
  std::string progress;               // "" = as recorded; "exact" or "emulated-pmu:SKID[:SEED]" to override the counter
  std::string test_device_semantics;  // test-only: replay with perturbed device semantics
  bool rewind = false;  // keep the trace in memory so that checkpoints can move the replay back (debug, query)
  std::string interp_mode;  // "" = the software CPU's default executor
  // The caller restores a checkpoint before the replay runs (a segment): the inputs are read and checked against the
  // trace as always, but not loaded, since the checkpoint replaces RAM and every vCPU's state (Session::build_machine).
  bool restores_checkpoint = false;
  // What the command writes besides the serial output (debug: checkpoint files); open_replay adds the trace's inputs
  // and the serial output and checks them all before opening any (logging/output_file.h).
  OutputPlan files;
};

struct ReplaySetup {
  std::unique_ptr<Session> session;
  trace::Header header;
  CheckpointIdentity identity;  // what checkpoint files of this trace and machine must match
};

// Everything a replay checks before running (CPU and device model versions, progress mode, backend, the inputs'
// sizes and hashes one at a time, trapped RDTSC), then a replay session attached to the trace: `deja replay`
// runs it; `deja debug` and `deja query` (with `rewind`) step it.
Result<ReplaySetup> open_replay(const ReplaySetupOptions& options);

// "ADDR:LEN" (hex with 0x, or decimal) for --mem and --writes.
Result<std::pair<uint64_t, uint64_t>> parse_range(const std::string& text, uint64_t max_length);

}  // namespace deja
