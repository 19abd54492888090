// The APIC bus of a multiprocessor (SDM vol. 3, 10.6): IPI destinations and shorthands, lowest priority, NMI/INIT/STARTUP, x2APIC, MSI.
#include "devices/apic_fabric.h"

#include <gtest/gtest.h>

#include "devices/lapic.h"
#include "tests/devices/fakes.h"

namespace deja {
namespace {

struct NoPic : InterruptController {
  bool interrupt_pending() override { return false; }
  uint8_t acknowledge() override { return 0; }
};

constexpr uint64_t kTpr = 0x80, kLdr = 0xd0, kDfr = 0xe0, kSvr = 0xf0, kEsr = 0x280, kIcrLo = 0x300, kIcrHi = 0x310,
                   kLvtLint0 = 0x350;
constexpr uint32_t kFixed = 0x000, kLowest = 0x100, kSmi = 0x200, kNmi = 0x400, kInit = 0x500, kStartup = 0x600,
                   kLogical = 1u << 11, kAssert = 1u << 14, kLevel = 1u << 15, kSelf = 1u << 18, kAll = 2u << 18,
                   kOthers = 3u << 18;

struct Smp : ::testing::Test {
  static constexpr int kCpus = 4;
  test::FakeClock clock;
  NoPic pic;
  std::vector<std::unique_ptr<LocalApic>> apics;
  std::unique_ptr<ApicFabric> bus;

