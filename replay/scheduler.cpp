// The default schedule: seeded round robin with quanta and PAUSE counts drawn per slice.
#include "replay/scheduler.h"

#include <fmt/format.h>

#include "core/seeded_random.h"
#include "devices/state_codec.h"

namespace deja {

std::string_view slice_unit_name(SliceUnit unit) {
  return unit == SliceUnit::kInstructions ? "instructions" : "guest-exits";
}

ScheduleConfig default_schedule(SliceUnit unit, uint64_t seed) {
  ScheduleConfig c;
  c.seed = seed;
  c.unit = unit;
  c.quantum = unit == SliceUnit::kInstructions ? 200'000 : 32;
  // In guest exits a PAUSE is an exit like the holder's work (135 us each under nested KVM): a spinner's slice of up
  // to 64 of them let a vCPU waiting for another that catches up on its timer ticks (IF clear) take as much host time
  // as that one's slice, and Linux's tick handler never caught up (docs/smp.md, run G). A few PAUSEs hand over sooner.
  c.pause_limit = unit == SliceUnit::kInstructions ? 64 : 8;
  // (Guest-exit slices keep every PAUSE an exit: untested under nested KVM with the newer rule.)
  c.version = unit == SliceUnit::kInstructions ? kScheduleVersionPauseWithCompany : kScheduleVersionPauseAlways;
  return c;
}

std::vector<uint8_t> GeneratorScheduler::save() const {
  StateWriter w(tag_, 1);
  w.u64(random_.state());
  return w.take();
}

Result<> GeneratorScheduler::restore(std::span<const uint8_t> state) {
  StateReader r(state, tag_, 1);
  const uint64_t s = r.u64();
  if (auto done = r.finish(); !done) return done;
  random_.set_state(s);
  return {};
}

namespace {

class QuantumScheduler : public GeneratorScheduler {
 public:
  explicit QuantumScheduler(const ScheduleConfig& config) : GeneratorScheduler(config, "SCHD") {}

  uint32_t next(uint32_t current, SwitchPoint, std::span<const bool> runnable) override {
    const uint32_t n = uint32_t(runnable.size());
    for (uint32_t step = 1; step <= n; ++step) {
      const uint32_t candidate = (current + step) % n;
      if (runnable[candidate]) return candidate;
    }
    return current;  // (never reached: the caller passes at least one runnable vCPU)
  }

  Slice slice(uint32_t) override {
    Slice t;
    t.length = config_.quantum / 2 + random_.below(config_.quantum);
    if (config_.pause_limit > 0) t.pauses = uint32_t(1 + random_.below(config_.pause_limit));
    return t;
  }
};

}  // namespace

Result<std::unique_ptr<Scheduler>> make_scheduler(const ScheduleConfig& config) {
  if (config.policy != "quantum" && config.policy != "pct" && config.policy != "random") {
    return fail(ErrorKind::kUnsupported, "schedule policy '{}' is not one this deja implements (quantum, pct, random)",
                config.policy);
  }
  if (config.quantum < 2 || config.quantum > (uint64_t{1} << 40)) {
    return fail(ErrorKind::kInvalidArgument, "schedule quantum {} is out of range (2 to 2^40)", config.quantum);
  }
  if (config.pause_limit > (1u << 20)) {
    return fail(ErrorKind::kInvalidArgument, "schedule PAUSE limit {} is out of range (0 to 2^20)",
                config.pause_limit);
  }
  if (config.version > kScheduleVersionPauseWithCompany) {
    return fail(ErrorKind::kUnsupported, "schedule version {} is newer than this deja's ({})", config.version,
                kScheduleVersionPauseWithCompany);
  }
  if (config.policy == "pct") return make_pct_scheduler(config);
  if (config.policy == "random") return make_random_scheduler(config);
  return std::unique_ptr<Scheduler>(new QuantumScheduler(config));
}

}  // namespace deja
