// 8254 PIT: counts and OUT computed from virtual ticks; control/read-back decoding; port 0x61.
#include "devices/pit8254.h"

#include <algorithm>

#include "devices/state_codec.h"

namespace deja {

uint64_t Pit8254::ticks_at(uint64_t ns) {
  return uint64_t((unsigned __int128)ns * kInputHz / 1000000000u);
}

uint64_t Pit8254::ns_of_tick(uint64_t tick) {
  return uint64_t(((unsigned __int128)tick * 1000000000u + kInputHz - 1) / kInputHz);
}

namespace {

// BCD: digits as written (an invalid digit counts as its value, the datasheet leaves it undefined).
uint32_t from_bcd(uint16_t v) { return (v >> 12) * 1000u + ((v >> 8) & 0xf) * 100u + ((v >> 4) & 0xf) * 10u + (v & 0xf); }
uint16_t to_bcd(uint32_t v) {
  return uint16_t((v / 1000 % 10) << 12 | (v / 100 % 10) << 8 | (v / 10 % 10) << 4 | (v % 10));
}

// OUT at position p of a cycle of reload n (modes 1 and 5 only once triggered).
bool out_at_position(uint8_t mode, uint64_t n, uint64_t p) {
  switch (mode) {
    case 0:
    case 1: return p >= n;
    case 2: return n < 2 || p % n != n - 1;  // low for the one CLK at count 1
    case 3: return p % n < (n + 1) / 2;      // high for (N+1)/2, low for N/2 (rounded down)
    default: return p != n;                  // 4, 5: low for the one CLK at count 0
  }
}

// The first position at or after p_min at which OUT rises.
std::optional<uint64_t> first_rise_position(uint8_t mode, uint64_t n, uint64_t p_min) {
  switch (mode) {
    case 0:
    case 1:
      if (n >= p_min) return n;
      return std::nullopt;
    case 2:
    case 3: {
      if (n < 2) return std::nullopt;  // counts of 1 are illegal in these modes; OUT stays high
      uint64_t k = std::max<uint64_t>(1, (p_min + n - 1) / n);
      return k * n;
    }
    default:
      if (n + 1 >= p_min) return n + 1;
      return std::nullopt;
  }
}

}  // namespace

uint32_t Pit8254::Channel::reload_of_register() const {
  if (bcd) return count_register == 0 ? 10000 : from_bcd(count_register);
  return count_register == 0 ? 65536u : count_register;
}

bool Pit8254::Channel::counting() const {
  if (load_tick == kNever) return false;
  if (mode == 1 || mode == 5) return triggered;  // the gate only triggers these modes
  return gate;
}

uint64_t Pit8254::Channel::counted(uint64_t tick) const {
  return counted_before_anchor + (counting() && tick > anchor_tick ? tick - anchor_tick : 0);
}

std::pair<uint64_t, uint64_t> Pit8254::Channel::regime(uint64_t c) const {
  if (pending && c >= pending_at) return {pending_reload, pending_phase0 + (c - pending_at)};
  return {reload, phase0 + c};
}

void Pit8254::Channel::settle(uint64_t tick) {
  if (load_tick == kNever || tick < load_tick) return;
  counted_before_anchor = counted(tick);
  anchor_tick = std::max(anchor_tick, tick);
  if (pending && counted_before_anchor >= pending_at) {
    counted_before_anchor -= pending_at;
    reload = pending_reload;
    phase0 = pending_phase0;
    pending = false;
  }
}

void Pit8254::Channel::load_next_clk(uint64_t tick, bool out_until_then) {
  held_count = count_at(tick);
  held_out = out_until_then;
  load_tick = tick + 1;
  anchor_tick = tick + 1;
  counted_before_anchor = 0;
  reload = reload_of_register();
  phase0 = 0;
  pending = false;
  cr_waiting = false;
}

bool Pit8254::Channel::out_at(uint64_t tick) const {
  if ((mode == 2 || mode == 3) && !gate) return true;
  if (load_tick == kNever || tick < load_tick) return held_out;
  auto [n, p] = regime(counted(tick));
  return out_at_position(mode, n, p);
}

uint16_t Pit8254::Channel::count_at(uint64_t tick) const {
  if (load_tick == kNever || tick < load_tick) return held_count;
  auto [n, p] = regime(counted(tick));
  uint64_t modulus = bcd ? 10000 : 65536;
  uint64_t v;
  switch (mode) {
    case 2:
      v = n - p % n;
      break;
    case 3: {
      // Even N: N, N-2, ..., 2 in each half. Odd N: N-1, N-3, ..., 0 in the high half (one CLK
      // longer), then N-1, ..., 2 in the low half.
      uint64_t q = p % n;
      if (n % 2 == 0) {
        v = n - 2 * (q < n / 2 ? q : q - n / 2);
      } else {
        uint64_t high = (n + 1) / 2;
        v = n - 1 - 2 * (q < high ? q : q - high);
      }
      break;
    }
    default:  // modes 0, 1, 4, 5 count on through zero and wrap
      v = (n + modulus - p % modulus) % modulus;
      break;
  }
  v %= modulus;
  return bcd ? to_bcd(uint32_t(v)) : uint16_t(v);
}

bool Pit8254::Channel::null_count_at(uint64_t tick) const {
  if (!cr_valid || cr_waiting) return true;
  if (load_tick == kNever || tick < load_tick) return true;
  return pending && counted(tick) < pending_at;
}

uint8_t Pit8254::Channel::status_at(uint64_t tick) const {
  return uint8_t((out_at(tick) ? 0x80 : 0) | (null_count_at(tick) ? 0x40 : 0) | (access << 4) |
                 (programmed_mode << 1) | (bcd ? 1 : 0));
}

std::optional<uint64_t> Pit8254::Channel::next_rise_counted(uint64_t after) const {
  // Rises at counted values c in (max(after, start), end) of a regime starting at `start`.
  auto in_regime = [&](uint64_t n, uint64_t p0, uint64_t start, std::optional<uint64_t> end) -> std::optional<uint64_t> {
    uint64_t from = std::max(after, start) + 1;
    auto p = first_rise_position(mode, n, p0 + (from - start));
    if (!p) return std::nullopt;
    uint64_t c = start + (*p - p0);
    if (end && c >= *end) return std::nullopt;
    return c;
  };
  if (!pending) return in_regime(reload, phase0, 0, std::nullopt);
  if (auto c = in_regime(reload, phase0, 0, pending_at)) return c;
  if (pending_at > after && !out_at_position(mode, reload, phase0 + pending_at - 1) &&
      out_at_position(mode, pending_reload, pending_phase0)) {
    return pending_at;  // the period ends and the new count starts with OUT high
  }
  return in_regime(pending_reload, pending_phase0, pending_at, std::nullopt);
}

std::optional<uint64_t> Pit8254::Channel::next_rise_tick(uint64_t after) const {
  if (load_tick == kNever) return std::nullopt;
  uint64_t after_counted = 0;
  if (after < load_tick) {
    // The load itself can raise OUT (held low until the counting element takes the count).
    if (!out_at(load_tick - 1) && out_at(load_tick)) return load_tick;
  } else {
    after_counted = counted(after);
  }
  if (!counting()) return std::nullopt;
  auto c = next_rise_counted(after_counted);
  if (!c) return std::nullopt;
  return anchor_tick + (*c - counted_before_anchor);
}

Pit8254::Pit8254(Clock& clock, IrqLine irq0) : clock_(clock), irq0_(irq0) {
  // Port 0x61 resets to 0 on a PC, so channel 2 starts with its gate low.
  channels_[2].gate = false;
}

void Pit8254::mark_irq_delivered(uint64_t tick) {
  if (tick <= irq_checked_tick_) return;
  auto edge = channels_[0].next_rise_tick(irq_checked_tick_);
  if (edge && *edge <= tick) irq0_.pulse();
  irq_checked_tick_ = tick;
}

void Pit8254::out_changed(unsigned index, bool before, uint64_t tick) {
  if (index == 0 && !before && channels_[0].out_at(tick)) irq0_.pulse();
}

std::optional<uint64_t> Pit8254::next_deadline_ns() const {
  auto edge = channels_[0].next_rise_tick(irq_checked_tick_);
  if (!edge) return std::nullopt;
  return ns_of_tick(*edge);
}

void Pit8254::advance(uint64_t now_ns) { mark_irq_delivered(ticks_at(now_ns)); }

void Pit8254::write_control(uint8_t value, uint64_t tick) {
  unsigned select = value >> 6;
  if (select == 3) {  // read-back: bit 5 = !COUNT, bit 4 = !STATUS, bits 3..1 = channels 2..0
    for (unsigned i = 0; i < 3; ++i) {
      if (!(value & (2u << i))) continue;
      Channel& ch = channels_[i];
      if (!(value & 0x20)) latch_count(ch, tick);
      if (!(value & 0x10) && !ch.status_latched) {
        ch.latched_status = ch.status_at(tick);
        ch.status_latched = true;
      }
    }
    return;
  }
  Channel& ch = channels_[select];
  uint8_t access = (value >> 4) & 3;
  if (access == 0) {
    latch_count(ch, tick);
    return;
  }
  bool before = ch.out_at(tick);
  uint8_t mode = (value >> 1) & 7;
  ch.held_count = ch.count_at(tick);  // the counting element keeps its value until a count loads
  ch.programmed_mode = mode;
  ch.mode = mode > 5 ? uint8_t(mode - 4) : mode;  // 6 and 7 are aliases of 2 and 3
  ch.access = access;
  ch.bcd = value & 1;
  ch.held_out = ch.mode != 0;  // the control word sets OUT low in mode 0, high in the others
  ch.load_tick = kNever;
  ch.cr_valid = false;
  ch.cr_waiting = false;
  ch.triggered = false;
  ch.pending = false;
  ch.counted_before_anchor = 0;
  ch.anchor_tick = tick;
  ch.write_high_next = false;
  ch.read_high_next = false;
  ch.count_latched = false;  // a latch is held "until read or the counter is reprogrammed"
  ch.status_latched = false;
  out_changed(select, before, tick);
}

void Pit8254::write_counter(unsigned index, uint8_t value, uint64_t tick) {
  Channel& ch = channels_[index];
  switch (ch.access) {
    case 1:
      ch.count_register = value;
      break;
    case 2:
      ch.count_register = uint16_t(value << 8);
      break;
    default:
      if (!ch.write_high_next) {
        ch.count_register = uint16_t((ch.count_register & 0xff00) | value);
        ch.write_high_next = true;
        if (ch.mode == 0) {
          // Mode 0: the first byte stops counting and drives OUT low (datasheet).
          ch.settle(tick);
          ch.held_count = ch.count_at(tick);
          ch.held_out = false;
          ch.load_tick = kNever;
          ch.pending = false;
        }
        return;
      }
      ch.count_register = uint16_t((ch.count_register & 0x00ff) | (value << 8));
      ch.write_high_next = false;
      break;
  }
  ch.settle(tick);
  ch.cr_valid = true;
  switch (ch.mode) {
    case 0:
      ch.load_next_clk(tick, false);  // OUT low until terminal count
      break;
    case 4:
      ch.load_next_clk(tick, ch.out_at(tick));  // retriggers: the strobe comes N+1 CLKs from now
      break;
    case 2:
    case 3: {
      if (ch.load_tick == kNever || tick < ch.load_tick) {
        ch.load_next_clk(tick, true);  // not counting yet: the first count loads on the next CLK
        break;
      }
      if (!ch.gate) {
        ch.cr_waiting = true;  // loaded by the next rising gate
        break;
      }
      // Counting: the new count takes over at the end of the current period (mode 2) or
      // half-cycle (mode 3).
      uint64_t c = ch.counted(tick);
      uint64_t n = ch.reload;
      uint64_t p = ch.phase0 + c;
      uint64_t q = p % n;
      uint32_t next = ch.reload_of_register();
      uint64_t boundary;
      uint32_t next_phase0 = 0;
      if (ch.mode == 2) {
        boundary = p - q + n;
      } else if (q < (n + 1) / 2) {
        boundary = p - q + (n + 1) / 2;  // end of the high half: the new count starts low
        next_phase0 = (next + 1) / 2;
      } else {
        boundary = p - q + n;  // end of the low half: the new count starts high
      }
      ch.pending = true;
      ch.pending_reload = next;
      ch.pending_phase0 = next_phase0;
      ch.pending_at = boundary - ch.phase0;
      break;
    }
    default:  // 1, 5: loaded by the next trigger; a running one-shot is not disturbed
      ch.cr_waiting = true;
      break;
  }
}

void Pit8254::latch_count(Channel& ch, uint64_t tick) {
  if (ch.count_latched) return;  // a second latch before the first is read is ignored
  ch.latched_count = ch.count_at(tick);
  ch.count_latched = true;
}

uint8_t Pit8254::read_counter(Channel& ch, uint64_t tick) {
  if (ch.status_latched) {
    ch.status_latched = false;
    return ch.latched_status;
  }
  uint16_t value = ch.count_latched ? ch.latched_count : ch.count_at(tick);
  bool high;
  bool last_byte;
  switch (ch.access) {
    case 1: high = false; last_byte = true; break;
    case 2: high = true; last_byte = true; break;
    default:
      high = ch.read_high_next;
      ch.read_high_next = !ch.read_high_next;
      last_byte = high;
      break;
  }
  if (last_byte) ch.count_latched = false;
  return high ? uint8_t(value >> 8) : uint8_t(value);
}

void Pit8254::read(uint64_t offset, std::span<uint8_t> data) {
  uint64_t tick = now_tick();
  for (size_t i = 0; i < data.size(); ++i) {
    uint64_t port = (offset + i) & 3;
    // The control word register is write-only.
    data[i] = port == 3 ? 0xff : read_counter(channels_[port], tick);
  }
}

void Pit8254::write(uint64_t offset, std::span<const uint8_t> data) {
  uint64_t tick = now_tick();
  // Edges produced by the old programming are delivered before it changes.
  mark_irq_delivered(tick);
  for (size_t i = 0; i < data.size(); ++i) {
    uint64_t port = (offset + i) & 3;
    if (port == 3) {
      write_control(data[i], tick);
    } else {
      write_counter(unsigned(port), data[i], tick);
    }
  }
}

void Pit8254::set_gate(unsigned channel, bool level) {
  DEJA_ASSERT(channel < 3, "8254 channel {} does not exist", channel);
  Channel& ch = channels_[channel];
  if (ch.gate == level) return;
  uint64_t tick = now_tick();
  mark_irq_delivered(tick);
  bool before = ch.out_at(tick);
  ch.settle(tick);  // counted up to now under the old gate
  ch.gate = level;
  if (level && ch.cr_valid) {
    switch (ch.mode) {
      case 1:
      case 5:
        ch.load_next_clk(tick, before);  // mode 1: OUT goes low on that CLK
        ch.triggered = true;
        break;
      case 2:
      case 3:
        ch.load_next_clk(tick, true);  // a rising gate reloads from the count register
        break;
      default:
        break;  // modes 0 and 4 resume where they stopped
    }
  }
  out_changed(channel, before, tick);
}

bool Pit8254::gate(unsigned channel) const {
  DEJA_ASSERT(channel < 3, "8254 channel {} does not exist", channel);
  return channels_[channel].gate;
}

bool Pit8254::out(unsigned channel) {
  DEJA_ASSERT(channel < 3, "8254 channel {} does not exist", channel);
  return channels_[channel].out_at(now_tick());
}

namespace {
constexpr char kPitTag[] = "PIT4";
constexpr uint8_t kPitVersion = 2;
}  // namespace

std::vector<uint8_t> Pit8254::save() const {
  StateWriter w(kPitTag, kPitVersion);
  w.u64(irq_checked_tick_);
  for (const Channel& ch : channels_) {
    w.u8(ch.mode);
    w.u8(ch.programmed_mode);
    w.u8(ch.access);
    w.boolean(ch.bcd);
    w.u16(ch.count_register);
    w.boolean(ch.write_high_next);
    w.boolean(ch.read_high_next);
    w.boolean(ch.count_latched);
    w.u16(ch.latched_count);
    w.boolean(ch.status_latched);
    w.u8(ch.latched_status);
    w.boolean(ch.gate);
    w.boolean(ch.cr_valid);
    w.boolean(ch.cr_waiting);
    w.boolean(ch.triggered);
    w.u64(ch.load_tick);
    w.u16(ch.held_count);
    w.boolean(ch.held_out);
    w.u32(ch.reload);
    w.u32(ch.phase0);
    w.u64(ch.anchor_tick);
    w.u64(ch.counted_before_anchor);
    w.boolean(ch.pending);
    w.u32(ch.pending_reload);
    w.u32(ch.pending_phase0);
    w.u64(ch.pending_at);
  }
  return w.take();
}

Result<> Pit8254::restore(std::span<const uint8_t> state) {
  StateReader r(state, kPitTag, kPitVersion);
  uint64_t irq_checked = r.u64();
  std::array<Channel, 3> channels;
  for (unsigned i = 0; i < 3; ++i) {
    Channel& ch = channels[i];
    ch.mode = r.u8();
    ch.programmed_mode = r.u8();
    ch.access = r.u8();
    ch.bcd = r.boolean();
    ch.count_register = r.u16();
    ch.write_high_next = r.boolean();
    ch.read_high_next = r.boolean();
    ch.count_latched = r.boolean();
    ch.latched_count = r.u16();
    ch.status_latched = r.boolean();
    ch.latched_status = r.u8();
    ch.gate = r.boolean();
    ch.cr_valid = r.boolean();
    ch.cr_waiting = r.boolean();
    ch.triggered = r.boolean();
    ch.load_tick = r.u64();
    ch.held_count = r.u16();
    ch.held_out = r.boolean();
    ch.reload = r.u32();
    ch.phase0 = r.u32();
    ch.anchor_tick = r.u64();
    ch.counted_before_anchor = r.u64();
    ch.pending = r.boolean();
    ch.pending_reload = r.u32();
    ch.pending_phase0 = r.u32();
    ch.pending_at = r.u64();
    if (!r.ok()) break;
    if (ch.mode > 5) r.invalid(fmt::format("channel {} mode {} does not exist", i, ch.mode));
    if (ch.programmed_mode > 7 || (ch.programmed_mode > 5 ? ch.programmed_mode - 4 : ch.programmed_mode) != ch.mode) {
      r.invalid(fmt::format("channel {} programmed mode {} does not give mode {}", i, ch.programmed_mode, ch.mode));
    }
    if (ch.access < 1 || ch.access > 3) r.invalid(fmt::format("channel {} access mode {} invalid", i, ch.access));
    // BCD digits are taken as written, so 0xffff reads as 16665.
    uint32_t max_reload = ch.bcd ? 16665 : 65536;
    if (ch.load_tick != kNever && (ch.reload == 0 || ch.reload > max_reload || ch.phase0 >= ch.reload ||
                                   ch.anchor_tick < ch.load_tick)) {
      r.invalid(fmt::format("channel {} counting element (reload {}, phase {}) is inconsistent", i, ch.reload,
                            ch.phase0));
    }
    if (ch.pending && (ch.pending_reload == 0 || ch.pending_reload > max_reload ||
                       ch.pending_phase0 >= ch.pending_reload)) {
      r.invalid(fmt::format("channel {} pending count {} is inconsistent", i, ch.pending_reload));
    }
  }
  if (auto done = r.finish(); !done) return done;
  irq_checked_tick_ = irq_checked;
  channels_ = channels;
  return {};
}

void SystemControlPortB::read(uint64_t /*offset*/, std::span<uint8_t> data) {
  bool refresh = (pit_.clock().now_ns() / kRefreshHalfPeriodNs) & 1;
  uint8_t value = uint8_t((control_ & 0x0f) | (refresh ? 0x10 : 0) | (pit_.out(2) ? 0x20 : 0));
  std::fill(data.begin(), data.end(), value);
}

void SystemControlPortB::write(uint64_t /*offset*/, std::span<const uint8_t> data) {
  if (data.empty()) return;
  control_ = data[0] & 0x0f;
  pit_.set_gate(2, control_ & 1);
}

namespace {
constexpr char kPortBTag[] = "P61B";
constexpr uint8_t kPortBVersion = 1;
}  // namespace

std::vector<uint8_t> SystemControlPortB::save() const {
  StateWriter w(kPortBTag, kPortBVersion);
  w.u8(control_);
  return w.take();
}

Result<> SystemControlPortB::restore(std::span<const uint8_t> state) {
  StateReader r(state, kPortBTag, kPortBVersion);
  uint8_t control = r.u8();
  if (r.ok() && (control & 0xf0)) r.invalid(fmt::format("control value {:#x} sets read-only bits", control));
  if (auto done = r.finish(); !done) return done;
  control_ = control;
  return {};
}

}  // namespace deja
