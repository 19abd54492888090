// 8254 PIT and port 0x61 tests, as the datasheet times them: modes 0-5, next-CLK loading, latch, read-back, gates, BCD, IRQ0, Linux's uses.
#include "devices/pit8254.h"

#include <gtest/gtest.h>

#include "tests/devices/fakes.h"

namespace deja {
namespace {

using test::inb;
using test::outb;

struct PitFixture : ::testing::Test {
  test::FakeClock clock;
  test::RecordingIrqSink irqs;
  Pit8254 pit{clock, IrqLine(&irqs, 0)};
  SystemControlPortB port61{pit};

  void at_tick(uint64_t tick) { clock.now = Pit8254::ns_of_tick(tick); }
  void control(unsigned channel, uint8_t mode, bool bcd = false) {
    outb(pit, 3, uint8_t((channel << 6) | 0x30 | (mode << 1) | (bcd ? 1 : 0)));  // lohi
  }
  void count(unsigned channel, uint16_t value) {
    outb(pit, channel, uint8_t(value));
    outb(pit, channel, uint8_t(value >> 8));
  }
  void program(unsigned channel, uint8_t mode, uint16_t value) {
    control(channel, mode);
    count(channel, value);
  }
  uint16_t read_count(unsigned channel) {
    uint16_t lo = inb(pit, channel);
    return uint16_t(lo | (inb(pit, channel) << 8));
  }
  uint8_t status(unsigned channel) {
    outb(pit, 3, uint8_t(0xe0 | (2 << channel)));  // read-back, status only
    return inb(pit, channel);
  }
  bool out2() { return inb(port61, 0) & 0x20; }
  unsigned irq0() const { return irqs.rising_edges[0]; }
  void advance_to(uint64_t tick) { pit.advance(Pit8254::ns_of_tick(tick)); }
};

TEST(Pit8254Clock, TicksAreExactIntegerFractionsOfNanoseconds) {
  EXPECT_EQ(Pit8254::ticks_at(1000000000), 1193182u);
  EXPECT_EQ(Pit8254::ticks_at(3600ull * 1000000000), 3600ull * 1193182);  // no drift after an hour
  EXPECT_EQ(Pit8254::ticks_at(838), 0u);
  EXPECT_EQ(Pit8254::ticks_at(839), 1u);  // 1 tick = 838.095 ns
  for (uint64_t tick : {1ull, 1193ull, 65536ull, 123456789ull}) {
    uint64_t ns = Pit8254::ns_of_tick(tick);
    EXPECT_EQ(Pit8254::ticks_at(ns), tick);
    EXPECT_EQ(Pit8254::ticks_at(ns - 1), tick - 1);
  }
}

TEST_F(PitFixture, ControlWordSetsOutAndARiseIsAnIrq0Edge) {
  EXPECT_EQ(status(0) & 0x80, 0);  // power-up: mode 0, OUT low
  control(0, 2);
  EXPECT_EQ(status(0), 0xf4);  // OUT high, NULL COUNT, lohi, mode 2
  EXPECT_EQ(irq0(), 1u);       // OUT went low -> high
  control(0, 0);
  EXPECT_EQ(status(0), 0x70);  // OUT low, NULL COUNT, lohi, mode 0
  EXPECT_EQ(irq0(), 1u);
  control(0, 4);  // Linux's oneshot set-up, 0x38
  EXPECT_EQ(status(0), 0xf8);
  EXPECT_EQ(irq0(), 2u);
  EXPECT_FALSE(pit.next_deadline_ns());  // nothing counts until a count is written
  outb(pit, 3, 0x3c);  // mode 6 is mode 2; the status byte reports the bits as written
  EXPECT_EQ(status(0), 0xfc);
}

TEST_F(PitFixture, Mode2LoadsOnTheNextClkAndRaisesIrq0EveryPeriod) {
  program(0, 2, 1000);
  unsigned base = irq0();
  EXPECT_EQ(status(0) & 0x40, 0x40);  // NULL COUNT until the next CLK
  at_tick(1);
  EXPECT_EQ(status(0) & 0x40, 0);
  EXPECT_EQ(read_count(0), 1000);
  at_tick(2);
  EXPECT_EQ(read_count(0), 999);
  EXPECT_EQ(*pit.next_deadline_ns(), Pit8254::ns_of_tick(1001));
  advance_to(1000);
  EXPECT_EQ(irq0(), base);
  advance_to(1001);
  EXPECT_EQ(irq0(), base + 1);
  EXPECT_FALSE(irqs.levels[0]);  // a pulse
  EXPECT_EQ(*pit.next_deadline_ns(), Pit8254::ns_of_tick(2001));
  advance_to(10001);  // nine periods at once: one pulse
  EXPECT_EQ(irq0(), base + 2);
  EXPECT_EQ(*pit.next_deadline_ns(), Pit8254::ns_of_tick(11001));
  // (Register writes, such as the read-back command, deliver the edges up to their tick first.)
  at_tick(11000);
  EXPECT_EQ(read_count(0), 1);
  EXPECT_EQ(status(0) & 0x80, 0);  // OUT low for the CLK at count 1
  at_tick(11001);
  EXPECT_EQ(read_count(0), 1000);  // reloaded
  EXPECT_EQ(status(0) & 0x80, 0x80);
  EXPECT_EQ(irq0(), base + 3);
}

TEST_F(PitFixture, Mode2NewCountTakesEffectAtTheEndOfThePeriod) {
  program(0, 2, 1000);
  at_tick(301);  // 300 counted: count 700
  count(0, 100);
  EXPECT_EQ(read_count(0), 700);  // the current period is not disturbed
  EXPECT_EQ(status(0) & 0x40, 0x40);  // NULL COUNT until the new count is loaded
  EXPECT_EQ(*pit.next_deadline_ns(), Pit8254::ns_of_tick(1001));
  at_tick(1000);
  EXPECT_EQ(read_count(0), 1);
  at_tick(1001);
  EXPECT_EQ(read_count(0), 100);
  advance_to(1001);
  EXPECT_EQ(*pit.next_deadline_ns(), Pit8254::ns_of_tick(1101));
  EXPECT_EQ(status(0) & 0x40, 0);
  at_tick(1050);
  EXPECT_EQ(read_count(0), 51);
  // Two writes in one period: the last one wins.
  at_tick(1110);
  count(0, 500);
  count(0, 50);
  at_tick(1201);
  EXPECT_EQ(read_count(0), 50);
}

TEST_F(PitFixture, Mode3EvenCountSquareWave) {
  outb(port61, 0, 0x01);  // gate 2 high
  program(2, 3, 100);
  at_tick(1);
  EXPECT_TRUE(out2());
  EXPECT_EQ(read_count(2), 100);
  at_tick(11);
  EXPECT_EQ(read_count(2), 80);  // decrements by two
  at_tick(50);
  EXPECT_TRUE(out2());
  EXPECT_EQ(read_count(2), 2);
  at_tick(51);
  EXPECT_FALSE(out2());  // second half: 50 CLKs low
  EXPECT_EQ(read_count(2), 100);
  at_tick(100);
  EXPECT_FALSE(out2());
  at_tick(101);
  EXPECT_TRUE(out2());
}

TEST_F(PitFixture, Mode3OddCountIsHighOneClkLonger) {
  outb(port61, 0, 0x01);
  program(2, 3, 5);
  // High for 3 CLKs reading 4, 2, 0; low for 2 reading 4, 2; then again.
  const bool outs[] = {true, true, true, false, false, true, true, true, false, false};
  const uint16_t counts[] = {4, 2, 0, 4, 2, 4, 2, 0, 4, 2};
  for (int i = 0; i < 10; ++i) {
    at_tick(1 + i);
    EXPECT_EQ(out2(), outs[i]) << "CLK " << i;
    EXPECT_EQ(read_count(2), counts[i]) << "CLK " << i;
  }
}

TEST_F(PitFixture, Mode3OnChannel0PulsesOncePerPeriodAndReloadsAtTheHalfCycle) {
  program(0, 3, 100);
  unsigned base = irq0();
  advance_to(100);
  EXPECT_EQ(irq0(), base);
  advance_to(101);
  EXPECT_EQ(irq0(), base + 1);
  advance_to(150);
  EXPECT_EQ(irq0(), base + 1);
  advance_to(201);
  EXPECT_EQ(irq0(), base + 2);
  // A new count written in the high half is loaded at its end, and counts the low half first.
  at_tick(211);
  count(0, 40);
  at_tick(250);
  EXPECT_EQ(read_count(0), 2);  // the old high half ends
  EXPECT_EQ(*pit.next_deadline_ns(), Pit8254::ns_of_tick(271));  // 20 CLKs low, then high
  at_tick(251);
  EXPECT_EQ(status(0) & 0xc0, 0x00);  // OUT low, loaded
  EXPECT_EQ(read_count(0), 40);
  at_tick(271);
  EXPECT_EQ(status(0) & 0x80, 0x80);
}

TEST_F(PitFixture, Mode0OutRisesNPlusOneClksAfterTheWrite) {
  outb(port61, 0, 0x01);
  program(2, 0, 1000);
  EXPECT_FALSE(out2());
  at_tick(1000);
  EXPECT_FALSE(out2());
  EXPECT_EQ(read_count(2), 1);
  at_tick(1001);
  EXPECT_TRUE(out2());
  EXPECT_EQ(read_count(2), 0);
  at_tick(5001);
  EXPECT_TRUE(out2());  // stays high; the counter wraps on
  EXPECT_EQ(read_count(2), uint16_t(1000 - 5000));

  at_tick(6000);
  program(0, 0, 500);
  unsigned base = irq0();
  advance_to(6500);
  EXPECT_EQ(irq0(), base);
  advance_to(6501);
  EXPECT_EQ(irq0(), base + 1);
  EXPECT_FALSE(pit.next_deadline_ns());  // one-shot: no further edges
  advance_to(6000 + 70000);
  EXPECT_EQ(irq0(), base + 1);
}

TEST_F(PitFixture, Mode0FirstByteStopsCountingAndDrivesOutLow) {
  outb(port61, 0, 0x01);
  program(2, 0, 100);
  at_tick(200);
  EXPECT_TRUE(out2());
  outb(pit, 2, 0x50);  // low byte of a new count
  EXPECT_FALSE(out2());
  uint16_t held = read_count(2);
  at_tick(300);
  EXPECT_EQ(read_count(2), held);  // not counting
  outb(pit, 2, 0x00);              // high byte: 0x0050 loads on the next CLK
  at_tick(301);
  EXPECT_EQ(read_count(2), 0x50);
  at_tick(301 + 0x50);
  EXPECT_TRUE(out2());
}

TEST_F(PitFixture, Mode4StrobesOutLowNPlusOneClksAfterTheWrite) {
  outb(port61, 0, 0x01);
  program(2, 4, 10);
  at_tick(10);
  EXPECT_TRUE(out2());
  at_tick(11);
  EXPECT_FALSE(out2());  // count 0: OUT low for one CLK
  at_tick(12);
  EXPECT_TRUE(out2());
  at_tick(20);
  EXPECT_TRUE(out2());  // no second strobe
  EXPECT_EQ(read_count(2), uint16_t(10 - 19));
}

// Linux's PIT clockevent in oneshot mode: 0x38 once, then only the count, rewritten at every event.
TEST_F(PitFixture, LinuxOneshotClockeventReprogrammedAtEveryTick) {
  outb(pit, 3, 0x30);  // pit_shutdown: mode 0 ...
  outb(pit, 0, 0);
  outb(pit, 0, 0);     // ... with count 0 (65536)
  outb(pit, 3, 0x38);  // pit_set_oneshot: OUT high again
  unsigned base = irq0();
  EXPECT_FALSE(pit.next_deadline_ns());
  uint64_t tick = 100;
  for (int event = 0; event < 5; ++event) {
    at_tick(tick);
    uint16_t delta = uint16_t(1193 + 7 * event);
    count(0, delta);  // pit_next_event
    // The strobe is low at write + delta + 1; its end, one CLK later, is the rising edge.
    ASSERT_TRUE(pit.next_deadline_ns());
    EXPECT_EQ(*pit.next_deadline_ns(), Pit8254::ns_of_tick(tick + delta + 2)) << "event " << event;
    advance_to(tick + delta + 1);
    EXPECT_EQ(irq0(), base + event);
    advance_to(tick + delta + 2);
    EXPECT_EQ(irq0(), base + event + 1);
    EXPECT_FALSE(pit.next_deadline_ns());  // one-shot until the next write
    tick += delta + 50;
  }
  // A rewrite before the strobe moves it: the earlier count never strobes.
  at_tick(tick);
  count(0, 1000);
  at_tick(tick + 500);
  count(0, 1000);
  EXPECT_EQ(*pit.next_deadline_ns(), Pit8254::ns_of_tick(tick + 500 + 1002));
}

TEST_F(PitFixture, CounterLatchFreezesTheReadValueUntilReadOrReprogrammed) {
  program(0, 2, 1000);
  at_tick(301);
  outb(pit, 3, 0x00);  // latch channel 0
  at_tick(601);
  outb(pit, 3, 0x00);  // a second latch before the read is ignored
  EXPECT_EQ(read_count(0), 700);
  EXPECT_EQ(read_count(0), 400);  // the latch is released after both bytes
  outb(pit, 3, 0x00);
  control(0, 2);  // reprogramming drops the latch
  count(0, 1000);
  at_tick(611);
  EXPECT_EQ(read_count(0), 991);
}

TEST_F(PitFixture, ReadBackCommand) {
  at_tick(10);
  program(0, 2, 1000);
  EXPECT_EQ(status(0), 0xf4);  // OUT high, NULL COUNT (no CLK since the write), lohi, mode 2
  at_tick(20);
  EXPECT_EQ(status(0), 0xb4);
  // Count and status of channels 0 and 2: status first, then the count.
  outb(port61, 0, 0x01);
  at_tick(30);
  outb(pit, 3, 0x90);  // channel 2: lobyte only, mode 0
  outb(pit, 2, 50);
  at_tick(41);
  outb(pit, 3, 0xca);  // latch count + status of channels 0 and 2
  at_tick(60);         // latched values do not move
  EXPECT_EQ(inb(pit, 0), 0xb4);
  EXPECT_EQ(read_count(0), 1000 - 30);
  EXPECT_EQ(inb(pit, 2), 0x10);  // OUT low, count loaded, lobyte, mode 0
  EXPECT_EQ(inb(pit, 2), 40);
  EXPECT_EQ(inb(pit, 2), 21);  // the latch is gone: 29 counted by tick 60
  // A status latch does not replace an unread one; a count-only read-back leaves status alone.
  outb(pit, 3, 0xe2);
  at_tick(70);
  outb(pit, 3, 0xd2);  // count of channel 0 only
  outb(pit, 3, 0xe2);
  EXPECT_EQ(inb(pit, 0), 0xb4);
  EXPECT_EQ(read_count(0), 1000 - 59);
}

TEST_F(PitFixture, Channel2GateInModes0And2) {
  program(2, 0, 1000);  // gate low after reset: loaded, but not counting
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
  at_tick(1031);
  EXPECT_EQ(read_count(2), 70);
  outb(port61, 0, 0x00);
  at_tick(1050);
  EXPECT_TRUE(out2());  // a low gate forces OUT high in mode 2
  EXPECT_EQ(read_count(2), 70);
  count(2, 40);           // with the gate low, the next rising gate loads it
  EXPECT_EQ(status(2) & 0x40, 0x40);
  outb(port61, 0, 0x01);  // a rising gate reloads in modes 2/3 on the next CLK
  at_tick(1061);
  EXPECT_EQ(read_count(2), 30);
}

TEST_F(PitFixture, Mode1OneShotTriggeredByGate) {
  program(2, 1, 100);
  EXPECT_TRUE(out2());
  EXPECT_EQ(status(2) & 0x40, 0x40);  // waits for a trigger
  at_tick(10);
  outb(port61, 0, 0x01);
  EXPECT_TRUE(out2());  // low from the next CLK
  at_tick(11);
  EXPECT_FALSE(out2());
  EXPECT_EQ(read_count(2), 100);
  at_tick(110);
  EXPECT_FALSE(out2());
  at_tick(111);
  EXPECT_TRUE(out2());
}

TEST_F(PitFixture, Mode1NewCountWaitsForTheNextTrigger) {
  program(2, 1, 100);
  outb(port61, 0, 0x01);  // trigger at tick 0
  at_tick(10);
  count(2, 800);  // while the one-shot runs
  at_tick(101);
  EXPECT_TRUE(out2());  // the running one-shot kept its count of 100
  outb(port61, 0, 0x00);
  outb(port61, 0, 0x01);  // retrigger at tick 101 with 800
  at_tick(901);
  EXPECT_FALSE(out2());
  at_tick(902);
  EXPECT_TRUE(out2());
}

TEST_F(PitFixture, Mode5HardwareTriggeredStrobe) {
  program(2, 5, 20);
  at_tick(50);
  EXPECT_TRUE(out2());  // nothing until a trigger
  outb(port61, 0, 0x01);
  at_tick(71);
  EXPECT_FALSE(out2());  // loaded at 51, count 0 at 71
  at_tick(72);
  EXPECT_TRUE(out2());
  at_tick(80);
  outb(port61, 0, 0x00);
  outb(port61, 0, 0x01);  // retrigger
  at_tick(101);
  EXPECT_FALSE(out2());
}

// Linux's quick_pit_calibrate: channel 2 mode 0 from 0xffff with the gate on, then ~25,000 reads of
// port 0x42 (LSB then MSB, no latch) while the MSB steps down; pit_calibrate_tsc waits for OUT.
TEST_F(PitFixture, LinuxTscCalibrationOnChannel2) {
  outb(port61, 0, uint8_t((inb(port61, 0) & ~0x02) | 0x01));
  outb(pit, 3, 0xb0);
  outb(pit, 2, 0xff);
  outb(pit, 2, 0xff);
  uint8_t last_msb = 0xff;
  uint64_t ns = Pit8254::ns_of_tick(1);  // Linux discards the reads before the next CLK loads the count
  for (int i = 0; i < 25000; ++i) {
    ns += 700;  // a read every 0.7 us of virtual time
    clock.now = ns;
    (void)inb(pit, 2);
    uint8_t msb = inb(pit, 2);
    EXPECT_LE(msb, last_msb);
    last_msb = msb;
  }
  EXPECT_EQ(last_msb, uint8_t((0xffff - (Pit8254::ticks_at(ns) - 1)) >> 8));  // loaded at tick 1
  EXPECT_FALSE(out2());
  at_tick(0x10000);
  EXPECT_TRUE(out2());  // 0xffff + 1 CLKs after the write
}

TEST_F(PitFixture, BcdCounting) {
  outb(port61, 0, 0x01);
  control(2, 0, true);
  count(2, 0x1000);  // 1000 decimal
  at_tick(1);
  EXPECT_EQ(read_count(2), 0x1000);
  at_tick(2);
  EXPECT_EQ(read_count(2), 0x0999);
  at_tick(1001);
  EXPECT_EQ(read_count(2), 0x0000);
  EXPECT_TRUE(out2());
  at_tick(1002);
  EXPECT_EQ(read_count(2), 0x9999);  // wraps in decimal
  control(2, 2, true);
  count(2, 0);  // 0 is 10000 in BCD
  at_tick(1003);
  EXPECT_EQ(read_count(2), 0x0000);
  at_tick(1004);
  EXPECT_EQ(read_count(2), 0x9999);
  EXPECT_EQ(status(2) & 0x01, 0x01);
}

TEST_F(PitFixture, Port61StoresLowBitsAndTogglesRefresh) {
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

TEST_F(PitFixture, LobyteAndHibyteAccessModes) {
  outb(pit, 3, 0x14);  // channel 0, lobyte, mode 2
  outb(pit, 0, 0x80);
  at_tick(1);
  EXPECT_EQ(inb(pit, 0), 0x80);
  outb(pit, 3, 0x24);  // channel 0, hibyte, mode 2
  outb(pit, 0, 0x02);
  at_tick(0x102);
  EXPECT_EQ(inb(pit, 0), 0x01);  // loaded at tick 2: count 0x200 - 0x100, its high byte
}

TEST_F(PitFixture, SaveRestoreRoundTripAndRejection) {
  program(0, 2, 1193);
  outb(port61, 0, 0x03);
  program(2, 3, 500);
  at_tick(700);
  count(0, 300);       // a pending count is state too
  outb(pit, 3, 0x00);  // and a pending latch
  pit.advance(clock.now);
  std::vector<uint8_t> state = pit.save();
  std::vector<uint8_t> port_state = port61.save();

  Pit8254 copy(clock, IrqLine(&irqs, 0));
  SystemControlPortB copy61(copy);
  ASSERT_TRUE(copy.restore(state));
  ASSERT_TRUE(copy61.restore(port_state));
  EXPECT_EQ(copy.save(), state);
  EXPECT_EQ(copy.next_deadline_ns(), pit.next_deadline_ns());
  for (uint64_t tick : {900ull, 1200ull, 1500ull}) {
    at_tick(tick);
    EXPECT_EQ(inb(copy, 0), inb(pit, 0));
    EXPECT_EQ(inb(copy, 0), inb(pit, 0));
    EXPECT_EQ(inb(copy, 2), inb(pit, 2));
    EXPECT_EQ(inb(copy61, 0), inb(port61, 0));
  }

  EXPECT_FALSE(copy.restore(std::span<const uint8_t>(state).first(state.size() - 3)));
  std::vector<uint8_t> bad_mode = state;
  bad_mode[5 + 8] = 7;  // channel 0 mode
  auto result = copy.restore(bad_mode);
  ASSERT_FALSE(result);
  EXPECT_NE(result.error().message.find("mode 7"), std::string::npos) << result.error().message;
  EXPECT_FALSE(copy61.restore(std::vector<uint8_t>{'P', '6', '1', 'B', 1, 0x30}));
}

}  // namespace
}  // namespace deja
