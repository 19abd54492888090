// Local APIC: register file (xAPIC MMIO and x2APIC MSR views), priority and EOI, IPIs, message reception, LVT, timer, IA32_APIC_BASE.
#include "devices/lapic.h"

#include <algorithm>
#include <bit>

#include "devices/state_codec.h"

namespace deja {
namespace {

constexpr uint64_t kBaseBsp = 1ull << 8, kBaseExtd = 1ull << 10, kBaseEnable = 1ull << 11;
constexpr unsigned kPhysAddrBits = 39;  // CPUID.80000008H:EAX[7:0] of the CPU model
constexpr uint64_t kBaseAddressMask = ((1ull << kPhysAddrBits) - 1) & ~0xfffull;

constexpr uint32_t kLvtMasked = 1u << 16;

constexpr uint32_t kEsrSendIllegalVector = 1u << 5, kEsrReceiveIllegalVector = 1u << 6,
                   kEsrIllegalRegister = 1u << 7;

// Register indices (xAPIC offset >> 4; x2APIC MSR - 0x800).
enum Reg : unsigned {
  kId = 0x02, kVer = 0x03, kTpr = 0x08, kApr = 0x09, kPpr = 0x0a, kEoi = 0x0b, kLdr = 0x0d, kDfr = 0x0e,
  kSvr = 0x0f, kIsr0 = 0x10, kTmr0 = 0x18, kIrr0 = 0x20, kEsr = 0x28, kIcrLow = 0x30, kIcrHigh = 0x31,
  kLvt0 = 0x32, kLvtLast = 0x37, kTmict = 0x38, kTmcct = 0x39, kTdcr = 0x3e, kSelfIpi = 0x3f,
};

// The registers of the xAPIC page (Table 10-1), everything else in it is reserved.
bool xapic_register_exists(unsigned index) {
  switch (index) {
    case kId: case kVer: case kTpr: case kApr: case kPpr: case kEoi: case kLdr: case kDfr: case kSvr:
    case kEsr: case kIcrLow: case kIcrHigh: case kTmict: case kTmcct: case kTdcr:
      return true;
    default:
      return (index >= kIsr0 && index < kIrr0 + 8) || (index >= kLvt0 && index <= kLvtLast);
  }
}

// ICR bits a write may set (xAPIC): vector, delivery mode, destination mode, level, trigger, shorthand.
constexpr uint32_t kIcrWritable = 0x000cc7ff | (1u << 11);
// x2APIC ICR low bits that are reserved (#GP when set): delivery status, 13, 16-17, 20-31.
constexpr uint32_t kX2IcrReserved = 0xfff33000;

}  // namespace

LocalApic::LocalApic(Clock& clock, const LocalApicConfig& config, InterruptController& ext_int)
    : clock_(clock), config_(config), ext_int_(ext_int) {
  apic_base_ = kBase | (config.bsp ? kBaseBsp : 0) | kBaseEnable;
  reset_registers();
  // The firmware's virtual-wire set-up on the BSP (MP specification 3.6.2.2), as QEMU and KVM
  // reset it: the 8259A reaches the CPU through LINT0 as ExtINT until the OS reprograms LINT0.
  // Application processors keep LINT0 masked.
  if (config.bsp) lvt_[kLvtLint0] = apic_delivery::kExtInt << 8;
}

void LocalApic::reset_registers() {
  id_ = config_.apic_id << 24;
  tpr_ = 0;
  ldr_ = 0;
  dfr_ = 0xffffffff;
  svr_ = 0xff;
  isr_ = {};
  tmr_ = {};
  irr_ = {};
  esr_ = esr_pending_ = 0;
  icr_low_ = icr_high_ = 0;
  lvt_.fill(kLvtMasked);
  initial_count_ = 0;
  divide_config_ = 0;
  extint_requested_ = false;
  stop_timer();
  tsc_deadline_ = 0;
}

void LocalApic::set(Bits& b, uint8_t v, bool on) {
  if (on) b[v >> 5] |= 1u << (v & 31);
  else b[v >> 5] &= ~(1u << (v & 31));
}

int LocalApic::highest(const Bits& b) {
  for (int i = 7; i >= 0; --i) {
    if (b[i]) return i * 32 + 31 - std::countl_zero(b[i]);
  }
  return -1;
}

bool LocalApic::hw_enabled() const { return apic_base_ & kBaseEnable; }
bool LocalApic::x2apic_mode() const { return (apic_base_ & (kBaseEnable | kBaseExtd)) == (kBaseEnable | kBaseExtd); }

// SDM 10.8.3.1: PPR is the TPR when its class is at least the class in service, else that class.
uint8_t LocalApic::ppr() const {
  int isrv = std::max(highest(isr_), 0);
  return (tpr_ >> 4) >= (isrv >> 4) ? tpr_ : uint8_t(isrv & 0xf0);
}

// SDM 10.6.2.4 (arbitration priority), as written there.
uint8_t LocalApic::apr() const {
  unsigned tpr = tpr_ >> 4;
  unsigned isrv = unsigned(std::max(highest(isr_), 0)) >> 4;
  unsigned irrv = unsigned(std::max(highest(irr_), 0)) >> 4;
  if (tpr >= irrv && tpr > isrv) return tpr_;
  return uint8_t(std::max(tpr & isrv, irrv) << 4);
}

bool LocalApic::lint0_extint() const {
  uint32_t lvt = lvt_[kLvtLint0];
  return !(lvt & kLvtMasked) && ((lvt >> 8) & 7) == apic_delivery::kExtInt;
}

// ---- the CPU's interrupt input ------------------------------------------------------------------

bool LocalApic::interrupt_pending() {
  // A globally disabled APIC is absent: the 8259A drives INTR directly (P6 family and later).
  if (!hw_enabled()) return ext_int_.interrupt_pending();
  if (sw_enabled()) {
    int v = highest(irr_);
    if (v >= 0 && (v & 0xf0) > (ppr() & 0xf0)) return true;
  }
  // ExtINT is not subject to the task priority (SDM 10.8.3.1).
  return extint_requested_ || (lint0_extint() && ext_int_.interrupt_pending());
}

uint8_t LocalApic::acknowledge() {
  if (!hw_enabled()) return ext_int_.acknowledge();
  if (sw_enabled()) {
    int v = highest(irr_);
    if (v >= 0 && (v & 0xf0) > (ppr() & 0xf0)) {
      set(irr_, uint8_t(v), false);
      set(isr_, uint8_t(v), true);
      return uint8_t(v);
    }
  }
  if (extint_requested_ || (lint0_extint() && ext_int_.interrupt_pending())) {
    extint_requested_ = false;
    return ext_int_.acknowledge();  // the vector comes from the 8259A's INTA cycle
  }
  // The request went away between INTR and INTA (SDM 10.9): the spurious vector, ISR untouched.
  return uint8_t(svr_ & 0xff);
}

bool LocalApic::accept(uint8_t vector, bool level) {
  if (vector < 16) {
    signal_error(kEsrReceiveIllegalVector);  // not registered in the IRR (SDM 10.5.3)
    return false;
  }
  // A software-disabled APIC takes no new fixed interrupts; what is pending stays held (SDM 10.4.7.2).
  if (!sw_enabled()) return false;
  set(irr_, vector, true);
  set(tmr_, vector, level);  // TMR follows the trigger mode of the accepted interrupt (SDM 10.8.4)
  return true;
}

void LocalApic::signal_error(uint32_t bits) {
  esr_pending_ |= bits;
  if (in_error_) return;  // an illegal vector in the error LVT itself does not loop
  in_error_ = true;
  uint32_t lvt = lvt_[kLvtError];
  if (!(lvt & kLvtMasked)) accept(uint8_t(lvt & 0xff), false);
  in_error_ = false;
}

void LocalApic::eoi() {
  int v = highest(isr_);
  if (v < 0) return;
  set(isr_, uint8_t(v), false);
  // Level-triggered: broadcast the EOI so the I/O APIC clears its Remote IRR (SDM 10.8.5).
  if (test(tmr_, uint8_t(v)) && eoi_listener_) eoi_listener_->end_of_interrupt(uint8_t(v));
}

// ---- messages -------------------------------------------------------------------------------------

bool LocalApic::matches(bool logical, uint32_t destination, bool x2_format) const {
  if (x2apic_mode()) {
    // x2APIC: 32-bit destinations from the ICR; 8-bit ones from the I/O APIC and MSI are used as
    // is, with 0xff as broadcast (the SDM's xAPIC-compatible format; KVM does the same).
    if (destination == 0xffffffffu || (!x2_format && destination == 0xff)) return true;
    if (!logical) return destination == config_.apic_id;
    uint32_t ldr = ldr_;
    return (destination >> 16) == (ldr >> 16) && (destination & ldr & 0xffff) != 0;
  }
  uint8_t dest = uint8_t(destination);
  if (dest == 0xff) return true;
  if (!logical) return dest == (id_ >> 24);
  uint8_t logical_id = uint8_t(ldr_ >> 24);
  if ((dfr_ >> 28) == 0xf) return (dest & logical_id) != 0;                     // flat model
  return (dest >> 4) == (logical_id >> 4) && (dest & logical_id & 0x0f) != 0;  // cluster model
}

bool LocalApic::deliver(const ApicMessage& message) {
  if (!hw_enabled() || !matches(message.logical, message.destination, message.x2_destination)) return false;
  return receive(message);
}

bool LocalApic::receive(const ApicMessage& message) {
  switch (message.delivery_mode) {
    case apic_delivery::kFixed:
    case apic_delivery::kLowestPriority:  // the bus chose this CPU (alone, it is the lowest-priority one)
      return accept(message.vector, message.level);
    case apic_delivery::kExtInt:
      extint_requested_ = true;  // INTA goes to the 8259A
      return true;
    case apic_delivery::kNmi:
      if (!signals_) return false;  // alone on its bus (device model 3's one vCPU): not modelled
      signals_->nmi(index_);
      return true;
    case apic_delivery::kInit: {
      if (!signals_) return false;
      // INIT resets the APIC as power-up would, except its ID and IA32_APIC_BASE (xAPIC or x2APIC mode
      // stays): SDM 10.4.7.3 and 10.12.5.1. The CPU then waits for a STARTUP message.
      const uint32_t id = id_, ldr = ldr_;
      reset_registers();
      id_ = id;
      if (x2apic_mode()) ldr_ = ldr;  // derived from the x2APIC ID, read-only
      signals_->init(index_);
      return true;
    }
    case apic_delivery::kStartup:
      if (!signals_) return false;
      signals_->startup(index_, message.vector);
      return true;
    default:
      return false;  // SMI: deja has no system-management mode
  }
}

void LocalApic::deliver_msi(uint64_t address, uint32_t data) {
  if (auto m = decode_msi(address, data)) deliver(*m);
}

void LocalApic::send_ipi(uint32_t icr_low, uint32_t destination, bool x2) {
  ApicMessage m;
  m.vector = uint8_t(icr_low);
  m.delivery_mode = uint8_t((icr_low >> 8) & 7);
  m.logical = icr_low & (1u << 11);
  m.level = icr_low & (1u << 15);
  m.shorthand = IpiShorthand((icr_low >> 18) & 3);
  m.destination = x2 ? destination : destination >> 24;
  m.x2_destination = x2;
  m.source = index_;
  const bool vectored = m.delivery_mode == apic_delivery::kFixed || m.delivery_mode == apic_delivery::kLowestPriority;
  if (vectored && m.vector < 16) {
    signal_error(kEsrSendIllegalVector);
    return;
  }
  if (!ipi_bus_) {
    // Alone on the bus: a fixed or lowest-priority IPI can reach this CPU only; the rest is dropped.
    const bool to_self = m.shorthand == IpiShorthand::kSelf || m.shorthand == IpiShorthand::kAllIncludingSelf ||
                         (m.shorthand == IpiShorthand::kNone && matches(m.logical, m.destination, x2));
    if (vectored && to_self) accept(m.vector, false);
    return;
  }
  // INIT level de-assert (trigger level, level 0) only synchronizes arbitration IDs: no effect on any CPU.
  if (m.delivery_mode == apic_delivery::kInit && m.level && !(icr_low & (1u << 14))) return;
  // ExtINT IPIs and the self shorthand with anything but a fixed interrupt are invalid (SDM Table 10-2).
  if (m.delivery_mode == apic_delivery::kExtInt) return;
  if (m.shorthand == IpiShorthand::kSelf && m.delivery_mode != apic_delivery::kFixed) return;
  m.level = false;  // the trigger mode applies to INIT de-assert only (SDM 10.6.1): IPIs are edge-triggered
  ipi_bus_->deliver(m);
}

// ---- registers --------------------------------------------------------------------------------------

void LocalApic::write_svr(uint32_t value) {
  uint32_t next = value & 0x3ff;  // vector, APIC enable, focus checking; no EOI-broadcast suppression
  if (sw_enabled() && !(next & 0x100)) {
    // Entering the software-disabled state masks every LVT entry (SDM 10.4.7.2).
    uint64_t now = clock_.now_ns();
    advance(now);
    for (auto& lvt : lvt_) lvt |= kLvtMasked;
  }
  svr_ = next;
}

void LocalApic::write_lvt(Lvt which, uint32_t value) {
  static constexpr uint32_t kWritable[kLvtCount] = {
      0x000300ff,  // timer: vector, mask, mode bit 17 (bit 18 added below with TSC-deadline)
      0x000107ff,  // thermal: vector, delivery mode, mask
      0x000107ff,  // performance counter
      0x0001a7ff,  // LINT0: vector, delivery mode, polarity, trigger mode, mask
      0x0001a7ff,  // LINT1
      0x000100ff,  // error: vector, mask
  };
  uint32_t writable = kWritable[which] | (which == kLvtTimer && config_.tsc_deadline ? 1u << 18 : 0);
  uint32_t next = value & writable;
  if (!sw_enabled()) next |= kLvtMasked;  // masks cannot be cleared while software-disabled
  if (which != kLvtTimer) {
    lvt_[which] = next;
    return;
  }
  uint64_t now = clock_.now_ns();
  advance(now);  // expiries under the old entry are delivered (or not) under it
  unsigned old_mode = timer_mode();
  unsigned new_mode = (next >> 17) & 3;
  lvt_[kLvtTimer] = next;
  bool old_counting = old_mode < 2, new_counting = new_mode < 2;
  if (old_mode != new_mode && old_counting && new_counting && timer_running_ && initial_count_) {
    // One-shot <-> periodic: the count goes on from where it is. A periodic count's position is
    // within its current period; a one-shot that already reached zero stays stopped.
    uint64_t ticks = timer_ticks(now);
    if (new_mode == 0) {
      timer_base_ticks_ = ticks % initial_count_;
      timer_anchor_ns_ = now;
    } else if (ticks >= initial_count_) {
      stop_timer();
    }
  } else if (old_mode != new_mode && !(old_counting && new_counting)) {
    // Entering or leaving TSC-deadline mode (or the reserved mode 3) disarms the timer (SDM 10.5.4.1).
    initial_count_ = 0;
    tsc_deadline_ = 0;
    stop_timer();
  }
}

std::optional<uint64_t> LocalApic::read_register(unsigned index, bool x2) {
  if (index >= kIsr0 && index < kIsr0 + 8) return isr_[index - kIsr0];
  if (index >= kTmr0 && index < kTmr0 + 8) return tmr_[index - kTmr0];
  if (index >= kIrr0 && index < kIrr0 + 8) return irr_[index - kIrr0];
  if (index >= kLvt0 && index <= kLvtLast) return lvt_[index - kLvt0];
  switch (index) {
    case kId: return x2 ? config_.apic_id : id_;
    case kVer: return kVersion;
    case kTpr: return tpr_;
    case kApr: if (x2) return std::nullopt; return apr();
    case kPpr: return ppr();
    case kEoi: if (x2) return std::nullopt; return 0;  // write-only
    case kLdr: return ldr_;
    case kDfr: if (x2) return std::nullopt; return dfr_;
    case kSvr: return svr_;
    case kEsr: return esr_;
    case kIcrLow: return x2 ? (uint64_t(icr_high_) << 32) | icr_low_ : icr_low_;
    case kIcrHigh: if (x2) return std::nullopt; return icr_high_;
    case kTmict: return initial_count_;
    case kTmcct: return current_count(clock_.now_ns());
    case kTdcr: return divide_config_;
    default: return std::nullopt;  // reserved (SELF IPI is write-only)
  }
}

bool LocalApic::write_register(unsigned index, uint64_t value, bool x2) {
  // x2APIC (SDM 10.12.1.2-3): read-only registers and set reserved bits are #GP; the xAPIC page
  // ignores writes to read-only registers.
  auto reserved = [&](uint64_t writable) { return x2 && (value & ~writable); };
  uint32_t v = uint32_t(value);
  if (index >= kLvt0 && index <= kLvtLast) {
    static constexpr uint32_t kAccepted[kLvtCount] = {0x000310ff, 0x000117ff, 0x000117ff,
                                                      0x0001f7ff, 0x0001f7ff, 0x000110ff};
    Lvt which = Lvt(index - kLvt0);
    uint32_t accepted = kAccepted[which] | (which == kLvtTimer && config_.tsc_deadline ? 1u << 18 : 0);
    if (reserved(accepted)) return false;
    write_lvt(which, v);
    return true;
  }
  switch (index) {
    case kId:
      if (x2) return false;
      id_ = v & 0xff000000;
      return true;
    case kTpr:
      if (reserved(0xff)) return false;
      tpr_ = uint8_t(v);
      return true;
    case kEoi:
      if (x2 && value != 0) return false;
      eoi();
      return true;
    case kLdr:
      if (x2) return false;
      ldr_ = v & 0xff000000;
      return true;
    case kDfr:
      if (x2) return false;
      dfr_ = (v & 0xf0000000) | 0x0fffffff;
      return true;
    case kSvr:
      if (reserved(0x3ff)) return false;
      write_svr(v);
      return true;
    case kEsr:
      if (x2 && value != 0) return false;
      esr_ = esr_pending_;
      esr_pending_ = 0;
      return true;
    case kIcrLow:
      if (x2) {
        if (uint32_t(value) & kX2IcrReserved) return false;
        icr_low_ = uint32_t(value);
        icr_high_ = uint32_t(value >> 32);
        send_ipi(icr_low_, icr_high_, true);
      } else {
        icr_low_ = v & kIcrWritable;
        send_ipi(icr_low_, icr_high_, false);
      }
      return true;
    case kIcrHigh:
      if (x2) return false;
      icr_high_ = v & 0xff000000;
      return true;
    case kTmict: {
      if (reserved(0xffffffff)) return false;
      if (timer_mode() >= 2) return true;  // ignored in TSC-deadline mode
      uint64_t now = clock_.now_ns();
      advance(now);
      initial_count_ = v;
      if (v == 0) stop_timer();
      else start_timer(now);
      return true;
    }
    case kTdcr: {
      if (reserved(0xb)) return false;
      uint64_t now = clock_.now_ns();
      advance(now);
      // The count continues at the new rate from its current value.
      timer_base_ticks_ = timer_ticks(now);
      timer_anchor_ns_ = now;
      divide_config_ = v & 0xb;
      return true;
    }
    case kSelfIpi:
      if (!x2 || reserved(0xff)) return false;
      if (v < 16) signal_error(kEsrSendIllegalVector);
      else accept(uint8_t(v), false);
      return true;
    case kVer:
    case kApr:
    case kPpr:
    case kTmcct:
      return !x2;
    default:
      if (index >= kIsr0 && index < kIrr0 + 8) return !x2;  // ISR, TMR, IRR are read-only
      return false;  // reserved
  }
}

void LocalApic::read(uint64_t offset, std::span<uint8_t> data) {
  // In x2APIC mode (and when globally disabled) the page is not decoded: it reads as nothing there.
  if (!hw_enabled() || x2apic_mode()) {
    std::fill(data.begin(), data.end(), uint8_t{0xff});
    return;
  }
  uint64_t value = 0;
  unsigned index = unsigned(offset >> 4) & 0xff;
  if (!xapic_register_exists(index)) {
    signal_error(kEsrIllegalRegister);
  } else if (auto r = read_register(index, false)) {
    value = *r;
  }
  // Registers are 32 bits at the start of each 16-byte slot; narrower reads see their bytes.
  unsigned byte = unsigned(offset & 0xf);
  for (size_t i = 0; i < data.size(); ++i) data[i] = byte + i < 4 ? uint8_t(value >> (8 * (byte + i))) : 0;
}

void LocalApic::write(uint64_t offset, std::span<const uint8_t> data) {
  if (!hw_enabled() || x2apic_mode()) return;
  // Registers take aligned 32-bit stores (SDM 10.4.1); narrower or unaligned stores are dropped.
  if ((offset & 0xf) != 0 || data.size() < 4) return;
  unsigned index = unsigned(offset >> 4) & 0xff;
  if (!xapic_register_exists(index)) {
    signal_error(kEsrIllegalRegister);
    return;
  }
  write_register(index, load_le(data.first(4)), false);
}

// ---- MSRs ------------------------------------------------------------------------------------------

bool LocalApic::owns_msr(uint32_t index) const {
  return index == kApicBaseMsr || (index >= kX2apicFirstMsr && index <= kX2apicLastMsr) ||
         (index == kTscDeadlineMsr && config_.tsc_deadline);
}

LocalApic::MsrRead LocalApic::read_msr(uint32_t index) {
  if (index == kApicBaseMsr) return {apic_base_, false};
  if (index == kTscDeadlineMsr) {
    if (!config_.tsc_deadline) return {0, true};
    return {timer_mode() == 2 ? tsc_deadline_ : 0, false};  // reads 0 in the other timer modes
  }
  if (index < kX2apicFirstMsr || index > kX2apicLastMsr || !x2apic_mode()) return {0, true};
  // Fetching TMCCT reads the clock only for that register.
  auto r = read_register(index - kX2apicFirstMsr, true);
  if (!r) return {0, true};
  return {*r, false};
}

bool LocalApic::write_msr(uint32_t index, uint64_t value) {
  if (index == kApicBaseMsr) {
    uint64_t reserved = ~(kBaseAddressMask | kBaseBsp | kBaseEnable | (config_.x2apic ? kBaseExtd : 0));
    if (value & reserved) return false;
    bool enable = value & kBaseEnable, extd = value & kBaseExtd;
    if (extd && !enable) return false;                             // invalid state
    if (x2apic_mode() && enable && !extd) return false;            // x2APIC -> xAPIC must pass disabled
    if (!hw_enabled() && extd) return false;                       // disabled -> x2APIC must pass xAPIC
    if ((value & kBaseAddressMask) != kBase) return false;         // relocation is not modelled
    bool was_enabled = hw_enabled(), was_x2 = x2apic_mode();
    apic_base_ = value;
    if (was_enabled && !enable) {
      // A globally disabled APIC returns to its power-up state (SDM 10.4.3).
      reset_registers();
    } else if (!was_x2 && extd) {
      // xAPIC -> x2APIC: the ID becomes the x2APIC ID and the LDR is derived from it (SDM 10.12.10.2).
      uint32_t id = config_.apic_id;
      ldr_ = ((id & 0xffff0) << 12) | (1u << (id & 0xf));
    }
    return true;
  }
  if (index == kTscDeadlineMsr) {
    if (!config_.tsc_deadline) return false;
    if (timer_mode() != 2) return true;  // ignored in the other timer modes
    tsc_deadline_ = value;               // 0 disarms; a past deadline fires at once
    return true;
  }
  if (index < kX2apicFirstMsr || index > kX2apicLastMsr || !x2apic_mode()) return false;
  unsigned reg = index - kX2apicFirstMsr;
  if (reg != kIcrLow && (value >> 32)) return false;  // 32-bit registers: bits 63:32 are reserved
  return write_register(reg, value, true);
}

// ---- the timer ----------------------------------------------------------------------------------------

uint64_t LocalApic::divide() const {
  unsigned code = (divide_config_ & 3) | ((divide_config_ >> 1) & 4);
  return code == 7 ? 1 : 2u << code;
}

uint64_t LocalApic::timer_ticks(uint64_t now_ns) const {
  if (!timer_running_) return timer_base_ticks_;
  return timer_base_ticks_ + (now_ns > timer_anchor_ns_ ? (now_ns - timer_anchor_ns_) / divide() : 0);
}

uint32_t LocalApic::current_count(uint64_t now_ns) const {
  if (!timer_running_ || initial_count_ == 0 || timer_mode() >= 2) return 0;
  uint64_t ticks = timer_ticks(now_ns);
  uint64_t n = initial_count_;
  if (timer_mode() == 1) return uint32_t(n - ticks % n);
  return ticks >= n ? 0 : uint32_t(n - ticks);
}

std::optional<uint64_t> LocalApic::next_expiry_after(uint64_t after_ns) const {
  if (!timer_running_ || initial_count_ == 0) return std::nullopt;
  uint64_t div = divide();
  uint64_t n = initial_count_;
  uint64_t base = timer_base_ticks_;
  if (timer_mode() == 0) {
    if (base >= n) return std::nullopt;
    uint64_t at = timer_anchor_ns_ + (n - base) * div;
    return at > after_ns ? std::optional(at) : std::nullopt;
  }
  if (timer_mode() != 1) return std::nullopt;
  // Expiry k is when the count reaches k*n: anchor + (k*n - base) * div; the first one past after_ns.
  uint64_t elapsed = after_ns > timer_anchor_ns_ ? (after_ns - timer_anchor_ns_) / div : 0;
  uint64_t k = (base + elapsed) / n + 1;
  return timer_anchor_ns_ + (k * n - base) * div;
}

uint64_t LocalApic::tsc_to_ns(uint64_t tsc) const {
  // The first ns at which the engine's TSC (floor(ns * tsc_hz / 1e9)) reaches `tsc`.
  unsigned __int128 ns = ((unsigned __int128)tsc * 1'000'000'000u + config_.tsc_hz - 1) / config_.tsc_hz;
  return ns > UINT64_MAX ? UINT64_MAX : uint64_t(ns);
}

void LocalApic::start_timer(uint64_t now_ns) {
  timer_running_ = true;
  timer_anchor_ns_ = now_ns;
  timer_base_ticks_ = 0;
  timer_checked_ns_ = std::max(timer_checked_ns_, now_ns);
}

void LocalApic::stop_timer() {
  timer_running_ = false;
  timer_base_ticks_ = 0;
}

void LocalApic::fire_timer() {
  uint32_t lvt = lvt_[kLvtTimer];
  if (!(lvt & kLvtMasked)) accept(uint8_t(lvt & 0xff), false);
}

std::optional<uint64_t> LocalApic::next_deadline_ns() const {
  // A masked timer still counts, but nothing can come of its expiries: no wake-ups for it.
  if (!hw_enabled() || (lvt_[kLvtTimer] & kLvtMasked)) return std::nullopt;
  if (timer_mode() == 2) return tsc_deadline_ ? std::optional(tsc_to_ns(tsc_deadline_)) : std::nullopt;
  return next_expiry_after(timer_checked_ns_);
}

void LocalApic::advance(uint64_t now_ns) {
  if (timer_mode() == 2) {
    if (tsc_deadline_ && tsc_to_ns(tsc_deadline_) <= now_ns) {
      tsc_deadline_ = 0;  // the MSR reads 0 once the deadline passed (SDM 10.5.4.1)
      fire_timer();
    }
  } else if (auto at = next_expiry_after(timer_checked_ns_); at && *at <= now_ns) {
    fire_timer();  // several expiries since the last call are one interrupt, as the IRR holds one
  }
  timer_checked_ns_ = std::max(timer_checked_ns_, now_ns);
}

// ---- state -----------------------------------------------------------------------------------------------

namespace {
constexpr char kLapicTag[] = "LAPC";
constexpr uint8_t kLapicVersion = 1;
}  // namespace

std::vector<uint8_t> LocalApic::save() const {
  StateWriter w(kLapicTag, kLapicVersion);
  w.u64(apic_base_);
  w.u32(id_);
  w.u8(tpr_);
  w.u32(ldr_);
  w.u32(dfr_);
  w.u32(svr_);
  for (const Bits* bits : {&isr_, &tmr_, &irr_}) {
    for (uint32_t word : *bits) w.u32(word);
  }
  w.u32(esr_);
  w.u32(esr_pending_);
  w.u32(icr_low_);
  w.u32(icr_high_);
  for (uint32_t lvt : lvt_) w.u32(lvt);
  w.u32(initial_count_);
  w.u32(divide_config_);
  w.boolean(extint_requested_);
  w.boolean(timer_running_);
  w.u64(timer_anchor_ns_);
  w.u64(timer_base_ticks_);
  w.u64(timer_checked_ns_);
  w.u64(tsc_deadline_);
  return w.take();
}

Result<> LocalApic::restore(std::span<const uint8_t> state) {
  StateReader r(state, kLapicTag, kLapicVersion);
  uint64_t base = r.u64();
  uint32_t id = r.u32();
  uint8_t tpr = r.u8();
  uint32_t ldr = r.u32();
  uint32_t dfr = r.u32();
  uint32_t svr = r.u32();
  Bits isr{}, tmr{}, irr{};
  for (Bits* bits : {&isr, &tmr, &irr}) {
    for (uint32_t& word : *bits) word = r.u32();
  }
  uint32_t esr = r.u32();
  uint32_t esr_pending = r.u32();
  uint32_t icr_low = r.u32();
  uint32_t icr_high = r.u32();
  std::array<uint32_t, kLvtCount> lvt{};
  for (uint32_t& entry : lvt) entry = r.u32();
  uint32_t initial = r.u32();
  uint32_t divide = r.u32();
  bool extint = r.boolean();
  bool running = r.boolean();
  uint64_t anchor = r.u64();
  uint64_t base_ticks = r.u64();
  uint64_t checked = r.u64();
  uint64_t deadline = r.u64();
  if (r.ok()) {
    uint64_t allowed = kBaseAddressMask | kBaseBsp | kBaseEnable | (config_.x2apic ? kBaseExtd : 0);
    if ((base & ~allowed) || (base & kBaseAddressMask) != kBase || ((base & kBaseExtd) && !(base & kBaseEnable))) {
      r.invalid(fmt::format("IA32_APIC_BASE {:#x} is not a state this APIC can be in", base));
    }
    if (svr & ~0x3ffu) r.invalid(fmt::format("SVR {:#x} sets reserved bits", svr));
    if (divide & ~0xbu) r.invalid(fmt::format("divide configuration {:#x} sets reserved bits", divide));
    if (((lvt[kLvtTimer] >> 17) & 3) >= 2 && !config_.tsc_deadline) {
      r.invalid("the timer is in TSC-deadline mode, which this CPU model lacks");
    }
  }
  if (auto done = r.finish(); !done) return done;
  apic_base_ = base;
  id_ = id;
  tpr_ = tpr;
  ldr_ = ldr;
  dfr_ = dfr;
  svr_ = svr;
  isr_ = isr;
  tmr_ = tmr;
  irr_ = irr;
  esr_ = esr;
  esr_pending_ = esr_pending;
  icr_low_ = icr_low;
  icr_high_ = icr_high;
  lvt_ = lvt;
  initial_count_ = initial;
  divide_config_ = divide;
  extint_requested_ = extint;
  timer_running_ = running;
  timer_anchor_ns_ = anchor;
  timer_base_ticks_ = base_ticks;
  timer_checked_ns_ = checked;
  tsc_deadline_ = deadline;
  return {};
}

}  // namespace deja
