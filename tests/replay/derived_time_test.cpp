// Unit tests of derived time (Engine::derive_time, trace format 4): the TSC and device clock reads follow from the
// instruction count and device reads between asynchronous events, with no event, the same in every mode.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "replay/engine.h"

namespace deja {
namespace {

struct DerivedEngine {
  explicit DerivedEngine(Mode mode) : engine(mode, ProgressMode::kExact) {
    engine.derive_time(Engine::TimeRates{}, [this] { return std::optional<uint64_t>(instructions); });
  }
  Engine engine;
  uint64_t instructions = 0;
};

TEST(DerivedTime, TscAndClockAdvanceByInstructionsAndDeviceReads) {
  DerivedEngine d(Mode::kRun);
  d.engine.begin_async(5'000'000);  // an asynchronous event at 5 ms, instruction 0
  d.engine.end_async();
  EXPECT_EQ(d.engine.now_ns(), 5'000'000u);
  d.instructions = 1000;  // 1 ns an instruction
  EXPECT_EQ(d.engine.now_ns(), 5'001'000u);
  EXPECT_EQ(d.engine.rdtsc(0x1000, false), 2 * 5'001'000u);  // the TSC runs at 2 GHz
  d.engine.port_read(0x61, 1, 0x20, 0x1000);                  // a device read costs 1 us
  EXPECT_EQ(d.engine.now_ns(), 5'002'000u);
  EXPECT_EQ(d.engine.msr_read(0x10, 0x1000, 0), 2 * 5'002'000u);
  EXPECT_EQ(d.engine.events_processed(), 0u);  // run mode: nothing logged, as in record (no clock or rdtsc events)
}

TEST(DerivedTime, NeverRunsBackwardsAndEachTscReadIsLarger) {
  DerivedEngine d(Mode::kRun);
  d.engine.begin_async(1'000'000);
  d.engine.end_async();
  d.instructions = 10'000'000;  // 10 ms of derived time, past the next event's time
  EXPECT_EQ(d.engine.now_ns(), 11'000'000u);
  const uint64_t tsc = d.engine.rdtsc(0, false);
  d.engine.begin_async(2'000'000);  // an event whose time lies behind what derived time reached
  d.engine.end_async();
  EXPECT_EQ(d.engine.now_ns(), 11'000'000u);
  EXPECT_EQ(d.engine.rdtsc(0, false), tsc + 1);  // the same instruction count: still one tick later
  EXPECT_GT(d.engine.rdtsc(0, false), tsc + 1);
}

TEST(DerivedTime, InstructionsUntilADeadline) {
  DerivedEngine d(Mode::kRun);
  d.engine.begin_async(1'000);
  d.engine.end_async();
  EXPECT_EQ(d.engine.instructions_until(1'000), 1u);  // due now: stop at the next boundary
  EXPECT_EQ(d.engine.instructions_until(4'000), 3000u);
  d.instructions = 3000;
  EXPECT_EQ(d.engine.running_now_ns(), 4'000u);
}

TEST(DerivedTime, AsynchronousEventsCarryTheirInstructionCount) {
  Engine engine(Mode::kRecord, ProgressMode::kExact);
  uint64_t instructions = 77;
  engine.derive_time(Engine::TimeRates{}, [&] { return std::optional<uint64_t>(instructions); });
  Position where;
  where.instructions = instructions;
  engine.record_async(where, 123, {});
  trace::Event e;
  e.mutable_async()->set_instructions(77);
  EXPECT_EQ(Engine::positional_instructions(e), 77u);
  Position other = where;
  other.instructions = 76;
  EXPECT_FALSE(engine.positional_matches(e, other));  // an earlier visit of the same coordinate is not the event
  EXPECT_TRUE(engine.positional_matches(e, where));
}

// A halted guest's wait ends at host time, but never more than the catch-up bound past its next deadline: a guest
// whose derived time lags host time gets its timer at the deadline, and the lag is dropped, so that later waits
// end at host-timed points again.
TEST(DerivedTime, IdleTimeStopsAtTheNextDeadlineAndDropsTheLag) {
  DerivedEngine d(Mode::kRecord);
  d.engine.begin_async(1'000'000);  // derived time 1 ms, instruction 0
  d.engine.end_async();
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // host time passes; the guest retires nothing
  EXPECT_EQ(d.engine.idle_now_ns(5'000'000), 5'000'000u)
      << "host time more than the catch-up bound past the timer due at 5 ms: it fires at 5 ms";
  const uint64_t no_timer = d.engine.idle_now_ns(std::nullopt);
  EXPECT_GE(no_timer, 5'000'000u);
  EXPECT_LT(no_timer, 5'000'000u + Engine::kCatchUpNs) << "the lag is dropped, not caught up in one jump";
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_GE(d.engine.idle_now_ns(std::nullopt), no_timer + 20'000'000u) << "from there, the wait is host-timed";
  EXPECT_LT(d.engine.idle_now_ns(3'600'000'000'000), 3'600'000'000'000u) << "a far deadline: host time";
  d.instructions = 999'000'000;  // derived time 1 s: the wait never goes back before it
  EXPECT_EQ(d.engine.idle_now_ns(5'000'000), 1'000'000'000u);
}

}  // namespace
}  // namespace deja
