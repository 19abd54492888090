// The I/O APIC (Intel 82093AA) at 0xFEC00000: 24 redirection entries routing ISA IRQs and PCI INTx lines to the local APIC.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "devices/device.h"
#include "devices/interrupts.h"

namespace deja {

// Follows the Intel 82093AA I/O APIC datasheet (order no. 290566): IOREGSEL at offset 0x00 and
// IOWIN at 0x10; registers IOAPICID (bits 27:24), IOAPICVER (0x00170011: version 0x11, 24
// entries), IOAPICARB (loaded from the ID), and the 64-bit redirection entries 0x10-0x3F.
//
// Input pins take logical levels (true = asserted), as devices drive their IrqLine; the polarity
// bit is stored and reported but not applied, because the MP table tells the OS every line is
// active high (QEMU's I/O APIC ignores it the same way). Edge-triggered pins deliver on a rising
// edge while unmasked; an edge on a masked pin is lost. Level-triggered pins deliver while
// asserted, unmasked and Remote IRR clear; Remote IRR is set when the local APIC accepts and
// cleared by its EOI broadcast for the entry's vector (then a still-asserted line delivers again)
// or by rewriting the entry as edge-triggered (the workaround Linux uses on this chip, which has
// no EOI register). Delivery is immediate, so Delivery Status always reads 0.
class IoApic : public Device, public IrqSink, public EoiListener {
 public:
  static constexpr uint64_t kBase = 0xfec00000;
  static constexpr uint64_t kMmioSize = 0x1000;
  static constexpr unsigned kPins = 24;
  static constexpr uint32_t kVersion = 0x00170011;

  IoApic(ApicBus& bus, uint8_t id);

  std::string_view name() const override { return "ioapic"; }
  void read(uint64_t offset, std::span<uint8_t> data) override;
  void write(uint64_t offset, std::span<const uint8_t> data) override;
  std::vector<uint8_t> save() const override;
  Result<> restore(std::span<const uint8_t> state) override;

  // IrqSink: pin `line` (INTIN0-23) driven to `level`.
  void set_irq(unsigned line, bool level) override;
  // EoiListener: the local APIC's EOI for a level-triggered `vector`.
  void end_of_interrupt(uint8_t vector) override;

  uint64_t entry(unsigned pin) const { return redirection_[pin]; }

 private:
  uint32_t read_register(uint8_t index) const;
  void write_register(uint8_t index, uint32_t value);
  // Sends pin's message if the pin is due (level: asserted, unmasked, Remote IRR clear).
  void service(unsigned pin);
  void send(unsigned pin);

  ApicBus& bus_;
  uint8_t id_;
  uint8_t select_ = 0;  // IOREGSEL
  std::array<uint64_t, kPins> redirection_{};
  uint32_t levels_ = 0;  // current input levels, one bit per pin
};

}  // namespace deja
