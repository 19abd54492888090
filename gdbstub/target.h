// What the gdb server drives: a replayed machine that can be read, resumed forwards or backwards, and asked monitor commands.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/backend.h"
#include "core/cpu_state.h"
#include "core/error.h"

namespace deja::gdb {

struct ResumeRequest {
  bool reverse = false;
  bool single_step = false;
  std::vector<uint64_t> breakpoints;     // Z0 / Z1: stop before executing these (linear) addresses
  std::vector<Watchpoint> watchpoints;   // Z2-Z4
};

struct StopInfo {
  enum class Why {
    kStep,          // one step done
    kBreakpoint,    // reached a breakpoint
    kWatchpoint,    // `watch_address` (forward: the access just happened; reverse: the access is next)
    kInterrupted,   // Ctrl-C
    kHistoryBegin,  // reverse execution reached the start of the trace
    kHistoryEnd,    // forward execution reached the end of the trace
    kError,         // the replay failed (divergence, host error): `message`
  };
  Why why = Why::kStep;
  bool hardware = false;       // kBreakpoint: a Z1 breakpoint
  uint64_t watch_address = 0;
  WatchKind watch_kind = WatchKind::kWrite;
  std::string message;
};

class Target {
 public:
  virtual ~Target() = default;
  // The vCPUs, which gdb sees as threads 1..threads() (thread N+1 is vCPU N).
  virtual uint32_t threads() { return 1; }
  // The vCPU the machine stopped on: the one the schedule was running (serialized vCPUs: exactly one runs).
  virtual uint32_t stopped_vcpu() { return 0; }
  virtual Result<CpuState> registers(uint32_t vcpu) = 0;
  // Reads guest-virtual memory through vCPU `vcpu`'s page tables; returns the readable prefix length.
  virtual size_t read_virtual(uint32_t vcpu, uint64_t gva, std::span<uint8_t> out) = 0;
  // Runs until a stop; `interrupted()` is polled now and then and true means Ctrl-C.
  virtual StopInfo resume(const ResumeRequest& request, const std::function<bool()>& interrupted) = 0;
  // A `monitor` command line; returns the text to show (ending in a newline).
  virtual std::string monitor(std::string_view command, const std::function<bool()>& interrupted) = 0;
};

}  // namespace deja::gdb
