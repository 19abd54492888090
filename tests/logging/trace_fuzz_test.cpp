// Deterministic mutation fuzzing of the reader and verifier: thousands of bit flips, truncations and splices.
// Runs in every CI build and under ASan/UBSan with -DDEJA_SANITIZE=ON; failures print seed and iteration.
#include <random>

#include "logging/trace_format.h"
#include "logging/trace_verify.h"
#include "trace_test_support.h"

namespace deja {
namespace {

using testing::TempDir;

std::string mutate(const std::string& original, std::mt19937_64& rng, std::string& what) {
  std::string s = original;
  auto pick = [&](uint64_t n) { return n == 0 ? 0 : static_cast<size_t>(rng() % n); };
  int rounds = 1 + static_cast<int>(rng() % 3 == 0);
  for (int round = 0; round < rounds; ++round) {
    switch (rng() % 8) {
      case 0: {  // a few bit flips
        int flips = 1 + static_cast<int>(rng() % 4);
        for (int i = 0; i < flips && !s.empty(); ++i) {
          size_t at = pick(s.size());
          s[at] = static_cast<char>(s[at] ^ (1 << (rng() % 8)));
          what += fmt::format("flip@{} ", at);
        }
        break;
      }
      case 1: {  // interesting byte values
        static const uint8_t kValues[] = {0x00, 0xff, 0x7f, 0x80, 0x01};
        if (s.empty()) break;
        size_t at = pick(s.size());
        s[at] = static_cast<char>(kValues[rng() % 5]);
        what += fmt::format("byte@{} ", at);
        break;
      }
      case 2: {  // truncation
        size_t length = pick(s.size() + 1);
        s.resize(length);
        what += fmt::format("truncate@{} ", length);
        break;
      }
      case 3: {  // splice: overwrite one range with another part of the file
        if (s.size() < 2) break;
        size_t from = pick(s.size()), to = pick(s.size());
        size_t n = std::min({static_cast<size_t>(1 + rng() % 200), s.size() - from, s.size() - to});
        std::string piece = s.substr(from, n);
        s.replace(to, n, piece);
        what += fmt::format("splice {}+{}->{} ", from, n, to);
        break;
      }
      case 4: {  // insertion of a copy
        size_t from = pick(s.size()), to = pick(s.size() + 1);
        size_t n = std::min(static_cast<size_t>(1 + rng() % 200), s.size() - from);
        s.insert(to, s.substr(from, n));
        what += fmt::format("insert {}+{}@{} ", from, n, to);
        break;
      }
      case 5: {  // deletion
        size_t from = pick(s.size());
        size_t n = std::min(static_cast<size_t>(1 + rng() % 200), s.size() - from);
        s.erase(from, n);
        what += fmt::format("delete {}+{} ", from, n);
        break;
      }
      case 6: {  // a length-like field set to a hostile value
        if (s.size() < 4) break;
        static const uint32_t kValues[] = {0, 1, 0xffffffffu, 0x80000000u, 64u << 20, (64u << 20) + 1, 47, 49};
        size_t at = pick(s.size() - 3);
        uint32_t v = kValues[rng() % 8];
        for (int i = 0; i < 4; ++i) s[at + i] = static_cast<char>(v >> (8 * i));
        what += fmt::format("u32@{}={:#x} ", at, v);
        break;
      }
      case 7: {  // trailing garbage
        size_t n = 1 + rng() % 100;
        for (size_t i = 0; i < n; ++i) s.push_back(static_cast<char>(rng()));
        what += fmt::format("append {} ", n);
        break;
      }
    }
  }
  return s;
}

void fuzz(const std::vector<trace::Event>& events, size_t chunk_bytes, uint64_t seed, int iterations) {
  TempDir dir;
  std::string base = dir.file("base.trace");
  testing::write_trace(base, events, chunk_bytes);
  const std::string original = testing::read_bytes(base);
  std::string path = dir.file("fuzz.trace");
  std::mt19937_64 rng(seed);
  int detected = 0;
  for (int iteration = 0; iteration < iterations; ++iteration) {
    std::string what;
    std::string damaged = mutate(original, rng, what);
    testing::write_bytes(path, damaged);
    const bool unchanged = damaged == original;
    SCOPED_TRACE(fmt::format("seed {} iteration {}: {}", seed, iteration, what));

    VerifyReport report = verify_trace(path);
    // Every byte is covered by a check, so any change at all must fail verification.
    ASSERT_EQ(report.ok, unchanged) << report.summary;
    detected += !report.ok;

    testing::ReadOutcome out = testing::read_all(path, events.size() + 1);
    ASSERT_LE(out.events.size(), events.size());
    // Whatever the reader hands out was verified by the chain, so it is the original recording's prefix.
    for (size_t i = 0; i < out.events.size(); ++i) ASSERT_TRUE(testing::same_event(out.events[i], events[i])) << i;
    if (unchanged) {
      ASSERT_TRUE(out.complete);
    } else {
      ASSERT_FALSE(out.complete) << out.message;
      ASSERT_FALSE(out.message.empty());
    }
  }
  EXPECT_GT(detected, iterations * 9 / 10);
}

TEST(TraceFuzz, RandomMutationsOfSmallChunkTrace) { fuzz(testing::sample_events(80), 120, 0x5eed0001, 3000); }

TEST(TraceFuzz, RandomMutationsOfSingleChunkTrace) { fuzz(testing::sample_events(40), 1 << 16, 0x5eed0002, 1500); }

TEST(TraceFuzz, RandomMutationsOfHeaderOnlyTrace) { fuzz(testing::sample_events(1), 1 << 16, 0x5eed0003, 1000); }

}  // namespace
}  // namespace deja
