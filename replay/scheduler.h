// Which vCPU runs next and for how long: the schedule of vCPUs serialized on one host thread, a pure function of a seed.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/error.h"

namespace deja {

// Why the running vCPU stopped being run (docs/smp.md, "The schedule").
enum class SwitchPoint : uint8_t {
  kTurnEnd,  // it ran its turn (a quantum of retired instructions, or of guest exits in exit-sync mode)
  kPause,    // it executed its turn's number of PAUSEs: a spin-wait, whose lock holder must get to run
  kIdle,     // it cannot run: halted with nothing to wake it, waiting for STARTUP, or stopped by INIT
};

// What a scheduler's turns are measured in, which the progress mode decides: retired instructions where the
// backend counts them exactly (interp, exact), guest-caused exits otherwise (exit-sync: KVM without a PMU).
enum class TurnUnit : uint8_t { kInstructions = 0, kGuestExits = 1 };
std::string_view turn_unit_name(TurnUnit unit);

// The parameters of a schedule, recorded in the trace header (MachineConfig.schedule) so that replay makes
// the same choices.
struct ScheduleConfig {
  std::string policy = "quantum";
  uint64_t seed = 0;
  TurnUnit unit = TurnUnit::kInstructions;
  uint64_t quantum = 0;      // mean turn length in `unit` (each turn draws from [quantum/2, 3*quantum/2))
  uint32_t pause_limit = 0;  // PAUSEs a turn may execute: each turn draws from [1, pause_limit]
  bool operator==(const ScheduleConfig&) const = default;
};
// The defaults: a quantum of 200,000 instructions (0.2 ms of the guest's clock per turn), 32 guest exits in
// exit-sync mode, and up to 64 PAUSEs (Linux's spinlocks pause between reads of the lock word).
ScheduleConfig default_schedule(TurnUnit unit, uint64_t seed);

// A turn: how long the vCPU may run before the scheduler looks again.
struct Turn {
  uint64_t length = 0;  // in the schedule's unit
  uint32_t pauses = 0;  // PAUSEs before it yields
};

// The interface exploration policies plug into (issue #24: PCT priorities, random quanta): everything a
// policy decides goes through next() and turn(), and everything it remembers through save()/restore(), so a
// checkpoint and a replay make the same choices. A policy sees only what the guest did (never host time).
class Scheduler {
 public:
  virtual ~Scheduler() = default;
  virtual const ScheduleConfig& config() const = 0;
  // The vCPU to run after `current` stopped at `why`; `runnable[i]` says whether vCPU i can run now (never
  // all false). May be `current` itself (it starts a new turn).
  virtual uint32_t next(uint32_t current, SwitchPoint why, std::span<const bool> runnable) = 0;
  // The turn of `vcpu`, which starts running now.
  virtual Turn turn(uint32_t vcpu) = 0;
  // The policy's state (a checkpoint's part).
  virtual std::vector<uint8_t> save() const = 0;
  virtual Result<> restore(std::span<const uint8_t> state) = 0;
};

// The default policy: round robin over the runnable vCPUs, in index order from the one after `current`, with
// each turn's length and PAUSE count drawn from a generator seeded with the schedule's seed (splitmix64).
// Fails on a policy name or parameters it does not take.
Result<std::unique_ptr<Scheduler>> make_scheduler(const ScheduleConfig& config);

}  // namespace deja
