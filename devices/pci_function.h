// One PCI function's configuration space (type 0 header, BARs, capability list, INTx), the part every PCI device shares.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string_view>

#include "devices/device.h"
#include "devices/state_codec.h"

namespace deja {

class PciHost;

// What identifies a function on the bus (PCI Local Bus 3.0, 6.2.1). `class_code` is base class << 16 |
// sub-class << 8 | programming interface.
struct PciIds {
  uint16_t vendor = 0;
  uint16_t device = 0;
  uint8_t revision = 0;
  uint32_t class_code = 0;
  uint16_t subsystem_vendor = 0;
  uint16_t subsystem = 0;
  uint8_t interrupt_pin = 0;  // 0 none, 1 INTA# .. 4 INTD#
};

enum class PciBarKind : uint8_t { kNone, kIo, kMemory32, kMemory64 };

namespace pci {
constexpr unsigned kConfigSize = 256;
constexpr unsigned kBarCount = 6;
// Header registers.
constexpr unsigned kVendorId = 0x00, kDeviceId = 0x02, kCommand = 0x04, kStatus = 0x06, kRevision = 0x08,
                   kClassCode = 0x09, kCacheLineSize = 0x0c, kLatencyTimer = 0x0d, kHeaderType = 0x0e, kBar0 = 0x10,
                   kSubsystemVendor = 0x2c, kSubsystem = 0x2e, kRomAddress = 0x30, kCapabilityPointer = 0x34,
                   kInterruptLine = 0x3c, kInterruptPin = 0x3d;
constexpr unsigned kFirstCapability = 0x40;
// Command register bits.
constexpr uint16_t kCommandIo = 1u << 0, kCommandMemory = 1u << 1, kCommandBusMaster = 1u << 2,
                   kCommandParity = 1u << 6, kCommandSerr = 1u << 8, kCommandIntxDisable = 1u << 10;
// Status register bits: interrupt status and capability list are read-only; the error bits are write-1-to-clear.
constexpr uint16_t kStatusInterrupt = 1u << 3, kStatusCapabilities = 1u << 4, kStatusWriteOneToClear = 0xf900;
// Capability IDs.
constexpr uint8_t kCapabilityMsix = 0x11, kCapabilityVendor = 0x09;
}  // namespace pci

// Configuration space as the PCI Local Bus Specification 3.0 (6.2) lays it out: every byte has a mask of the
// bits software can write and of the bits it clears by writing 1; everything else is read-only. BARs size
// themselves through their masks (write all ones, read back ~(size - 1) with the type bits). The function does
// not decode its BARs itself: its PciHost maps each one on the port or MMIO bus wherever the guest programs it,
// while the command register enables that kind of decoding, and unmaps it otherwise.
class PciFunction {
 public:
  explicit PciFunction(const PciIds& ids);
  virtual ~PciFunction();
  PciFunction(const PciFunction&) = delete;
  PciFunction& operator=(const PciFunction&) = delete;

  virtual std::string_view name() const = 0;

  // A configuration access of `size` (1, 2 or 4) bytes at `offset`, within one dword of the 256 bytes.
  uint32_t config_read(unsigned offset, unsigned size);
  void config_write(unsigned offset, unsigned size, uint32_t value);

  // Accesses to a mapped BAR, `offset` from its base. Unclaimed by default: reads all ones.
  virtual void bar_read(unsigned bar, uint64_t offset, std::span<uint8_t> data);
  virtual void bar_write(unsigned bar, uint64_t offset, std::span<const uint8_t> data);

  PciBarKind bar_kind(unsigned bar) const { return bars_[bar].kind; }
  uint64_t bar_size(unsigned bar) const { return bars_[bar].size; }
  // The address programmed into a BAR (type bits cleared; a 64-bit BAR's two dwords together).
  uint64_t bar_address(unsigned bar) const;
  // The BAR's address when the command register enables its kind of decoding and the address is usable
  // (not 0, the BAR fits below the top of its space); nullopt otherwise.
  std::optional<uint64_t> bar_decoded_address(unsigned bar) const;

  // Firmware set-up by the machine builder (there is no BIOS): a BAR's address and the decode enables.
  void set_bar_address(unsigned bar, uint64_t address);
  void enable_decoding(uint16_t command_bits);

  // The INTx output as the bus sees it: the device's interrupt condition unless Interrupt Disable is set.
  bool intx_output() const { return intx_asserted_ && !(command() & pci::kCommandIntxDisable); }
  uint16_t command() const { return uint16_t(config_[pci::kCommand] | config_[pci::kCommand + 1] << 8); }

  // Called by PciHost::attach.
  void attached(PciHost& host, unsigned slot) {
    host_ = &host;
    slot_ = slot;
  }
  unsigned slot() const { return slot_; }
  uint8_t interrupt_line() const { return config_[pci::kInterruptLine]; }
  void set_interrupt_line(uint8_t line) { config_[pci::kInterruptLine] = line; }

  // The configuration space and INTx condition, for the owning device's save()/restore(). restore_config()
  // re-maps the BARs as the restored registers say (the bus mappings are not state of their own).
  void save_config(StateWriter& w) const;
  void restore_config(StateReader& r);

 protected:
  // Declares BAR `index` (a 64-bit BAR also takes index + 1). Sizes are powers of two: memory at least 16
  // bytes, I/O at least 4. Call before the function is attached.
  void define_bar(unsigned index, PciBarKind kind, uint64_t size, bool prefetchable = false);
  // Appends a capability; `body` is what follows its ID and next pointer. Bits set in `writable` (same length
  // as body) are software-writable. Returns the capability's offset.
  uint8_t add_capability(uint8_t id, std::span<const uint8_t> body, std::span<const uint8_t> writable = {});
  uint8_t* config_bytes() { return config_.data(); }
  const uint8_t* config_bytes() const { return config_.data(); }

  // The device's interrupt condition (level): INTx# is driven while it holds and Interrupt Disable is clear.
  void set_intx(bool asserted);

  // Registers with side effects: before a read of [offset, offset+size) the function may refresh the bytes;
  // after a write it may act on them. Both see only accesses inside a capability or the device-specific area.
  virtual void before_config_read(unsigned /*offset*/, unsigned /*size*/) {}
  virtual void after_config_write(unsigned /*offset*/, unsigned /*size*/) {}

 private:
  struct Bar {
    PciBarKind kind = PciBarKind::kNone;
    uint64_t size = 0;
  };
  void update_decoding();
  void drive_intx();

  std::array<uint8_t, pci::kConfigSize> config_{};
  std::array<uint8_t, pci::kConfigSize> writable_{};
  std::array<uint8_t, pci::kConfigSize> write_one_to_clear_{};
  std::array<Bar, pci::kBarCount> bars_{};
  uint8_t last_capability_ = 0;
  uint8_t next_capability_offset_ = pci::kFirstCapability;
  bool intx_asserted_ = false;
  bool intx_driven_ = false;  // what the host was last told
  PciHost* host_ = nullptr;
  unsigned slot_ = 0;
};

}  // namespace deja
