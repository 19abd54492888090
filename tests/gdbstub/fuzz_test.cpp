// Deterministic mutation fuzzing of the packet reader and the server: random, mutated and oversized packets.
// Runs in every CI build and under ASan/UBSan (-DDEJA_SANITIZE=ON); a failure prints the seed and iteration.
#include <random>

#include <gtest/gtest.h>

#include "fake_target.h"
#include "gdbstub/server.h"

namespace deja::gdb {
namespace {

const char* const kSeeds[] = {
    "g", "p10", "m100000,40", "M10,1:00", "Z0,100010,1", "z2,2000,8", "Z4,3000,4;X1,a", "vCont;c", "vCont;s:1;c",
    "bc", "bs", "?", "qSupported:multiprocess+;swbreak+", "qXfer:features:read:target.xml:0,ffb", "qRcmd,7768656e",
    "qAttached", "Hg0", "Hc-1", "T1", "vMustReplyEmpty", "QStartNoAckMode", "D", "c", "s", "qfThreadInfo",
};

std::string mutate(std::string s, std::mt19937_64& rng) {
  const int rounds = 1 + int(rng() % 4);
  for (int i = 0; i < rounds; ++i) {
    switch (rng() % 7) {
      case 0: if (!s.empty()) s[rng() % s.size()] = char(rng()); break;
      case 1: s.insert(s.begin() + long(rng() % (s.size() + 1)), char("0123456789abcdef,:;$#}*\x03"[rng() % 25])); break;
      case 2: if (!s.empty()) s.erase(s.begin() + long(rng() % s.size())); break;
      case 3: s.resize(rng() % (s.size() + 1)); break;
      case 4: s += std::string(rng() % 64, "f0,"[rng() % 3]); break;
      case 5: s = s.substr(0, rng() % (s.size() + 1)) + kSeeds[rng() % std::size(kSeeds)]; break;
      case 6: s += std::string(rng() % 20000, 'f'); break;
    }
  }
  return s;
}

TEST(GdbFuzz, ServerAnswersEveryMutatedPacket) {
  const uint64_t seed = 0x6db;
  std::mt19937_64 rng(seed);
  for (int iteration = 0; iteration < 20000; ++iteration) {
    FakeTarget target;
    Server server(target);
    std::string packet = mutate(kSeeds[rng() % std::size(kSeeds)], rng);
    SCOPED_TRACE(::testing::Message() << "seed " << seed << " iteration " << iteration);
    auto reply = server.handle(packet, [] { return false; });
    if (reply) {
      // Framed replies stay well-formed and bounded.
      std::string framed = frame(*reply);
      ASSERT_LE(reply->size(), 2 * kMaxPacket);
      PacketReader reader(4 * kMaxPacket);
      std::vector<Incoming> back;
      reader.feed(framed, back);
      ASSERT_EQ(back.size(), 1u);
      ASSERT_EQ(back[0].kind, Incoming::Kind::kPacket);
    }
  }
}

TEST(GdbFuzz, ReaderSurvivesArbitraryByteStreams) {
  const uint64_t seed = 0x5eed;
  std::mt19937_64 rng(seed);
  PacketReader reader;
  std::vector<Incoming> out;
  for (int iteration = 0; iteration < 2000; ++iteration) {
    std::string bytes;
    if (rng() % 2) {
      bytes = frame(mutate(kSeeds[rng() % std::size(kSeeds)], rng));
      if (rng() % 3 == 0) bytes = mutate(bytes, rng);
    } else {
      bytes.resize(rng() % 512);
      for (char& c : bytes) c = char(rng());
    }
    size_t at = 0;
    while (at < bytes.size()) {
      size_t n = 1 + rng() % 64;
      reader.feed(std::string_view(bytes).substr(at, n), out);
      at += n;
    }
    for (const auto& item : out) ASSERT_LE(item.payload.size(), kMaxPacket);
    out.clear();
  }
  // Still in sync afterwards.
  reader.feed("#00$g#67", out);
  ASSERT_FALSE(out.empty());
  EXPECT_EQ(out.back().payload, "g");
}

}  // namespace
}  // namespace deja::gdb
