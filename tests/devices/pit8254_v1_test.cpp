// Device model 1's 8254 PIT (kept for old traces): the tests it had when it was the current PIT.
#include "devices/pit8254_v1.h"

#include <gtest/gtest.h>

#include "tests/devices/fakes.h"

namespace deja {
namespace {

using test::inb;
using test::outb;

struct PitV1Fixture : ::testing::Test {
  test::FakeClock clock;
  test::RecordingIrqSink irqs;
  Pit8254V1 pit{clock, IrqLine(&irqs, 0)};
  SystemControlPortB port61{pit};

  void at_tick(uint64_t tick) { clock.now = Pit8254::ns_of_tick(tick); }
  void program(unsigned channel, uint8_t mode, uint16_t count) {
    outb(pit, 3, uint8_t((channel << 6) | 0x30 | (mode << 1)));  // lohi, binary
    outb(pit, channel, uint8_t(count));
    outb(pit, channel, uint8_t(count >> 8));
  }
  uint16_t read_count(unsigned channel) {
    uint16_t lo = inb(pit, channel);
    return uint16_t(lo | (inb(pit, channel) << 8));
  }
  bool out2() { return inb(port61, 0) & 0x20; }
};

TEST_F(PitV1Fixture, Mode2RaisesIrq0EveryPeriod) {
  program(0, 2, 1193);
  ASSERT_TRUE(pit.next_deadline_ns());
  EXPECT_EQ(*pit.next_deadline_ns(), Pit8254::ns_of_tick(1193));
  pit.advance(Pit8254::ns_of_tick(1193) - 1);
  EXPECT_EQ(irqs.rising_edges[0], 0u);
  pit.advance(Pit8254::ns_of_tick(1193));
  EXPECT_EQ(irqs.rising_edges[0], 1u);
  EXPECT_FALSE(irqs.levels[0]);  // a pulse
  EXPECT_EQ(*pit.next_deadline_ns(), Pit8254::ns_of_tick(2 * 1193));
  // Ten periods at once coalesce into one pulse; the next deadline is the following period.
  pit.advance(Pit8254::ns_of_tick(12 * 1193));
  EXPECT_EQ(irqs.rising_edges[0], 2u);
  EXPECT_EQ(*pit.next_deadline_ns(), Pit8254::ns_of_tick(13 * 1193));
}

TEST_F(PitV1Fixture, Mode2CountsDownAndReloads) {
  program(0, 2, 1000);
  at_tick(1);
  EXPECT_EQ(read_count(0), 999);
  at_tick(999);
  EXPECT_EQ(read_count(0), 1);
  at_tick(1000);
  EXPECT_EQ(read_count(0), 1000);
  at_tick(1250);
  EXPECT_EQ(read_count(0), 750);
}

TEST_F(PitV1Fixture, Mode3SquareWaveOnChannel2) {
  outb(port61, 0, 0x01);  // gate 2 high
  program(2, 3, 100);
  at_tick(0);
  EXPECT_TRUE(out2());
  at_tick(49);
  EXPECT_TRUE(out2());
  at_tick(50);
  EXPECT_FALSE(out2());
  at_tick(99);
  EXPECT_FALSE(out2());
  at_tick(100);
  EXPECT_TRUE(out2());  // reloaded, next period
  at_tick(150);
  EXPECT_FALSE(out2());
  at_tick(10);
  EXPECT_EQ(read_count(2), 80);  // mode 3 counts down by two
}

TEST_F(PitV1Fixture, Mode3OnChannel0PulsesAtEachRisingEdge) {
  program(0, 3, 100);
  pit.advance(Pit8254::ns_of_tick(99));
  EXPECT_EQ(irqs.rising_edges[0], 0u);
  pit.advance(Pit8254::ns_of_tick(100));
  EXPECT_EQ(irqs.rising_edges[0], 1u);
  pit.advance(Pit8254::ns_of_tick(150));
  EXPECT_EQ(irqs.rising_edges[0], 1u);
  pit.advance(Pit8254::ns_of_tick(200));
  EXPECT_EQ(irqs.rising_edges[0], 2u);
}

TEST_F(PitV1Fixture, Mode0TerminalCountRaisesOutOnce) {
  outb(port61, 0, 0x01);
  program(2, 0, 1000);
  EXPECT_FALSE(out2());
  at_tick(999);
  EXPECT_FALSE(out2());
  EXPECT_EQ(read_count(2), 1);
  at_tick(1000);
  EXPECT_TRUE(out2());
  at_tick(5000);
  EXPECT_TRUE(out2());  // stays high; the counter wraps on
  EXPECT_EQ(read_count(2), uint16_t(1000 - 5000));

  program(0, 0, 500);
  pit.advance(Pit8254::ns_of_tick(5000 + 500));
  EXPECT_EQ(irqs.rising_edges[0], 1u);
  EXPECT_FALSE(pit.next_deadline_ns());  // one-shot: no further edges
  pit.advance(Pit8254::ns_of_tick(5000 + 70000));
  EXPECT_EQ(irqs.rising_edges[0], 1u);
}

TEST_F(PitV1Fixture, CounterLatchFreezesTheReadValue) {
  program(0, 2, 1000);
  at_tick(300);
  outb(pit, 3, 0x00);  // latch channel 0
  at_tick(600);
  EXPECT_EQ(read_count(0), 700);
  EXPECT_EQ(read_count(0), 400);  // the latch is released after both bytes
}

TEST_F(PitV1Fixture, ReadBackStatusAndCount) {
  at_tick(10);
  program(0, 2, 1000);
  outb(pit, 3, 0xe2);  // read-back status of channel 0
  EXPECT_EQ(inb(pit, 0), 0xf4);  // OUT high, NULL COUNT (no CLK since the write), lohi, mode 2
  at_tick(20);
  outb(pit, 3, 0xe2);
  EXPECT_EQ(inb(pit, 0), 0xb4);
  // Count and status of channels 0 and 2: status first, then the count.
  outb(port61, 0, 0x01);
  at_tick(30);
  outb(pit, 3, 0x90);  // channel 2: lobyte only, mode 0
  outb(pit, 2, 50);
  at_tick(40);
  outb(pit, 3, 0xca);  // latch count + status of channels 0 and 2
  EXPECT_EQ(inb(pit, 0), 0xb4);
  EXPECT_EQ(read_count(0), 1000 - 30);
  EXPECT_EQ(inb(pit, 2), 0x10);  // OUT low, count loaded, lobyte, mode 0
  EXPECT_EQ(inb(pit, 2), 40);
}

TEST_F(PitV1Fixture, Channel2GateStopsAndRestartsCounting) {
  program(2, 0, 1000);  // gate low after reset: no counting
  at_tick(500);
  EXPECT_EQ(read_count(2), 1000);
  outb(port61, 0, 0x01);
  at_tick(700);
  EXPECT_EQ(read_count(2), 800);
  outb(port61, 0, 0x00);  // mode 0: a low gate pauses
  at_tick(900);
  EXPECT_EQ(read_count(2), 800);
  outb(port61, 0, 0x01);
  at_tick(1000);
  EXPECT_EQ(read_count(2), 700);

  program(2, 2, 100);
  at_tick(1030);
  EXPECT_EQ(read_count(2), 70);
  outb(port61, 0, 0x00);
  at_tick(1050);
  EXPECT_TRUE(out2());  // a low gate forces OUT high in mode 2
  outb(port61, 0, 0x01);  // a rising gate reloads in modes 2/3
  at_tick(1060);
  EXPECT_EQ(read_count(2), 90);
}

TEST_F(PitV1Fixture, Mode1OneShotTriggeredByGate) {
  program(2, 1, 100);
  EXPECT_TRUE(out2());
  at_tick(10);
  outb(port61, 0, 0x01);
  EXPECT_FALSE(out2());
  at_tick(109);
  EXPECT_FALSE(out2());
  at_tick(110);
  EXPECT_TRUE(out2());
}

TEST_F(PitV1Fixture, Port61StoresLowBitsAndTogglesRefresh) {
  outb(port61, 0, 0xfe);
  EXPECT_EQ(inb(port61, 0) & 0x0f, 0x0e);
  EXPECT_FALSE(pit.gate(2));
  clock.now = 0;
  EXPECT_EQ(inb(port61, 0) & 0x10, 0);
  clock.now = SystemControlPortB::kRefreshHalfPeriodNs;
  EXPECT_EQ(inb(port61, 0) & 0x10, 0x10);
  clock.now = 2 * SystemControlPortB::kRefreshHalfPeriodNs;
  EXPECT_EQ(inb(port61, 0) & 0x10, 0);
}

TEST_F(PitV1Fixture, LobyteAndHibyteAccessModes) {
  outb(pit, 3, 0x14);  // channel 0, lobyte, mode 2
  outb(pit, 0, 0x80);
  EXPECT_EQ(inb(pit, 0), 0x80);
  outb(pit, 3, 0x24);  // channel 0, hibyte, mode 2
  outb(pit, 0, 0x02);
  at_tick(0x100);
  EXPECT_EQ(inb(pit, 0), 0x01);  // count 0x200 - 0x100
}

TEST_F(PitV1Fixture, SaveRestoreRoundTripAndRejection) {
  program(0, 2, 1193);
  outb(port61, 0, 0x03);
  program(2, 3, 500);
  at_tick(700);
  outb(pit, 3, 0x00);  // pending latch is state too
  pit.advance(clock.now);
  std::vector<uint8_t> state = pit.save();
  std::vector<uint8_t> port_state = port61.save();

  Pit8254V1 copy(clock, IrqLine(&irqs, 0));
  SystemControlPortB copy61(copy);
  ASSERT_TRUE(copy.restore(state));
  ASSERT_TRUE(copy61.restore(port_state));
  EXPECT_EQ(copy.save(), state);
  EXPECT_EQ(copy.next_deadline_ns(), pit.next_deadline_ns());
  at_tick(900);
  EXPECT_EQ(inb(copy, 0), inb(pit, 0));
  EXPECT_EQ(inb(copy, 0), inb(pit, 0));
  EXPECT_EQ(inb(copy, 2), inb(pit, 2));
  EXPECT_EQ(inb(copy61, 0), inb(port61, 0));

  EXPECT_FALSE(copy.restore(std::span<const uint8_t>(state).first(state.size() - 3)));
  std::vector<uint8_t> bad_mode = state;
  bad_mode[5 + 8] = 7;  // channel 0 mode
  auto result = copy.restore(bad_mode);
  ASSERT_FALSE(result);
  EXPECT_NE(result.error().message.find("mode 7"), std::string::npos) << result.error().message;
  EXPECT_FALSE(copy61.restore(std::vector<uint8_t>{'P', '6', '1', 'B', 1, 0x30}));
}

TEST_F(PitV1Fixture, Mode4StrobesOutLowForOneTick) {
  outb(port61, 0, 0x01);
  program(2, 4, 10);
  at_tick(9);
  EXPECT_TRUE(out2());
  at_tick(10);
  EXPECT_FALSE(out2());
  at_tick(11);
  EXPECT_TRUE(out2());
  program(0, 4, 10);  // on channel 0 the strobe's rising edge is IRQ0
  EXPECT_EQ(*pit.next_deadline_ns(), Pit8254::ns_of_tick(11 + 11));
}

TEST_F(PitV1Fixture, ControlWordResetsOutAndStopsUntilCountWritten) {
  program(0, 2, 100);
  outb(pit, 3, 0x30);  // channel 0 mode 0, no count yet
  EXPECT_FALSE(pit.next_deadline_ns());
  outb(pit, 3, 0xe2);
  EXPECT_EQ(inb(pit, 0), 0x70);  // OUT low, NULL COUNT, lohi, mode 0
}

TEST_F(PitV1Fixture, Mode1NewCountWaitsForTheNextTrigger) {
  program(2, 1, 100);
  outb(port61, 0, 0x01);  // trigger at tick 0
  at_tick(10);
  outb(pit, 2, 0x20);  // new count 0x0320 = 800 while the one-shot runs
  outb(pit, 2, 0x03);
  at_tick(100);
  EXPECT_TRUE(out2());  // the running one-shot kept its count of 100
  outb(port61, 0, 0x00);
  outb(port61, 0, 0x01);  // retrigger at tick 100 with 800
  at_tick(899);
  EXPECT_FALSE(out2());
  at_tick(900);
  EXPECT_TRUE(out2());
}

}  // namespace
}  // namespace deja
