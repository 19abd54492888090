// Which vCPU runs next and for how long: the schedule of vCPUs serialized on one host thread, a pure function of a seed.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/seeded_random.h"

namespace deja {

// Why the running vCPU stopped being run (docs/smp.md, "The schedule").
enum class SwitchPoint : uint8_t {
  kSliceEnd,  // it ran its slice (a quantum of retired instructions, or of guest exits in exit-sync mode)
  kPause,    // it executed its slice's number of PAUSEs: a spin-wait, whose lock holder must get to run
  kIdle,     // it cannot run: halted with nothing to wake it, waiting for STARTUP, or stopped by INIT
  kPreempt,  // the policy preempted it at a scheduling event (Scheduler::preempt)
};

// The events a run makes where the order of vCPUs matters (PCT's steps, docs/explore.md): the same in a recording and
// its replay, since each is an exit or an interrupt both make at the same instruction.
enum class ScheduleEvent : uint8_t {
  kDeviceAccess,  // a port or MMIO access (the local APIC's ICR, so every IPI sent, included)
  kPause,         // a PAUSE (a spin-wait)
  kInterrupt,     // an interrupt delivered (an IPI or a device's)
  kLocked,        // a locked instruction (ScheduleConfig::lock_events)
};

// What a scheduler's slices are measured in, which the progress mode decides: retired instructions where the
// backend counts them exactly (interp, exact), guest-caused exits otherwise (exit-sync: KVM without a PMU).
enum class SliceUnit : uint8_t { kInstructions = 0, kGuestExits = 1 };
std::string_view slice_unit_name(SliceUnit unit);

// The parameters of a schedule, recorded in the trace header (MachineConfig.schedule) so that replay makes
// the same choices.
struct ScheduleConfig {
  std::string policy = "quantum";
  uint64_t seed = 0;
  SliceUnit unit = SliceUnit::kInstructions;
  uint64_t quantum = 0;      // mean slice length in `unit` (each slice draws from [quantum/2, 3*quantum/2))
  // PAUSEs a slice may execute: each slice draws from [1, pause_limit]. 0: PAUSE is no switch point, and no exit
  // (a backend that cannot stop there: KVM without the kvm-deja module).
  uint32_t pause_limit = 0;
  uint32_t depth = 0;          // "pct": the bug depth d it aims at (d - 1 priority change points)
  uint64_t change_window = 0;  // "pct": the change points are drawn from the first k scheduling events
  uint64_t dropped_change_points = 0;  // "pct": bit i leaves out the i-th change point (deja explore --minimize)
  // How the session applies the policy (kScheduleVersion*): which exits it makes switch points.
  uint32_t version = 0;
  bool lock_events = false;  // locked instructions are scheduling events (the backend stops at each)
  bool operator==(const ScheduleConfig&) const = default;
};
// The schedule versions (ScheduleConfig::version, the trace header's Schedule.version):
// 0: every PAUSE exits while pause_limit > 0 (traces recorded before version 1);
inline constexpr uint32_t kScheduleVersionPauseAlways = 0;
// 1: a vCPU's PAUSEs exit only while another vCPU is runnable (instruction slices): one spinning with nobody to
//    yield to (Linux's TSC delay loops while its APs wait for STARTUP) makes no exits, and waking another (an IPI,
//    STARTUP, a device interrupt routed to it) makes its PAUSEs switch points again at once; and "pct" yields one slice
//    after 8 whole slices in a row as after its PAUSEs (a spin without PAUSE must not starve the vCPU it waits for).
inline constexpr uint32_t kScheduleVersionPauseWithCompany = 1;
// The defaults: a quantum of 200,000 instructions (0.2 ms of the guest's clock per slice), 32 guest exits in
// exit-sync mode, and up to 64 PAUSEs (Linux's spinlocks pause between reads of the lock word).
ScheduleConfig default_schedule(SliceUnit unit, uint64_t seed);

// A slice: how long the vCPU may run before the scheduler looks again.
struct Slice {
  uint64_t length = 0;  // in the schedule's unit
  uint32_t pauses = 0;  // PAUSEs before it yields
};

// The interface exploration policies plug into (issue #24: PCT priorities, random quanta): everything a
// policy decides goes through next() and slice(), and everything it remembers through save()/restore(), so a
// checkpoint and a replay make the same choices. A policy sees only what the guest did (never host time).
class Scheduler {
 public:
  virtual ~Scheduler() = default;
  virtual const ScheduleConfig& config() const = 0;
  // The vCPU to run after `current` stopped at `why`; `runnable[i]` says whether vCPU i can run now (never
  // all false). May be `current` itself (it starts a new slice).
  virtual uint32_t next(uint32_t current, SwitchPoint why, std::span<const bool> runnable) = 0;
  // The slice of `vcpu`, which starts running now.
  virtual Slice slice(uint32_t vcpu) = 0;
  // A scheduling event on `current`, which is running. A policy that wants to preempt it there says so in
  // preempting() until next() is asked (with kPreempt); that wish is part of its saved state. Returns the change point
  // that took effect there, by its draw (ScheduleConfig::dropped_change_points' bit), if one did.
  virtual std::optional<uint32_t> event(uint32_t /*current*/, ScheduleEvent) { return std::nullopt; }
  virtual bool preempting() const { return false; }
  // The policy's state (a checkpoint's part).
  virtual std::vector<uint8_t> save() const = 0;
  virtual Result<> restore(std::span<const uint8_t> state) = 0;
};

// A policy whose whole state is its generator (seeded with the schedule's seed), saved under `tag`.
class GeneratorScheduler : public Scheduler {
 public:
  GeneratorScheduler(const ScheduleConfig& config, const char* tag) : config_(config), random_(config.seed), tag_(tag) {}
  const ScheduleConfig& config() const override { return config_; }
  std::vector<uint8_t> save() const override;
  Result<> restore(std::span<const uint8_t> state) override;

 protected:
  ScheduleConfig config_;
  SplitMix64 random_;

 private:
  const char* tag_;
};

// The policies, by ScheduleConfig::policy:
// - "quantum", the default: round robin over the runnable vCPUs, in index order from the one after `current`, with
//   each slice's length and PAUSE count drawn from a generator seeded with the schedule's seed (splitmix64);
// - "pct" and "random", for exploration (replay/scheduler_explore.cpp, docs/explore.md).
// Fails on a policy name or parameters it does not take.
Result<std::unique_ptr<Scheduler>> make_scheduler(const ScheduleConfig& config);
// The exploration policies (make_scheduler() has checked the common parameters).
Result<std::unique_ptr<Scheduler>> make_pct_scheduler(const ScheduleConfig& config);
Result<std::unique_ptr<Scheduler>> make_random_scheduler(const ScheduleConfig& config);

}  // namespace deja
