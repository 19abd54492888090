// Units of `deja explore`: --until predicates, the serial watch, seed ranges and shards, results as JSON, summaries,
// and the exploration schedules (PCT's change points and priorities, random slices, save/restore).
#include <gtest/gtest.h>

#include <algorithm>
#include <string_view>
#include <vector>

#include "explore/campaign.h"
#include "explore/predicates.h"
#include "replay/scheduler.h"

namespace deja::explore {
namespace {

std::span<const uint8_t> bytes(std::string_view s) { return {reinterpret_cast<const uint8_t*>(s.data()), s.size()}; }

TEST(Predicates, ParseAndRefuse) {
  EXPECT_TRUE(parse_predicate("exit:3"));
  EXPECT_TRUE(parse_predicate("exit:!1"));
  EXPECT_TRUE(parse_predicate("exit:3,5"));
  EXPECT_TRUE(parse_predicate("serial:BUG:|Oops|panic"));
  EXPECT_TRUE(parse_predicate("digest:ab12"));
  EXPECT_EQ(parse_predicate("hang:5M")->hang_instructions, 5'000'000u);
  EXPECT_EQ(parse_predicate("hang")->hang_instructions, 1'000'000'000u);
  for (const char* bad : {"exit", "exit:x", "exit:300", "serial:", "serial:(", "digest:xyz", "hang:0", "hang:-1",
                          "hang:5Q", "nope:1"}) {
    EXPECT_FALSE(parse_predicate(bad)) << bad;
  }
}

TEST(Predicates, Met) {
  std::vector<Predicate> p{*parse_predicate("exit:!1"), *parse_predicate("digest:AB"), *parse_predicate("hang:10")};
  RunEnd end{true, 1, false, "abcd"};
  EXPECT_EQ(met_predicates(p, end, std::nullopt), std::vector<std::string>{"digest:AB"});
  end = RunEnd{true, 3, true, "00"};
  EXPECT_EQ(met_predicates(p, end, std::nullopt), (std::vector<std::string>{"exit:!1", "hang:10"}));
  end = RunEnd{false, 4, false, "00"};  // not a guest exit: no exit predicate
  EXPECT_TRUE(met_predicates(p, end, std::nullopt).empty());
  EXPECT_EQ(hang_instructions(p), 10u);
}

TEST(Predicates, SerialWatchMatchesLinesAcrossWrites) {
  std::vector<Predicate> p{*parse_predicate("serial:^BUG: .*owners$")};
  SerialWatch w(p);
  w.feed(bytes("booting\nBU"));
  EXPECT_FALSE(w.matched());
  w.feed(bytes("G: two owner"));
  EXPECT_FALSE(w.matched());
  w.feed(bytes("s\nmore"));
  EXPECT_EQ(w.matched(), "serial:^BUG: .*owners$");
  SerialWatch unbounded(p);
  unbounded.feed(bytes(std::string(100'000, 'x')));  // one long line: matched in pieces, bounded memory
  EXPECT_FALSE(unbounded.matched());
}

TEST(Campaign, SeedRangesAndShards) {
  EXPECT_EQ(parse_seed_range("3..7")->size(), 5u);
  EXPECT_EQ(parse_seed_range("9")->first, 9u);
  EXPECT_FALSE(parse_seed_range("7..3"));
  EXPECT_FALSE(parse_seed_range("a..b"));
  EXPECT_FALSE(parse_seed_range("0..99999999999"));
  EXPECT_FALSE(parse_shard("2/2"));
  EXPECT_FALSE(parse_shard("1"));
  const SeedRange r = *parse_seed_range("10..19");
  std::vector<uint64_t> all;
  for (uint32_t i = 0; i < 3; ++i) {
    for (uint64_t s : shard_seeds(r, Shard{i, 3})) all.push_back(s);
  }
  std::sort(all.begin(), all.end());
  ASSERT_EQ(all.size(), 10u);
  for (uint64_t i = 0; i < 10; ++i) EXPECT_EQ(all[i], 10 + i);
}

TEST(Campaign, ResultsRoundTripAndSummary) {
  SeedResult a;
  a.seed = 4;
  a.status = 12;
  a.reason = "limit: serial:BUG";
  a.met = {"serial:BUG"};
  a.trace = "d/seed-4.trace";
  a.instructions = 123;
  auto back = seed_result_from_json(to_json(a));
  ASSERT_TRUE(back);
  EXPECT_EQ(back->met, a.met);
  EXPECT_EQ(back->trace, a.trace);
  EXPECT_EQ(back->instructions, 123u);
  EXPECT_FALSE(seed_result_from_json("{not json"));
  SeedResult b;
  b.seed = 2;
  b.reason = "guest exit";
  b.status = 1;
  const Summary s = summarize({a, b}, 2.0);
  EXPECT_EQ(s.failures, 1u);
  EXPECT_EQ(s.first_failing_seed, 4u);
  EXPECT_EQ(s.outcomes.at("exit 1"), 1u);
  EXPECT_EQ(s.outcomes.at("fail: serial:BUG"), 1u);
}

ScheduleConfig pct(uint64_t seed, uint32_t depth, uint64_t window) {
  ScheduleConfig c = default_schedule(SliceUnit::kInstructions, seed);
  c.policy = "pct";
  c.depth = depth;
  c.change_window = window;
  return c;
}

TEST(Schedules, PctRunsTheHighestPriorityAndPreemptsAtAChangePoint) {
  // depth 2, window 1: the change point is the first scheduling event.
  auto s = make_scheduler(pct(5, 2, 1));
  ASSERT_TRUE(s);
  const bool both[2] = {true, true};
  const uint32_t first = (*s)->next(0, SwitchPoint::kSliceEnd, both);
  EXPECT_EQ((*s)->next(1 - first, SwitchPoint::kSliceEnd, both), first);  // the same one while nothing changes
  EXPECT_FALSE((*s)->preempting());
  EXPECT_EQ((*s)->event(first, ScheduleEvent::kDeviceAccess), 0u);
  EXPECT_TRUE((*s)->preempting());
  EXPECT_EQ((*s)->next(first, SwitchPoint::kPreempt, both), 1 - first);  // its priority dropped below the other's
  EXPECT_FALSE((*s)->preempting());
  // A spinning vCPU yields to another, then the priorities rule again.
  EXPECT_EQ((*s)->next(1 - first, SwitchPoint::kPause, both), first);
  EXPECT_EQ((*s)->next(first, SwitchPoint::kSliceEnd, both), 1 - first);
}

// A change point is named by its draw, whatever the order they fire in: the bit of dropped_change_points that
// leaves it out (deja explore --minimize reports it so).
TEST(Schedules, PctNamesAChangePointByItsDraw) {
  bool out_of_order = false;
  for (uint64_t seed = 0; seed < 50; ++seed) {
    for (uint64_t dropped : {0, 1, 2, 4}) {
      ScheduleConfig c = pct(seed, 4, 20);
      c.dropped_change_points = dropped;
      auto s = make_scheduler(c);
      ASSERT_TRUE(s);
      std::vector<uint32_t> fired;
      for (int e = 0; e < 20; ++e) {
        if (auto change_point = (*s)->event(0, ScheduleEvent::kPause)) fired.push_back(*change_point);
      }
      EXPECT_FALSE(fired.empty());
      for (uint32_t i : fired) EXPECT_FALSE(dropped >> i & 1) << seed << " " << i;
      if (dropped == 0) out_of_order |= !std::is_sorted(fired.begin(), fired.end());
    }
  }
  EXPECT_TRUE(out_of_order);  // (the case the order of firing would have named wrongly)
}

TEST(Schedules, SaveRestoreContinuesTheSameChoices) {
  for (const char* policy : {"pct", "random"}) {
    ScheduleConfig c = pct(9, 3, 50);
    c.policy = policy;
    c.quantum = 100;
    auto a = make_scheduler(c);
    ASSERT_TRUE(a);
    const bool all[3] = {true, true, true};
    uint32_t cur = 0;
    for (int i = 0; i < 20; ++i) {
      (*a)->event(cur, ScheduleEvent::kPause);
      cur = (*a)->next(cur, (*a)->preempting() ? SwitchPoint::kPreempt : SwitchPoint::kSliceEnd, all);
      (*a)->slice(cur);
    }
    auto b = make_scheduler(c);
    ASSERT_TRUE((*b)->restore((*a)->save()));
    for (int i = 0; i < 50; ++i) {
      (*a)->event(cur, ScheduleEvent::kInterrupt);
      (*b)->event(cur, ScheduleEvent::kInterrupt);
      const SwitchPoint why = (*a)->preempting() ? SwitchPoint::kPreempt : SwitchPoint::kSliceEnd;
      const uint32_t next = (*a)->next(cur, why, all);
      ASSERT_EQ((*b)->next(cur, why, all), next) << policy;
      ASSERT_EQ((*a)->slice(next).length, (*b)->slice(next).length) << policy;
      cur = next;
    }
  }
  EXPECT_FALSE(make_scheduler(pct(1, 0, 10)));
  EXPECT_FALSE(make_scheduler(pct(1, 2, 0)));
}

}  // namespace
}  // namespace deja::explore
