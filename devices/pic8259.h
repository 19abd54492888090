// The PC's two cascaded Intel 8259A interrupt controllers (master 0x20, slave 0xa0 on IRQ2) + ELCR.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "devices/device.h"

namespace deja {

// Behaviour follows the Intel 8259A datasheet (order no. 231468): ICW1-ICW4, OCW1-OCW3, fully
// nested priority with rotation, special mask mode, poll command, auto-EOI, cascade on IR2.
//
// Trigger modes: a line is edge-triggered unless ICW1.LTIM or its ELCR bit (ports 0x4d0/0x4d1,
// as on the PIIX; reserved bits 0-2 of the master and 0,5 of the slave read as 0) makes it level
// triggered. Edge mode latches a rising edge into IRR and, unlike silicon, keeps it latched when
// the line falls again: devices here may pulse() a line, which silicon would drop. A request
// still "goes away" before INTA in two ways, and INTA then returns the spurious vector
// (base+7 of the chip that lost it, IRQ15's with the master's IR2 ISR bit set, as on hardware):
// the guest masks it in IMR, or a level-triggered line falls.
class PicPair : public IrqSink {
 public:
  PicPair();

  // The IrqSink side: ISA IRQ 0-7 on the master, 8-15 on the slave.
  void set_irq(unsigned line, bool level) override;

  Device& master_ports() { return master_ports_; }
  Device& slave_ports() { return slave_ports_; }
  Device& elcr_ports() { return elcr_ports_; }

  // The master's INTR output.
  bool interrupt_pending() const;
  // The two INTA cycles: the vector the CPU receives. Sets ISR bits (unless auto-EOI).
  uint8_t acknowledge();

  // Both chips' complete state (the three adapter Devices carry none of their own).
  std::vector<uint8_t> save() const;
  Result<> restore(std::span<const uint8_t> state);

 private:
  struct Chip {
    uint8_t irr = 0;
    uint8_t isr = 0;
    uint8_t imr = 0;
    uint8_t line_levels = 0;   // current input levels, for edge detection
    uint8_t elcr = 0;          // level-triggered lines (ELCR)
    uint8_t elcr_mask = 0;     // which ELCR bits exist
    uint8_t vector_base = 0;   // ICW2 & 0xf8
    uint8_t icw3 = 0;
    uint8_t init_step = 0;     // 0 = operational, 2..4 = the next ICW expected
    uint8_t priority_add = 0;  // the IR with the highest priority (rotation)
    bool icw4_needed = false;
    bool single = false;
    bool ltim = false;
    bool auto_eoi = false;
    bool rotate_on_auto_eoi = false;
    bool special_fully_nested = false;
    bool mode_8086 = false;
    uint8_t icw4_buffer_bits = 0;  // BUF, M/S: stored only
    bool special_mask = false;
    bool read_isr = false;
    bool poll = false;

    uint8_t level_triggered() const { return ltim ? 0xff : elcr; }
    // Highest-priority pending IR that the ISR does not block, or -1.
    int pending_irq(bool is_master) const;
    void set_line(unsigned ir, bool level);
    void acknowledge_ir(int ir);  // INTA for IR `ir`: ISR, IRR, auto-EOI
    void write_command(uint8_t value);
    void write_data(uint8_t value);
    uint8_t read(uint64_t offset, bool is_master);
    uint8_t poll_read(bool is_master);
    void non_specific_eoi(bool rotate);
  };

  class ChipPorts : public Device {
   public:
    ChipPorts(PicPair& pair, bool is_master) : pair_(pair), is_master_(is_master) {}
    std::string_view name() const override { return is_master_ ? "pic-master" : "pic-slave"; }
    void read(uint64_t offset, std::span<uint8_t> data) override;
    void write(uint64_t offset, std::span<const uint8_t> data) override;
    std::vector<uint8_t> save() const override { return {}; }
    Result<> restore(std::span<const uint8_t> state) override;

   private:
    PicPair& pair_;
    bool is_master_;
  };

  class ElcrPorts : public Device {
   public:
    explicit ElcrPorts(PicPair& pair) : pair_(pair) {}
    std::string_view name() const override { return "pic-elcr"; }
    void read(uint64_t offset, std::span<uint8_t> data) override;
    void write(uint64_t offset, std::span<const uint8_t> data) override;
    std::vector<uint8_t> save() const override { return {}; }
    Result<> restore(std::span<const uint8_t> state) override;

   private:
    PicPair& pair_;
  };

  // The slave's INTR drives the master's IR2.
  void update_cascade();
  bool cascaded() const { return !master_.single; }

  Chip master_;
  Chip slave_;
  ChipPorts master_ports_{*this, true};
  ChipPorts slave_ports_{*this, false};
  ElcrPorts elcr_ports_{*this};
};

}  // namespace deja
