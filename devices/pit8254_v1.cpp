// 8254 PIT of device model 1: counts and OUT computed from virtual ticks; control/read-back decoding (unchanged since).
#include "devices/pit8254_v1.h"

#include <algorithm>

#include "devices/state_codec.h"

namespace deja {

bool Pit8254V1::Channel::counting() const {
  if (!loaded) return false;
  switch (mode) {
    case 1:
    case 5:
      return triggered;  // the gate only triggers; a low gate does not stop these modes
    default:
      return gate;
  }
}

uint64_t Pit8254V1::Channel::counted(uint64_t tick) const {
  return counted_before_anchor + (counting() && tick > anchor_tick ? tick - anchor_tick : 0);
}

void Pit8254V1::Channel::settle(uint64_t tick) {
  counted_before_anchor = counted(tick);
  anchor_tick = std::max(anchor_tick, tick);
}

bool Pit8254V1::Channel::out_at(uint64_t tick) const {
  if (!loaded) return mode != 0;  // the control word sets OUT low in mode 0, high otherwise
  uint64_t n = reload();
  uint64_t c = counted(tick);
  switch (mode) {
    case 0: return c >= n;
    case 1: return !triggered || c >= n;
    case 2: return !gate || n < 2 || c % n != n - 1;
    case 3: return !gate || c % n < (n + 1) / 2;
    case 4: return c != n;
    default: return !triggered || c != n;  // mode 5
  }
}

uint16_t Pit8254V1::Channel::count_at(uint64_t tick) const {
  if (!loaded) return count_register;  // undefined on silicon; the last written value here
  uint64_t n = reload();
  uint64_t c = counted(tick);
  switch (mode) {
    case 2:
      return uint16_t(n - c % n);
    case 3: {
      // Decrements by two through each half period (the high half is the longer one for odd n).
      uint64_t phase = c % n;
      uint64_t half_high = (n + 1) / 2;
      uint64_t into_half = phase < half_high ? phase : phase - half_high;
      return uint16_t(std::max<uint64_t>(2, (n - 2 * into_half) & ~uint64_t{1}));
    }
    default:  // modes 0, 1, 4, 5 keep decrementing through zero and wrap
      return uint16_t(n - c);
  }
}

uint8_t Pit8254V1::Channel::status_at(uint64_t tick) const {
  bool null = !loaded || tick <= load_tick;
  return uint8_t((out_at(tick) ? 0x80 : 0) | (null ? 0x40 : 0) | (access << 4) | (mode << 1) | (bcd ? 1 : 0));
}

uint64_t Pit8254V1::Channel::rising_edges(uint64_t from, uint64_t to) const {
  if (to <= from || !loaded) return 0;
  uint64_t n = reload();
  switch (mode) {
    case 0:
    case 1:
      return from < n && n <= to ? 1 : 0;
    case 2:
    case 3:
      return to / n - from / n;
    default:  // 4, 5: OUT is low for the one tick at count 0 and rises on the next
      return from < n + 1 && n + 1 <= to ? 1 : 0;
  }
}

std::optional<uint64_t> Pit8254V1::Channel::next_rising_edge(uint64_t after) const {
  if (!loaded) return std::nullopt;
  uint64_t n = reload();
  switch (mode) {
    case 0:
    case 1:
      if (after < n) return n;
      return std::nullopt;
    case 2:
    case 3:
      return (after / n + 1) * n;
    default:
      if (after < n + 1) return n + 1;
      return std::nullopt;
  }
}

Pit8254V1::Pit8254V1(Clock& clock, IrqLine irq0) : clock_(clock), irq0_(irq0) {
  // Port 0x61 resets to 0 on a PC, so channel 2 starts with its gate low.
  channels_[2].gate = false;
}

void Pit8254V1::mark_irq_delivered(uint64_t tick) {
  if (tick <= irq_checked_tick_) return;
  const Channel& ch = channels_[0];
  if (ch.counting() && ch.rising_edges(ch.counted(irq_checked_tick_), ch.counted(tick)) > 0) irq0_.pulse();
  irq_checked_tick_ = tick;
}

std::optional<uint64_t> Pit8254V1::next_deadline_ns() const {
  const Channel& ch = channels_[0];
  if (!ch.counting()) return std::nullopt;
  uint64_t from = std::max(irq_checked_tick_, ch.anchor_tick);
  auto edge = ch.next_rising_edge(ch.counted(from));
  if (!edge) return std::nullopt;
  return Pit8254::ns_of_tick(from + (*edge - ch.counted(from)));
}

void Pit8254V1::advance(uint64_t now_ns) { mark_irq_delivered(Pit8254::ticks_at(now_ns)); }

void Pit8254V1::write_control(uint8_t value, uint64_t tick) {
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
  uint8_t mode = (value >> 1) & 7;
  ch.mode = mode > 5 ? uint8_t(mode - 4) : mode;  // 6 and 7 are aliases of 2 and 3
  ch.access = access;
  ch.bcd = value & 1;
  ch.loaded = false;
  ch.triggered = false;
  ch.write_high_next = false;
  ch.read_high_next = false;
  ch.counted_before_anchor = 0;
  ch.anchor_tick = tick;
}

void Pit8254V1::write_counter(Channel& ch, uint8_t value, uint64_t tick) {
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
        // Mode 0: writing the first byte stops the count and drives OUT low (datasheet).
        if (ch.mode == 0) {
          ch.settle(tick);
          ch.loaded = false;
        }
        return;
      }
      ch.count_register = uint16_t((ch.count_register & 0x00ff) | (value << 8));
      ch.write_high_next = false;
      break;
  }
  ch.load_tick = tick;
  ch.settle(tick);
  if ((ch.mode == 1 || ch.mode == 5)) {
    // The count is transferred on the next gate trigger; a running one-shot is not disturbed.
    if (!ch.triggered) ch.counting_count = ch.count_register;
    ch.loaded = true;
    return;
  }
  // Modes 0 and 4 restart with the new count. Modes 2 and 3 would finish the current period
  // first; here the new period starts at once (documented simplification).
  ch.loaded = true;
  ch.counting_count = ch.count_register;
  ch.counted_before_anchor = 0;
  ch.anchor_tick = tick;
}

