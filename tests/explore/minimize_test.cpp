// Units of ddmin (explore/minimize.h) on synthetic failures: 1-minimal results, bounded tests, each removal tried once.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "explore/minimize.h"

namespace deja::explore {
namespace {

// A failure that needs every item of `needed` (and fails whatever else is kept).
std::function<bool(const Removal&)> needs(std::set<size_t> needed) {
  return [needed](const Removal& removed) {
    for (size_t i : needed) {
      if (removed[i]) return false;
    }
    return true;
  };
}

std::set<size_t> kept(const Removal& removed) {
  std::set<size_t> left;
  for (size_t i = 0; i < removed.size(); ++i) {
    if (!removed[i]) left.insert(i);
  }
  return left;
}

// Taking away any one more item left makes it pass (none left: nothing to check).
void expect_one_minimal(const Minimized& m, const std::function<bool(const Removal&)>& still_fails) {
  EXPECT_TRUE(still_fails(m.removed));
  for (size_t i : kept(m.removed)) {
    Removal more = m.removed;
    more[i] = true;
    EXPECT_FALSE(still_fails(more)) << "item " << i << " can go too";
  }
}

// Zeller and Hildebrandt's worst case, and one more for the run with everything removed.
unsigned bound(size_t n) { return unsigned(n * n + 3 * n) / 2 + 1; }

TEST(Minimize, KeepsTheTwoItemsAFailureNeeds) {
  const auto still_fails = needs({3, 7});
  const Minimized m = minimize_failure(20, still_fails);
  EXPECT_EQ(kept(m.removed), (std::set<size_t>{3, 7}));
  expect_one_minimal(m, still_fails);
  EXPECT_LE(m.tests, 20u);  // 19: about 2 k log2(n), where the worst case is 231 and a greedy pass 20
}

TEST(Minimize, KeepsTheOneItemAFailureNeeds) {
  for (size_t needed : {size_t{0}, size_t{9}, size_t{19}}) {
    const Minimized m = minimize_failure(20, needs({needed}));
    EXPECT_EQ(kept(m.removed), std::set<size_t>{needed});
    EXPECT_LE(m.tests, 12u) << needed;  // 5 to 11: about 2 log2(n)
  }
  const Minimized one = minimize_failure(1, needs({0}));  // the run without it is tried too
  EXPECT_EQ(kept(one.removed), std::set<size_t>{0});
  EXPECT_EQ(one.tests, 1u);
}

TEST(Minimize, TakesAllAwayWhenTheFailureNeedsNone) {
  for (size_t n : {size_t{1}, size_t{2}, size_t{20}}) {
    const Minimized m = minimize_failure(n, needs({}));
    EXPECT_EQ(m.removed, Removal(n, true)) << n;
    EXPECT_LE(m.tests, 6u) << n;  // 5 for 20: about log2(n)
  }
  const Minimized none = minimize_failure(0, needs({}));
  EXPECT_TRUE(none.removed.empty());
  EXPECT_EQ(none.tests, 0u);
}

TEST(Minimize, KeepsAllWhenTheFailureNeedsAll) {
  std::set<size_t> all;
  for (size_t i = 0; i < 20; ++i) all.insert(i);
  const auto still_fails = needs(all);
  const Minimized m = minimize_failure(20, still_fails);
  EXPECT_EQ(m.removed, Removal(20, false));
  expect_one_minimal(m, still_fails);
  EXPECT_LE(m.tests, bound(20));
}

// A failure that is not monotone (an item that makes it pass, pairs that make it fail alone): still 1-minimal,
// still within the bound, each removal asked once, ending on the last that failed, and the same answer every time.
TEST(Minimize, OneMinimalBoundedAndDeterministicOnAnyFailure) {
  for (uint64_t salt = 0; salt < 200; ++salt) {
    const size_t n = 1 + salt % 24;
    std::set<Removal> asked;
    bool asked_twice = false;
    Removal last_failing(n, false);
    auto still_fails = [&](const Removal& removed) {
      asked_twice |= !asked.insert(removed).second;
      uint64_t h = salt * 0x9e3779b97f4a7c15u;
      for (bool r : removed) h = (h ^ r) * 0x100000001b3u, h ^= h >> 29;
      const bool fails = std::find(removed.begin(), removed.end(), true) == removed.end() || h % 3 == 0;
      if (fails) last_failing = removed;
      return fails;
    };
    const Minimized m = minimize_failure(n, still_fails);
    EXPECT_FALSE(asked_twice) << salt;
    EXPECT_EQ(m.removed, last_failing) << salt;  // the run a caller kept last is the minimized one
    EXPECT_LE(m.tests, bound(n)) << salt;
    asked.clear();
    expect_one_minimal(m, still_fails);
    asked.clear();
    const Minimized again = minimize_failure(n, still_fails);
    EXPECT_EQ(again.removed, m.removed) << salt;
    EXPECT_EQ(again.tests, m.tests) << salt;
  }
}

}  // namespace
}  // namespace deja::explore
