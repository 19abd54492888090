// Intel MultiProcessor Specification 1.4 tables for the APIC PC: the floating pointer and the configuration table.
#pragma once

#include <cstdint>
#include <vector>

namespace deja {

// A PCI device's INTx pin wired to an I/O APIC input (level-triggered, active high).
struct MpPciInterrupt {
  uint8_t device = 0;  // device number on bus 0
  uint8_t pin = 1;     // 1 = INTA# .. 4 = INTD#
  uint8_t ioapic_pin = 0;
};

struct MpTableConfig {
  // The processors' local APIC IDs, the bootstrap processor's first.
  std::vector<uint8_t> apic_ids = {0};
  uint8_t apic_version = 0x14;
  uint32_t cpu_signature = 0;  // CPUID.1:EAX
  uint32_t cpu_features = 0;   // CPUID.1:EDX
  uint32_t lapic_address = 0xfee00000;
  uint8_t ioapic_id = 1;
  uint8_t ioapic_version = 0x11;
  uint32_t ioapic_address = 0xfec00000;
  // ISA IRQ 0 (the PIT) reaches I/O APIC input 2; every other ISA IRQ but 2 reaches the input of its number.
  bool pci_bus = false;  // a PCI bus 0 exists (its devices' INTx follow)
  std::vector<MpPciInterrupt> pci_interrupts;
};

// Where the machine builder places them: the floating pointer at the start of the BIOS area (which
// the e820 map reports reserved), the configuration table right after it.
constexpr uint32_t kMpFloatingPointerAddress = 0xf0000;

// The floating pointer (16 bytes) followed by the configuration table, for placement at `address`
// (16-byte aligned, below 1 MiB), with both checksums. The table says: the processors (the BSP first, their
// LAPICs at lapic_address), the buses, one I/O APIC, the ISA interrupts (conforming: edge, active
// high) and PCI ones (level, active high), and the 8259A's INTR on LINT0 as ExtINT and NMI on
// LINT1, in virtual-wire mode (no IMCR).
std::vector<uint8_t> build_mp_tables(const MpTableConfig& config, uint32_t address);

}  // namespace deja
