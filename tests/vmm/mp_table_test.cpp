// MP specification 1.4 tables: checksums, lengths, and the entries Linux's mpparse reads.
#include "vmm/mp_table.h"

#include <gtest/gtest.h>

#include <map>

namespace deja {
namespace {

uint8_t sum(const std::vector<uint8_t>& b, size_t from, size_t len) {
  uint8_t s = 0;
  for (size_t i = from; i < from + len; ++i) s = uint8_t(s + b[i]);
  return s;
}
uint16_t u16(const std::vector<uint8_t>& b, size_t at) { return uint16_t(b[at] | b[at + 1] << 8); }
uint32_t u32(const std::vector<uint8_t>& b, size_t at) { return u16(b, at) | uint32_t(u16(b, at + 2)) << 16; }

struct Parsed {
  std::vector<std::vector<uint8_t>> entries;  // each entry's bytes, in table order
};

Parsed parse(const std::vector<uint8_t>& b, uint32_t address) {
  Parsed p;
  EXPECT_EQ(std::string(b.begin(), b.begin() + 4), "_MP_");
  EXPECT_EQ(b[8], 1);  // 16 bytes
  EXPECT_EQ(b[9], 4);  // revision 1.4
  EXPECT_EQ(sum(b, 0, 16), 0);
  EXPECT_EQ(b[11], 0);            // a configuration table follows, no default configuration
  EXPECT_EQ(b[12] & 0x80, 0);     // virtual-wire mode
  uint32_t table = u32(b, 4);
  EXPECT_EQ(table, address + 16);
  size_t t = table - address;
  EXPECT_EQ(std::string(b.begin() + t, b.begin() + t + 4), "PCMP");
  uint16_t length = u16(b, t + 4);
  EXPECT_EQ(t + length, b.size());
  EXPECT_EQ(b[t + 6], 4);
  EXPECT_EQ(sum(b, t, length), 0);
  EXPECT_EQ(u32(b, t + 36), 0xfee00000u);
  uint16_t count = u16(b, t + 34);
  size_t at = t + 44;
  int last_type = -1;
  for (uint16_t i = 0; i < count; ++i) {
    uint8_t type = b.at(at);
    EXPECT_GE(type, last_type) << "entries must be sorted by type";
    last_type = type;
    size_t size = type == 0 ? 20 : 8;
    p.entries.emplace_back(b.begin() + at, b.begin() + at + size);
    at += size;
  }
  EXPECT_EQ(at, b.size());
  return p;
}

TEST(MpTable, OneCpuOneIoApicIsaRouting) {
  MpTableConfig c;
  c.cpu_signature = 0x610;
  c.cpu_features = 0x1234;
  auto b = build_mp_tables(c, kMpFloatingPointerAddress);
  Parsed p = parse(b, kMpFloatingPointerAddress);
  ASSERT_GE(p.entries.size(), 3u);
  const auto& cpu = p.entries[0];
  EXPECT_EQ(cpu[0], 0);
  EXPECT_EQ(cpu[2], 0x14);
  EXPECT_EQ(cpu[3], 0x3);  // enabled, BSP
  EXPECT_EQ(u32(cpu, 4), 0x610u);
  EXPECT_EQ(u32(cpu, 8), 0x1234u);
  EXPECT_EQ(std::string(p.entries[1].begin() + 2, p.entries[1].end()), "ISA   ");
  const auto& ioapic = p.entries[2];
  EXPECT_EQ(ioapic[0], 2);
  EXPECT_EQ(ioapic[1], 1);
  EXPECT_EQ(ioapic[2], 0x11);
  EXPECT_EQ(u32(ioapic, 4), 0xfec00000u);
  std::map<int, int> isa_to_pin;
  int extint = 0, nmi = 0;
  for (const auto& e : p.entries) {
    if (e[0] == 3) {
      EXPECT_EQ(e[1], 0);           // INT
      EXPECT_EQ(u16(e, 2), 0);      // conforming to ISA: edge, active high
      EXPECT_EQ(e[4], 0);           // the ISA bus
      EXPECT_EQ(e[6], 1);           // I/O APIC ID
      isa_to_pin[e[5]] = e[7];
    } else if (e[0] == 4) {
      if (e[1] == 3) {
        ++extint;
        EXPECT_EQ(e[7], 0);  // LINT0
      } else if (e[1] == 1) {
        ++nmi;
        EXPECT_EQ(e[6], 0xff);
        EXPECT_EQ(e[7], 1);  // LINT1
      }
    }
  }
  EXPECT_EQ(isa_to_pin.size(), 15u);
  EXPECT_EQ(isa_to_pin[0], 2);  // the PIT on input 2
  EXPECT_EQ(isa_to_pin.count(2), 0u);
  for (int irq = 1; irq < 16; ++irq) {
    if (irq != 2) {
      EXPECT_EQ(isa_to_pin[irq], irq);
    }
  }
  EXPECT_EQ(extint, 1);
  EXPECT_EQ(nmi, 1);
}

TEST(MpTable, PciInterruptsAreLevelTriggeredOnBusZero) {
  MpTableConfig c;
  c.pci_bus = true;
  c.pci_interrupts = {{.device = 3, .pin = 1, .ioapic_pin = 11}, {.device = 4, .pin = 2, .ioapic_pin = 10}};
  auto b = build_mp_tables(c, 0x9fc00);
  Parsed p = parse(b, 0x9fc00);
  EXPECT_EQ(std::string(p.entries[1].begin() + 2, p.entries[1].end()), "PCI   ");
  EXPECT_EQ(p.entries[1][1], 0);
  EXPECT_EQ(p.entries[2][1], 1);  // ISA is bus 1
  int pci = 0;
  for (const auto& e : p.entries) {
    if (e[0] != 3) continue;
    if (e[4] == 1) {
      EXPECT_NE(e[7], 10) << "an input a PCI line drives has no ISA entry";
      EXPECT_NE(e[7], 11);
      continue;
    }
    ++pci;
    EXPECT_EQ(u16(e, 2), 0xdu);  // active high, level
    if (e[5] == (3 << 2)) {
      EXPECT_EQ(e[7], 11);
    } else if (e[5] == ((4 << 2) | 1)) {
      EXPECT_EQ(e[7], 10);
    } else {
      ADD_FAILURE() << "unexpected source " << int(e[5]);
    }
  }
  EXPECT_EQ(pci, 2);
}

TEST(MpTable, EveryProcessorIsListedTheBootstrapOneFirst) {
  MpTableConfig c;
  c.apic_ids = {0, 1, 2, 3};
  c.ioapic_id = 4;
  auto b = build_mp_tables(c, kMpFloatingPointerAddress);
  Parsed p = parse(b, kMpFloatingPointerAddress);
  ASSERT_GE(p.entries.size(), 6u);
  for (int i = 0; i < 4; ++i) {
    const auto& cpu = p.entries[i];
    EXPECT_EQ(cpu[0], 0);
    EXPECT_EQ(cpu[1], i);
    EXPECT_EQ(cpu[3], i == 0 ? 0x3 : 0x1);  // enabled; BSP only for the first
  }
  EXPECT_EQ(p.entries[4][0], 1);  // then the buses
  int extint_to = -1;
  for (const auto& e : p.entries) {
    if (e[0] == 3) {
      EXPECT_EQ(e[6], 4);  // the I/O APIC's ID
    }
    if (e[0] == 4 && e[1] == 3) extint_to = e[6];
  }
  EXPECT_EQ(extint_to, 0);  // the 8259A reaches the BSP's LINT0
}

}  // namespace
}  // namespace deja
