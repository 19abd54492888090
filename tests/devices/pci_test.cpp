// PCI configuration space rules and mechanism #1: CONFIG_ADDRESS, data port widths, read-only and write-1-to-clear
// bits, BAR sizing and placement on the buses (64-bit BARs above 4 GiB too), command register, capabilities, INTx.
#include <gtest/gtest.h>

#include <vector>

#include "devices/bus.h"
#include "devices/pci_host.h"
#include "tests/devices/fakes.h"

namespace deja {
namespace {

using test::RecordingIrqSink;

// A function with a 32-bit memory BAR 0 (4 KiB), a 64-bit memory BAR 2 (16 KiB), an I/O BAR 5 (32 ports) and two
// capabilities; BAR accesses are remembered.
class TestFunction : public PciFunction {
 public:
  TestFunction()
      : PciFunction(PciIds{.vendor = 0x1234, .device = 0x5678, .revision = 3, .class_code = 0x020000,
                           .subsystem_vendor = 0x1af4, .subsystem = 0x1100, .interrupt_pin = 1}) {
    define_bar(0, PciBarKind::kMemory32, 0x1000);
    define_bar(2, PciBarKind::kMemory64, 0x4000, true);
    define_bar(5, PciBarKind::kIo, 32);
    const uint8_t vendor[] = {8, 0xaa, 0xbb, 0xcc, 0xdd, 0xee};
    first_cap = add_capability(pci::kCapabilityVendor, vendor);
    const uint8_t second[] = {0x11, 0x22};
    const uint8_t second_mask[] = {0xff, 0x00};
    second_cap = add_capability(0x05, second, second_mask);
  }
  std::string_view name() const override { return "test-function"; }
  void bar_read(unsigned bar, uint64_t offset, std::span<uint8_t> data) override {
    reads.push_back({bar, offset});
    store_le(data, 0x1000 * bar + offset);
  }
  void bar_write(unsigned bar, uint64_t offset, std::span<const uint8_t> data) override {
    writes.push_back({bar, offset, load_le(data)});
  }
  void interrupt(bool level) { set_intx(level); }

  struct Access {
    unsigned bar;
    uint64_t offset;
    uint64_t value = 0;
  };
  std::vector<Access> reads, writes;
  uint8_t first_cap = 0, second_cap = 0;
};

class PciTest : public ::testing::Test {
 protected:
  PciTest() {
    EXPECT_TRUE(pio.add(PciHost::kConfigAddressPort, PciHost::kPortCount, &host));
    EXPECT_TRUE(host.attach(3, function, 11));
  }

  uint32_t in(uint16_t port, unsigned size) {
    uint8_t data[4] = {};
    pio.read(port, std::span(data, size));
    return uint32_t(load_le(std::span(data, size)));
  }
  void out(uint16_t port, unsigned size, uint32_t value) {
    uint8_t data[4];
    store_le(std::span(data, size), value);
    pio.write(port, std::span(data, size));
  }
  static uint32_t address(unsigned device, unsigned reg, unsigned fn = 0, unsigned bus = 0) {
    return 0x80000000u | bus << 16 | device << 11 | fn << 8 | reg;
  }
  uint32_t config(unsigned device, unsigned reg, unsigned size = 4) {
    out(0xcf8, 4, address(device, reg & 0xfc));
    return in(uint16_t(0xcfc + (reg & 3)), size);
  }
  void set_config(unsigned device, unsigned reg, unsigned size, uint32_t value) {
    out(0xcf8, 4, address(device, reg & 0xfc));
    out(uint16_t(0xcfc + (reg & 3)), size, value);
  }
  uint64_t mmio_read(uint64_t address) {
    uint8_t data[4] = {};
    return mmio.read(address, std::span(data, 4)) ? load_le(std::span(data, 4)) : ~0ull;
  }

