// A local APIC, one per vCPU: xAPIC registers at 0xFEE00000, x2APIC MSRs 0x800-0x8FF, IA32_APIC_BASE, IPIs, the APIC timer.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "devices/device.h"
#include "devices/interrupts.h"

namespace deja {

struct LocalApicConfig {
  uint32_t apic_id = 0;       // the initial APIC ID (CPUID.1:EBX[31:24])
  bool bsp = true;            // IA32_APIC_BASE.BSP: the bootstrap processor's (the firmware's virtual wire on LINT0)
  bool x2apic = false;        // CPUID.1:ECX.x2APIC: IA32_APIC_BASE.EXTD may be set
  bool tsc_deadline = false;  // CPUID.1:ECX.TSC_DEADLINE: LVT timer mode 2 and IA32_TSC_DEADLINE
  uint64_t tsc_hz = 2'000'000'000;  // the guest's TSC rate of virtual time (the CPU model's)
};

// Follows the Intel SDM vol. 3, chapter 10 ("Advanced Programmable Interrupt Controller"), as a
// Pentium 4 / Xeon class xAPIC with the x2APIC extension: version 0x14 with six LVT entries
// (timer, thermal, performance counter, LINT0, LINT1, error; no CMCI), no EOI-broadcast suppression.
//
// Modelled: ID, version, TPR, APR, PPR, EOI, LDR, DFR (flat and cluster), SVR (software enable,
// spurious vector, focus bit stored), ISR/TMR/IRR, ESR with its write-to-update protocol and the
// error interrupt (send/receive illegal vector, illegal register address), the ICR for IPIs to
// this CPU (fixed and lowest-priority; destination shorthands, physical and logical matching),
// the LVT entries with their writable-bit masks and the software-disabled mask rule, the timer in
// one-shot, periodic and (when the CPU model has it) TSC-deadline mode with the divide
// configuration, IA32_APIC_BASE (global enable, x2APIC mode switches with their #GP rules), and
// the x2APIC MSR interface with its reserved-bit, read-only and write-only #GP rules.
//
// Time: the APIC timer counts the 1 GHz bus clock divided by the divide configuration (as QEMU and
// KVM do), from the Clock's virtual ns, with integer math and never by stepping; its expiries are
// device deadlines (next_deadline_ns / advance) like the PIT's. The TSC deadline converts to ns
// with the model's TSC rate, the same mapping the engine uses for RDTSC.
//
// Not modelled, documented in docs/devices.md: without a CpuSignalSink (a one-vCPU machine, as in
// device model 3) NMI, INIT and start-up messages are dropped; SMI always is (no SMM); LINT0 carries only
// the 8259A's INTR as ExtINT (LINT1 is not connected); the APIC page cannot be relocated (an IA32_APIC_BASE write that moves
// it is #GP); CR8 is the backend's and does not alias the TPR.
class LocalApic : public Device, public InterruptController, public ApicBus, public MsiSink {
 public:
  static constexpr uint64_t kBase = 0xfee00000;
  static constexpr uint64_t kMmioSize = 0x1000;
  static constexpr uint64_t kBusHz = 1'000'000'000;
  static constexpr uint32_t kVersion = 0x00050014;  // max LVT entry 5, version 0x14
  static constexpr uint32_t kApicBaseMsr = 0x1b, kTscDeadlineMsr = 0x6e0, kX2apicFirstMsr = 0x800,
                            kX2apicLastMsr = 0x8ff;

  // `ext_int` is the 8259A pair's INTR and INTA (LINT0 / ExtINT messages).
  LocalApic(Clock& clock, const LocalApicConfig& config, InterruptController& ext_int);

  // The EOI broadcast for level-triggered vectors goes here (the I/O APIC).
  void set_eoi_listener(EoiListener* listener) { eoi_listener_ = listener; }
  // On a multiprocessor's APIC bus (devices/apic_fabric.h): IPIs go out through `bus`, NMI, INIT and STARTUP
  // messages received go to `signals` as CPU `index`. Without this the APIC is alone: IPIs reach itself only.
  void attach_bus(ApicBus* bus, CpuSignalSink* signals, uint32_t index) {
    ipi_bus_ = bus;
    signals_ = signals;
    index_ = index;
  }

  // Device: the xAPIC page (offsets from kBase).
  std::string_view name() const override { return "lapic"; }
  void read(uint64_t offset, std::span<uint8_t> data) override;
  void write(uint64_t offset, std::span<const uint8_t> data) override;
  std::vector<uint8_t> save() const override;
  Result<> restore(std::span<const uint8_t> state) override;
  std::optional<uint64_t> next_deadline_ns() const override;
  void advance(uint64_t now_ns) override;

