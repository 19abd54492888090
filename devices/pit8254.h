// Intel 8254 programmable interval timer (ports 0x40-0x43) and PC system control port B (0x61).
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "devices/device.h"

namespace deja {

// What port 0x61 and the machine need of a PIT, whichever device model's it is (pit8254_v1.h keeps model 1's).
class PitChannels : public Device {
 public:
  // The GATE input of `channel` (port 0x61 drives channel 2's) and the OUT output, now.
  virtual void set_gate(unsigned channel, bool level) = 0;
  virtual bool gate(unsigned channel) const = 0;
  virtual bool out(unsigned channel) = 0;
  // The virtual clock the PIT counts from (port 0x61's refresh toggle shares it).
  virtual Clock& clock() = 0;
};

// Follows the Intel 8254 datasheet (order no. 231164): three channels, modes 0-5 (6 and 7 alias 2
// and 3), lobyte/hibyte/lohi access, counter latch and read-back commands, the status byte with
// NULL COUNT, gate semantics per mode, binary and BCD counting.
//
// Time: the 1.193182 MHz input clock is derived from the Clock's virtual ns with integer math,
// tick(ns) = ns * 1193182 / 1e9 (floor), so it never drifts. A write happens between two CLK
// edges; the datasheet's "next CLK pulse" after a write at tick T is tick T+1. A channel's count and
// OUT are computed from the tick its counting element was loaded at, never by stepping.
//
// As the datasheet times it:
// - A count written in modes 0 and 4 (and the first count in modes 2 and 3) is loaded into the
//   counting element on the next CLK; until then the channel reads its previous count and NULL
//   COUNT is 1. So mode 0's OUT rises N+1 ticks after the write and mode 4 strobes OUT low N+1
//   ticks after it (for one tick), the "software retriggered strobe" Linux reprograms at every tick.
// - A new count written while modes 2 or 3 count is loaded at the end of the current period (mode
//   2) or half-cycle (mode 3); NULL COUNT stays 1 until then.
// - Mode 3 with an odd count N loads N-1, counts down by two, and holds OUT high one CLK longer:
//   high for (N+1)/2, low for (N-1)/2.
// - Mode 0: writing the first byte of a lohi count stops counting and drives OUT low.
// - Gates: modes 0 and 4 pause while low; in modes 2 and 3 a low gate stops counting and drives OUT
//   high, and a rising gate reloads on the next CLK; in modes 1 and 5 a rising gate triggers (the
//   count register loads on the next CLK).
// - A control word resets the channel: OUT goes low (mode 0) or high (the others), NULL COUNT is
//   1, the latches and byte flip-flops are cleared, and counting stops until a count is written.
//
// IRQ 0 is channel 0's OUT: every rising edge pulses it, including the one a control word causes
// when it drives a low OUT high. advance(now) pulses once if one or more rising edges happened
// since the last call: missed edges are coalesced into one pulse, as an edge-triggered PIC would
// latch them into one IRR bit anyway.
//
// Gates of channels 0 and 1 are tied high, as on the PC; channel 2's comes from port 0x61.
class Pit8254 : public PitChannels {
 public:
  static constexpr uint64_t kInputHz = 1193182;

  Pit8254(Clock& clock, IrqLine irq0);

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

  static uint64_t ticks_at(uint64_t ns);
  // The first ns at which ticks_at(ns) >= tick.
  static uint64_t ns_of_tick(uint64_t tick);

 private:
  static constexpr uint64_t kNever = UINT64_MAX;

  // A counting sequence: the counting element counts `reload` (1..65536, or 1..10000 in BCD), and at
  // `counted` CLKs since its load it is at position phase0 + counted of the mode's cycle.
  struct Channel {
    uint8_t mode = 0;             // 0..5 (the effective mode)
    uint8_t programmed_mode = 0;  // 0..7 as written, for the status byte
    uint8_t access = 3;           // 1 = lobyte, 2 = hibyte, 3 = lobyte then hibyte
    bool bcd = false;
    uint16_t count_register = 0;  // CR, as written; 0 means 65536 (10000 in BCD)
    bool write_high_next = false;  // lohi: the next write is the high byte
    bool read_high_next = false;   // lohi: the next read is the high byte
    bool count_latched = false;
    uint16_t latched_count = 0;
    bool status_latched = false;
    uint8_t latched_status = 0;
    bool gate = true;