  Smp() {
    std::vector<LocalApic*> raw;
    for (int i = 0; i < kCpus; ++i) {
      LocalApicConfig c{.apic_id = uint32_t(i), .bsp = i == 0, .x2apic = true, .tsc_deadline = true};
      apics.push_back(std::make_unique<LocalApic>(clock, c, pic));
      raw.push_back(apics.back().get());
    }
    bus = std::make_unique<ApicFabric>(raw);
    for (int i = 0; i < kCpus; ++i) apics[i]->attach_bus(bus.get(), bus.get(), uint32_t(i));
    for (int i = 0; i < kCpus; ++i) wr(i, kSvr, 0x1ff);  // software-enabled
  }
  uint32_t rd(int cpu, uint64_t offset) {
    uint8_t b[4];
    apics[cpu]->read(offset, b);
    return uint32_t(load_le(b));
  }
  void wr(int cpu, uint64_t offset, uint32_t value) {
    uint8_t b[4];
    store_le(b, value);
    apics[cpu]->write(offset, b);
  }
  void ipi(int from, uint8_t destination, uint32_t icr_low) {
    wr(from, kIcrHi, uint32_t(destination) << 24);
    wr(from, kIcrLo, icr_low);
  }
  // Which CPUs have `vector` requested.
  std::vector<int> requested(uint8_t vector) {
    std::vector<int> out;
    for (int i = 0; i < kCpus; ++i) {
      if (apics[i]->irr(vector)) out.push_back(i);
    }
    return out;
  }
  void clear_all() {
    for (int i = 0; i < kCpus; ++i) {
      while (apics[i]->interrupt_pending()) {
        apics[i]->acknowledge();
        wr(i, 0xb0, 0);  // EOI
      }
    }
  }
};

TEST_F(Smp, ApplicationProcessorsStartWaitingForStartup) {
  EXPECT_EQ(bus->activity(0), ApicFabric::Activity::kRunning);
  for (int i = 1; i < kCpus; ++i) EXPECT_EQ(bus->activity(i), ApicFabric::Activity::kWaitForSipi);
  EXPECT_EQ(apics[0]->apic_base(), 0xfee00900u);  // BSP flag
  EXPECT_EQ(apics[1]->apic_base(), 0xfee00800u);
  EXPECT_EQ(rd(0, kLvtLint0), 0x700u);  // the virtual wire on the BSP only
  EXPECT_EQ(rd(1, kLvtLint0), 0x10000u);
}

TEST_F(Smp, PhysicalDestinationsAndBroadcast) {
  ipi(0, 2, kFixed | 0x40);
  EXPECT_EQ(requested(0x40), std::vector<int>{2});
  ipi(3, 0xff, kFixed | 0x41);
  EXPECT_EQ(requested(0x41), (std::vector<int>{0, 1, 2, 3}));
  ipi(1, 9, kFixed | 0x42);  // no such APIC: lost
  EXPECT_TRUE(requested(0x42).empty());
}

TEST_F(Smp, Shorthands) {
  ipi(1, 0, kFixed | kSelf | 0x50);
  EXPECT_EQ(requested(0x50), std::vector<int>{1});
  ipi(1, 0, kFixed | kAll | 0x51);
  EXPECT_EQ(requested(0x51), (std::vector<int>{0, 1, 2, 3}));
  ipi(1, 0, kFixed | kOthers | 0x52);
  EXPECT_EQ(requested(0x52), (std::vector<int>{0, 2, 3}));
}

TEST_F(Smp, LogicalFlatAndClusterDestinations) {
  for (int i = 0; i < kCpus; ++i) wr(i, kLdr, (1u << i) << 24);  // flat: one bit each
  ipi(0, 0x0a, kFixed | kLogical | 0x60);
  EXPECT_EQ(requested(0x60), (std::vector<int>{1, 3}));
  // Cluster model: cluster in the high nibble, members in the low one.
  for (int i = 0; i < kCpus; ++i) {
    wr(i, kDfr, 0x0fffffff);
    wr(i, kLdr, (((i / 2) << 4) | (1u << (i % 2))) << 24);
  }
  ipi(0, 0x13, kFixed | kLogical | 0x61);  // cluster 1, both members
  EXPECT_EQ(requested(0x61), (std::vector<int>{2, 3}));
  ipi(0, 0x02, kFixed | kLogical | 0x62);  // cluster 0, member 1
  EXPECT_EQ(requested(0x62), std::vector<int>{1});
}

TEST_F(Smp, LowestPriorityGoesToTheLowestArbitrationPriority) {
  ipi(0, 0xff, kLowest | 0x70);  // all equal: the first
  EXPECT_EQ(requested(0x70), std::vector<int>{0});
  clear_all();
  wr(0, kTpr, 0x50);
  wr(1, kTpr, 0x40);
  wr(2, kTpr, 0x20);
  wr(3, kTpr, 0x30);
  ipi(1, 0xff, kLowest | 0x71);
  EXPECT_EQ(requested(0x71), std::vector<int>{2});
}

TEST_F(Smp, InitAndStartup) {
  wr(2, kTpr, 0x30);
  ipi(0, 2, kInit | kLevel | kAssert);
  EXPECT_EQ(bus->activity(2), ApicFabric::Activity::kWaitForSipi);
  EXPECT_TRUE(bus->pending(2).reset);
  EXPECT_EQ(rd(2, kTpr), 0u);              // INIT reset the APIC ...
  EXPECT_EQ(rd(2, 0x20), 2u << 24);        // ... but not its ID
  EXPECT_EQ(rd(2, kSvr), 0xffu);           // software-disabled again
  ipi(0, 2, kInit | kLevel);               // INIT level de-assert: nothing
  EXPECT_EQ(bus->counts(2).inits, 1u);
  ipi(0, 2, kStartup | 0x08);
  EXPECT_EQ(bus->activity(2), ApicFabric::Activity::kRunning);
  auto pending = bus->take_pending(2);
  EXPECT_TRUE(pending.reset);
  ASSERT_TRUE(pending.start_vector);
  EXPECT_EQ(*pending.start_vector, 0x08);
  ipi(0, 2, kStartup | 0x09);              // not waiting any more: ignored
  EXPECT_FALSE(bus->pending(2).start_vector);
  EXPECT_EQ(bus->counts(2).startups, 2u);
  // An AP waiting since power-up takes STARTUP without INIT, as after firmware.
  ipi(0, 3, kStartup | 0x10);
  EXPECT_EQ(bus->activity(3), ApicFabric::Activity::kRunning);
  EXPECT_EQ(*bus->take_pending(3).start_vector, 0x10);
}

TEST_F(Smp, NmiAndSmi) {
  ipi(1, 0, kNmi | kOthers);
  EXPECT_TRUE(bus->pending(0).nmi);
  EXPECT_FALSE(bus->pending(2).nmi);  // waiting for STARTUP: the NMI is held off
  EXPECT_FALSE(bus->pending(1).nmi);
  ipi(0, 1, kSmi);                    // no SMM: dropped
  EXPECT_FALSE(bus->pending(1).nmi);
  EXPECT_EQ(bus->counts(2).nmis, 1u);
}

TEST_F(Smp, IllegalVectorsAndInvalidShorthands) {
  ipi(0, 1, kFixed | 0x05);
  EXPECT_FALSE(apics[1]->irr(0x05));
  wr(0, kEsr, 0);
  EXPECT_EQ(rd(0, kEsr), 1u << 5);  // send illegal vector
  ipi(0, 0, kInit | kSelf | kAssert);  // INIT to self by shorthand: invalid, dropped
  EXPECT_EQ(bus->counts(0).inits, 0u);
}

TEST_F(Smp, HardwareDisabledApicTakesNothing) {
  EXPECT_TRUE(apics[3]->write_msr(0x1b, 0xfee00000));  // global disable
  ipi(0, 0xff, kFixed | 0x80);
  EXPECT_EQ(requested(0x80), (std::vector<int>{0, 1, 2}));
}

TEST_F(Smp, X2apicIcrAndDestinations) {
  for (int i = 0; i < kCpus; ++i) {
    ASSERT_TRUE(apics[i]->write_msr(0x1b, 0xfee00c00 | (i == 0 ? 0x100 : 0)));  // x2APIC mode
  }
  // ICR as one MSR: destination in bits 63:32.
  ASSERT_TRUE(apics[0]->write_msr(0x830, (uint64_t{3} << 32) | kFixed | 0x90));
  EXPECT_EQ(requested(0x90), std::vector<int>{3});
  ASSERT_TRUE(apics[0]->write_msr(0x830, (uint64_t{0xffffffff} << 32) | kFixed | 0x91));
  EXPECT_EQ(requested(0x91), (std::vector<int>{0, 1, 2, 3}));
  // Logical: the LDR derived from the x2APIC ID (cluster = ID >> 4, bit ID & 15).
  EXPECT_EQ(apics[2]->read_msr(0x80d).value, 0x4u);
  ASSERT_TRUE(apics[1]->write_msr(0x830, (uint64_t{0x0000000a} << 32) | kFixed | kLogical | 0x92));
  EXPECT_EQ(requested(0x92), (std::vector<int>{1, 3}));
  // SELF IPI register.
  ASSERT_TRUE(apics[2]->write_msr(0x83f, 0x93));
  EXPECT_EQ(requested(0x93), std::vector<int>{2});
  // INIT and STARTUP in x2APIC mode.
  ASSERT_TRUE(apics[0]->write_msr(0x830, (uint64_t{1} << 32) | kInit | kLevel | kAssert));
  EXPECT_EQ(bus->activity(1), ApicFabric::Activity::kWaitForSipi);
  EXPECT_TRUE(apics[1]->x2apic_mode());  // INIT keeps x2APIC mode
  ASSERT_TRUE(apics[0]->write_msr(0x830, (uint64_t{1} << 32) | kStartup | 0x20));
  EXPECT_EQ(*bus->take_pending(1).start_vector, 0x20);
}

TEST_F(Smp, MsiReachesTheNamedCpu) {
  bus->deliver_msi(0xfee00000 | (2u << 12), 0x0000 | 0xa0);
  EXPECT_EQ(requested(0xa0), std::vector<int>{2});
  bus->deliver_msi(0xfee00000 | (0xffu << 12), 0xa1);
  EXPECT_EQ(requested(0xa1), (std::vector<int>{0, 1, 2, 3}));
}

TEST_F(Smp, StateRoundTripsAndRefusesAnotherMachine) {
  ipi(0, 1, kInit | kLevel | kAssert);
  ipi(0, 2, kStartup | 0x08);
  ipi(0, 0, kNmi);
  auto saved = bus->save();
  std::vector<LocalApic*> raw;
  for (auto& a : apics) raw.push_back(a.get());
  ApicFabric other(raw);
  ASSERT_TRUE(other.restore(saved));
  EXPECT_EQ(other.save(), saved);
  EXPECT_EQ(other.activity(1), ApicFabric::Activity::kWaitForSipi);
  EXPECT_EQ(other.activity(2), ApicFabric::Activity::kRunning);
  EXPECT_TRUE(other.pending(0).nmi);
  ApicFabric two({raw[0], raw[1]});
  EXPECT_FALSE(two.restore(saved));
  saved.resize(saved.size() - 1);
  EXPECT_FALSE(other.restore(saved));
}

}  // namespace
}  // namespace deja