  // MSRs (IA32_APIC_BASE, x2APIC 0x800-0x8FF, IA32_TSC_DEADLINE when the model has it).
  bool owns_msr(uint32_t index) const;
  struct MsrRead {
    uint64_t value = 0;
    bool fault = false;  // #GP
  };
  MsrRead read_msr(uint32_t index);
  bool write_msr(uint32_t index, uint64_t value);  // false: #GP

  // InterruptController: the CPU's INTR and INTA.
  bool interrupt_pending() override;
  uint8_t acknowledge() override;

  // ApicBus / MsiSink: messages from the I/O APIC and PCI devices, when this APIC is alone on its bus.
  bool deliver(const ApicMessage& message) override;
  void deliver_msi(uint64_t address, uint32_t data) override;
  // The APIC bus's view (devices/apic_fabric.h): does a message's destination name this APIC (IPI
  // shorthands aside), its arbitration priority for lowest-priority delivery, and taking a message it was
  // chosen for (true: accepted).
  bool matches(bool logical, uint32_t destination, bool x2_format) const;
  uint8_t apr() const;
  bool receive(const ApicMessage& message);
  bool hw_enabled() const;
  uint32_t apic_id() const { return config_.apic_id; }

  // For tests and diagnostics.
  uint64_t apic_base() const { return apic_base_; }
  bool x2apic_mode() const;
  bool irr(uint8_t vector) const { return test(irr_, vector); }
  bool isr(uint8_t vector) const { return test(isr_, vector); }
  bool tmr(uint8_t vector) const { return test(tmr_, vector); }
  uint8_t ppr() const;

 private:
  using Bits = std::array<uint32_t, 8>;
  enum Lvt { kLvtTimer, kLvtThermal, kLvtPerf, kLvtLint0, kLvtLint1, kLvtError, kLvtCount };

  static bool test(const Bits& b, uint8_t v) { return b[v >> 5] >> (v & 31) & 1; }
  static void set(Bits& b, uint8_t v, bool on);
  static int highest(const Bits& b);

  bool sw_enabled() const { return svr_ & 0x100; }
  void reset_registers();

  // Register file access by index (offset >> 4, or MSR - 0x800); `x2` selects x2APIC semantics.
  std::optional<uint64_t> read_register(unsigned index, bool x2);
  bool write_register(unsigned index, uint64_t value, bool x2);  // false: #GP (x2APIC)
  void write_lvt(Lvt which, uint32_t value);
  void write_svr(uint32_t value);
  void eoi();
  void send_ipi(uint32_t icr_low, uint32_t destination, bool x2);
  // A fixed interrupt from a local source or a message: IRR (and TMR), or a receive-illegal-vector error.
  bool accept(uint8_t vector, bool level);
  void signal_error(uint32_t bits);
  bool lint0_extint() const;

  // The timer.
  unsigned timer_mode() const { return (lvt_[kLvtTimer] >> 17) & 3; }
  uint64_t divide() const;
  uint64_t timer_ticks(uint64_t now_ns) const;
  uint32_t current_count(uint64_t now_ns) const;
  std::optional<uint64_t> next_expiry_after(uint64_t after_ns) const;
  void start_timer(uint64_t now_ns);
  void stop_timer();
  void fire_timer();
  uint64_t tsc_to_ns(uint64_t tsc) const;

  Clock& clock_;
  LocalApicConfig config_;
  InterruptController& ext_int_;
  EoiListener* eoi_listener_ = nullptr;
  ApicBus* ipi_bus_ = nullptr;
  CpuSignalSink* signals_ = nullptr;
  uint32_t index_ = 0;

  uint64_t apic_base_ = 0;
  uint32_t id_ = 0;  // xAPIC ID register (ID in bits 31:24)
  uint8_t tpr_ = 0;
  uint32_t ldr_ = 0;
  uint32_t dfr_ = 0xffffffff;
  uint32_t svr_ = 0xff;
  Bits isr_{}, tmr_{}, irr_{};
  uint32_t esr_ = 0;          // as last updated by an ESR write
  uint32_t esr_pending_ = 0;  // errors detected since
  uint32_t icr_low_ = 0, icr_high_ = 0;
  std::array<uint32_t, kLvtCount> lvt_{};
  uint32_t initial_count_ = 0;
  uint32_t divide_config_ = 0;
  bool extint_requested_ = false;  // an ExtINT message waits for INTA
  bool in_error_ = false;          // delivering the error interrupt (no recursive errors)

  // Timer state: ticks counted = timer_base_ticks_ + (now - timer_anchor_ns_) / divide, while
  // timer_running_; expiries at or before timer_checked_ns_ have been delivered.
  bool timer_running_ = false;
  uint64_t timer_anchor_ns_ = 0;
  uint64_t timer_base_ticks_ = 0;
  uint64_t timer_checked_ns_ = 0;
  uint64_t tsc_deadline_ = 0;  // armed IA32_TSC_DEADLINE, 0 = disarmed
};

}  // namespace deja