void Pit8254V1::latch_count(Channel& ch, uint64_t tick) {
  if (ch.count_latched) return;  // a second latch before the first is read is ignored
  ch.latched_count = ch.count_at(tick);
  ch.count_latched = true;
}

uint8_t Pit8254V1::read_counter(Channel& ch, uint64_t tick) {
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

void Pit8254V1::read(uint64_t offset, std::span<uint8_t> data) {
  uint64_t tick = now_tick();
  for (size_t i = 0; i < data.size(); ++i) {
    uint64_t port = (offset + i) & 3;
    // The control word register is write-only.
    data[i] = port == 3 ? 0xff : read_counter(channels_[port], tick);
  }
}

void Pit8254V1::write(uint64_t offset, std::span<const uint8_t> data) {
  uint64_t tick = now_tick();
  // Edges produced by the old programming are delivered before it changes.
  mark_irq_delivered(tick);
  for (size_t i = 0; i < data.size(); ++i) {
    uint64_t port = (offset + i) & 3;
    if (port == 3) {
      write_control(data[i], tick);
    } else {
      write_counter(channels_[port], data[i], tick);
    }
  }
}

void Pit8254V1::set_gate(unsigned channel, bool level) {
  DEJA_ASSERT(channel < 3, "8254 channel {} does not exist", channel);
  Channel& ch = channels_[channel];
  if (ch.gate == level) return;
  uint64_t tick = now_tick();
  mark_irq_delivered(tick);
  ch.settle(tick);
  ch.gate = level;
  if (!level || !ch.loaded) return;  // a falling gate freezes `counted` (settled above)
  switch (ch.mode) {
    case 1:
    case 5:
      ch.triggered = true;
      ch.counting_count = ch.count_register;
      [[fallthrough]];
    case 2:
    case 3:
      // A rising gate (re)starts the count from the count register.
      ch.counted_before_anchor = 0;
      ch.anchor_tick = tick;
      break;
    default:
      break;  // modes 0 and 4 resume where they stopped
  }
}

bool Pit8254V1::gate(unsigned channel) const {
  DEJA_ASSERT(channel < 3, "8254 channel {} does not exist", channel);
  return channels_[channel].gate;
}

bool Pit8254V1::out(unsigned channel) {
  DEJA_ASSERT(channel < 3, "8254 channel {} does not exist", channel);
  return channels_[channel].out_at(now_tick());
}

namespace {
constexpr char kPitTag[] = "PIT4";
constexpr uint8_t kPitVersion = 1;
}  // namespace

std::vector<uint8_t> Pit8254V1::save() const {
  StateWriter w(kPitTag, kPitVersion);
  w.u64(irq_checked_tick_);
  for (const Channel& ch : channels_) {
    w.u8(ch.mode);
    w.u8(ch.access);
    w.boolean(ch.bcd);
    w.u16(ch.count_register);
    w.u16(ch.counting_count);
    w.boolean(ch.write_high_next);
    w.boolean(ch.read_high_next);
    w.boolean(ch.loaded);
    w.boolean(ch.triggered);
    w.boolean(ch.gate);
    w.boolean(ch.count_latched);
    w.u16(ch.latched_count);
    w.boolean(ch.status_latched);
    w.u8(ch.latched_status);
    w.u64(ch.anchor_tick);
    w.u64(ch.counted_before_anchor);
    w.u64(ch.load_tick);
  }
  return w.take();
}

Result<> Pit8254V1::restore(std::span<const uint8_t> state) {
  StateReader r(state, kPitTag, kPitVersion);
  uint64_t irq_checked = r.u64();
  std::array<Channel, 3> channels;
  for (unsigned i = 0; i < 3; ++i) {
    Channel& ch = channels[i];
    ch.mode = r.u8();
    ch.access = r.u8();
    ch.bcd = r.boolean();
    ch.count_register = r.u16();
    ch.counting_count = r.u16();
    ch.write_high_next = r.boolean();
    ch.read_high_next = r.boolean();
    ch.loaded = r.boolean();
    ch.triggered = r.boolean();
    ch.gate = r.boolean();
    ch.count_latched = r.boolean();
    ch.latched_count = r.u16();
    ch.status_latched = r.boolean();
    ch.latched_status = r.u8();
    ch.anchor_tick = r.u64();
    ch.counted_before_anchor = r.u64();
    ch.load_tick = r.u64();
    if (!r.ok()) break;
    if (ch.mode > 5) r.invalid(fmt::format("channel {} mode {} does not exist", i, ch.mode));
    if (ch.access < 1 || ch.access > 3) r.invalid(fmt::format("channel {} access mode {} invalid", i, ch.access));
  }
  if (auto done = r.finish(); !done) return done;
  irq_checked_tick_ = irq_checked;
  channels_ = channels;
  return {};
}

}  // namespace deja
