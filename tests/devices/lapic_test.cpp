// Local APIC tests (Intel SDM vol. 3 ch. 10): reset state, priority/TPR/PPR/EOI, ExtINT, errors, timer modes, x2APIC, state.
#include "devices/lapic.h"

#include <gtest/gtest.h>

#include "tests/devices/fakes.h"

namespace deja {
namespace {

// The 8259A pair as LINT0 sees it.
struct FakePic : InterruptController {
  bool pending = false;
  uint8_t vector = 0x20;
  unsigned acks = 0;
  bool interrupt_pending() override { return pending; }
  uint8_t acknowledge() override {
    ++acks;
    pending = false;
    return vector;
  }
};

struct FakeEoi : EoiListener {
  std::vector<uint8_t> vectors;
  void end_of_interrupt(uint8_t v) override { vectors.push_back(v); }
};

// Register offsets in the xAPIC page.
constexpr uint64_t kId = 0x20, kVer = 0x30, kTpr = 0x80, kApr = 0x90, kPpr = 0xa0, kEoi = 0xb0, kLdr = 0xd0,
                   kDfr = 0xe0, kSvr = 0xf0, kIsr = 0x100, kTmr = 0x180, kIrr = 0x200, kEsr = 0x280, kIcrLo = 0x300,
                   kIcrHi = 0x310, kLvtTimer = 0x320, kLvtThermal = 0x330, kLvtLint0 = 0x350, kLvtLint1 = 0x360,
                   kLvtError = 0x370, kTmict = 0x380, kTmcct = 0x390, kTdcr = 0x3e0;

struct ApicFixture : ::testing::Test {
  test::FakeClock clock;
  FakePic pic;
  FakeEoi eoi_listener;
  LocalApicConfig config{.apic_id = 0, .x2apic = true, .tsc_deadline = true, .tsc_hz = 2'000'000'000};
  std::unique_ptr<LocalApic> apic = make(config);

  std::unique_ptr<LocalApic> make(const LocalApicConfig& c) {
    auto a = std::make_unique<LocalApic>(clock, c, pic);
    a->set_eoi_listener(&eoi_listener);
    return a;
  }
  uint32_t rd(uint64_t offset) {
    uint8_t b[4];
    apic->read(offset, b);
    return uint32_t(load_le(b));
  }
  void wr(uint64_t offset, uint32_t value) {
    uint8_t b[4];
    store_le(b, value);
    apic->write(offset, b);
  }
  void enable() { wr(kSvr, 0x1ff); }
  void self_ipi(uint8_t vector) { wr(kIcrLo, (1u << 18) | vector); }  // shorthand self, fixed
  uint32_t esr() {
    wr(kEsr, 0);  // the write latches the errors detected since the last one
    return rd(kEsr);
  }
  uint8_t take() {
    EXPECT_TRUE(apic->interrupt_pending());
    return apic->acknowledge();
  }
};

TEST_F(ApicFixture, PowerUpState) {
  EXPECT_EQ(apic->apic_base(), 0xfee00900u);  // base, BSP, global enable
  EXPECT_EQ(rd(kVer), 0x00050014u);          // version 0x14, six LVT entries
  EXPECT_EQ(rd(kId), 0u);
  EXPECT_EQ(rd(kSvr), 0xffu);  // software-disabled, spurious vector 0xff
  EXPECT_EQ(rd(kDfr), 0xffffffffu);
  EXPECT_EQ(rd(kTpr), 0u);
  EXPECT_EQ(rd(kPpr), 0u);
  EXPECT_EQ(rd(kLvtTimer), 0x10000u);
  EXPECT_EQ(rd(kLvtError), 0x10000u);
  EXPECT_EQ(rd(kLvtLint1), 0x10000u);
  EXPECT_EQ(rd(kLvtLint0), 0x700u);  // the firmware's virtual wire: ExtINT
  EXPECT_FALSE(apic->interrupt_pending());
  LocalApic other(clock, LocalApicConfig{.apic_id = 3}, pic);
  uint8_t b[4];
  other.read(kId, b);
  EXPECT_EQ(load_le(b), 3u << 24);
}

TEST_F(ApicFixture, ExtIntThroughLint0AndWhenGloballyDisabled) {
  pic.pending = true;
  pic.vector = 0x24;
  EXPECT_TRUE(apic->interrupt_pending());
  EXPECT_EQ(apic->acknowledge(), 0x24);
  EXPECT_EQ(pic.acks, 1u);
  enable();
  wr(kTpr, 0xf0);  // ExtINT ignores the task priority
  pic.pending = true;
  EXPECT_TRUE(apic->interrupt_pending());
  wr(kLvtLint0, 0x10700);  // masked
  EXPECT_FALSE(apic->interrupt_pending());
  // A globally disabled APIC is not there: the 8259A drives INTR.
  ASSERT_TRUE(apic->write_msr(0x1b, 0xfee00100));
  EXPECT_TRUE(apic->interrupt_pending());
  EXPECT_EQ(apic->acknowledge(), 0x24);
  uint8_t b[4];
  apic->read(kVer, b);
  EXPECT_EQ(load_le(b), 0xffffffffu);  // the page is not decoded
}

TEST_F(ApicFixture, SoftwareDisableMasksLvtAndRefusesFixedInterrupts) {
  wr(kLvtTimer, 0x40);  // disabled: the mask cannot be cleared
  EXPECT_EQ(rd(kLvtTimer), 0x10040u);
  self_ipi(0x40);
  EXPECT_FALSE(apic->irr(0x40));
  enable();
  wr(kLvtTimer, 0x40);
  wr(kLvtLint0, 0x700);
  EXPECT_EQ(rd(kLvtTimer), 0x40u);
  self_ipi(0x50);
  EXPECT_TRUE(apic->irr(0x50));
  wr(kSvr, 0xff);  // back to software-disabled: every LVT entry is masked, pending IRR is held
  EXPECT_EQ(rd(kLvtTimer), 0x10040u);
  EXPECT_EQ(rd(kLvtLint0), 0x10700u);
  EXPECT_TRUE(apic->irr(0x50));
  EXPECT_FALSE(apic->interrupt_pending());
  enable();
  EXPECT_EQ(take(), 0x50);
}

TEST_F(ApicFixture, PriorityClassesIsrAndEoi) {
  enable();
  self_ipi(0x40);
  self_ipi(0x61);
  self_ipi(0x65);
  EXPECT_EQ(rd(kIrr + 0x30), (1u << 1) | (1u << 5));  // 0x61, 0x65: bits 1 and 5 of IRR[96..127]
  EXPECT_EQ(take(), 0x65);
  EXPECT_TRUE(apic->isr(0x65));
  EXPECT_FALSE(apic->irr(0x65));
  EXPECT_EQ(rd(kPpr), 0x60u);
  EXPECT_FALSE(apic->interrupt_pending());  // 0x61 is the same class as the one in service
  self_ipi(0x70);
  EXPECT_EQ(take(), 0x70);  // a higher class nests
  EXPECT_EQ(rd(kPpr), 0x70u);
  wr(kEoi, 0);
  EXPECT_FALSE(apic->isr(0x70));
  EXPECT_TRUE(apic->isr(0x65));
  wr(kEoi, 0);
  EXPECT_EQ(take(), 0x61);
  wr(kEoi, 0);
  EXPECT_EQ(take(), 0x40);
  wr(kEoi, 0);
  EXPECT_EQ(rd(kPpr), 0u);
  wr(kEoi, 0);  // no ISR bit: ignored
  EXPECT_TRUE(eoi_listener.vectors.empty());  // all edge-triggered: no EOI broadcast
  EXPECT_EQ(apic->acknowledge(), 0xff);       // nothing deliverable: the spurious vector
  EXPECT_EQ(rd(kIsr + 0x70), 0u);
}

TEST_F(ApicFixture, TaskPriorityBlocksItsClassAndBelow) {
  enable();
  wr(kTpr, 0x5a);
  EXPECT_EQ(rd(kPpr), 0x5au);
  self_ipi(0x5f);
  EXPECT_FALSE(apic->interrupt_pending());
  EXPECT_EQ(rd(kApr), 0x5au);  // TPR at least the IRR and above the ISR class
  self_ipi(0x60);
  EXPECT_EQ(rd(kApr), 0x60u);
  EXPECT_EQ(take(), 0x60);
  EXPECT_EQ(rd(kPpr), 0x60u);  // the class in service exceeds the TPR
  wr(kEoi, 0);
  wr(kTpr, 0x40);
  EXPECT_EQ(take(), 0x5f);
}

TEST_F(ApicFixture, LevelTriggeredMessagesSetTmrAndBroadcastEoi) {
  enable();
  ASSERT_TRUE(apic->deliver({.vector = 0x33, .delivery_mode = apic_delivery::kFixed, .level = true}));
  EXPECT_TRUE(apic->tmr(0x33));
  EXPECT_EQ(rd(kTmr + 0x10), 1u << 19);
  EXPECT_EQ(take(), 0x33);
  wr(kEoi, 0);
  EXPECT_EQ(eoi_listener.vectors, std::vector<uint8_t>{0x33});
  ASSERT_TRUE(apic->deliver({.vector = 0x33, .level = false}));
  EXPECT_FALSE(apic->tmr(0x33));
  EXPECT_EQ(take(), 0x33);
  wr(kEoi, 0);
  EXPECT_EQ(eoi_listener.vectors.size(), 1u);
  // ExtINT messages are answered by the 8259A's INTA.
  pic.vector = 0x2c;
  ASSERT_TRUE(apic->deliver({.delivery_mode = apic_delivery::kExtInt}));
  EXPECT_EQ(take(), 0x2c);
  EXPECT_FALSE(apic->deliver({.vector = 0x40, .delivery_mode = apic_delivery::kNmi}));  // not modelled
}

TEST_F(ApicFixture, DestinationMatching) {
  enable();
  EXPECT_FALSE(apic->deliver({.vector = 0x40, .destination = 1}));
  EXPECT_TRUE(apic->deliver({.vector = 0x41, .destination = 0xff}));
  wr(kLdr, 0x04000000);  // flat model, logical ID bit 2
  EXPECT_TRUE(apic->deliver({.vector = 0x42, .logical = true, .destination = 0x0c}));
  EXPECT_FALSE(apic->deliver({.vector = 0x43, .logical = true, .destination = 0x03}));
  wr(kDfr, 0x0fffffff);  // cluster model: cluster 1, member bit 2
  EXPECT_EQ(rd(kDfr), 0x0fffffffu);
  wr(kLdr, 0x14000000);
  EXPECT_TRUE(apic->deliver({.vector = 0x44, .logical = true, .destination = 0x14}));
  EXPECT_FALSE(apic->deliver({.vector = 0x45, .logical = true, .destination = 0x24}));
  // ICR with a destination field, physical.
  wr(kIcrHi, 0x01000000);
  wr(kIcrLo, 0x46);
  EXPECT_FALSE(apic->irr(0x46));
  wr(kIcrHi, 0);
  wr(kIcrLo, 0x47);
  EXPECT_TRUE(apic->irr(0x47));
  wr(kIcrLo, (3u << 18) | 0x48);  // all excluding self
  EXPECT_FALSE(apic->irr(0x48));
  wr(kIcrLo, (2u << 18) | 0x49);  // all including self
  EXPECT_TRUE(apic->irr(0x49));
  EXPECT_EQ(rd(kIcrLo), (2u << 18) | 0x49);  // delivery status idle
  // MSI: address carries the destination, data the vector and trigger.
  apic->deliver_msi(0xfee00000, 0x4a);
  EXPECT_TRUE(apic->irr(0x4a));
  apic->deliver_msi(0xfee01000, 0x4b);  // destination 1
  EXPECT_FALSE(apic->irr(0x4b));
  apic->deliver_msi(0xfee00000, 0xc04c);  // level, asserted
  EXPECT_TRUE(apic->tmr(0x4c));
}

TEST_F(ApicFixture, ErrorStatusRegisterAndErrorInterrupt) {
  enable();
  wr(kLvtError, 0xfe);
  self_ipi(5);  // an illegal vector is not sent
  EXPECT_FALSE(apic->irr(5));
  EXPECT_EQ(rd(kEsr), 0u);  // not visible before the ESR write
  EXPECT_TRUE(apic->irr(0xfe));  // but the error interrupt is raised at once
  EXPECT_EQ(esr(), 0x20u);        // send illegal vector
  EXPECT_EQ(esr(), 0u);
  apic->deliver({.vector = 9});
  EXPECT_EQ(esr(), 0x40u);  // receive illegal vector
  rd(0x2f0);                // CMCI: not present in a 6-entry LVT
  EXPECT_EQ(esr(), 0x80u);  // illegal register address
  wr(kLvtError, 0x3);       // an illegal vector in the error entry itself does not loop
  self_ipi(1);
  EXPECT_EQ(esr(), 0x60u);
}

TEST_F(ApicFixture, LvtWritableBits) {
  enable();
  wr(kLvtTimer, 0xffffffff);
  EXPECT_EQ(rd(kLvtTimer), 0x000700ffu);  // vector, mask, mode bits 18:17 (TSC-deadline capable)
  wr(kLvtThermal, 0xffffffff);
  EXPECT_EQ(rd(kLvtThermal), 0x000107ffu);
  wr(kLvtLint1, 0xffffffff);
  EXPECT_EQ(rd(kLvtLint1), 0x0001a7ffu);  // remote IRR and delivery status read 0
  wr(kLvtError, 0xffffffff);
  EXPECT_EQ(rd(kLvtError), 0x000100ffu);
  wr(kSvr, 0xffffffff);
  EXPECT_EQ(rd(kSvr), 0x3ffu);  // no EOI-broadcast suppression
  wr(kTdcr, 0xff);
  EXPECT_EQ(rd(kTdcr), 0xbu);
  auto plain = make(LocalApicConfig{});
  std::swap(apic, plain);
  enable();
  wr(kLvtTimer, 0x00060000);
  EXPECT_EQ(rd(kLvtTimer), 0x00020000u);  // without TSC-deadline, bit 18 is reserved
}

TEST_F(ApicFixture, OneShotTimerWithDivide) {
  enable();
  wr(kLvtTimer, 0x30);
  wr(kTdcr, 0x3);  // divide by 16
  clock.now = 1000;
  wr(kTmict, 1000);
  ASSERT_TRUE(apic->next_deadline_ns());
  EXPECT_EQ(*apic->next_deadline_ns(), 1000u + 16000);
  clock.now = 1000 + 1600;
  EXPECT_EQ(rd(kTmcct), 900u);
  EXPECT_EQ(rd(kTmict), 1000u);
  apic->advance(16999);
  EXPECT_FALSE(apic->irr(0x30));
  apic->advance(17000);
  EXPECT_TRUE(apic->irr(0x30));
  EXPECT_FALSE(apic->next_deadline_ns());
  clock.now = 50000;
  EXPECT_EQ(rd(kTmcct), 0u);  // stays at zero
  // Every divide configuration.
  const std::pair<uint32_t, uint64_t> divides[] = {{0x0, 2}, {0x1, 4}, {0x2, 8}, {0x3, 16}, {0x8, 32},
                                                   {0x9, 64}, {0xa, 128}, {0xb, 1}};
  for (auto [code, divisor] : divides) {
    wr(kTdcr, code);
    clock.now = 100000;
    wr(kTmict, 10);
    EXPECT_EQ(*apic->next_deadline_ns(), 100000 + 10 * divisor) << "divide code " << code;
  }
  wr(kTmict, 0);  // stops the timer
  EXPECT_FALSE(apic->next_deadline_ns());
}

TEST_F(ApicFixture, PeriodicTimerReloadsAndCoalesces) {
  enable();
  wr(kTdcr, 0xb);  // divide by 1: one count per ns
  wr(kLvtTimer, 0x20031);
  clock.now = 0;
  wr(kTmict, 500);
  EXPECT_EQ(*apic->next_deadline_ns(), 500u);
  clock.now = 499;
  EXPECT_EQ(rd(kTmcct), 1u);
  clock.now = 500;
  EXPECT_EQ(rd(kTmcct), 500u);  // reloaded
  apic->advance(500);
  EXPECT_EQ(take(), 0x31);
  wr(kEoi, 0);
  EXPECT_EQ(*apic->next_deadline_ns(), 1000u);
  apic->advance(5200);  // nine expiries: one interrupt, as the IRR holds one
  EXPECT_EQ(take(), 0x31);
  wr(kEoi, 0);
  EXPECT_FALSE(apic->interrupt_pending());
  EXPECT_EQ(*apic->next_deadline_ns(), 5500u);
  // A divide change keeps the current count and continues at the new rate.
  clock.now = 5300;
  wr(kTdcr, 0x0);  // divide by 2
  EXPECT_EQ(rd(kTmcct), 200u);
  EXPECT_EQ(*apic->next_deadline_ns(), 5300u + 2 * 200);
  // Masked: it counts on, but raises nothing, and unmasking does not replay missed expiries.
  wr(kLvtTimer, 0x30031);
  EXPECT_FALSE(apic->next_deadline_ns());
  apic->advance(9000);
  clock.now = 9000;
  wr(kLvtTimer, 0x20031);
  EXPECT_FALSE(apic->interrupt_pending());
  EXPECT_GT(*apic->next_deadline_ns(), 9000u);
  // Periodic -> one-shot: the current period's count runs down to zero, then stops.
  clock.now = 9100;
  uint32_t left = rd(kTmcct);
  wr(kLvtTimer, 0x31);
  EXPECT_EQ(rd(kTmcct), left);
  EXPECT_EQ(*apic->next_deadline_ns(), 9100u + 2 * left);
  apic->advance(9100 + 2 * left);
  EXPECT_EQ(take(), 0x31);
  EXPECT_FALSE(apic->next_deadline_ns());
  clock.now = 9100 + 2 * left;
  wr(kLvtTimer, 0x20031);  // an expired one-shot stays stopped in periodic mode until TMICT is written
  EXPECT_FALSE(apic->next_deadline_ns());
}

TEST_F(ApicFixture, TscDeadlineMode) {
  enable();
  EXPECT_EQ(apic->read_msr(0x6e0).value, 0u);
  EXPECT_TRUE(apic->write_msr(0x6e0, 1234));  // ignored outside TSC-deadline mode
  EXPECT_EQ(apic->read_msr(0x6e0).value, 0u);
  wr(kLvtTimer, 0x35);
  wr(kTmict, 100);
  EXPECT_TRUE(apic->next_deadline_ns());
  wr(kLvtTimer, 0x40035);  // entering TSC-deadline mode disarms the count
  EXPECT_EQ(rd(kTmict), 0u);
  EXPECT_FALSE(apic->next_deadline_ns());
  wr(kTmict, 100);  // ignored in this mode
  EXPECT_EQ(rd(kTmict), 0u);
  EXPECT_EQ(rd(kTmcct), 0u);
  ASSERT_TRUE(apic->write_msr(0x6e0, 2001));  // 2 GHz TSC: 1000.5 ns, so the first ns at or past is 1001
  EXPECT_EQ(apic->read_msr(0x6e0).value, 2001u);
  EXPECT_EQ(*apic->next_deadline_ns(), 1001u);
  apic->advance(1000);
  EXPECT_FALSE(apic->irr(0x35));
  apic->advance(1001);
  EXPECT_TRUE(apic->irr(0x35));
  EXPECT_EQ(apic->read_msr(0x6e0).value, 0u);  // disarmed once it fired
  EXPECT_FALSE(apic->next_deadline_ns());
  ASSERT_TRUE(apic->write_msr(0x6e0, 10));  // already past: due at once
  EXPECT_EQ(*apic->next_deadline_ns(), 5u);
  ASSERT_TRUE(apic->write_msr(0x6e0, 0));  // 0 disarms
  EXPECT_FALSE(apic->next_deadline_ns());
  ASSERT_TRUE(apic->write_msr(0x6e0, 1u << 20));
  wr(kLvtTimer, 0x35);  // leaving the mode disarms too
  wr(kLvtTimer, 0x40035);
  EXPECT_EQ(apic->read_msr(0x6e0).value, 0u);
  // Without the feature the MSR does not exist.
  LocalApic plain(clock, LocalApicConfig{}, pic);
  EXPECT_FALSE(plain.owns_msr(0x6e0));
  EXPECT_TRUE(plain.read_msr(0x6e0).fault);
}

TEST_F(ApicFixture, ApicBaseMsrRules) {
  EXPECT_FALSE(apic->write_msr(0x1b, 0xfee00900 | 1));           // reserved bit 0
  EXPECT_FALSE(apic->write_msr(0x1b, 0xfee00900 | (1ull << 39)));  // above MAXPHYADDR
  EXPECT_FALSE(apic->write_msr(0x1b, 0xfed00900));               // relocation is not modelled
  EXPECT_FALSE(apic->write_msr(0x1b, 0xfee00500));               // EXTD without EN
  enable();
  wr(kTpr, 0x30);
  ASSERT_TRUE(apic->write_msr(0x1b, 0xfee00000));  // global disable: back to the power-up state
  EXPECT_FALSE(apic->write_msr(0x1b, 0xfee00c00));  // disabled -> x2APIC must pass through xAPIC
  ASSERT_TRUE(apic->write_msr(0x1b, 0xfee00800));
  EXPECT_EQ(rd(kTpr), 0u);
  EXPECT_EQ(rd(kSvr), 0xffu);
  EXPECT_EQ(rd(kLvtLint0), 0x10000u);
  EXPECT_EQ(apic->read_msr(0x1b).value, 0xfee00800u);
  LocalApic no_x2(clock, LocalApicConfig{}, pic);
  EXPECT_FALSE(no_x2.write_msr(0x1b, 0xfee00d00));  // EXTD needs CPUID x2APIC
}

TEST_F(ApicFixture, X2apicMsrInterface) {
  EXPECT_TRUE(apic->read_msr(0x802).fault);  // xAPIC mode: the MSRs do not exist
  EXPECT_FALSE(apic->write_msr(0x808, 0));
  wr(kLdr, 0x80000000);
  ASSERT_TRUE(apic->write_msr(0x1b, 0xfee00d00));
  EXPECT_TRUE(apic->x2apic_mode());
  EXPECT_EQ(rd(kVer), 0xffffffffu);  // the page is not decoded in x2APIC mode
  EXPECT_EQ(apic->read_msr(0x802).value, 0u);  // x2APIC ID
  EXPECT_EQ(apic->read_msr(0x803).value, 0x00050014u);
  EXPECT_EQ(apic->read_msr(0x80d).value, 1u);  // LDR derived from the ID: cluster 0, bit 0
  EXPECT_FALSE(apic->write_msr(0x80d, 2));       // read-only
  EXPECT_FALSE(apic->write_msr(0x802, 0));
  EXPECT_TRUE(apic->read_msr(0x809).fault);  // no APR, DFR or ICR high in x2APIC mode
  EXPECT_TRUE(apic->read_msr(0x80e).fault);
  EXPECT_TRUE(apic->read_msr(0x831).fault);
  EXPECT_TRUE(apic->read_msr(0x80b).fault);  // EOI and SELF IPI are write-only
  EXPECT_TRUE(apic->read_msr(0x83f).fault);
  EXPECT_FALSE(apic->write_msr(0x80f, 0x1000));  // SVR bit 12: reserved here
  ASSERT_TRUE(apic->write_msr(0x80f, 0x1ff));
  EXPECT_FALSE(apic->write_msr(0x808, 0x100));  // TPR bits 63:8
  EXPECT_FALSE(apic->write_msr(0x808, 1ull << 32));
  ASSERT_TRUE(apic->write_msr(0x83f, 0x51));  // SELF IPI
  EXPECT_TRUE(apic->irr(0x51));
  EXPECT_FALSE(apic->write_msr(0x83f, 0x151));
  ASSERT_TRUE(apic->write_msr(0x830, (1ull << 32) | 0x52));  // ICR: destination 1 is not us
  EXPECT_FALSE(apic->irr(0x52));
  ASSERT_TRUE(apic->write_msr(0x830, 0x53));  // destination 0
  EXPECT_TRUE(apic->irr(0x53));
  EXPECT_EQ(apic->read_msr(0x830).value, 0x53u);
  EXPECT_FALSE(apic->write_msr(0x830, 0x1053));  // delivery status is reserved in x2APIC
  EXPECT_EQ(apic->acknowledge(), 0x53);
  EXPECT_FALSE(apic->write_msr(0x80b, 1));  // EOI takes only 0
  ASSERT_TRUE(apic->write_msr(0x80b, 0));
  EXPECT_FALSE(apic->isr(0x53));
  EXPECT_FALSE(apic->write_msr(0x828, 1));  // ESR takes only 0
  ASSERT_TRUE(apic->write_msr(0x828, 0));
  EXPECT_FALSE(apic->write_msr(0x832, 0x80030));  // LVT timer bit 19: reserved
  ASSERT_TRUE(apic->write_msr(0x83e, 0xb));
  EXPECT_FALSE(apic->write_msr(0x83e, 0x4));
  ASSERT_TRUE(apic->write_msr(0x832, 0x30));
  clock.now = 100;
  ASSERT_TRUE(apic->write_msr(0x838, 1000));
  clock.now = 400;
  EXPECT_EQ(apic->read_msr(0x839).value, 700u);
  EXPECT_FALSE(apic->write_msr(0x839, 1));  // current count is read-only
  EXPECT_FALSE(apic->write_msr(0x1b, 0xfee00900));  // x2APIC -> xAPIC directly is #GP
  ASSERT_TRUE(apic->write_msr(0x1b, 0xfee00000));
  ASSERT_TRUE(apic->write_msr(0x1b, 0xfee00900));
  EXPECT_EQ(rd(kLdr), 0u);  // reset by the global disable
}

TEST_F(ApicFixture, NarrowAndUnalignedAccesses) {
  enable();
  wr(kTpr, 0x42);
  uint8_t byte = 0;
  apic->read(kTpr, std::span(&byte, 1));
  EXPECT_EQ(byte, 0x42);
  apic->read(kVer + 2, std::span(&byte, 1));
  EXPECT_EQ(byte, 0x05);
  apic->read(kVer + 4, std::span(&byte, 1));
  EXPECT_EQ(byte, 0);
  uint8_t two[2] = {0x11, 0x22};
  apic->write(kTpr, two);  // narrower than 32 bits: dropped
  EXPECT_EQ(rd(kTpr), 0x42u);
}

TEST_F(ApicFixture, SaveRestoreRoundTripAndRejection) {
  enable();
  wr(kTdcr, 0x1);
  wr(kLvtTimer, 0x20040);
  clock.now = 777;
  wr(kTmict, 12345);
  self_ipi(0x90);
  apic->deliver({.vector = 0x91, .level = true});
  EXPECT_EQ(apic->acknowledge(), 0x91);
  auto state = apic->save();
  auto copy = make(config);
  ASSERT_TRUE(copy->restore(state));
  EXPECT_EQ(copy->save(), state);
  EXPECT_EQ(copy->next_deadline_ns(), apic->next_deadline_ns());
  clock.now = 5000;
  uint8_t a[4], b[4];
  apic->read(kTmcct, a);
  copy->read(kTmcct, b);
  EXPECT_EQ(load_le(a), load_le(b));
  EXPECT_TRUE(copy->isr(0x91));
  EXPECT_TRUE(copy->tmr(0x91));
  EXPECT_TRUE(copy->irr(0x90));

  EXPECT_FALSE(copy->restore(std::span<const uint8_t>(state).first(state.size() - 1)));
  auto bad_base = state;
  bad_base[5] = 0x01;  // IA32_APIC_BASE bit 0
  auto r = copy->restore(bad_base);
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message.find("IA32_APIC_BASE"), std::string::npos) << r.error().message;
  // A TSC-deadline state does not restore into an APIC whose CPU model lacks the mode.
  apic->write(kLvtTimer, std::vector<uint8_t>{0x40, 0, 0x04, 0});
  LocalApic plain(clock, LocalApicConfig{}, pic);
  EXPECT_FALSE(plain.restore(apic->save()));
}

}  // namespace
}  // namespace deja
