// MC146818 RTC tests: BCD/binary, 12h, UIP window, SET mode, status C, periodic/update/alarm IRQ8, state.
#include "devices/cmos_rtc.h"

#include <gtest/gtest.h>

#include "tests/devices/fakes.h"

namespace deja {
namespace {

using test::inb;
using test::outb;

constexpr unsigned kIrq = 8;
constexpr uint64_t kSecond = 1000000000;
// Tuesday 2023-11-14 22:13:20 UTC.
constexpr int64_t kStart = 1700000000;

struct RtcFixture : ::testing::Test {
  test::FakeClock clock;
  test::RecordingIrqSink irqs;
  CmosRtc rtc{clock, kStart, IrqLine(&irqs, kIrq)};

  uint8_t cmos(uint8_t index) {
    outb(rtc, 0, index);
    return inb(rtc, 1);
  }
  void set_cmos(uint8_t index, uint8_t value) {
    outb(rtc, 0, index);
    outb(rtc, 1, value);
  }
};

TEST_F(RtcFixture, BcdTimeAndDateFromStartTime) {
  EXPECT_EQ(cmos(0x0b), 0x02);  // 24 h, BCD
  EXPECT_EQ(cmos(0x00), 0x20);
  EXPECT_EQ(cmos(0x02), 0x13);
  EXPECT_EQ(cmos(0x04), 0x22);
  EXPECT_EQ(cmos(0x06), 0x03);  // Tuesday (Sunday = 1)
  EXPECT_EQ(cmos(0x07), 0x14);
  EXPECT_EQ(cmos(0x08), 0x11);
  EXPECT_EQ(cmos(0x09), 0x23);
  EXPECT_EQ(cmos(0x32), 0x20);
  EXPECT_EQ(cmos(0x0d), 0x80);
}

TEST_F(RtcFixture, TimeFollowsTheVirtualClock) {
  clock.now = 1 * kSecond + kSecond / 2;
  EXPECT_EQ(cmos(0x00), 0x21);
  clock.now = 101 * kSecond;  // 22:15:01
  EXPECT_EQ(cmos(0x00), 0x01);
  EXPECT_EQ(cmos(0x02), 0x15);
  clock.now = (86400 - 80000) * kSecond;  // crosses midnight into Wednesday the 15th
  EXPECT_EQ(cmos(0x04), 0x00);
  EXPECT_EQ(cmos(0x07), 0x15);
  EXPECT_EQ(cmos(0x06), 0x04);
}

TEST_F(RtcFixture, BinaryAndTwelveHourModes) {
  set_cmos(0x0b, 0x06);  // binary, 24 h
  EXPECT_EQ(cmos(0x00), 20);
  EXPECT_EQ(cmos(0x04), 22);
  EXPECT_EQ(cmos(0x09), 23);
  set_cmos(0x0b, 0x00);  // BCD, 12 h: 10 PM
  EXPECT_EQ(cmos(0x04), 0x90);
  set_cmos(0x0b, 0x04);  // binary, 12 h
  EXPECT_EQ(cmos(0x04), 0x8a);
  clock.now = (86400 - 80000 + 3600 * 12 + 60) * kSecond;  // 12:xx the next day: 12 PM
  EXPECT_EQ(cmos(0x04), 0x8c);
  clock.now = (86400 - 80000 + 60) * kSecond;  // 00:xx: 12 AM
  EXPECT_EQ(cmos(0x04), 12);
}

TEST_F(RtcFixture, UipIsSetInTheLast244MicrosecondsBeforeEachUpdate) {
  clock.now = 5 * kSecond - CmosRtc::kUipWindowNs - 1;
  EXPECT_EQ(cmos(0x0a), 0x26);
  clock.now = 5 * kSecond - CmosRtc::kUipWindowNs;
  EXPECT_EQ(cmos(0x0a), 0xa6);
  EXPECT_EQ(cmos(0x00), 0x24);  // the registers still hold the old second
  clock.now = 5 * kSecond;
  EXPECT_EQ(cmos(0x0a), 0x26);
  EXPECT_EQ(cmos(0x00), 0x25);
  set_cmos(0x0a, 0xff);  // UIP is read-only
  clock.now = 6 * kSecond - 1;
  EXPECT_EQ(cmos(0x0a), 0xff);
  clock.now = 6 * kSecond;
  EXPECT_EQ(cmos(0x0a), 0x7f);
}

TEST_F(RtcFixture, SetModeHaltsUpdatesAndSetsTheTime) {
  set_cmos(0x0b, 0x82);
  clock.now = 3 * kSecond - 1000;
  EXPECT_EQ(cmos(0x0a) & 0x80, 0);  // no UIP while SET
  EXPECT_EQ(cmos(0x00), 0x20);      // frozen
  set_cmos(0x04, 0x05);
  set_cmos(0x02, 0x30);
  set_cmos(0x00, 0x00);
  set_cmos(0x07, 0x01);
  set_cmos(0x08, 0x03);
  set_cmos(0x09, 0x24);
  EXPECT_EQ(cmos(0x04), 0x05);
  clock.now = 3 * kSecond;
  set_cmos(0x0b, 0x02);
  EXPECT_EQ(cmos(0x04), 0x05);
  EXPECT_EQ(cmos(0x02), 0x30);
  EXPECT_EQ(cmos(0x00), 0x00);
  EXPECT_EQ(cmos(0x06), 0x06);  // 2024-03-01 was a Friday
  clock.now = 5 * kSecond + 1;
  EXPECT_EQ(cmos(0x00), 0x02);
  EXPECT_EQ(cmos(0x07), 0x01);
  EXPECT_EQ(cmos(0x08), 0x03);
  EXPECT_EQ(cmos(0x09), 0x24);
}

TEST_F(RtcFixture, WritingARunningClockRegisterMovesOnlyThatField) {
  set_cmos(0x02, 0x45);
  EXPECT_EQ(cmos(0x02), 0x45);
  EXPECT_EQ(cmos(0x04), 0x22);
  clock.now = 2 * kSecond;
  EXPECT_EQ(cmos(0x00), 0x22);
}

TEST_F(RtcFixture, UpdateInterruptAndStatusCClearOnRead) {
  set_cmos(0x0a, 0x20);  // periodic rate off, so PF stays clear
  set_cmos(0x0b, 0x12);  // UIE
  clock.now = kSecond / 2;
  EXPECT_EQ(cmos(0x0c), 0x00);
  ASSERT_TRUE(rtc.next_deadline_ns());
  EXPECT_EQ(*rtc.next_deadline_ns(), kSecond);
  rtc.advance(kSecond - 1);
  EXPECT_EQ(irqs.rising_edges[kIrq], 0u);
  rtc.advance(kSecond);
  EXPECT_EQ(irqs.rising_edges[kIrq], 1u);
  EXPECT_TRUE(irqs.levels[kIrq]);
  EXPECT_FALSE(rtc.next_deadline_ns());  // the line stays high until C is read
  clock.now = kSecond;
  EXPECT_EQ(cmos(0x0c), 0x90);  // IRQF + UF
  EXPECT_FALSE(irqs.levels[kIrq]);
  EXPECT_EQ(cmos(0x0c), 0x00);
  EXPECT_EQ(*rtc.next_deadline_ns(), 2 * kSecond);
}

TEST_F(RtcFixture, FlagsAreSetWithoutTheirInterruptEnable) {
  clock.now = 3 * kSecond;
  EXPECT_EQ(cmos(0x0c), 0x50);  // PF (1024 Hz) and UF, no IRQF
  EXPECT_EQ(irqs.rising_edges[kIrq], 0u);
  EXPECT_FALSE(rtc.next_deadline_ns());
}

TEST_F(RtcFixture, PeriodicInterruptRate) {
  set_cmos(0x0b, 0x42);  // PIE, 1024 Hz from register A's default rate 6
  ASSERT_TRUE(rtc.next_deadline_ns());
  EXPECT_EQ(*rtc.next_deadline_ns(), 976563u);  // ceil(32 / 32768 s)
  rtc.advance(976562);
  EXPECT_EQ(irqs.rising_edges[kIrq], 0u);
  rtc.advance(976563);
  EXPECT_EQ(irqs.rising_edges[kIrq], 1u);
  clock.now = 976563;
  EXPECT_EQ(cmos(0x0c), 0xc0);
  EXPECT_EQ(*rtc.next_deadline_ns(), 1953125u);

  set_cmos(0x0a, 0x2f);  // rate 15: 2 Hz
  EXPECT_EQ(*rtc.next_deadline_ns(), kSecond / 2);
  set_cmos(0x0a, 0x23);  // rate 3: 8192 Hz, 122.0703125 us
  EXPECT_EQ(*rtc.next_deadline_ns(), 1098633u);  // cycle 36 = ceil(36 / 32768 s)
  set_cmos(0x0a, 0x20);  // rate 0: off
  EXPECT_FALSE(rtc.next_deadline_ns());
}

TEST_F(RtcFixture, AlarmInterrupt) {
  set_cmos(0x0a, 0x20);  // periodic rate off, so PF stays clear
  set_cmos(0x01, 0x23);  // 22:13:23
  set_cmos(0x03, 0x13);
  set_cmos(0x05, 0xc0);  // any hour
  set_cmos(0x0b, 0x22);  // AIE
  rtc.advance(2 * kSecond);
  EXPECT_EQ(irqs.rising_edges[kIrq], 0u);
  rtc.advance(3 * kSecond);
  EXPECT_EQ(irqs.rising_edges[kIrq], 1u);
  clock.now = 3 * kSecond;
  EXPECT_EQ(cmos(0x0c), 0xb0);  // IRQF + AF + UF
}

TEST_F(RtcFixture, IndexRegisterKeepsNmiMaskAndCmosStores) {
  outb(rtc, 0, 0x80 | 0x40);
  EXPECT_TRUE(rtc.nmi_masked());
  outb(rtc, 1, 0x5a);
  outb(rtc, 0, 0x40);
  EXPECT_FALSE(rtc.nmi_masked());
  EXPECT_EQ(inb(rtc, 1), 0x5a);
  EXPECT_EQ(inb(rtc, 0), 0xff);
}

TEST_F(RtcFixture, MemorySizeBytesAsQemuWritesThem) {
  rtc.set_memory_size(8 << 20);
  EXPECT_EQ(cmos(0x15) | cmos(0x16) << 8, 640);
  EXPECT_EQ(cmos(0x17) | cmos(0x18) << 8, 7 * 1024);
  EXPECT_EQ(cmos(0x30) | cmos(0x31) << 8, 7 * 1024);
  EXPECT_EQ(cmos(0x34) | cmos(0x35) << 8, 0);
  rtc.set_memory_size(256ull << 20);
  EXPECT_EQ(cmos(0x17) | cmos(0x18) << 8, 0xffff);
  EXPECT_EQ(cmos(0x34) | cmos(0x35) << 8, (256 - 16) * 16);
  rtc.set_memory_size(6ull << 30);
  EXPECT_EQ(cmos(0x5b) | cmos(0x5c) << 8 | cmos(0x5d) << 16, (2ll << 30) / 65536);
}

TEST_F(RtcFixture, SaveRestoreRoundTripAndRejection) {
  set_cmos(0x0b, 0x86);
  set_cmos(0x04, 7);
  set_cmos(0x0b, 0x46);
  set_cmos(0x40, 0x77);
  outb(rtc, 0, 0x84);
  clock.now = 12345678;
  rtc.advance(clock.now);
  std::vector<uint8_t> state = rtc.save();

  test::FakeClock other_clock;
  other_clock.now = clock.now;
  CmosRtc copy(other_clock, 0, IrqLine(&irqs, kIrq));
  ASSERT_TRUE(copy.restore(state));
  EXPECT_EQ(copy.save(), state);
  EXPECT_TRUE(copy.nmi_masked());
  EXPECT_EQ(copy.next_deadline_ns(), rtc.next_deadline_ns());
  for (uint8_t index : {0x00, 0x04, 0x07, 0x0b, 0x40}) {
    outb(copy, 0, index);
    EXPECT_EQ(inb(copy, 1), cmos(index)) << "register " << int(index);
  }

  EXPECT_FALSE(copy.restore(std::span<const uint8_t>(state).first(20)));
  std::vector<uint8_t> bad_c = state;
  bad_c[5 + 8 + 8 + 128 + 1 + 1 + 1 + 1] = 0x01;  // register C with a reserved bit
  auto result = copy.restore(bad_c);
  ASSERT_FALSE(result);
  EXPECT_NE(result.error().message.find("register C"), std::string::npos) << result.error().message;
}

TEST_F(RtcFixture, TwelveHourValuesSetInSetModeReadBackIn24Hours) {
  set_cmos(0x0b, 0x80);  // SET, BCD, 12 h
  set_cmos(0x04, 0x91);  // 11 PM
  set_cmos(0x0b, 0x00);
  set_cmos(0x0b, 0x02);  // 24 h view
  EXPECT_EQ(cmos(0x04), 0x23);
  set_cmos(0x0b, 0x80);
  set_cmos(0x04, 0x12);
  set_cmos(0x0b, 0x02);  // clearing SET together with 24 h parses the hour in 24 h format: noon
  EXPECT_EQ(cmos(0x04), 0x12);
  set_cmos(0x0b, 0x80);
  set_cmos(0x0b, 0x00);
  EXPECT_EQ(cmos(0x04), 0x92);  // noon in 12 h format is 12 PM
}

}  // namespace
}  // namespace deja
