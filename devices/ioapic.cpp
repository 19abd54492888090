// I/O APIC: indirect register access, redirection entries, edge and level (Remote IRR) delivery, EOI.
#include "devices/ioapic.h"

#include <algorithm>

#include "devices/state_codec.h"

namespace deja {
namespace {

constexpr uint64_t kMasked = 1ull << 16, kLevel = 1ull << 15, kRemoteIrr = 1ull << 14;
// Bits a write may change: vector, delivery mode, destination mode, polarity, trigger mode, mask
// (low dword); the destination field (bits 63:56).
constexpr uint64_t kWritable = 0xff000000'0001afffull;
constexpr uint64_t kResetEntry = kMasked;

constexpr uint8_t kRegId = 0x00, kRegVersion = 0x01, kRegArbitration = 0x02, kRegFirstEntry = 0x10;

}  // namespace

IoApic::IoApic(ApicBus& bus, uint8_t id) : bus_(bus), id_(id & 0x0f) { redirection_.fill(kResetEntry); }

uint32_t IoApic::read_register(uint8_t index) const {
  switch (index) {
    case kRegId: return uint32_t(id_) << 24;
    case kRegVersion: return kVersion;
    case kRegArbitration: return uint32_t(id_) << 24;  // loaded from the ID (datasheet 3.2.3)
    default: break;
  }
  if (index >= kRegFirstEntry && index < kRegFirstEntry + 2 * kPins) {
    uint64_t e = redirection_[(index - kRegFirstEntry) / 2];
    return (index & 1) ? uint32_t(e >> 32) : uint32_t(e);
  }
  return 0;  // reserved registers
}

void IoApic::write_register(uint8_t index, uint32_t value) {
  if (index == kRegId) {
    id_ = (value >> 24) & 0x0f;
    return;
  }
  if (index < kRegFirstEntry || index >= kRegFirstEntry + 2 * kPins) return;  // read-only or reserved
  unsigned pin = (index - kRegFirstEntry) / 2;
  uint64_t e = redirection_[pin];
  uint64_t written = (index & 1) ? (e & 0xffffffffull) | (uint64_t(value) << 32) : (e & ~0xffffffffull) | value;
  uint64_t next = (written & kWritable) | (e & kRemoteIrr);
  if (!(next & kLevel)) next &= ~kRemoteIrr;  // an edge-triggered entry has no Remote IRR
  redirection_[pin] = next;
  service(pin);  // unmasking an asserted level-triggered pin delivers it
}

void IoApic::read(uint64_t offset, std::span<uint8_t> data) {
  uint32_t value = 0;
  unsigned slot = unsigned(offset & ~0xfull);
  if (slot == 0x00) value = select_;
  else if (slot == 0x10) value = read_register(select_);
  unsigned byte = unsigned(offset & 0xf);
  for (size_t i = 0; i < data.size(); ++i) data[i] = byte + i < 4 ? uint8_t(value >> (8 * (byte + i))) : 0;
}

void IoApic::write(uint64_t offset, std::span<const uint8_t> data) {
  if (data.empty()) return;
  if (offset == 0x00) {
    select_ = data[0];  // IOREGSEL: bits 7:0
  } else if (offset == 0x10 && data.size() >= 4) {
    write_register(select_, uint32_t(load_le(data.first(4))));
  }
  // Other offsets and narrower IOWIN stores are not decoded (the datasheet requires dword access).
}

void IoApic::send(unsigned pin) {
  uint64_t e = redirection_[pin];
  ApicMessage m;
  m.vector = uint8_t(e);
  m.delivery_mode = uint8_t((e >> 8) & 7);
  m.logical = e & (1ull << 11);
  m.destination = uint32_t(e >> 56);
  m.level = e & kLevel;
  bool accepted = bus_.deliver(m);
  if (accepted && m.level) redirection_[pin] |= kRemoteIrr;
}

void IoApic::service(unsigned pin) {
  uint64_t e = redirection_[pin];
  if ((e & kMasked) || !(e & kLevel) || (e & kRemoteIrr) || !(levels_ >> pin & 1)) return;
  send(pin);
}

void IoApic::set_irq(unsigned line, bool level) {
  if (line >= kPins) return;
  bool was = levels_ >> line & 1;
  if (level) levels_ |= 1u << line;
  else levels_ &= ~(1u << line);
  uint64_t e = redirection_[line];
  if (e & kLevel) {
    if (level) service(line);
  } else if (level && !was && !(e & kMasked)) {
    send(line);
  }
}

void IoApic::end_of_interrupt(uint8_t vector) {
  for (unsigned pin = 0; pin < kPins; ++pin) {
    uint64_t e = redirection_[pin];
    if (!(e & kLevel) || !(e & kRemoteIrr) || uint8_t(e) != vector) continue;
    redirection_[pin] &= ~kRemoteIrr;
    service(pin);
  }
}

namespace {
constexpr char kIoApicTag[] = "IOAP";
constexpr uint8_t kIoApicVersion = 1;
}  // namespace

std::vector<uint8_t> IoApic::save() const {
  StateWriter w(kIoApicTag, kIoApicVersion);
  w.u8(id_);
  w.u8(select_);
  w.u32(levels_);
  for (uint64_t e : redirection_) w.u64(e);
  return w.take();
}

Result<> IoApic::restore(std::span<const uint8_t> state) {
  StateReader r(state, kIoApicTag, kIoApicVersion);
  uint8_t id = r.u8();
  uint8_t select = r.u8();
  uint32_t levels = r.u32();
  std::array<uint64_t, kPins> entries{};
  for (uint64_t& e : entries) e = r.u64();
  if (r.ok()) {
    if (id > 0x0f) r.invalid(fmt::format("I/O APIC ID {} is wider than 4 bits", id));
    if (levels >> kPins) r.invalid(fmt::format("input levels {:#x} name pins past INTIN{}", levels, kPins - 1));
    for (unsigned pin = 0; pin < kPins; ++pin) {
      if (entries[pin] & ~(kWritable | kRemoteIrr)) {
        r.invalid(fmt::format("redirection entry {} ({:#x}) sets reserved bits", pin, entries[pin]));
        break;
      }
    }
  }
  if (auto done = r.finish(); !done) return done;
  id_ = id;
  select_ = select;
  levels_ = levels;
  redirection_ = entries;
  return {};
}

}  // namespace deja
