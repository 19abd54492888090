// The schedules: the default one a pure function of its seed, a PAUSE limit of 0 (KVM without PAUSE exits) that draws
// none; PCT's yield at a slice's end by schedule version.
#include "replay/scheduler.h"

#include <array>

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

// PCT, schedule version 1: a vCPU that runs 8 whole slices in a row without a PAUSE yields one slice to the other (a spin
// without PAUSE must not starve the vCPU it waits for); version 0, as traces before it replay, keeps it running.
TEST(Scheduler, PctYieldsAtSliceEndFromVersionOne) {
  for (uint32_t version : {kScheduleVersionPauseAlways, kScheduleVersionPauseWithCompany}) {
    ScheduleConfig config = default_schedule(SliceUnit::kInstructions, 7);
    config.policy = "pct";
    config.depth = 2;
    config.change_window = 1'000'000;
    config.version = version;
    auto made = make_scheduler(config);
    ASSERT_TRUE(made) << made.error().message;
    const std::array<bool, 2> both{true, true};
    const uint32_t highest = (*made)->next(0, SwitchPoint::kIdle, both);
    for (int slice = 1; slice < 8; ++slice) EXPECT_EQ((*made)->next(highest, SwitchPoint::kSliceEnd, both), highest);
    const uint32_t after_eighth = (*made)->next(highest, SwitchPoint::kSliceEnd, both);
    EXPECT_EQ(after_eighth, version == kScheduleVersionPauseAlways ? highest : 1 - highest);
    EXPECT_EQ((*made)->next(after_eighth, SwitchPoint::kSliceEnd, both), highest);  // (then priorities rule again)
    EXPECT_EQ((*made)->next(highest, SwitchPoint::kPause, both), 1 - highest);
  }
}

TEST(Scheduler, RefusesANewerVersion) {
  ScheduleConfig config = default_schedule(SliceUnit::kInstructions, 1);
  config.version = kScheduleVersionPauseWithCompany + 1;
  EXPECT_FALSE(make_scheduler(config));
}

}  // namespace
}  // namespace deja
