// PCI configuration space rules: write masks, write-one-to-clear status bits, BAR sizing, capabilities, INTx.
#include "devices/pci_function.h"

#include <algorithm>

#include "devices/pci_host.h"

namespace deja {
namespace {

void put16(std::span<uint8_t> bytes, unsigned offset, uint16_t v) {
  bytes[offset] = uint8_t(v);
  bytes[offset + 1] = uint8_t(v >> 8);
}

void put32(std::span<uint8_t> bytes, unsigned offset, uint32_t v) {
  for (unsigned i = 0; i < 4; ++i) bytes[offset + i] = uint8_t(v >> (8 * i));
}

uint32_t get32(std::span<const uint8_t> bytes, unsigned offset) {
  uint32_t v = 0;
  for (unsigned i = 0; i < 4; ++i) v |= uint32_t(bytes[offset + i]) << (8 * i);
  return v;
}

bool power_of_two(uint64_t v) { return v != 0 && (v & (v - 1)) == 0; }

}  // namespace

PciFunction::PciFunction(const PciIds& ids) {
  put16(config_, pci::kVendorId, ids.vendor);
  put16(config_, pci::kDeviceId, ids.device);
  config_[pci::kRevision] = ids.revision;
  config_[pci::kClassCode] = uint8_t(ids.class_code);
  config_[pci::kClassCode + 1] = uint8_t(ids.class_code >> 8);
  config_[pci::kClassCode + 2] = uint8_t(ids.class_code >> 16);
  config_[pci::kHeaderType] = 0x00;  // type 0, single function
  put16(config_, pci::kSubsystemVendor, ids.subsystem_vendor);
  put16(config_, pci::kSubsystem, ids.subsystem);
  config_[pci::kInterruptPin] = ids.interrupt_pin;
  // Writable: bus master, parity error response, SERR# enable; INTx disable when there is a pin. The I/O and
  // memory enables become writable with the first BAR of their kind (a function without one hardwires them to 0).
  uint16_t command = pci::kCommandBusMaster | pci::kCommandParity | pci::kCommandSerr;
  if (ids.interrupt_pin) command |= pci::kCommandIntxDisable;
  put16(writable_, pci::kCommand, command);
  put16(write_one_to_clear_, pci::kStatus, pci::kStatusWriteOneToClear);
  writable_[pci::kCacheLineSize] = 0xff;
  writable_[pci::kLatencyTimer] = 0xff;
  // Interrupt Line is a scratch register for software: the wiring is the board's, not this register's.
  writable_[pci::kInterruptLine] = 0xff;
}

PciFunction::~PciFunction() = default;

void PciFunction::define_bar(unsigned index, PciBarKind kind, uint64_t size, bool prefetchable) {
  const bool wide = kind == PciBarKind::kMemory64;
  DEJA_ASSERT(index < pci::kBarCount && (!wide || index + 1 < pci::kBarCount), "BAR {} of {} out of range", index,
              name());
  DEJA_ASSERT(bars_[index].kind == PciBarKind::kNone && (!wide || bars_[index + 1].kind == PciBarKind::kNone),
              "BAR {} of {} defined twice", index, name());
  DEJA_ASSERT(power_of_two(size) && size >= (kind == PciBarKind::kIo ? 4u : 16u) &&
                  (kind != PciBarKind::kIo || size <= 256) && (kind != PciBarKind::kMemory32 || size <= (1ull << 31)),
              "BAR {} of {}: bad size {:#x}", index, name(), size);
  bars_[index] = Bar{kind, size};
  const unsigned reg = pci::kBar0 + 4 * index;
  uint16_t command_enable = 0;
  if (kind == PciBarKind::kIo) {
    put32(config_, reg, 0x1);  // bit 0: I/O space
    put32(writable_, reg, uint32_t(~(size - 1)) & 0xfffc);  // x86 port addresses are 16 bits
    command_enable = pci::kCommandIo;
  } else {
    uint32_t type = (wide ? 0x4u : 0x0u) | (prefetchable ? 0x8u : 0x0u);
    put32(config_, reg, type);
    put32(writable_, reg, uint32_t(~(size - 1)) & 0xfffffff0u);
    if (wide) {
      bars_[index + 1] = Bar{PciBarKind::kNone, 0};
      put32(writable_, reg + 4, uint32_t(~(size - 1) >> 32));
    }
    command_enable = pci::kCommandMemory;
  }
  writable_[pci::kCommand] |= uint8_t(command_enable);
}

uint8_t PciFunction::add_capability(uint8_t id, std::span<const uint8_t> body, std::span<const uint8_t> writable) {
  const unsigned length = 2 + unsigned(body.size());
  const unsigned offset = (next_capability_offset_ + 3u) & ~3u;
  DEJA_ASSERT(offset + length <= pci::kConfigSize, "capability {:#x} of {} does not fit", id, name());
  DEJA_ASSERT(writable.empty() || writable.size() == body.size(), "capability mask of {} has the wrong size", name());
  config_[offset] = id;
  config_[offset + 1] = 0;
  std::copy(body.begin(), body.end(), config_.begin() + offset + 2);
  std::copy(writable.begin(), writable.end(), writable_.begin() + offset + 2);
  if (last_capability_ == 0) {
    config_[pci::kCapabilityPointer] = uint8_t(offset);
    config_[pci::kStatus] |= uint8_t(pci::kStatusCapabilities);
  } else {
    config_[last_capability_ + 1] = uint8_t(offset);
  }
  last_capability_ = uint8_t(offset);
  next_capability_offset_ = uint8_t(offset + length);
  return uint8_t(offset);
}

uint32_t PciFunction::config_read(unsigned offset, unsigned size) {
  DEJA_ASSERT((size == 1 || size == 2 || size == 4) && offset % size == 0 && offset + size <= pci::kConfigSize,
              "config read of {} bytes at {:#x}", size, offset);
  if (offset + size > pci::kFirstCapability) before_config_read(offset, size);
  // Status bit 3 reflects the device's interrupt condition, whatever Interrupt Disable says.
  if (intx_asserted_) {
    config_[pci::kStatus] |= uint8_t(pci::kStatusInterrupt);
  } else {
    config_[pci::kStatus] &= uint8_t(~pci::kStatusInterrupt);
  }
  uint32_t v = 0;
  for (unsigned i = 0; i < size; ++i) v |= uint32_t(config_[offset + i]) << (8 * i);
  return v;
}

void PciFunction::config_write(unsigned offset, unsigned size, uint32_t value) {
  DEJA_ASSERT((size == 1 || size == 2 || size == 4) && offset % size == 0 && offset + size <= pci::kConfigSize,
              "config write of {} bytes at {:#x}", size, offset);
  for (unsigned i = 0; i < size; ++i) {
    const unsigned at = offset + i;
    const uint8_t byte = uint8_t(value >> (8 * i));
    config_[at] = uint8_t((config_[at] & ~writable_[at]) | (byte & writable_[at]));
    config_[at] &= uint8_t(~(byte & write_one_to_clear_[at]));
  }
  const unsigned end = offset + size;
  const bool touches_command = offset < pci::kCommand + 2 && end > pci::kCommand;
  const bool touches_bars = offset < pci::kBar0 + 4 * pci::kBarCount && end > pci::kBar0;
  if (touches_command || touches_bars) update_decoding();
  if (touches_command) drive_intx();
  if (end > pci::kFirstCapability) after_config_write(offset, size);
}

void PciFunction::bar_read(unsigned /*bar*/, uint64_t /*offset*/, std::span<uint8_t> data) {
  std::fill(data.begin(), data.end(), uint8_t{0xff});
}

void PciFunction::bar_write(unsigned /*bar*/, uint64_t /*offset*/, std::span<const uint8_t> /*data*/) {}

uint64_t PciFunction::bar_address(unsigned bar) const {
  const unsigned reg = pci::kBar0 + 4 * bar;
  switch (bars_[bar].kind) {
    case PciBarKind::kNone:
      return 0;
    case PciBarKind::kIo:
      return get32(config_, reg) & 0xfffcu;
    case PciBarKind::kMemory32:
      return get32(config_, reg) & 0xfffffff0u;
    case PciBarKind::kMemory64:
      return (uint64_t(get32(config_, reg + 4)) << 32) | (get32(config_, reg) & 0xfffffff0u);
  }
  return 0;
}

std::optional<uint64_t> PciFunction::bar_decoded_address(unsigned bar) const {
  const Bar& b = bars_[bar];
  if (b.kind == PciBarKind::kNone) return std::nullopt;
  const uint16_t enable = b.kind == PciBarKind::kIo ? pci::kCommandIo : pci::kCommandMemory;
  if (!(command() & enable)) return std::nullopt;
  const uint64_t address = bar_address(bar);
  // Address 0 is "not assigned" (as in QEMU); a BAR being sized holds ~(size-1), which can run past the top.
  const uint64_t top = b.kind == PciBarKind::kIo ? 0x10000 : b.kind == PciBarKind::kMemory32 ? (1ull << 32) : 0;
  if (address == 0) return std::nullopt;
  if (top != 0 && (address >= top || b.size > top - address)) return std::nullopt;
  if (top == 0 && address + b.size < address) return std::nullopt;  // a 64-bit BAR wrapping past 2^64
  return address;
}

void PciFunction::set_bar_address(unsigned bar, uint64_t address) {
  const unsigned reg = pci::kBar0 + 4 * bar;
  const uint32_t type = get32(config_, reg) & (bars_[bar].kind == PciBarKind::kIo ? 0x3u : 0xfu);
  put32(config_, reg, (uint32_t(address) & get32(writable_, reg)) | type);
  if (bars_[bar].kind == PciBarKind::kMemory64) put32(config_, reg + 4, uint32_t(address >> 32));
  update_decoding();
}

void PciFunction::enable_decoding(uint16_t command_bits) {
  const uint16_t writable = uint16_t(writable_[pci::kCommand] | writable_[pci::kCommand + 1] << 8);
  put16(config_, pci::kCommand, uint16_t(command() | (command_bits & writable)));
  update_decoding();
}

void PciFunction::update_decoding() {
  if (host_) host_->update_mappings(*this);
}

void PciFunction::set_intx(bool asserted) {
  intx_asserted_ = asserted;
  drive_intx();
}

void PciFunction::drive_intx() {
  const bool out = intx_output();
  if (out == intx_driven_) return;
  intx_driven_ = out;
  if (host_) host_->set_intx(*this, out);
}

void PciFunction::save_config(StateWriter& w) const {
  w.bytes(config_);
  w.boolean(intx_asserted_);
}

void PciFunction::restore_config(StateReader& r) {
  std::array<uint8_t, pci::kConfigSize> saved{};
  r.bytes(saved);
  const bool asserted = r.boolean();
  if (!r.ok()) return;
  // Read-only bytes must be this function's own: a blob of another function (or a corrupt one) is refused.
  for (unsigned i = 0; i < pci::kConfigSize; ++i) {
    const uint8_t fixed = uint8_t(~writable_[i] & ~write_one_to_clear_[i]);
    const uint8_t dynamic = i == pci::kStatus ? uint8_t(pci::kStatusInterrupt) : 0;
    if ((saved[i] & fixed & ~dynamic) != (config_[i] & fixed & ~dynamic)) {
      r.invalid(fmt::format("PCI configuration byte {:#x} of {} is read-only and differs ({:#04x}, expected {:#04x})",
                            i, name(), saved[i], config_[i]));
      return;
    }
  }
  config_ = saved;
  intx_asserted_ = asserted;
  intx_driven_ = intx_output();
  if (host_) host_->restore_intx(*this, intx_driven_);
  update_decoding();
}

}  // namespace deja
