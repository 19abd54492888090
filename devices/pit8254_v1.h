// The 8254 PIT of device model 1, kept unchanged so that traces recorded with it replay exactly (the current PIT is pit8254.h).
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "devices/pit8254.h"

namespace deja {

// Device model 1's PIT: a count takes effect at the tick of its write, modes 2/3 restart at once on a
// new count, mode 3's odd counts are approximate, BCD counts in binary, and control-word OUT edges do not
// pulse IRQ0 (docs/devices.md lists what device model 2 changed). Tick math and save format as then.
// Otherwise it follows the Intel 8254 datasheet (order no. 231164): three channels, modes 0-5, lobyte/hibyte/
// lohi access, counter latch and read-back commands, gate semantics, status byte with NULL COUNT.
//
// Time: the 1.193182 MHz input clock is derived from the Clock's virtual ns with integer math,
// tick(ns) = ns * 1193182 / 1e9 (floor), so it never drifts. A channel's count and OUT are
// computed from the tick at which it was loaded, never by stepping.
//
// Simplifications, all documented in docs/devices.md:
// - The count register loads into the counting element at the tick of the write (silicon waits
//   for the next CLK edge, up to 838 ns later); NULL COUNT stays set until the next tick.
// - BCD mode is stored and reported in the status byte, but counting is binary.
// - Channel 0's OUT rising edges pulse IRQ0. advance(now) pulses once if one or more rising edges
//   happened since the last call: missed edges are coalesced into one pulse, as a PIC would latch
//   several edges between INTAs into one IRR bit anyway. Edges caused by writing a control word
//   (OUT returning high) do not pulse.
// - Gates of channels 0 and 1 are tied high, as on the PC; channel 2's comes from port 0x61.
class Pit8254V1 : public PitChannels {
 public:
  Pit8254V1(Clock& clock, IrqLine irq0);

  std::string_view name() const override { return "pit8254"; }
  void read(uint64_t offset, std::span<uint8_t> data) override;
  void write(uint64_t offset, std::span<const uint8_t> data) override;
  std::vector<uint8_t> save() const override;
  Result<> restore(std::span<const uint8_t> state) override;
  std::optional<uint64_t> next_deadline_ns() const override;
  void advance(uint64_t now_ns) override;

  void set_gate(unsigned channel, bool level) override;
  bool gate(unsigned channel) const override;
  bool out(unsigned channel) override;
  Clock& clock() override { return clock_; }

 private:
  struct Channel {
    uint8_t mode = 0;        // 0..5
    uint8_t access = 3;      // 1 = lobyte, 2 = hibyte, 3 = lobyte then hibyte
    bool bcd = false;
    uint16_t count_register = 0;  // as written; 0 means 65536
    uint16_t counting_count = 0;  // the value the counting element was last loaded with
    bool write_high_next = false;  // lohi: the next write is the high byte
    bool read_high_next = false;   // lohi: the next read is the high byte
    bool loaded = false;           // a count was written since the control word
    bool triggered = false;        // modes 1/5: a gate rising edge started the count
    bool gate = true;
    bool count_latched = false;
    uint16_t latched_count = 0;
    bool latched_read_high_next = false;
    bool status_latched = false;
    uint8_t latched_status = 0;
    uint64_t anchor_tick = 0;  // tick when `counted_before_anchor` was last brought up to date
    uint64_t counted_before_anchor = 0;
    uint64_t load_tick = 0;    // tick of the last count write (NULL COUNT until the next tick)
    bool null_count = true;

    uint32_t reload() const { return counting_count == 0 ? 65536u : counting_count; }
    bool counting() const;
    uint64_t counted(uint64_t tick) const;
    void settle(uint64_t tick);
    bool out_at(uint64_t tick) const;
    uint16_t count_at(uint64_t tick) const;
    uint8_t status_at(uint64_t tick) const;
    // Rising OUT edges in the counted range (from, to], and the counted value of the next one.
    uint64_t rising_edges(uint64_t from, uint64_t to) const;
    std::optional<uint64_t> next_rising_edge(uint64_t after) const;
  };

  uint64_t now_tick() { return Pit8254::ticks_at(clock_.now_ns()); }
  void write_control(uint8_t value, uint64_t tick);
  void write_counter(Channel& ch, uint8_t value, uint64_t tick);
  uint8_t read_counter(Channel& ch, uint64_t tick);
  void latch_count(Channel& ch, uint64_t tick);
  // Edges of channel 0 up to `tick` are considered delivered.
  void mark_irq_delivered(uint64_t tick);

  Clock& clock_;
  IrqLine irq0_;
  std::array<Channel, 3> channels_;
  uint64_t irq_checked_tick_ = 0;  // channel 0 edges up to this tick have been pulsed
};

}  // namespace deja
