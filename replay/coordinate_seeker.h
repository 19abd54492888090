// CoordinateSeeker: stops a vCPU exactly at a recorded coordinate using only a ProgressCounter and the backend's debug controls.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "core/backend.h"

namespace deja {

// Where to stop: the coordinate, and the digest of the general registers there (which tells apart
// points a loop without conditional branches revisits with the same branch count, RIP and RCX;
// without it the first such point is taken).
enum class Visit { kTarget, kEarlier, kLater };
struct SeekTarget {
  Coordinate at;
  std::optional<uint64_t> gpr_digest;
  // A further check where the counter and the registers match, of what only the caller knows (the
  // guest-exit count, the instruction count). An earlier visit is stepped past like an earlier
  // iteration of a loop, so `sti; hlt` or `incq mem; jmp` loops stop at the recorded visit; a later
  // one means the target was passed (kCoordinateMissed). Checked at every breakpoint hit, so it
  // also catches a guest that loops past the target without ever branching.
  std::function<Visit()> visit;
  // The instruction count the recording has there (0: not counted). On a backend that counts instructions
  // and steps, an earlier visit is left by running straight to that count (never past it: a step retires
  // at most one instruction) instead of stopping at every visit of the RIP: a spin without branches that
  // a fast recording ran a billion times replays in one run.
  uint64_t instructions = 0;
};

// The algorithm (docs/coordinates.md): while the target is more than skid() branches away, arm the
// counter skid() branches early and run freely; within the skid, put an instruction breakpoint on
// the target RIP and check the count and registers at every hit, single-stepping past hits that are
// not the target (and through a REP instruction's iterations at the target RIP). An overflow armed
// one branch past the target catches a guest that never reaches it. Written once for every counter:
// the KVM backend's host PMU and the software CPU's exact or PMU-emulating counter.
class CoordinateSeeker {
 public:
  CoordinateSeeker(Backend& cpu, ProgressCounter& counter) : cpu_(cpu), counter_(counter) {}

  // The coordinate the following run() calls stop at, or none (run() then is the backend's).
  void set_target(std::optional<SeekTarget> target) { target_ = target; }
  const std::optional<SeekTarget>& target() const { return target_; }
  // The caller's own debug controls (a debugger's breakpoints, watchpoints, step target), merged into
  // every run; kDebug exits they cause are returned, not consumed.
  void set_user_debug(const DebugControl& control) { user_ = control; }
  // Forgets the armed counter and the applied controls (after a checkpoint restore changed the vCPU).
  Result<> reset() {
    armed_ = false;
    debug_ = DebugControl{.single_step = true};  // differs from anything: the next run applies its controls
    return release();
  }

  // Like Backend::run(), but returns kCoordinateReached exactly at the target (which is then
  // cleared), and kCoordinateMissed (with `detail`) once the counter shows the target was passed.
  // The debug exits it causes itself are consumed; overflow stops come back as kKicked so that the
  // caller sees every return to the VMM.
  Result<VcpuExit*> run();

  struct Stats {
    uint64_t overflows = 0;         // runs ended by the armed counter
    uint64_t breakpoint_hits = 0;   // breakpoint stops at the target RIP
    uint64_t single_steps = 0;
    uint64_t skips = 0;             // runs to the target's instruction count past earlier visits
    uint64_t reached = 0;
  };
  const Stats& stats() const { return stats_; }

 private:
  Result<> apply(const DebugControl& control);
  // Drops the target, the armed overflow and the debug controls.
  Result<> release();
  VcpuExit* own_exit(ExitKind kind, std::string detail = {});
  bool caused_by_user(const VcpuExit& exit);

  Backend& cpu_;
  ProgressCounter& counter_;
  std::optional<SeekTarget> target_;
  DebugControl debug_;
  DebugControl user_;
  bool armed_ = false;
  VcpuExit exit_;
  Stats stats_;
};

}  // namespace deja
