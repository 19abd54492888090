// 8259A pair tests: Linux-style init, priority, masks, EOI kinds, cascade, spurious IRQs, poll, AEOI.
#include "devices/pic8259.h"

#include <gtest/gtest.h>

#include "tests/devices/fakes.h"

namespace deja {
namespace {

using test::inb;
using test::outb;

// As Linux's init_8259A(): vectors 0x30/0x38, slave on IR2, 8086 mode, optional auto-EOI.
void init_linux(PicPair& pic, bool auto_eoi = false) {
  Device& m = pic.master_ports();
  Device& s = pic.slave_ports();
  outb(m, 1, 0xff);
  outb(s, 1, 0xff);
  outb(m, 0, 0x11);  // ICW1: edge, cascade, ICW4 needed
  outb(m, 1, 0x30);  // ICW2
  outb(m, 1, 0x04);  // ICW3: slave on IR2
  outb(m, 1, auto_eoi ? 0x03 : 0x01);
  outb(s, 0, 0x11);
  outb(s, 1, 0x38);
  outb(s, 1, 0x02);  // slave identity 2
  outb(s, 1, 0x01);
  outb(m, 1, 0x00);
  outb(s, 1, 0x00);
}

uint8_t read_isr(Device& chip) {
  outb(chip, 0, 0x0b);  // OCW3: read ISR
  uint8_t isr = inb(chip, 0);
  outb(chip, 0, 0x0a);  // back to IRR
  return isr;
}

void pulse(PicPair& pic, unsigned line) {
  pic.set_irq(line, true);
  pic.set_irq(line, false);
}

TEST(Pic8259, InitSequenceProgramsVectorsAndMasks) {
  PicPair pic;
  init_linux(pic);
  EXPECT_EQ(inb(pic.master_ports(), 1), 0x00);
  outb(pic.master_ports(), 1, 0xa5);
  EXPECT_EQ(inb(pic.master_ports(), 1), 0xa5);
  outb(pic.master_ports(), 1, 0x00);
  EXPECT_FALSE(pic.interrupt_pending());
  pulse(pic, 1);
  EXPECT_TRUE(pic.interrupt_pending());
  EXPECT_EQ(pic.acknowledge(), 0x31);
  EXPECT_EQ(read_isr(pic.master_ports()), 0x02);
}

TEST(Pic8259, LowerIrqNumberWinsAndIsrBlocksLowerPriority) {
  PicPair pic;
  init_linux(pic);
  pulse(pic, 4);
  pulse(pic, 1);
  EXPECT_EQ(inb(pic.master_ports(), 0), 0x12);  // IRR
  EXPECT_EQ(pic.acknowledge(), 0x31);
  EXPECT_FALSE(pic.interrupt_pending());  // IRQ4 waits behind IRQ1 in service
  outb(pic.master_ports(), 0, 0x20);      // non-specific EOI
  EXPECT_TRUE(pic.interrupt_pending());
  EXPECT_EQ(pic.acknowledge(), 0x34);
}

TEST(Pic8259, HigherPriorityRequestNestsOverInService) {
  PicPair pic;
  init_linux(pic);
  pulse(pic, 4);
  EXPECT_EQ(pic.acknowledge(), 0x34);
  pulse(pic, 1);
  EXPECT_TRUE(pic.interrupt_pending());
  EXPECT_EQ(pic.acknowledge(), 0x31);
  EXPECT_EQ(read_isr(pic.master_ports()), 0x12);
}

TEST(Pic8259, MaskHoldsRequestUntilUnmasked) {
  PicPair pic;
  init_linux(pic);
  outb(pic.master_ports(), 1, 0x08);
  pulse(pic, 3);
  EXPECT_FALSE(pic.interrupt_pending());
  outb(pic.master_ports(), 1, 0x00);
  EXPECT_TRUE(pic.interrupt_pending());
  EXPECT_EQ(pic.acknowledge(), 0x33);
}

TEST(Pic8259, SpecificEoiClearsNamedLevelNonSpecificClearsHighest) {
  PicPair pic;
  init_linux(pic);
  pulse(pic, 3);
  EXPECT_EQ(pic.acknowledge(), 0x33);
  pulse(pic, 1);
  EXPECT_EQ(pic.acknowledge(), 0x31);
  EXPECT_EQ(read_isr(pic.master_ports()), 0x0a);
  outb(pic.master_ports(), 0, 0x63);  // specific EOI for IR3
  EXPECT_EQ(read_isr(pic.master_ports()), 0x02);
  // IR1 is still in service: a non-specific EOI clears it, the highest-priority ISR bit.
  outb(pic.master_ports(), 0, 0x20);
  EXPECT_EQ(read_isr(pic.master_ports()), 0x00);
  pulse(pic, 3);
  pulse(pic, 1);
  EXPECT_EQ(pic.acknowledge(), 0x31);
  EXPECT_FALSE(pic.interrupt_pending());
  outb(pic.master_ports(), 0, 0x61);  // specific EOI for IR1
  EXPECT_EQ(pic.acknowledge(), 0x33);
}

TEST(Pic8259, CascadeDeliversSlaveVectorAndSetsBothIsrs) {
  PicPair pic;
  init_linux(pic);
  pulse(pic, 10);
  EXPECT_TRUE(pic.interrupt_pending());
  EXPECT_EQ(pic.acknowledge(), 0x3a);
  EXPECT_EQ(read_isr(pic.master_ports()), 0x04);
  EXPECT_EQ(read_isr(pic.slave_ports()), 0x04);
  // A second slave IRQ of lower priority waits for both EOIs (slave first, as Linux does).
  pulse(pic, 12);
  EXPECT_FALSE(pic.interrupt_pending());
  outb(pic.slave_ports(), 0, 0x20);
  EXPECT_FALSE(pic.interrupt_pending());
  outb(pic.master_ports(), 0, 0x20);
  EXPECT_TRUE(pic.interrupt_pending());
  EXPECT_EQ(pic.acknowledge(), 0x3c);
}

TEST(Pic8259, SpuriousIrq7WhenMaskedBeforeInta) {
  PicPair pic;
  init_linux(pic);
  pulse(pic, 5);
  EXPECT_TRUE(pic.interrupt_pending());
  outb(pic.master_ports(), 1, 0x20);
  EXPECT_EQ(pic.acknowledge(), 0x37);
  EXPECT_EQ(read_isr(pic.master_ports()), 0x00);
}

TEST(Pic8259, SpuriousIrq7WhenLevelTriggeredLineFalls) {
  PicPair pic;
  init_linux(pic);
  outb(pic.elcr_ports(), 0, 0x20);  // IRQ5 level-triggered
  pic.set_irq(5, true);
  EXPECT_TRUE(pic.interrupt_pending());
  pic.set_irq(5, false);
  EXPECT_FALSE(pic.interrupt_pending());
  EXPECT_EQ(pic.acknowledge(), 0x37);
  EXPECT_EQ(read_isr(pic.master_ports()), 0x00);
}

TEST(Pic8259, SpuriousIrq15KeepsMasterIr2InService) {
  PicPair pic;
  init_linux(pic);
  pulse(pic, 11);
  EXPECT_TRUE(pic.interrupt_pending());
  outb(pic.slave_ports(), 1, 0x08);  // mask IRQ11 on the slave
  EXPECT_TRUE(pic.interrupt_pending());  // the master latched IR2's edge
  EXPECT_EQ(pic.acknowledge(), 0x3f);
  EXPECT_EQ(read_isr(pic.master_ports()), 0x04);
  EXPECT_EQ(read_isr(pic.slave_ports()), 0x00);
}

TEST(Pic8259, PollCommandReadsAndAcknowledges) {
  PicPair pic;
  init_linux(pic);
  outb(pic.master_ports(), 0, 0x0c);  // OCW3 poll
  EXPECT_EQ(inb(pic.master_ports(), 0), 0x00);
  pulse(pic, 6);
  outb(pic.master_ports(), 0, 0x0c);
  EXPECT_EQ(inb(pic.master_ports(), 0), 0x86);
  EXPECT_EQ(read_isr(pic.master_ports()), 0x40);
  EXPECT_EQ(inb(pic.master_ports(), 0), 0x00);  // poll lasts one read; IRR now empty
}

TEST(Pic8259, AutoEoiLeavesIsrClear) {
  PicPair pic;
  init_linux(pic, /*auto_eoi=*/true);
  pulse(pic, 1);
  EXPECT_EQ(pic.acknowledge(), 0x31);
  EXPECT_EQ(read_isr(pic.master_ports()), 0x00);
  pulse(pic, 3);
  EXPECT_TRUE(pic.interrupt_pending());  // nothing in service blocks it
}

TEST(Pic8259, EdgeTriggeredLineNeedsANewRisingEdge) {
  PicPair pic;
  init_linux(pic);
  pic.set_irq(1, true);
  EXPECT_EQ(pic.acknowledge(), 0x31);
  outb(pic.master_ports(), 0, 0x20);
  pic.set_irq(1, true);
  EXPECT_FALSE(pic.interrupt_pending());
  pic.set_irq(1, false);
  pic.set_irq(1, true);
  EXPECT_TRUE(pic.interrupt_pending());
}

TEST(Pic8259, RotateOnEoiMakesServicedLevelLowest) {
  PicPair pic;
  init_linux(pic);
  pulse(pic, 0);
  EXPECT_EQ(pic.acknowledge(), 0x30);
  outb(pic.master_ports(), 0, 0xa0);  // rotate on non-specific EOI
  pulse(pic, 0);
  pulse(pic, 1);
  EXPECT_EQ(pic.acknowledge(), 0x31);
}

TEST(Pic8259, SpecialMaskModeAllowsLowerPriority) {
  PicPair pic;
  init_linux(pic);
  pulse(pic, 1);
  EXPECT_EQ(pic.acknowledge(), 0x31);
  pulse(pic, 4);
  EXPECT_FALSE(pic.interrupt_pending());
  outb(pic.master_ports(), 1, 0x02);  // mask the level in service
  outb(pic.master_ports(), 0, 0x68);  // OCW3: set special mask mode
  EXPECT_TRUE(pic.interrupt_pending());
  EXPECT_EQ(pic.acknowledge(), 0x34);
}

TEST(Pic8259, ElcrStoresOnlyImplementedBits) {
  PicPair pic;
  outb(pic.elcr_ports(), 0, 0xff);
  outb(pic.elcr_ports(), 1, 0xff);
  EXPECT_EQ(inb(pic.elcr_ports(), 0), 0xf8);
  EXPECT_EQ(inb(pic.elcr_ports(), 1), 0xde);
}

TEST(Pic8259, SaveRestoreRoundTrip) {
  PicPair pic;
  init_linux(pic);
  outb(pic.elcr_ports(), 1, 0x0c);
  pulse(pic, 3);
  pulse(pic, 9);
  EXPECT_EQ(pic.acknowledge(), 0x39);
  outb(pic.master_ports(), 1, 0x40);
  std::vector<uint8_t> state = pic.save();

  PicPair copy;
  ASSERT_TRUE(copy.restore(state));
  EXPECT_EQ(copy.save(), state);
  EXPECT_EQ(inb(copy.master_ports(), 1), 0x40);
  EXPECT_EQ(inb(copy.elcr_ports(), 1), 0x0c);
  EXPECT_EQ(read_isr(copy.slave_ports()), 0x02);
  outb(copy.slave_ports(), 0, 0x20);
  outb(copy.master_ports(), 0, 0x20);
  EXPECT_EQ(copy.acknowledge(), 0x33);
}

TEST(Pic8259, RestoreRejectsTruncatedAndForeignState) {
  PicPair pic;
  std::vector<uint8_t> state = pic.save();
  auto truncated = std::span<const uint8_t>(state).first(state.size() - 1);
  auto result = pic.restore(truncated);
  ASSERT_FALSE(result);
  EXPECT_NE(result.error().message.find("truncated"), std::string::npos) << result.error().message;
  std::vector<uint8_t> foreign = state;
  foreign[0] = 'X';
  EXPECT_FALSE(pic.restore(foreign));
  std::vector<uint8_t> bad_step = state;
  bad_step[5 + 7] = 9;  // master init_step
  EXPECT_FALSE(pic.restore(bad_step));
  EXPECT_FALSE(pic.master_ports().restore(std::vector<uint8_t>{1}));
}

TEST(Pic8259, SingleModeSkipsIcw3AndHasNoCascade) {
  PicPair pic;
  outb(pic.master_ports(), 0, 0x13);  // ICW1: edge, single, ICW4 needed
  outb(pic.master_ports(), 1, 0x08);  // ICW2
  outb(pic.master_ports(), 1, 0x01);  // ICW4 (no ICW3 in single mode)
  outb(pic.master_ports(), 1, 0xfe);  // this is OCW1 already
  EXPECT_EQ(inb(pic.master_ports(), 1), 0xfe);
  outb(pic.master_ports(), 1, 0x00);
  pulse(pic, 2);
  EXPECT_EQ(pic.acknowledge(), 0x0a);  // IR2 is an ordinary input
}

TEST(Pic8259, LtimMakesEveryLineLevelTriggered) {
  PicPair pic;
  outb(pic.master_ports(), 0, 0x19);  // ICW1 with LTIM
  outb(pic.master_ports(), 1, 0x20);
  outb(pic.master_ports(), 1, 0x04);
  outb(pic.master_ports(), 1, 0x01);
  outb(pic.master_ports(), 1, 0x00);
  pic.set_irq(3, true);
  EXPECT_EQ(pic.acknowledge(), 0x23);
  outb(pic.master_ports(), 0, 0x20);
  EXPECT_TRUE(pic.interrupt_pending());  // still high: requests again without a new edge
  pic.set_irq(3, false);
  EXPECT_FALSE(pic.interrupt_pending());
}

}  // namespace
}  // namespace deja