    bool cr_valid = false;    // a count was written since the control word
    bool cr_waiting = false;  // CR written, waiting for a trigger or gate to load it (NULL COUNT)
    bool triggered = false;   // modes 1 and 5: a trigger loaded the counting element
    // Before load_tick (kNever: not loaded) the channel shows held_count and held_out.
    uint64_t load_tick = kNever;
    uint16_t held_count = 0;
    bool held_out = false;
    uint32_t reload = 0;
    uint32_t phase0 = 0;
    uint64_t anchor_tick = 0;  // ticks counted while enabled: counted_before_anchor + (tick - anchor)
    uint64_t counted_before_anchor = 0;
    // Modes 2 and 3: a count written while counting, taking over at `pending_at` CLKs counted.
    bool pending = false;
    uint32_t pending_reload = 0;
    uint32_t pending_phase0 = 0;
    uint64_t pending_at = 0;

    bool counting() const;
    uint64_t counted(uint64_t tick) const;
    // The regime (reload, position) `counted` CLKs into the sequence.
    std::pair<uint64_t, uint64_t> regime(uint64_t counted) const;
    uint32_t reload_of_register() const;
    void settle(uint64_t tick);
    bool out_at(uint64_t tick) const;
    uint16_t count_at(uint64_t tick) const;
    bool null_count_at(uint64_t tick) const;
    uint8_t status_at(uint64_t tick) const;
    std::optional<uint64_t> next_rise_counted(uint64_t after_counted) const;
    // The first tick after `after` at which OUT rises.
    std::optional<uint64_t> next_rise_tick(uint64_t after) const;
    // Loads the count register into the counting element on the next CLK after `tick`.
    void load_next_clk(uint64_t tick, bool out_until_then);
  };

  uint64_t now_tick() { return ticks_at(clock_.now_ns()); }
  void write_control(uint8_t value, uint64_t tick);
  void write_counter(unsigned index, uint8_t value, uint64_t tick);
  uint8_t read_counter(Channel& ch, uint64_t tick);
  void latch_count(Channel& ch, uint64_t tick);
  // Edges of channel 0 up to `tick` are considered delivered.
  void mark_irq_delivered(uint64_t tick);
  // Channel 0's OUT changed at `tick` without a CLK (control word, gate): a rise pulses IRQ 0.
  void out_changed(unsigned index, bool before, uint64_t tick);

  Clock& clock_;
  IrqLine irq0_;
  std::array<Channel, 3> channels_;
  uint64_t irq_checked_tick_ = 0;  // channel 0 edges up to this tick have been pulsed
};

// Port 0x61: bit 0 = channel 2 gate, bit 1 = speaker data enable, bits 2-3 = parity/IO check
// enables (stored); reads add bit 4 = refresh toggle (flips every 15.085 us of virtual time, as
// the DRAM refresh request did) and bit 5 = channel 2 OUT. Bits 6-7 (NMI sources) read 0.
class SystemControlPortB : public Device {
 public:
  static constexpr uint64_t kRefreshHalfPeriodNs = 15085;

  explicit SystemControlPortB(PitChannels& pit) : pit_(pit) {}

  std::string_view name() const override { return "port61"; }
  void read(uint64_t offset, std::span<uint8_t> data) override;
  void write(uint64_t offset, std::span<const uint8_t> data) override;
  std::vector<uint8_t> save() const override;
  Result<> restore(std::span<const uint8_t> state) override;

 private:
  PitChannels& pit_;
  uint8_t control_ = 0;
};

}  // namespace deja