  Bus pio{"port I/O"};
  Bus mmio{"MMIO"};
  RecordingIrqSink irqs;
  PciHost host{pio, mmio, irqs};
  TestFunction function;
};

TEST_F(PciTest, ConfigAddressReadsBackWithReservedBitsClear) {
  out(0xcf8, 4, 0xffffffff);
  EXPECT_EQ(in(0xcf8, 4), 0x80fffffcu);
  out(0xcf8, 4, 0x80000000);
  EXPECT_EQ(in(0xcf8, 4), 0x80000000u);
}

TEST_F(PciTest, LinuxType1ProbeSucceeds) {
  // pci_check_type1(): a byte write to 0xCFB, then CONFIG_ADDRESS must read back what was written.
  out(0xcf8, 4, 0x12345678 & 0x80fffffc);
  out(0xcfb, 1, 0x01);
  EXPECT_EQ(in(0xcf8, 4), 0x12345678u & 0x80fffffc) << "a byte write to 0xCFB must not touch CONFIG_ADDRESS";
  out(0xcf8, 4, 0x80000000);
  EXPECT_EQ(in(0xcf8, 4), 0x80000000u);
  // pci_sanity_check(): a host bridge (class 0600) at 00:00.0.
  EXPECT_EQ(config(0, 0x08) >> 16, 0x0600u);
  EXPECT_EQ(config(0, 0x00), 0x12378086u);
}

TEST_F(PciTest, NarrowAccessesToConfigAddressAreNotConfigAddress) {
  out(0xcf8, 4, 0x80001800);
  EXPECT_EQ(in(0xcf8, 1), 0xffu);
  EXPECT_EQ(in(0xcfa, 2), 0xffffu);
  out(0xcf8, 2, 0);
  out(0xcf9, 1, 0x06);  // PIIX reset control: not modelled, ignored
  EXPECT_EQ(in(0xcf8, 4), 0x80001800u);
}

TEST_F(PciTest, DataPortWidthsReachTheRightRegisterBytes) {
  EXPECT_EQ(config(3, 0x00, 4), 0x56781234u);
  EXPECT_EQ(config(3, 0x00, 2), 0x1234u);
  EXPECT_EQ(config(3, 0x02, 2), 0x5678u);
  EXPECT_EQ(config(3, 0x01, 1), 0x12u);
  EXPECT_EQ(config(3, 0x03, 1), 0x56u);
  EXPECT_EQ(config(3, 0x08, 1), 3u);  // revision
  EXPECT_EQ(config(3, 0x09, 1), 0x00u);
  EXPECT_EQ(config(3, 0x0b, 1), 0x02u);  // class: network
  EXPECT_EQ(config(3, 0x2c, 4), 0x11001af4u);
  EXPECT_EQ(config(3, 0x3d, 1), 1u);   // INTA#
  EXPECT_EQ(config(3, 0x3c, 1), 11u);  // the line the builder wired
}

TEST_F(PciTest, AbsentFunctionsAndDisabledAccessReadAllOnes) {
  EXPECT_EQ(config(4, 0), 0xffffffffu);                 // empty slot
  out(0xcf8, 4, address(3, 0, 1));                      // function 1 of a single-function device
  EXPECT_EQ(in(0xcfc, 4), 0xffffffffu);
  out(0xcf8, 4, address(3, 0, 0, 1));                   // bus 1: no bridges
  EXPECT_EQ(in(0xcfc, 4), 0xffffffffu);
  out(0xcf8, 4, address(3, 0) & 0x7fffffff);            // enable bit clear
  EXPECT_EQ(in(0xcfc, 4), 0xffffffffu);
  out(0xcfc, 4, 0);                                     // and writes go nowhere
  EXPECT_EQ(config(3, 0), 0x56781234u);
}

TEST_F(PciTest, ReadOnlyRegistersIgnoreWrites) {
  set_config(3, 0x00, 4, 0);
  set_config(3, 0x08, 4, 0);
  set_config(3, 0x2c, 4, 0);
  set_config(3, 0x3d, 1, 4);
  set_config(3, 0x34, 1, 0);
  EXPECT_EQ(config(3, 0x00), 0x56781234u);
  EXPECT_EQ(config(3, 0x08), 0x02000003u);
  EXPECT_EQ(config(3, 0x2c), 0x11001af4u);
  EXPECT_EQ(config(3, 0x3d, 1), 1u);
  EXPECT_EQ(config(3, 0x34, 1), function.first_cap);
  // Interrupt Line is software's scratch register; cache line size and latency timer are writable.
  set_config(3, 0x3c, 1, 5);
  EXPECT_EQ(config(3, 0x3c, 1), 5u);
  set_config(3, 0x0c, 2, 0x4010);
  EXPECT_EQ(config(3, 0x0c, 2), 0x4010u);
}

TEST_F(PciTest, CommandRegisterHasOnlyItsImplementedBits) {
  set_config(3, 0x04, 2, 0xffff);
  // I/O, memory, bus master, parity, SERR#, INTx disable.
  EXPECT_EQ(config(3, 0x04, 2), 0x0547u);
  set_config(3, 0x04, 2, 0);
  EXPECT_EQ(config(3, 0x04, 2), 0u);
}

TEST_F(PciTest, StatusErrorBitsAreWriteOneToClearAndNeverSetBySoftware) {
  const uint32_t before = config(3, 0x06, 2);
  EXPECT_EQ(before & pci::kStatusCapabilities, pci::kStatusCapabilities);
  set_config(3, 0x06, 2, 0xffff);
  EXPECT_EQ(config(3, 0x06, 2), before) << "writing 1s clears error bits, it never sets anything";
}

TEST_F(PciTest, CapabilityListIsWalkable) {
  std::vector<std::pair<uint8_t, uint8_t>> caps;  // (offset, id)
  for (uint32_t at = config(3, 0x34, 1); at != 0 && caps.size() < 48; at = config(3, at + 1, 1)) {
    EXPECT_EQ(at % 4, 0u) << "capabilities are dword aligned";
    EXPECT_GE(at, 0x40u);
    caps.emplace_back(uint8_t(at), uint8_t(config(3, at, 1)));
  }
  ASSERT_EQ(caps.size(), 2u);
  EXPECT_EQ(caps[0].second, pci::kCapabilityVendor);
  EXPECT_EQ(config(3, caps[0].first + 2, 1), 8u);  // the vendor capability's own length byte
  EXPECT_EQ(caps[1].second, 0x05);
  // Capability bodies are read-only except where the function says otherwise.
  set_config(3, caps[0].first + 3, 1, 0);
  EXPECT_EQ(config(3, caps[0].first + 3, 1), 0xaau);
  set_config(3, caps[1].first + 2, 1, 0x77);
  set_config(3, caps[1].first + 3, 1, 0x77);
  EXPECT_EQ(config(3, caps[1].first + 2, 1), 0x77u);
  EXPECT_EQ(config(3, caps[1].first + 3, 1), 0x22u);
}

TEST_F(PciTest, BarSizing) {
  // 32-bit memory BAR of 4 KiB: all ones reads back ~(size-1) with the type bits (memory, 32-bit, not prefetchable).
  set_config(3, 0x10, 4, 0xffffffff);
  EXPECT_EQ(config(3, 0x10), 0xfffff000u);
  // 64-bit prefetchable BAR of 16 KiB: low dword with type bits 0b1100, high dword all ones.
  set_config(3, 0x18, 4, 0xffffffff);
  set_config(3, 0x1c, 4, 0xffffffff);
  EXPECT_EQ(config(3, 0x18), 0xffffc00cu);
  EXPECT_EQ(config(3, 0x1c), 0xffffffffu);
  // I/O BAR of 32 ports: bit 0 set, 16-bit decode.
  set_config(3, 0x24, 4, 0xffffffff);
  EXPECT_EQ(config(3, 0x24), 0x0000ffe1u);
  // Unimplemented BARs and the expansion ROM read 0 whatever is written.
  set_config(3, 0x14, 4, 0xffffffff);
  set_config(3, 0x30, 4, 0xffffffff);
  EXPECT_EQ(config(3, 0x14), 0u);
  EXPECT_EQ(config(3, 0x30), 0u);
  // Sizing with decoding off maps nothing.
  EXPECT_EQ(mmio_read(0xfffff000), ~0ull);
  EXPECT_TRUE(function.reads.empty());
}

TEST_F(PciTest, BarsAreDecodedWhereTheGuestPutsThemWhileMemorySpaceIsEnabled) {
  set_config(3, 0x10, 4, 0xe0001000);
  EXPECT_EQ(mmio_read(0xe0001010), ~0ull) << "memory decoding is still off";
  set_config(3, 0x04, 2, pci::kCommandMemory);
  EXPECT_EQ(mmio_read(0xe0001010), 0x10u);
  ASSERT_EQ(function.reads.size(), 1u);
  EXPECT_EQ(function.reads[0].bar, 0u);
  // The guest moves it.
  set_config(3, 0x10, 4, 0xe0008000);
  EXPECT_EQ(mmio_read(0xe0001010), ~0ull);
  EXPECT_EQ(mmio_read(0xe0008020), 0x20u);
  // Disabling memory decoding unmaps it; enabling maps it again.
  set_config(3, 0x04, 2, 0);
  EXPECT_EQ(mmio_read(0xe0008020), ~0ull);
  set_config(3, 0x04, 2, pci::kCommandMemory);
  EXPECT_EQ(mmio_read(0xe0008020), 0x20u);
  // Address 0 is "unassigned": not decoded.
  set_config(3, 0x10, 4, 0);
  EXPECT_EQ(mmio_read(0x20), ~0ull);
}

TEST_F(PciTest, SixtyFourBitBarAboveFourGiB) {
  set_config(3, 0x04, 2, pci::kCommandMemory);
  set_config(3, 0x18, 4, 0x00000000);
  set_config(3, 0x1c, 4, 0x00000008);  // 0x8_0000_0000
  EXPECT_EQ(function.bar_address(2), 0x800000000ull);
  EXPECT_EQ(mmio_read(0x800000004), 0x2004u);
  set_config(3, 0x18, 4, 0x40000000);  // 0x8_4000_0000
  EXPECT_EQ(mmio_read(0x800000004), ~0ull);
  EXPECT_EQ(mmio_read(0x840000008), 0x2008u);
  // A 64-bit BAR being sized (all ones in both dwords) would wrap past 2^64: never decoded.
  set_config(3, 0x18, 4, 0xffffffff);
  set_config(3, 0x1c, 4, 0xffffffff);
  EXPECT_EQ(function.bar_decoded_address(2), std::nullopt);
}

TEST_F(PciTest, IoBarOnThePortBus) {
  set_config(3, 0x24, 4, 0xc040);
  EXPECT_EQ(in(0xc044, 1), 0xffu) << "I/O decoding is off";
  set_config(3, 0x04, 2, pci::kCommandIo);
  EXPECT_EQ(in(0xc044, 1), uint8_t(0x5000 + 4));
  EXPECT_EQ(function.reads.back().bar, 5u);
}

TEST_F(PciTest, OverlappingPlacementIsNotDecoded) {
  Bus& bus = mmio;
  class Other : public Device {
   public:
    std::string_view name() const override { return "other"; }
    void read(uint64_t, std::span<uint8_t> d) override { std::fill(d.begin(), d.end(), uint8_t{0x5a}); }
    void write(uint64_t, std::span<const uint8_t>) override {}
    std::vector<uint8_t> save() const override { return {}; }
    Result<> restore(std::span<const uint8_t>) override { return {}; }
  } other;
  ASSERT_TRUE(bus.add(0xfec00000, 0x1000, &other));
  set_config(3, 0x04, 2, pci::kCommandMemory);
  set_config(3, 0x10, 4, 0xfec00000);
  EXPECT_EQ(mmio_read(0xfec00000), 0x5a5a5a5au) << "the device already there keeps its range";
  EXPECT_EQ(host.refused_mappings(), 1u);
  set_config(3, 0x10, 4, 0xe0000000);
  EXPECT_EQ(mmio_read(0xe0000000), 0u);
}

TEST_F(PciTest, IntxDrivesTheWiredLineUnlessDisabled) {
  function.interrupt(true);
  EXPECT_TRUE(irqs.levels[11]);
  EXPECT_EQ(config(3, 0x06, 2) & pci::kStatusInterrupt, pci::kStatusInterrupt);
  set_config(3, 0x04, 2, pci::kCommandIntxDisable);
  EXPECT_FALSE(irqs.levels[11]) << "Interrupt Disable masks INTx#";
  EXPECT_EQ(config(3, 0x06, 2) & pci::kStatusInterrupt, pci::kStatusInterrupt) << "status still shows the condition";
  set_config(3, 0x04, 2, 0);
  EXPECT_TRUE(irqs.levels[11]);
  function.interrupt(false);
  EXPECT_FALSE(irqs.levels[11]);
  EXPECT_EQ(config(3, 0x06, 2) & pci::kStatusInterrupt, 0u);
  // The line is the wiring's, not the Interrupt Line register's.
  set_config(3, 0x3c, 1, 5);
  function.interrupt(true);
  EXPECT_TRUE(irqs.levels[11]);
  EXPECT_FALSE(irqs.levels[5]);
}

TEST_F(PciTest, SharedLinesAreWiredOr) {
  TestFunction second;
  ASSERT_TRUE(host.attach(7, second, 11));
  function.interrupt(true);
  second.interrupt(true);
  function.interrupt(false);
  EXPECT_TRUE(irqs.levels[11]) << "the other function still drives the line";
  second.interrupt(false);
  EXPECT_FALSE(irqs.levels[11]);
}

TEST_F(PciTest, AttachRefusesBadSlots) {
  TestFunction other;
  EXPECT_FALSE(host.attach(0, other, 10));
  EXPECT_FALSE(host.attach(3, other, 10));
  EXPECT_FALSE(host.attach(32, other, 10));
  EXPECT_FALSE(host.attach(8, other, 16));
}

TEST_F(PciTest, SavedConfigurationRestoresMappings) {
  set_config(3, 0x10, 4, 0xe0002000);
  set_config(3, 0x04, 2, pci::kCommandMemory);
  StateWriter w("TEST", 1);
  function.save_config(w);
  auto blob = w.take();
  set_config(3, 0x04, 2, 0);
  set_config(3, 0x10, 4, 0xe0004000);
  EXPECT_EQ(mmio_read(0xe0002000), ~0ull);
  StateReader r(blob, "TEST", 1);
  function.restore_config(r);
  ASSERT_TRUE(r.finish());
  EXPECT_EQ(mmio_read(0xe0002000), 0u);
  // A blob whose read-only bytes are another function's is refused.
  auto other = blob;
  other[5] ^= 0xff;  // the vendor ID
  StateReader bad(other, "TEST", 1);
  function.restore_config(bad);
  EXPECT_FALSE(bad.finish());
}

TEST_F(PciTest, HostSaveRestore) {
  out(0xcf8, 4, address(3, 0x10));
  auto blob = host.save();
  out(0xcf8, 4, 0);
  ASSERT_TRUE(host.restore(blob));
  EXPECT_EQ(in(0xcf8, 4), address(3, 0x10));
  blob[5] = 0x03;  // reserved bits of CONFIG_ADDRESS
  EXPECT_FALSE(host.restore(blob));
}

}  // namespace
}  // namespace deja
