// I/O APIC tests (82093AA datasheet): registers, edge and level delivery, Remote IRR and EOI, and the path into the local APIC.
#include "devices/ioapic.h"

#include <gtest/gtest.h>

#include "devices/lapic.h"
#include "tests/devices/fakes.h"

namespace deja {
namespace {

struct RecordingBus : ApicBus {
  std::vector<ApicMessage> messages;
  bool accept = true;
  bool deliver(const ApicMessage& m) override {
    messages.push_back(m);
    return accept;
  }
};

struct IoApicFixture : ::testing::Test {
  RecordingBus bus;
  IoApic ioapic{bus, 1};

  void select(uint8_t index) {
    uint8_t b[4] = {index, 0, 0, 0};
    ioapic.write(0x00, b);
  }
  uint32_t reg(uint8_t index) {
    select(index);
    uint8_t b[4];
    ioapic.read(0x10, b);
    return uint32_t(load_le(b));
  }
  void set_reg(uint8_t index, uint32_t value) {
    select(index);
    uint8_t b[4];
    store_le(b, value);
    ioapic.write(0x10, b);
  }
  void program(unsigned pin, uint64_t entry) {
    set_reg(uint8_t(0x11 + 2 * pin), uint32_t(entry >> 32));
    set_reg(uint8_t(0x10 + 2 * pin), uint32_t(entry));
  }
  uint64_t entry(unsigned pin) { return (uint64_t(reg(uint8_t(0x11 + 2 * pin))) << 32) | reg(uint8_t(0x10 + 2 * pin)); }
};

constexpr uint64_t kLevel = 1ull << 15, kMasked = 1ull << 16, kRemoteIrr = 1ull << 14;

TEST_F(IoApicFixture, IdentificationRegisters) {
  EXPECT_EQ(reg(0x00), 1u << 24);
  EXPECT_EQ(reg(0x01), 0x00170011u);  // version 0x11, maximum redirection entry 23
  EXPECT_EQ(reg(0x02), 1u << 24);     // arbitration ID follows the ID
  set_reg(0x00, 0xff000000);
  EXPECT_EQ(reg(0x00), 0x0f000000u);  // a 4-bit ID
  EXPECT_EQ(reg(0x02), 0x0f000000u);
  set_reg(0x01, 0);
  EXPECT_EQ(reg(0x01), 0x00170011u);  // read-only
  EXPECT_EQ(reg(0x03), 0u);           // reserved
  select(0x12);
  uint8_t b[4];
  ioapic.read(0x00, b);
  EXPECT_EQ(load_le(b), 0x12u);  // IOREGSEL reads back
}

TEST_F(IoApicFixture, RedirectionEntriesResetMaskedAndKeepReadOnlyBits) {
  for (unsigned pin = 0; pin < IoApic::kPins; ++pin) EXPECT_EQ(entry(pin), kMasked) << pin;
  program(5, 0xffffffff'ffffffffull);
  EXPECT_EQ(entry(5), 0xff000000'0001afffull);  // delivery status and Remote IRR stay 0, reserved bits 0
  EXPECT_EQ(reg(0x10 + 2 * 24), 0u);            // past the last entry: reserved
}

TEST_F(IoApicFixture, EdgeTriggeredPinsDeliverOnRisingEdgesWhileUnmasked) {
  program(2, (0x03ull << 56) | (1ull << 11) | (1ull << 8) | 0x30);  // logical dest 3, lowest priority
  ioapic.set_irq(2, true);
  ASSERT_EQ(bus.messages.size(), 1u);
  const ApicMessage& m = bus.messages[0];
  EXPECT_EQ(m.vector, 0x30);
  EXPECT_EQ(m.delivery_mode, apic_delivery::kLowestPriority);
  EXPECT_TRUE(m.logical);
  EXPECT_EQ(m.destination, 3u);
  EXPECT_FALSE(m.level);
  ioapic.set_irq(2, true);  // no new edge
  EXPECT_EQ(bus.messages.size(), 1u);
  ioapic.set_irq(2, false);
  ioapic.set_irq(2, true);
  EXPECT_EQ(bus.messages.size(), 2u);
  EXPECT_EQ(entry(2) & kRemoteIrr, 0u);
  // A masked edge is lost, and unmasking does not bring it back.
  program(2, kMasked | 0x30);
  ioapic.set_irq(2, false);
  ioapic.set_irq(2, true);
  program(2, 0x30);
  EXPECT_EQ(bus.messages.size(), 2u);
  ioapic.set_irq(30, true);  // no such pin
  EXPECT_EQ(bus.messages.size(), 2u);
}

TEST_F(IoApicFixture, LevelTriggeredRemoteIrrAndEoi) {
  program(10, kLevel | 0x51);
  ioapic.set_irq(10, true);
  ASSERT_EQ(bus.messages.size(), 1u);
  EXPECT_TRUE(bus.messages[0].level);
  EXPECT_TRUE(entry(10) & kRemoteIrr);
  ioapic.set_irq(10, true);  // Remote IRR holds further deliveries
  EXPECT_EQ(bus.messages.size(), 1u);
  ioapic.end_of_interrupt(0x52);  // another vector
  EXPECT_TRUE(entry(10) & kRemoteIrr);
  ioapic.end_of_interrupt(0x51);  // still asserted: delivered again
  EXPECT_EQ(bus.messages.size(), 2u);
  EXPECT_TRUE(entry(10) & kRemoteIrr);
  ioapic.set_irq(10, false);
  ioapic.end_of_interrupt(0x51);
  EXPECT_EQ(bus.messages.size(), 2u);
  EXPECT_FALSE(entry(10) & kRemoteIrr);
  // Unmasking an asserted level-triggered pin delivers it.
  program(11, kLevel | kMasked | 0x61);
  ioapic.set_irq(11, true);
  EXPECT_EQ(bus.messages.size(), 2u);
  program(11, kLevel | 0x61);
  EXPECT_EQ(bus.messages.size(), 3u);
  EXPECT_TRUE(entry(11) & kRemoteIrr);
  // Rewriting the entry as edge-triggered clears Remote IRR (Linux's EOI for this chip).
  program(11, kMasked | 0x61);
  EXPECT_FALSE(entry(11) & kRemoteIrr);
  program(11, kLevel | 0x61);
  EXPECT_EQ(bus.messages.size(), 4u);
  // A message nobody accepts sets no Remote IRR, so the next event retries it.
  bus.accept = false;
  program(12, kLevel | 0x71);
  ioapic.set_irq(12, true);
  EXPECT_FALSE(entry(12) & kRemoteIrr);
  bus.accept = true;
  ioapic.set_irq(12, true);
  EXPECT_TRUE(entry(12) & kRemoteIrr);
}

TEST_F(IoApicFixture, SaveRestoreRoundTripAndRejection) {
  program(3, kLevel | 0x41);
  ioapic.set_irq(3, true);
  select(0x16);
  auto state = ioapic.save();
  RecordingBus other_bus;
  IoApic copy(other_bus, 0);
  ASSERT_TRUE(copy.restore(state));
  EXPECT_EQ(copy.save(), state);
  EXPECT_TRUE(copy.entry(3) & kRemoteIrr);
  copy.end_of_interrupt(0x41);
  EXPECT_EQ(other_bus.messages.size(), 1u);  // the restored line level is still asserted
  EXPECT_FALSE(copy.restore(std::span<const uint8_t>(state).first(state.size() - 2)));
  auto bad = state;
  bad[5] = 0x20;  // ID wider than 4 bits
  EXPECT_FALSE(copy.restore(bad));
}

// The pieces together: a level-triggered line through the I/O APIC into the local APIC and back.
TEST(IoApicWithLocalApic, LevelInterruptRoundTrip) {
  test::FakeClock clock;
  struct NoPic : InterruptController {
    bool interrupt_pending() override { return false; }
    uint8_t acknowledge() override { return 0x27; }
  } pic;
  LocalApic lapic(clock, LocalApicConfig{}, pic);
  IoApic ioapic(lapic, 1);
  lapic.set_eoi_listener(&ioapic);
  uint8_t svr[4] = {0xff, 0x01, 0, 0};
  lapic.write(0xf0, svr);
  auto set_reg = [&](uint8_t index, uint32_t value) {
    uint8_t sel[4] = {index, 0, 0, 0};
    ioapic.write(0, sel);
    uint8_t b[4];
    store_le(b, value);
    ioapic.write(0x10, b);
  };
  set_reg(0x11 + 2 * 4, 0);                      // destination APIC 0
  set_reg(0x10 + 2 * 4, uint32_t(kLevel | 0x64));
  ioapic.set_irq(4, true);
  ASSERT_TRUE(lapic.interrupt_pending());
  EXPECT_TRUE(lapic.tmr(0x64));
  EXPECT_EQ(lapic.acknowledge(), 0x64);
  uint8_t zero[4] = {};
  lapic.write(0xb0, zero);  // EOI while the line is still high: it comes back
  EXPECT_TRUE(lapic.irr(0x64));
  EXPECT_EQ(lapic.acknowledge(), 0x64);
  ioapic.set_irq(4, false);
  lapic.write(0xb0, zero);
  EXPECT_FALSE(lapic.interrupt_pending());
  EXPECT_FALSE(ioapic.entry(4) & kRemoteIrr);
  // Edge-triggered, physical destination 1: not this APIC.
  set_reg(0x11 + 2 * 5, 1u << 24);
  set_reg(0x10 + 2 * 5, 0x65);
  ioapic.set_irq(5, true);
  EXPECT_FALSE(lapic.interrupt_pending());
}

}  // namespace
}  // namespace deja
