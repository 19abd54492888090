// The default schedule: a pure function of its seed, and a PAUSE limit of 0 (KVM without PAUSE exits) that draws none.
#include "replay/scheduler.h"

#include <gtest/gtest.h>

namespace deja {
namespace {

std::vector<Slice> slices(const ScheduleConfig& config, int n) {
  auto scheduler = make_scheduler(config);
  EXPECT_TRUE(scheduler.has_value());
  std::vector<Slice> out;
  for (int i = 0; i < n; ++i) out.push_back((*scheduler)->slice(uint32_t(i % 2)));
  return out;
}

TEST(Scheduler, SameSeedSameSlices) {
  const ScheduleConfig config = default_schedule(SliceUnit::kGuestExits, 7);
  const auto a = slices(config, 50), b = slices(config, 50);
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].length, b[i].length);
    EXPECT_EQ(a[i].pauses, b[i].pauses);
    EXPECT_GE(a[i].length, config.quantum / 2);
    EXPECT_LT(a[i].length, config.quantum / 2 + config.quantum);
    EXPECT_GE(a[i].pauses, 1u);
    EXPECT_LE(a[i].pauses, config.pause_limit);
  }
}

TEST(Scheduler, NoPauseLimitDrawsNoPausesAndTheSameLengths) {
  ScheduleConfig config = default_schedule(SliceUnit::kGuestExits, 7);
  config.pause_limit = 0;
  for (const Slice& s : slices(config, 20)) {
    EXPECT_EQ(s.pauses, 0u);
    EXPECT_GE(s.length, config.quantum / 2);
  }
  config.pause_limit = (1u << 20) + 1;
  EXPECT_FALSE(make_scheduler(config).has_value());
}

TEST(Scheduler, RoundRobinOverRunnable) {
  auto scheduler = make_scheduler(default_schedule(SliceUnit::kInstructions, 1));
  ASSERT_TRUE(scheduler.has_value());
  const bool runnable[] = {true, false, true, true};
  EXPECT_EQ((*scheduler)->next(0, SwitchPoint::kSliceEnd, runnable), 2u);
  EXPECT_EQ((*scheduler)->next(3, SwitchPoint::kPause, runnable), 0u);
  const bool only_current[] = {false, true, false, false};
  EXPECT_EQ((*scheduler)->next(1, SwitchPoint::kSliceEnd, only_current), 1u);
}

}  // namespace
}  // namespace deja
