// MC146818A RTC: calendar arithmetic, BCD/12h encoding, SET-mode offset, lazy interrupt flags.
#include "devices/cmos_rtc.h"

#include <algorithm>

#include "devices/state_codec.h"

namespace deja {
namespace {

constexpr uint64_t kNsPerSecond = 1000000000;
constexpr uint64_t kTimeBaseHz = 32768;

constexpr uint8_t kRegA = 0x0a, kRegB = 0x0b, kRegC = 0x0c, kRegD = 0x0d;
constexpr uint8_t kCentury = 0x32;
constexpr uint8_t kPf = 0x40, kAf = 0x20, kUf = 0x10;
constexpr uint8_t kPie = 0x40, kAie = 0x20, kUie = 0x10;

// Howard Hinnant's proleptic Gregorian conversions (public domain, "chrono-Compatible Low-Level
// Date Algorithms"): exact for every int64 day count we can produce.
int64_t days_from_civil(int64_t y, unsigned m, unsigned d) {
  y -= m <= 2;
  const int64_t era = (y >= 0 ? y : y - 399) / 400;
  const unsigned yoe = unsigned(y - era * 400);
  const unsigned doy = (153 * (m > 2 ? m - 3 : m + 9) + 2) / 5 + d - 1;
  const unsigned doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
  return era * 146097 + int64_t(doe) - 719468;
}

void civil_from_days(int64_t z, int64_t& year, int& month, int& day) {
  z += 719468;
  const int64_t era = (z >= 0 ? z : z - 146096) / 146097;
  const unsigned doe = unsigned(z - era * 146097);
  const unsigned yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
  const unsigned doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
  const unsigned mp = (5 * doy + 2) / 153;
  day = int(doy - (153 * mp + 2) / 5 + 1);
  month = int(mp < 10 ? mp + 3 : mp - 9);
  year = int64_t(yoe) + era * 400 + (month <= 2);
}

int64_t floor_div(int64_t a, int64_t b) { return a / b - ((a % b != 0) && ((a < 0) != (b < 0))); }

uint64_t cycles_at(uint64_t ns) { return uint64_t((unsigned __int128)ns * kTimeBaseHz / kNsPerSecond); }

uint64_t ns_of_cycle(uint64_t cycle) {
  return uint64_t(((unsigned __int128)cycle * kNsPerSecond + kTimeBaseHz - 1) / kTimeBaseHz);
}

}  // namespace

CmosRtc::CmosRtc(Clock& clock, int64_t unix_seconds_at_start, IrqLine irq8)
    : clock_(clock), irq8_(irq8), unix_start_(unix_seconds_at_start) {}

CmosRtc::WallTime CmosRtc::wall_time(int64_t unix_seconds) {
  WallTime t{};
  int64_t days = floor_div(unix_seconds, 86400);
  int64_t rem = unix_seconds - days * 86400;
  civil_from_days(days, t.year, t.month, t.day);
  t.hour = int(rem / 3600);
  t.minute = int(rem / 60 % 60);
  t.second = int(rem % 60);
  t.weekday = int(((days % 7) + 7 + 4) % 7);  // 1970-01-01 was a Thursday
  return t;
}

int64_t CmosRtc::unix_seconds(const WallTime& t) {
  return days_from_civil(t.year, unsigned(t.month), unsigned(t.day)) * 86400 + t.hour * 3600 + t.minute * 60 +
         t.second;
}

uint8_t CmosRtc::encode(int value) const {
  if (binary()) return uint8_t(value);
  return uint8_t(((value / 10) << 4) | (value % 10));
}

int CmosRtc::decode(uint8_t value) const {
  if (binary()) return value;
  return (value >> 4) * 10 + (value & 0x0f);
}

bool CmosRtc::is_clock_register(uint8_t index) {
  switch (index) {
    case 0: case 2: case 4: case 6: case 7: case 8: case 9: case kCentury:
      return true;
    default:
      return false;
  }
}

std::array<uint8_t, 128> CmosRtc::clock_registers(uint64_t now_ns) const {
  std::array<uint8_t, 128> regs = cmos_;
  if (set_mode()) return regs;  // updates are halted; the guest's values stand
  WallTime t = wall_time(unix_start_ + offset_seconds_ + int64_t(now_ns / kNsPerSecond));
  int64_t year = ((t.year % 10000) + 10000) % 10000;
  regs[0] = encode(t.second);
  regs[2] = encode(t.minute);
  if (hours_24()) {
    regs[4] = encode(t.hour);
  } else {
    int hour12 = t.hour % 12 == 0 ? 12 : t.hour % 12;
    regs[4] = uint8_t(encode(hour12) | (t.hour >= 12 ? 0x80 : 0));
  }
  regs[6] = encode(t.weekday + 1);
  regs[7] = encode(t.day);
  regs[8] = encode(t.month);
  regs[9] = encode(int(year % 100));
  regs[kCentury] = encode(int(year / 100));
  return regs;
}

int64_t CmosRtc::registers_to_unix(const std::array<uint8_t, 128>& regs) const {
  WallTime t{};
  // Out-of-range guest values are clamped so that any byte pattern gives a valid date.
  t.second = std::clamp(decode(regs[0]), 0, 59);
  t.minute = std::clamp(decode(regs[2]), 0, 59);
  if (hours_24()) {
    t.hour = decode(regs[4]);
  } else {
    t.hour = decode(regs[4] & 0x7f) % 12 + ((regs[4] & 0x80) ? 12 : 0);
  }
  t.hour = std::clamp(t.hour, 0, 23);
  t.day = std::clamp(decode(regs[7]), 1, 31);
  t.month = std::clamp(decode(regs[8]), 1, 12);
  t.year = int64_t(decode(regs[kCentury])) * 100 + decode(regs[9]);
  return unix_seconds(t);
}

uint64_t CmosRtc::periodic_cycles() const {
  unsigned rate = reg_a_ & 0x0f;
  if (rate == 0) return 0;
  if (rate < 3) rate += 7;  // rates 1 and 2 repeat rates 8 and 9 with a 32.768 kHz time base
  return uint64_t{1} << (rate - 1);
}

void CmosRtc::update_flags(uint64_t now_ns) {
  if (now_ns <= flags_through_ns_) return;
  uint64_t last = flags_through_ns_;
  flags_through_ns_ = now_ns;
  if (uint64_t period = periodic_cycles(); period && cycles_at(now_ns) / period > cycles_at(last) / period) {
    reg_c_ |= kPf;
  }
  if (set_mode()) {
    update_irq();
    return;
  }
  int64_t first_second = int64_t(last / kNsPerSecond) + 1;
  int64_t last_second = int64_t(now_ns / kNsPerSecond);
  if (last_second >= first_second) {
    reg_c_ |= kUf;
    // The alarm is compared at each update; a day covers every combination it can match.
    for (int64_t s = std::max(first_second, last_second - 86399); s <= last_second && !(reg_c_ & kAf); ++s) {
      std::array<uint8_t, 128> regs = clock_registers(uint64_t(s) * kNsPerSecond);
      auto matches = [&](uint8_t alarm, uint8_t value) { return alarm >= 0xc0 || alarm == value; };
      if (matches(cmos_[1], regs[0]) && matches(cmos_[3], regs[2]) && matches(cmos_[5], regs[4])) reg_c_ |= kAf;
    }
  }
  update_irq();
}

void CmosRtc::update_irq() {
  bool irqf = ((reg_c_ & kPf) && (reg_b_ & kPie)) || ((reg_c_ & kAf) && (reg_b_ & kAie)) ||
              ((reg_c_ & kUf) && (reg_b_ & kUie));
  if (irqf == irq_level_) return;
  irq_level_ = irqf;
  irq8_.set(irqf);
}

std::optional<uint64_t> CmosRtc::next_deadline_ns() const {
  if (irq_level_) return std::nullopt;  // nothing new can reach the line before C is read
  std::optional<uint64_t> deadline;
  if (uint64_t period = periodic_cycles(); period && (reg_b_ & kPie)) {
    deadline = ns_of_cycle((cycles_at(flags_through_ns_) / period + 1) * period);
  }
  if ((reg_b_ & (kUie | kAie)) && !set_mode()) {
    uint64_t next_second = (flags_through_ns_ / kNsPerSecond + 1) * kNsPerSecond;
    deadline = deadline ? std::min(*deadline, next_second) : next_second;
  }
  return deadline;
}

void CmosRtc::advance(uint64_t now_ns) { update_flags(now_ns); }

uint8_t CmosRtc::read_register(uint8_t index, uint64_t now_ns) {
  switch (index) {
    case kRegA: {
      bool uip = !set_mode() && now_ns % kNsPerSecond >= kNsPerSecond - kUipWindowNs;
      return uint8_t(reg_a_ | (uip ? 0x80 : 0));
    }
    case kRegB:
      return reg_b_;
    case kRegC: {
      uint8_t value = uint8_t(reg_c_ | (irq_level_ ? 0x80 : 0));
      reg_c_ = 0;
      update_irq();
      return value;
    }
    case kRegD:
      return 0x80;  // VRT: the battery is fine
    default:
      if (is_clock_register(index)) return clock_registers(now_ns)[index];
      return cmos_[index];
  }
}

void CmosRtc::write_register(uint8_t index, uint8_t value, uint64_t now_ns) {
  int64_t base = unix_start_ + int64_t(now_ns / kNsPerSecond);
  switch (index) {
    case kRegA:
      reg_a_ = value & 0x7f;  // UIP is read-only
      return;
    case kRegB: {
      uint8_t old = reg_b_;
      if (value & 0x80) value &= ~kUie;  // setting SET clears UIE (datasheet)
      if (!(old & 0x80) && (value & 0x80)) {
        // Freeze the clock registers, in the new data format, for the guest to overwrite.
        reg_b_ = value & 0x7f;
        std::array<uint8_t, 128> regs = clock_registers(now_ns);
        for (uint8_t i = 0; i < 128; ++i) {
          if (is_clock_register(i)) cmos_[i] = regs[i];
        }
      } else if ((old & 0x80) && !(value & 0x80)) {
        reg_b_ = value;
        offset_seconds_ = registers_to_unix(cmos_) - base;
      }
      reg_b_ = value;
      return;
    }
    case kRegC:
    case kRegD:
      return;  // read-only
    default:
      if (is_clock_register(index) && !set_mode()) {
        // Writing a running clock register sets that field and keeps the others running.
        std::array<uint8_t, 128> regs = clock_registers(now_ns);
        regs[index] = value;
        offset_seconds_ = registers_to_unix(regs) - base;
        return;
      }
      cmos_[index] = value;
      return;
  }
}

void CmosRtc::read(uint64_t offset, std::span<uint8_t> data) {
  for (size_t i = 0; i < data.size(); ++i) {
    if (((offset + i) & 1) == 0) {
      data[i] = 0xff;  // the index register is write-only
      continue;
    }
    uint64_t now = clock_.now_ns();
    update_flags(now);
    data[i] = read_register(index_, now);
  }
}

void CmosRtc::write(uint64_t offset, std::span<const uint8_t> data) {
  for (size_t i = 0; i < data.size(); ++i) {
    if (((offset + i) & 1) == 0) {
      index_ = data[i] & 0x7f;
      nmi_masked_ = data[i] & 0x80;
      continue;
    }
    uint64_t now = clock_.now_ns();
    update_flags(now);
    write_register(index_, data[i], now);
    update_irq();
  }
}

void CmosRtc::set_memory_size(uint64_t bytes) {
  constexpr uint64_t kMiB = 1 << 20;
  constexpr uint64_t k4GiB = uint64_t{4} << 30;
  auto put16 = [&](uint8_t index, uint64_t value) {
    value = std::min<uint64_t>(value, 0xffff);
    cmos_[index] = uint8_t(value);
    cmos_[index + 1] = uint8_t(value >> 8);
  };
  put16(0x15, 640);
  uint64_t extended_kib = bytes > kMiB ? (bytes - kMiB) / 1024 : 0;
  put16(0x17, extended_kib);
  put16(0x30, extended_kib);
  uint64_t below_4g = std::min(bytes, k4GiB);
  put16(0x34, below_4g > 16 * kMiB ? (below_4g - 16 * kMiB) / 65536 : 0);
  uint64_t above_4g = bytes > k4GiB ? (bytes - k4GiB) / 65536 : 0;
  cmos_[0x5b] = uint8_t(above_4g);
  cmos_[0x5c] = uint8_t(above_4g >> 8);
  cmos_[0x5d] = uint8_t(above_4g >> 16);
}

namespace {
constexpr char kTag[] = "RTC1";
constexpr uint8_t kVersion = 1;
}  // namespace

std::vector<uint8_t> CmosRtc::save() const {
  StateWriter w(kTag, kVersion);
  w.i64(unix_start_);
  w.i64(offset_seconds_);
  w.bytes(cmos_);
  w.u8(index_);
  w.boolean(nmi_masked_);
  w.u8(reg_a_);
  w.u8(reg_b_);
  w.u8(reg_c_);
  w.u64(flags_through_ns_);
  w.boolean(irq_level_);
  return w.take();
}

Result<> CmosRtc::restore(std::span<const uint8_t> state) {
  StateReader r(state, kTag, kVersion);
  int64_t unix_start = r.i64();
  int64_t offset = r.i64();
  std::array<uint8_t, 128> cmos;
  r.bytes(cmos);
  uint8_t index = r.u8();
  bool nmi = r.boolean();
  uint8_t a = r.u8(), b = r.u8(), c = r.u8();
  uint64_t flags_through = r.u64();
  bool irq_level = r.boolean();
  if (r.ok()) {
    if (index > 0x7f) r.invalid(fmt::format("index register {:#x} beyond the 128-byte CMOS", index));
    if (a & 0x80) r.invalid(fmt::format("register A {:#x} stores the read-only UIP bit", a));
    if (c & ~(kPf | kAf | kUf)) r.invalid(fmt::format("register C flags {:#x} beyond PF/AF/UF", c));
  }
  if (auto done = r.finish(); !done) return done;
  unix_start_ = unix_start;
  offset_seconds_ = offset;
  cmos_ = cmos;
  index_ = index;
  nmi_masked_ = nmi;
  reg_a_ = a;
  reg_b_ = b;
  reg_c_ = c;
  flags_through_ns_ = flags_through;
  irq_level_ = irq_level;
  return {};
}

}  // namespace deja
