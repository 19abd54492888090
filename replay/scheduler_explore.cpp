// The exploration schedules: PCT (probabilistic concurrency testing) and uniformly random slices, both from a seed.
#include <algorithm>
#include <array>

#include "core/seeded_random.h"
#include "devices/state_codec.h"
#include "replay/scheduler.h"
#include "vmm/machine.h"

namespace deja {
namespace {

// PCT (Burckhardt, Kothari, Musuvathi, Nagarakatte, ASPLOS 2010): every vCPU gets a distinct random priority of at
// least d; the highest-priority runnable vCPU runs; d - 1 change points are drawn uniformly from the first k
// scheduling events, and at the i-th the running vCPU's priority drops to d - i. A bug of depth d then shows with
// probability at least 1 / (n k^(d-1)). Steps are scheduling events (ScheduleEvent), not instructions, so k stays
// small. A vCPU spinning on PAUSE (waiting for a lower-priority one, which strict priorities would starve) yields
// one slice to the highest-priority other runnable vCPU after its slice's PAUSEs, and (schedule version 1) after 8
// whole slices of instructions in a row: PCT for programs that spin, with or without PAUSE.
class PctScheduler : public Scheduler {
 public:
  explicit PctScheduler(const ScheduleConfig& config) : config_(config), random_(config.seed) {
    // Random priorities, all at least d, distinct but for a 2^-48 chance (a tie goes to the lower index).
    for (uint64_t& p : priorities_) p = config.depth + (random_.next() >> 16);
    for (uint32_t i = 1; i < config.depth; ++i) {
      const uint64_t at = 1 + random_.below(config.change_window);  // (drawn even when left out: the others stay)
      change_points_.push_back(i - 1 < 64 && (config.dropped_change_points >> (i - 1) & 1) ? 0 : at);
    }
  }

  const ScheduleConfig& config() const override { return config_; }

  std::optional<uint32_t> event(uint32_t current, ScheduleEvent) override {
    ++events_;
    // (Two drawn at the same event: the later draw's lower priority is the one that stays.)
    std::optional<uint32_t> fired;
    for (size_t i = 0; i < change_points_.size(); ++i) {
      if (change_points_[i] != 0 && change_points_[i] == events_ && current < priorities_.size()) {
        priorities_[current] = config_.depth - 1 - i;  // below every starting priority, each lower
        preempting_ = true;
        fired = uint32_t(i);
      }
    }
    return fired;
  }
  bool preempting() const override { return preempting_; }

  uint32_t next(uint32_t current, SwitchPoint why, std::span<const bool> runnable) override {
    preempting_ = false;
    // kSpinSlices whole slices in a row without a PAUSE, a halt or a preemption while another vCPU could run are a spin
    // too (schedule version 1): Linux's AP calibrates its delay loop reading the TSC until jiffies move, which only the
    // BSP's timer tick moves, so a higher-priority AP that never yielded there starved the BSP for good. (Not one
    // slice: a lower-priority vCPU held at a change point must stay held through a long computation of the other.)
    bool others = false;
    for (uint32_t v = 0; v < runnable.size(); ++v) others |= runnable[v] && v != current;
    const bool long_run = why == SwitchPoint::kSliceEnd && others && config_.version >= kScheduleVersionPauseWithCompany;
    full_slices_ = long_run ? full_slices_ + 1 : 0;
    const bool yield = why == SwitchPoint::kPause || full_slices_ >= kSpinSlices;
    if (full_slices_ >= kSpinSlices) full_slices_ = 0;
    uint32_t best = current;
    bool found = false;
    for (uint32_t v = 0; v < runnable.size(); ++v) {
      if (!runnable[v] || (yield && v == current)) continue;
      if (!found || priorities_[v] > priorities_[best]) best = v, found = true;
    }
    return found ? best : current;
  }

  Slice slice(uint32_t) override {
    return Slice{config_.quantum, config_.pause_limit};
  }

  std::vector<uint8_t> save() const override {
    StateWriter w("PCTS", 2);
    w.u64(random_.state());
    w.u32(full_slices_);
    w.u64(events_);
    w.boolean(preempting_);
    for (uint64_t p : priorities_) w.u64(p);
    w.u32(uint32_t(change_points_.size()));
    for (uint64_t c : change_points_) w.u64(c);
    return w.take();
  }
  Result<> restore(std::span<const uint8_t> state) override {
    const uint8_t version = state.size() > 4 && state[4] == 1 ? 1 : 2;  // (1: before full_slices)
    StateReader r(state, "PCTS", version);
    const uint64_t s = r.u64();
    const uint32_t full_slices = version >= 2 ? r.u32() : 0;
    const uint64_t events = r.u64();
    const bool preempting = r.boolean();
    std::array<uint64_t, kMaxVcpus> priorities{};
    for (uint64_t& p : priorities) p = r.u64();
    std::vector<uint64_t> changes(std::min<uint32_t>(r.u32(), 4096));
    for (uint64_t& c : changes) c = r.u64();
    if (auto done = r.finish(); !done) return done;
    random_.set_state(s);
    full_slices_ = full_slices;
    events_ = events;
    preempting_ = preempting;
    priorities_ = priorities;
    change_points_ = std::move(changes);
    return {};
  }

 private:
  ScheduleConfig config_;
  SplitMix64 random_;
  std::array<uint64_t, kMaxVcpus> priorities_{};
  std::vector<uint64_t> change_points_;
  uint64_t events_ = 0;
  bool preempting_ = false;
  static constexpr uint32_t kSpinSlices = 8;
  uint32_t full_slices_ = 0;  // whole slices the running vCPU ran in a row while another could run
};

// Uniformly random: each slice's length is uniform in [1, 2 quantum] and its PAUSEs in [1, pause_limit], and the vCPU
// to run next is drawn uniformly from the runnable ones (after PAUSEs, from the others).
class RandomScheduler : public GeneratorScheduler {
 public:
  explicit RandomScheduler(const ScheduleConfig& config) : GeneratorScheduler(config, "RNDS") {}

  uint32_t next(uint32_t current, SwitchPoint why, std::span<const bool> runnable) override {
    std::vector<uint32_t> choices;
    for (uint32_t v = 0; v < runnable.size(); ++v) {
      if (runnable[v] && !(why == SwitchPoint::kPause && v == current)) choices.push_back(v);
    }
    return choices.empty() ? current : choices[random_.below(choices.size())];
  }
  Slice slice(uint32_t) override {
    const uint32_t pauses = config_.pause_limit > 0 ? uint32_t(1 + random_.below(config_.pause_limit)) : 0;
    return Slice{1 + random_.below(2 * config_.quantum), pauses};
  }
};

}  // namespace

Result<std::unique_ptr<Scheduler>> make_pct_scheduler(const ScheduleConfig& config) {
  if (config.depth < 1 || config.depth > 64) {
    return fail(ErrorKind::kInvalidArgument, "PCT depth {} is out of range (1 to 64)", config.depth);
  }
  if (config.change_window < 1 || config.change_window > (uint64_t{1} << 40)) {
    return fail(ErrorKind::kInvalidArgument, "PCT change window {} is out of range (1 to 2^40 events)",
                config.change_window);
  }
  return std::unique_ptr<Scheduler>(new PctScheduler(config));
}

Result<std::unique_ptr<Scheduler>> make_random_scheduler(const ScheduleConfig& config) {
  return std::unique_ptr<Scheduler>(new RandomScheduler(config));
}

}  // namespace deja
