// CoordinateSeeker: skid-early overflow, then breakpoints and single steps, to the exact coordinate.
#include "replay/coordinate_seeker.h"

#include <algorithm>

#include <fmt/format.h>

#include "replay/digest.h"

namespace deja {

Result<> CoordinateSeeker::apply(const DebugControl& own) {
  DebugControl control = own;
  control.single_step |= user_.single_step;
  // The caller's steps are the trap flag's only where the seeker does not step itself (it needs every instruction).
  control.step_as_trap_flag = user_.step_as_trap_flag && !own.single_step;
  control.breakpoints = user_.breakpoints;
  control.watchpoints = user_.watchpoints;
  if (user_.stop_at_step) control.stop_at_step = std::min(control.stop_at_step.value_or(UINT64_MAX), *user_.stop_at_step);
  if (control == debug_) return {};
  if (auto r = cpu_.set_debug(control); !r) return r;
  debug_ = control;
  return {};
}

Result<> CoordinateSeeker::release() {
  target_.reset();
  if (armed_) counter_.disarm();
  armed_ = false;
  return apply(DebugControl{});
}

bool CoordinateSeeker::caused_by_user(const VcpuExit& exit) {
  if (exit.watch_hit || user_.single_step) return true;
  if (user_.stop_at_step && cpu_.step_count() && *cpu_.step_count() >= *user_.stop_at_step) return true;
  if (user_.breakpoints.empty()) return false;
  auto state = cpu_.get_state();
  if (!state) return false;
  const bool code64 = (state->efer & efer::kLma) && state->cs.l;
  const uint64_t linear = code64 ? state->rip : (state->cs.base + state->rip) & 0xffffffffu;
  for (uint64_t b : user_.breakpoints)
    if (b == linear) return true;
  return false;
}

VcpuExit* CoordinateSeeker::own_exit(ExitKind kind, std::string detail) {
  exit_ = VcpuExit{};
  exit_.kind = kind;
  exit_.detail = std::move(detail);
  return &exit_;
}

Result<VcpuExit*> CoordinateSeeker::run() {
  for (;;) {
    if (!target_) {
      if (auto r = release(); !r) return std::unexpected(r.error());
      return cpu_.run();
    }
    const Coordinate& want = target_->at;
    auto state = cpu_.get_state();
    if (!state) return std::unexpected(state.error());
    const uint64_t count = counter_.read();
    const Visit visit = target_->visit ? target_->visit() : Visit::kTarget;
    if (visit == Visit::kLater) {
      std::string detail = fmt::format("the guest reached rip {:#x} at {} conditional branches after the point the "
                                       "recording names (more guest exits or instructions than recorded there)",
                                       state->rip, count);
      if (auto r = release(); !r) return std::unexpected(r.error());
      return own_exit(ExitKind::kCoordinateMissed, std::move(detail));
    }
    if (count == want.branches && state->rip == want.rip && state->gpr[kRcx] == want.rcx &&
        (!target_->gpr_digest || gpr_digest(*state) == *target_->gpr_digest) && visit == Visit::kTarget) {
      ++stats_.reached;
      if (auto r = release(); !r) return std::unexpected(r.error());
      VcpuExit* e = own_exit(ExitKind::kCoordinateReached);
      e->rip = state->rip;
      return e;
    }
    if (count > want.branches) {
      std::string detail =
          fmt::format("the {} counter reads {} conditional branches at rip {:#x}, past the target {} at rip {:#x} "
                      "rcx {:#x} (skid bound {})",
                      counter_.describe(), count, state->rip, want.branches, want.rip, want.rcx, counter_.skid());
      if (auto r = release(); !r) return std::unexpected(r.error());
      return own_exit(ExitKind::kCoordinateMissed, std::move(detail));
    }

    DebugControl control;
    uint64_t arm_at;
    if (want.branches - count > counter_.skid()) {
      // Far away: run freely until the counter is within its skid of the target.
      arm_at = want.branches - counter_.skid();
    } else {
      // Close: an overflow one branch past the target says the guest went by it.
      arm_at = want.branches + 1;
      const auto instructions = cpu_.instruction_count();
      const auto steps = cpu_.step_count();
      if (state->rip == want.rip && visit == Visit::kEarlier && target_->instructions != 0 && instructions &&
          steps && *instructions < target_->instructions) {
        // An earlier visit of the target RIP, short of the recorded instruction count: no visit before it can be the
        // target. Only here: elsewhere the breakpoint finds the RIP as it would on KVM with a PMU, whose algorithm
        // the software CPU's replays keep testing.
        control.stop_at_step = *steps + (target_->instructions - *instructions);
      } else if (state->rip == want.rip) {
        // At the target RIP but not the target: step past this visit (a breakpoint would stop here
        // again at once), one REP iteration or one instruction at a time.
        control.single_step = true;
      } else {
        const bool code64 = (state->efer & efer::kLma) && state->cs.l;
        control.breakpoint = code64 ? want.rip : (state->cs.base + want.rip) & 0xffffffffu;
      }
    }
    if (auto r = counter_.arm(arm_at); !r) return std::unexpected(r.error());
    armed_ = true;
    if (auto r = apply(control); !r) return std::unexpected(r.error());

    auto exit = cpu_.run();
    if (!exit) return exit;
    switch ((*exit)->kind) {
      case ExitKind::kDebug:
        if (caused_by_user(**exit)) return exit;
        ++(control.single_step ? stats_.single_steps : control.stop_at_step ? stats_.skips : stats_.breakpoint_hits);
        continue;
      case ExitKind::kKicked:
        ++stats_.overflows;
        return exit;
      default:
        return exit;
    }
  }
}

}  // namespace deja
