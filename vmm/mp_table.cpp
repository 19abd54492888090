// MP specification 1.4 table builder: entries in the order the specification requires, checksummed.
#include "vmm/mp_table.h"

#include <cstring>
#include <string_view>

namespace deja {
namespace {

class Bytes {
 public:
  void u8(uint8_t v) { b_.push_back(v); }
  void u16(uint16_t v) { le(v, 2); }
  void u32(uint32_t v) { le(v, 4); }
  void text(std::string_view s, size_t width) {
    for (size_t i = 0; i < width; ++i) b_.push_back(i < s.size() ? uint8_t(s[i]) : uint8_t(' '));
  }
  void zeros(size_t n) { b_.insert(b_.end(), n, 0); }
  size_t size() const { return b_.size(); }
  std::vector<uint8_t>& data() { return b_; }

 private:
  void le(uint64_t v, int n) {
    for (int i = 0; i < n; ++i) b_.push_back(uint8_t(v >> (8 * i)));
  }
  std::vector<uint8_t> b_;
};

// The byte that makes [from, from+len) sum to zero.
uint8_t checksum(const std::vector<uint8_t>& b, size_t from, size_t len) {
  uint8_t sum = 0;
  for (size_t i = from; i < from + len; ++i) sum = uint8_t(sum + b[i]);
  return uint8_t(-sum);
}

enum EntryType : uint8_t { kProcessor = 0, kBus = 1, kIoApic = 2, kIoInterrupt = 3, kLocalInterrupt = 4 };
enum InterruptType : uint8_t { kInt = 0, kNmi = 1, kExtInt = 3 };
// Interrupt flags: PO bits 1:0 (01 active high), EL bits 3:2 (11 level); 0 = conforming to the bus.
constexpr uint16_t kConforming = 0, kActiveHighLevel = 0x1 | (0x3 << 2);

void interrupt_entry(Bytes& t, EntryType type, InterruptType kind, uint16_t flags, uint8_t bus, uint8_t bus_irq,
                     uint8_t dest_apic, uint8_t dest_pin) {
  t.u8(type);
  t.u8(kind);
  t.u16(flags);
  t.u8(bus);
  t.u8(bus_irq);
  t.u8(dest_apic);
  t.u8(dest_pin);
}

}  // namespace

std::vector<uint8_t> build_mp_tables(const MpTableConfig& config, uint32_t address) {
  constexpr size_t kFloatingSize = 16, kHeaderSize = 44;
  Bytes t;
  // Floating pointer structure (MP spec 4.1).
  t.text("_MP_", 4);
  t.u32(address + kFloatingSize);  // the configuration table follows
  t.u8(1);                         // length in 16-byte units
  t.u8(4);                         // specification revision 1.4
  t.u8(0);                         // checksum, below
  t.u8(0);                         // feature byte 1: a configuration table is present
  t.u8(0);                         // feature byte 2: IMCRP clear = virtual-wire mode
  t.zeros(3);

  // Configuration table header (MP spec 4.2); length, count and checksum filled in below.
  size_t header = t.size();
  t.text("PCMP", 4);
  t.u16(0);
  t.u8(4);
  t.u8(0);
  t.text("DEJA", 8);
  t.text("PC-APIC", 12);
  t.u32(0);  // no OEM table
  t.u16(0);
  t.u16(0);  // entry count
  t.u32(config.lapic_address);
  t.u16(0);  // no extended entries
  t.u8(0);
  t.u8(0);
  uint16_t entries = 0;

  // Processors: enabled, the first the bootstrap processor.
  for (size_t i = 0; i < config.apic_ids.size(); ++i) {
    t.u8(kProcessor);
    t.u8(config.apic_ids[i]);
    t.u8(config.apic_version);
    t.u8(i == 0 ? 0x3 : 0x1);  // EN, and BP for the first
    t.u32(config.cpu_signature);
    t.u32(config.cpu_features);
    t.zeros(8);
    ++entries;
  }

  // Buses: PCI (when present) is bus 0, ISA the next.
  uint8_t isa_bus = config.pci_bus ? 1 : 0;
  if (config.pci_bus) {
    t.u8(kBus);
    t.u8(0);
    t.text("PCI", 6);
    ++entries;
  }
  t.u8(kBus);
  t.u8(isa_bus);
  t.text("ISA", 6);
  ++entries;

  t.u8(kIoApic);
  t.u8(config.ioapic_id);
  t.u8(config.ioapic_version);
  t.u8(0x1);  // enabled
  t.u32(config.ioapic_address);
  ++entries;

  // I/O interrupt assignments. ISA inputs a PCI line also drives are left to the PCI entry.
  auto used_by_pci = [&](uint8_t pin) {
    for (const auto& p : config.pci_interrupts) {
      if (p.ioapic_pin == pin) return true;
    }
    return false;
  };
  for (uint8_t irq = 0; irq < 16; ++irq) {
    if (irq == 2) continue;  // the cascade; input 2 carries IRQ 0
    uint8_t pin = irq == 0 ? 2 : irq;
    if (used_by_pci(pin)) continue;
    interrupt_entry(t, kIoInterrupt, kInt, kConforming, isa_bus, irq, config.ioapic_id, pin);
    ++entries;
  }
  for (const auto& p : config.pci_interrupts) {
    interrupt_entry(t, kIoInterrupt, kInt, kActiveHighLevel, 0, uint8_t((p.device << 2) | ((p.pin - 1) & 3)),
                    config.ioapic_id, p.ioapic_pin);
    ++entries;
  }
  // Local interrupts: the 8259A's INTR on the BSP's LINT0, NMI on every LINT1.
  interrupt_entry(t, kLocalInterrupt, kExtInt, kConforming, isa_bus, 0, config.apic_ids.at(0), 0);
  interrupt_entry(t, kLocalInterrupt, kNmi, kConforming, isa_bus, 0, 0xff, 1);
  entries += 2;

  auto& b = t.data();
  size_t table_length = b.size() - header;
  b[header + 4] = uint8_t(table_length);
  b[header + 5] = uint8_t(table_length >> 8);
  b[header + 34] = uint8_t(entries);
  b[header + 35] = uint8_t(entries >> 8);
  b[header + 7] = checksum(b, header, table_length);
  b[10] = checksum(b, 0, kFloatingSize);
  static_assert(kHeaderSize == 44);
  return std::move(b);
}

}  // namespace deja
