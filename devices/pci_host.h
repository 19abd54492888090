// The PCI host bridge: configuration mechanism #1 (ports 0xCF8-0xCFF), bus 0's functions, BAR mapping and INTx routing.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "devices/bus.h"
#include "devices/device.h"
#include "devices/pci_function.h"

namespace deja {

// The i440FX's host bridge function at 00:00.0 (vendor 8086, device 1237, class 0600): Linux's conf1 sanity check
// looks for a host bridge (or an Intel/Compaq function) on bus 0.
class PciHostBridgeFunction : public PciFunction {
 public:
  PciHostBridgeFunction();
  std::string_view name() const override { return "pci-host-bridge"; }
};

// Configuration mechanism #1 (PCI Local Bus 3.0, 3.2.2.3.2), one bus, single-function devices:
//   - CONFIG_ADDRESS is the dword at 0xCF8: enable bit 31, bus 23:16, device 15:11, function 10:8, register 7:2;
//     reserved bits 30:24 and 1:0 read as 0. Byte and word accesses to 0xCF8-0xCFB are not CONFIG_ADDRESS: reads
//     give all ones and writes are ignored (Linux's type-1 probe writes a byte to 0xCFB first; 0xCF9, the PIIX
//     reset control register, is not modelled).
//   - CONFIG_DATA is 0xCFC-0xCFF: a byte, word or dword access at 0xCFC + n reaches register (CONFIG_ADDRESS &
//     0xFC) + n. With the enable bit clear, or for another bus, an empty slot or a function other than 0, reads
//     give all ones and writes are ignored (master abort).
// The host maps each function's BARs on the port or MMIO bus at the address the guest programs, while the
// function's command register enables decoding; an address that overlaps another mapping is not decoded (and
// counted). INTx: each slot's pin drives the ISA IRQ line the builder wired it to, level-triggered and shared
// (wired-OR), into `irqs` (the 8259A pair, and the I/O APIC on pc-apic).
class PciHost : public Device {
 public:
  static constexpr uint16_t kConfigAddressPort = 0xcf8;
  static constexpr uint64_t kPortCount = 8;
  static constexpr unsigned kSlots = 32;

  PciHost(Bus& pio, Bus& mmio, IrqSink& irqs);
  ~PciHost() override;

  // Puts `function` at device `slot` (1-31; 0 is the host bridge) with INTx wired to ISA line `irq` (its Interrupt
  // Line register names it at reset, as firmware would leave it). Maps its BARs if they are already enabled.
  Result<> attach(unsigned slot, PciFunction& function, uint8_t irq);

  std::string_view name() const override { return "pci-host"; }
  void read(uint64_t offset, std::span<uint8_t> data) override;
  void write(uint64_t offset, std::span<const uint8_t> data) override;
  // CONFIG_ADDRESS and the host bridge function's configuration space.
  std::vector<uint8_t> save() const override;
  Result<> restore(std::span<const uint8_t> state) override;

  // Called by functions: decoding or a BAR changed (re-map), and the INTx output changed.
  void update_mappings(PciFunction& function);
  void set_intx(PciFunction& function, bool level);
  // A checkpoint restore: the line's level is the interrupt controller's restored state already.
  void restore_intx(PciFunction& function, bool level);

  PciFunction* function(unsigned slot) const { return slot < kSlots ? slots_[slot].function : nullptr; }
  uint32_t config_address() const { return config_address_; }
  // BAR placements refused because they overlapped another mapping (for --stats and tests).
  uint64_t refused_mappings() const { return refused_mappings_; }
  // The ISA line `slot` raises.
  uint8_t irq_of(unsigned slot) const { return slots_[slot].irq; }

 private:
  // A mapped BAR as a bus device: forwards accesses to its function.
  class BarWindow : public Device {
   public:
    BarWindow(PciFunction& function, unsigned bar) : function_(function), bar_(bar) {}
    std::string_view name() const override { return function_.name(); }
    void read(uint64_t offset, std::span<uint8_t> data) override { function_.bar_read(bar_, offset, data); }
    void write(uint64_t offset, std::span<const uint8_t> data) override { function_.bar_write(bar_, offset, data); }
    std::vector<uint8_t> save() const override { return {}; }
    Result<> restore(std::span<const uint8_t>) override { return {}; }

   private:
    PciFunction& function_;
    unsigned bar_;
  };
  struct Mapping {
    Bus* bus = nullptr;
    uint64_t base = 0;
  };
  struct Slot {
    PciFunction* function = nullptr;
    uint8_t irq = 0;
    std::array<std::unique_ptr<BarWindow>, pci::kBarCount> windows;
    std::array<std::optional<Mapping>, pci::kBarCount> mapped;
  };
  PciFunction* addressed() const;
  void data_read(unsigned reg, std::span<uint8_t> data);
  void data_write(unsigned reg, std::span<const uint8_t> data);
  void drive_line(uint8_t irq);

  Bus& pio_;
  Bus& mmio_;
  IrqSink& irqs_;
  PciHostBridgeFunction bridge_;
  std::array<Slot, kSlots> slots_{};
  std::array<uint32_t, 16> asserted_slots_{};  // per ISA line: the slots driving it (wired-OR)
  uint32_t config_address_ = 0;
  uint64_t refused_mappings_ = 0;
};

}  // namespace deja
