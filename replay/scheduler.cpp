// The default schedule: seeded round robin with quanta and PAUSE counts drawn per slice.
#include "replay/scheduler.h"

#include <fmt/format.h>

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
  c.pause_limit = 64;
  return c;
}

namespace {

// splitmix64 (Steele, Lea, Flood 2014): fully specified, so the same seed gives the same schedule on every
// host and build (the standard library's distributions are not).
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  // Uniform in [0, n) (n > 0), by rejection: no modulo bias.
  uint64_t below(uint64_t n) {
    const uint64_t limit = UINT64_MAX - UINT64_MAX % n;
    uint64_t v;
    do v = next(); while (v >= limit);
    return v % n;
  }
  uint64_t state() const { return state_; }
  void set_state(uint64_t state) { state_ = state; }

 private:
  uint64_t state_;
};

class QuantumScheduler : public Scheduler {
 public:
  explicit QuantumScheduler(const ScheduleConfig& config) : config_(config), random_(config.seed) {}
  const ScheduleConfig& config() const override { return config_; }

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

  std::vector<uint8_t> save() const override {
    StateWriter w("SCHD", 1);
    w.u64(random_.state());
    return w.take();
  }
  Result<> restore(std::span<const uint8_t> state) override {
    StateReader r(state, "SCHD", 1);
    const uint64_t s = r.u64();
    if (auto done = r.finish(); !done) return done;
    random_.set_state(s);
    return {};
  }

 private:
  ScheduleConfig config_;
  SplitMix64 random_;
};

}  // namespace

Result<std::unique_ptr<Scheduler>> make_scheduler(const ScheduleConfig& config) {
  if (config.policy != "quantum") {
    return fail(ErrorKind::kUnsupported, "schedule policy '{}' is not one this deja implements (quantum)",
                config.policy);
  }
  if (config.quantum < 2 || config.quantum > (uint64_t{1} << 40)) {
    return fail(ErrorKind::kInvalidArgument, "schedule quantum {} is out of range (2 to 2^40)", config.quantum);
  }
  if (config.pause_limit > (1u << 20)) {
    return fail(ErrorKind::kInvalidArgument, "schedule PAUSE limit {} is out of range (0 to 2^20)",
                config.pause_limit);
  }
  return std::unique_ptr<Scheduler>(new QuantumScheduler(config));
}

}  // namespace deja
