// ProgressCounter: the guest's retired conditional branches, readable exactly and able to interrupt the vCPU near a target.
#pragma once

#include <cstdint>
#include <string>

#include "core/error.h"

namespace deja {

// Implemented by the software CPU (exact, or emulating a PMU with random skid) and by the KVM backend
// over a host PMU counter (kvm/perf_counter.h). CoordinateSeeker (replay/coordinate_seeker.h) uses only
// this interface and the backend's debug controls to stop the vCPU at an exact coordinate.
class ProgressCounter {
 public:
  virtual ~ProgressCounter() = default;

  // What counts, for traces and messages: "interp", "emulated-pmu:1000", "pmu intel-skylake raw 0x5101c4".
  virtual std::string describe() const = 0;
  // Conditional branches the guest retired on this vCPU since reset, exactly (between run() calls).
  virtual uint64_t read() = 0;
  // Makes the vCPU's run() return kKicked once read() >= at, up to skid() branches later than that and
  // never earlier (a hardware overflow interrupt lands late, not early). Replaces an earlier arming;
  // `at` <= read() fires at the next instruction boundary.
  virtual Result<> arm(uint64_t at) = 0;
  virtual void disarm() = 0;
  // Bound on how late an armed overflow stops the vCPU, in conditional branches.
  virtual uint64_t skid() const = 0;
  // Makes read() return `count` from now on (a checkpoint restore puts the count back). Disarms.
  virtual Result<> rebase(uint64_t count) {
    return fail(ErrorKind::kInvalidArgument, "the progress counter '{}' cannot be set to {}", describe(), count);
  }
};

}  // namespace deja
