// Packet framing and hex codecs of the gdb remote protocol.
#include <gtest/gtest.h>

#include "gdbstub/packet.h"

namespace deja::gdb {
namespace {

std::vector<Incoming> feed(PacketReader& r, std::string_view bytes) {
  std::vector<Incoming> out;
  r.feed(bytes, out);
  return out;
}

TEST(GdbPacket, FramesAndChecksums) {
  EXPECT_EQ(frame("OK"), "$OK#9a");
  EXPECT_EQ(frame(""), "$#00");
  // '$', '#', '}' and '*' are escaped with '}' and XOR 0x20.
  EXPECT_EQ(frame("a$b"), "$a}\x04" "b#44");
}

TEST(GdbPacket, ReadsPacketsAcksAndInterruptsInAnySplit) {
  PacketReader r;
  std::string stream = "+$g#67\x03-" + frame("qSupported:xmlRegisters=i386");
  std::vector<Incoming> all;
  for (char c : stream) r.feed(std::string_view(&c, 1), all);
  ASSERT_EQ(all.size(), 5u);
  EXPECT_EQ(all[0].kind, Incoming::Kind::kAck);
  EXPECT_EQ(all[1].kind, Incoming::Kind::kPacket);
  EXPECT_EQ(all[1].payload, "g");
  EXPECT_EQ(all[2].kind, Incoming::Kind::kInterrupt);
  EXPECT_EQ(all[3].kind, Incoming::Kind::kNack);
  EXPECT_EQ(all[4].payload, "qSupported:xmlRegisters=i386");
}

TEST(GdbPacket, BadChecksumAndOversizedPacketsAreReported) {
  PacketReader r(8);
  auto bad = feed(r, "$g#00");
  ASSERT_EQ(bad.size(), 1u);
  EXPECT_EQ(bad[0].kind, Incoming::Kind::kBadChecksum);
  auto nonhex = feed(r, "$g#zz");
  EXPECT_EQ(nonhex[0].kind, Incoming::Kind::kBadChecksum);
  std::string body(20, 'm');
  auto big = feed(r, frame(body));
  ASSERT_EQ(big.size(), 1u);
  EXPECT_EQ(big[0].kind, Incoming::Kind::kTooLong);
  // The reader recovers for the next packet.
  auto next = feed(r, "garbage$g#67");
  ASSERT_EQ(next.size(), 1u);
  EXPECT_EQ(next[0].payload, "g");
}

TEST(GdbPacket, HexCodecsRefuseMalformedInput) {
  EXPECT_EQ(parse_hex_u64("1f"), 0x1fu);
  EXPECT_EQ(parse_hex_u64("ffffffffffffffff"), UINT64_MAX);
  EXPECT_FALSE(parse_hex_u64("1ffffffffffffffff"));
  EXPECT_FALSE(parse_hex_u64(""));
  EXPECT_FALSE(parse_hex_u64("12g"));
  EXPECT_EQ(hex_decode("00ff"), (std::vector<uint8_t>{0, 0xff}));
  EXPECT_FALSE(hex_decode("0"));
  EXPECT_FALSE(hex_decode("zz"));
  EXPECT_EQ(hex_le(0x1234, 4), "34120000");
  auto range = parse_addr_length("1000,20", 0x100);
  ASSERT_TRUE(range);
  EXPECT_EQ(range->first, 0x1000u);
  EXPECT_EQ(range->second, 0x20u);
  EXPECT_FALSE(parse_addr_length("1000,200", 0x100));
  EXPECT_FALSE(parse_addr_length("1000", 0x100));
  EXPECT_EQ(split("a;b;;c", ';').size(), 4u);
}

}  // namespace
}  // namespace deja::gdb
