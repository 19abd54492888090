// StreamMatch: the recorded/replayed serial comparison finds the first difference and stays within its memory cap.
#include "replay/stream_match.h"

#include <random>
#include <string>

#include <gtest/gtest.h>

namespace deja {
namespace {

std::string pattern(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::string s(n, '\0');
  for (auto& c : s) c = char(rng());
  return s;
}

// Feeds both streams in random pieces, interleaved at random.
void feed(StreamMatch& m, const std::string& recorded, const std::string& replayed, uint32_t seed) {
  std::mt19937 rng(seed);
  size_t a = 0, b = 0;
  while (a < recorded.size() || b < replayed.size()) {
    bool take_recorded = b == replayed.size() || (a < recorded.size() && rng() % 2);
    size_t n = 1 + rng() % 5000;
    if (take_recorded) {
      n = std::min(n, recorded.size() - a);
      m.add(StreamMatch::kRecorded, std::string_view(recorded).substr(a, n));
      a += n;
    } else {
      n = std::min(n, replayed.size() - b);
      m.add(StreamMatch::kReplayed, std::string_view(replayed).substr(b, n));
      b += n;
    }
  }
}

TEST(StreamMatch, EqualStreamsInAnyInterleavingMatch) {
  const std::string s = pattern(300'000, 1);
  for (uint32_t seed = 0; seed < 20; ++seed) {
    StreamMatch m(1000);  // a small cap, so that the hashed path is exercised
    feed(m, s, s, seed);
    EXPECT_FALSE(m.mismatch()) << "seed " << seed;
    EXPECT_EQ(m.pending(StreamMatch::kRecorded), 0u);
    EXPECT_EQ(m.pending(StreamMatch::kReplayed), 0u);
    EXPECT_EQ(m.matched(), s.size());
  }
}

TEST(StreamMatch, ReportsTheFirstDifferingByteWithinTheCap) {
  std::string recorded = pattern(10'000, 2), replayed = recorded;
  replayed[7777] ^= 0x20;
  StreamMatch m;
  m.add(StreamMatch::kRecorded, recorded);
  m.add(StreamMatch::kReplayed, replayed);
  ASSERT_TRUE(m.mismatch());
  EXPECT_EQ(m.mismatch()->offset, 7777u);
  EXPECT_EQ(m.mismatch()->end, 0u);
  EXPECT_EQ(m.mismatch()->recorded, uint8_t(recorded[7777]));
  EXPECT_EQ(m.mismatch()->replayed, uint8_t(replayed[7777]));
}

TEST(StreamMatch, FindsADifferenceBeyondTheCapByHash) {
  std::string recorded = pattern(200'000, 3), replayed = recorded;
  replayed[150'000] ^= 1;
  for (uint32_t seed = 0; seed < 10; ++seed) {
    StreamMatch m(4096);
    feed(m, recorded, replayed, seed);
    ASSERT_TRUE(m.mismatch()) << "seed " << seed;
    EXPECT_LE(m.mismatch()->offset, 150'000u);
    if (m.mismatch()->end) {
      EXPECT_GT(m.mismatch()->end, 150'000u);
    }
  }
}

TEST(StreamMatch, UnboundedOutputOfOneSideTakesBoundedMemory) {
  // 256 MiB "recorded" that the replay never produces (a hostile trace), then the same from the replay side.
  const std::string piece(1 << 20, 'x');
  StreamMatch recorded_ahead(1 << 20);
  for (int i = 0; i < 256; ++i) recorded_ahead.add(StreamMatch::kRecorded, piece);
  EXPECT_EQ(recorded_ahead.pending(StreamMatch::kRecorded), uint64_t{1} << 28);
  EXPECT_LE(recorded_ahead.held(), size_t{2} << 20);
  StreamMatch replayed_ahead(1 << 20);
  for (int i = 0; i < 256; ++i) replayed_ahead.add(StreamMatch::kReplayed, piece);
  EXPECT_LE(replayed_ahead.held(), size_t{2} << 20);
  for (int i = 0; i < 256; ++i) replayed_ahead.add(StreamMatch::kRecorded, piece);
  EXPECT_FALSE(replayed_ahead.mismatch());
  EXPECT_EQ(replayed_ahead.matched(), uint64_t{1} << 28);
}

TEST(StreamMatch, ShorterSideIsPendingAtTheEnd) {
  StreamMatch m(10);
  m.add(StreamMatch::kRecorded, "hello, world, and more");
  m.add(StreamMatch::kReplayed, "hello");
  EXPECT_FALSE(m.mismatch());
  EXPECT_EQ(m.pending(StreamMatch::kRecorded), 17u);
  EXPECT_EQ(m.pending(StreamMatch::kReplayed), 0u);
}

}  // namespace
}  // namespace deja
