// The interrupt fabric's interfaces: the CPU's interrupt input, APIC-bus messages, EOI broadcasts and MSI writes.
#pragma once

#include <cstdint>
#include <optional>

namespace deja {

// The CPU's interrupt input as the session sees it: is an interrupt pending, and the acknowledge
// cycle that yields its vector. The PIC-only PC presents its 8259A pair here; the APIC PC presents
// the local APIC, which has the 8259A behind it (LINT0 in ExtINT mode, or an ExtINT message).
class InterruptController {
 public:
  virtual ~InterruptController() = default;
  // True when the controller asserts INTR: an interrupt would be taken now if RFLAGS.IF (and the
  // backend's interrupt shadow) allowed it.
  virtual bool interrupt_pending() = 0;
  // The interrupt acknowledge cycle: the vector the CPU receives (the controller's spurious vector
  // when the request went away).
  virtual uint8_t acknowledge() = 0;
};

// Delivery modes of an APIC interrupt message (Intel SDM vol. 3, 10.6.1; 82093AA redirection entry).
namespace apic_delivery {
constexpr uint8_t kFixed = 0, kLowestPriority = 1, kSmi = 2, kNmi = 4, kInit = 5, kStartup = 6, kExtInt = 7;
}

// An IPI's destination shorthand (ICR bits 19:18): the destination field is used only with kNone.
enum class IpiShorthand : uint8_t { kNone = 0, kSelf = 1, kAllIncludingSelf = 2, kAllExcludingSelf = 3 };

// An interrupt message on the APIC bus: from an I/O APIC redirection entry, an MSI write or an IPI.
struct ApicMessage {
  uint8_t vector = 0;
  uint8_t delivery_mode = apic_delivery::kFixed;
  bool logical = false;      // destination mode: logical (true) or physical
  uint32_t destination = 0;  // APIC ID or logical destination; 0xff is the xAPIC broadcast
  bool level = false;        // trigger mode: level-triggered (the receiver sets its TMR bit)
  // IPIs only: the shorthand, the sender (its index on the bus) and whether `destination` is an x2APIC ICR's
  // 32-bit one (0xffffffff the broadcast) rather than an 8-bit one.
  IpiShorthand shorthand = IpiShorthand::kNone;
  uint32_t source = 0;
  bool x2_destination = false;
};

// Where I/O APICs and MSI-capable devices send messages: the local APIC(s).
class ApicBus {
 public:
  virtual ~ApicBus() = default;
  // Delivers `message`; true when a local APIC accepted it into its IRR (or took it as ExtINT).
  virtual bool deliver(const ApicMessage& message) = 0;
};

// What a local APIC passes to its CPU besides vectored interrupts (SDM 10.6.1): NMI, INIT and STARTUP
// messages. `cpu` is the receiving local APIC's index on the bus.
class CpuSignalSink {
 public:
  virtual ~CpuSignalSink() = default;
  virtual void nmi(uint32_t cpu) = 0;
  virtual void init(uint32_t cpu) = 0;
  virtual void startup(uint32_t cpu, uint8_t vector) = 0;
};

// Receives a local APIC's EOI broadcast for a level-triggered vector (the I/O APIC clears Remote IRR).
class EoiListener {
 public:
  virtual ~EoiListener() = default;
  virtual void end_of_interrupt(uint8_t vector) = 0;
};

// The message an MSI / MSI-X write carries (SDM 10.11: destination in address bits 19:12, logical mode in bit 2;
// vector, delivery mode and trigger in data); nullopt for a write outside 0xFEExxxxx or a level de-assert.
inline std::optional<ApicMessage> decode_msi(uint64_t address, uint32_t data) {
  if ((address >> 20) != 0xfee) return std::nullopt;  // not an interrupt message
  const bool level = data & 0x8000;
  if (level && !(data & 0x4000)) return std::nullopt;  // a level de-assert message carries no interrupt
  ApicMessage m;
  m.vector = uint8_t(data);
  m.delivery_mode = uint8_t((data >> 8) & 7);
  m.logical = address & 4;
  m.destination = uint32_t((address >> 12) & 0xff);
  m.level = level;
  return m;
}

// A PCI device's MSI / MSI-X write: `address` in 0xFEE00000-0xFEEFFFFF, 32-bit `data` (SDM 10.11).
class MsiSink {
 public:
  virtual ~MsiSink() = default;
  virtual void deliver_msi(uint64_t address, uint32_t data) = 0;
};

}  // namespace deja
