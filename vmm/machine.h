// The PC machine: RAM, buses, devices wired to their ports and IRQ lines, and one vCPU backend.
#pragma once

#include <functional>
#include <memory>
#include <span>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "devices/bus.h"
#include "devices/cmos_rtc.h"
#include "devices/debug_exit.h"
#include "devices/fw_cfg.h"
#include "devices/interrupts.h"
#include "devices/ioapic.h"
#include "devices/lapic.h"
#include "devices/pic8259.h"
#include "devices/pit8254.h"
#include "devices/pit8254_v1.h"
#include "devices/uart16550.h"
#include "vmm/backend.h"
#include "vmm/cpu_model.h"
#include "vmm/guest_memory.h"

namespace deja {

// Version of the device semantics (all device models together); recorded in trace headers and
// bumped whenever any device's guest-visible behaviour changes.
// Model 2: the PIT's datasheet timing (pit8254.h) and the pc-apic machine. Model 1 (pit8254_v1.h) is
// kept so that its traces replay; `MachineConfig::device_model_version` picks one.
constexpr uint32_t kDeviceModelVersion = 2;
constexpr uint32_t kOldestDeviceModelVersion = 1;

// The machine types (`--machine`), recorded in the trace header.
//   pc       the PIC-only PC: 8259A pair, no local APIC (CPUID.1:EDX.APIC clear)
//   pc-apic  the same PC plus a local APIC and an I/O APIC, found through an MP table
constexpr std::string_view kMachinePc = "pc", kMachinePcApic = "pc-apic";

struct MachineConfig {
  uint64_t memory_bytes = 256ull << 20;
  std::string cmdline;
  std::string backend = "interp";  // "kvm" or "interp"
  std::string machine = std::string(kMachinePc);  // "pc" or "pc-apic"
  uint32_t device_model_version = kDeviceModelVersion;  // replay: the trace's
  const CpuModel* cpu_model = &CpuModel::x86_64_v1();  // what CPUID answers (recorded in the trace header)
  int64_t rtc_epoch_unix_seconds = 0;
  // Test-only: perturbs a device's semantics so replay must report divergence (see tests).
  std::string device_semantics;
  // KVM: use the kvm-deja module's RDTSC exits when present (replay: only if the recording used them).
  bool trap_rdtsc = true;
  // The software CPU's execution mode (reference, threaded or jit; docs/interp.md); "" = its default.
  // Not part of the machine model: every mode computes the same guest execution.
  std::string interp_mode;
};

class Machine {
 public:
  // Builds RAM, devices and the backend. `clock` and `serial_out` must outlive the machine.
  static Result<std::unique_ptr<Machine>> create(const MachineConfig& config, Clock& clock, ByteSink& serial_out);

  GuestMemory& memory() { return memory_; }
  Backend& backend() { return *backend_; }
  Bus& pio() { return pio_; }
  Bus& mmio() { return mmio_; }
  PicPair& pic() { return *pic_; }
  // The CPU's interrupt input: the 8259A pair (pc), or the local APIC with the 8259A behind it (pc-apic).
  InterruptController& interrupts() { return *cpu_interrupts_; }
  // Where ISA devices (and PCI INTx, on the line its Interrupt Line names) raise IRQs 0-15: the
  // 8259A pair, and on pc-apic also the I/O APIC input of the same number (IRQ 0 -> input 2).
  IrqSink& isa_irqs() { return *isa_irqs_; }
  // PCI MSI / MSI-X writes: the local APIC (pc-apic), nullptr on the PIC-only PC.
  MsiSink* msi() { return lapic_.get(); }
  LocalApic* lapic() { return lapic_.get(); }
  IoApic* ioapic() { return ioapic_.get(); }

  // MSRs the machine's devices answer (the local APIC's on pc-apic): nullopt when none does.
  std::optional<LocalApic::MsrRead> read_msr(uint32_t index);
  // false: #GP; nullopt: no device has the MSR.
  std::optional<bool> write_msr(uint32_t index, uint64_t value);
  Uart16550& uart() { return *uart_; }
  DebugExit& debug_exit() { return *debug_exit_; }
  const MachineConfig& config() const { return config_; }

  // Earliest internal event of any timed device (virtual ns), and processing up to `now_ns`.
  std::optional<uint64_t> next_deadline_ns() const;
  void advance_devices(uint64_t now_ns);

  // Saved state of every device, in a fixed order (for digests and checkpoints).
  std::vector<std::vector<uint8_t>> device_states() const;
  // What device_states() holds, in that order: every device with state (each once), by name.
  struct StatefulPart {
    std::string name;
    std::function<std::vector<uint8_t>()> save;
    std::function<Result<>(std::span<const uint8_t>)> restore;
  };
  const std::vector<StatefulPart>& stateful_parts() const { return stateful_; }
  // Puts back what device_states() returned; a count or a blob that does not fit is refused, naming the device.
  Result<> restore_device_states(std::span<const std::vector<uint8_t>> states);

 private:
  explicit Machine(GuestMemory memory) : memory_(std::move(memory)) {}

  MachineConfig config_;
  GuestMemory memory_;
  Bus pio_{"port I/O"};
  Bus mmio_{"MMIO"};
  std::unique_ptr<PicPair> pic_;
  std::unique_ptr<InterruptController> pic_input_;  // the 8259A pair's INTR/INTA
  std::unique_ptr<IrqSink> isa_router_;             // pc-apic: ISA IRQs to both controllers
  IrqSink* isa_irqs_ = nullptr;
  InterruptController* cpu_interrupts_ = nullptr;
  std::unique_ptr<LocalApic> lapic_;
  std::unique_ptr<IoApic> ioapic_;
  std::unique_ptr<PitChannels> pit_;
  std::unique_ptr<SystemControlPortB> port61_;
  std::unique_ptr<Uart16550> uart_;
  std::unique_ptr<CmosRtc> rtc_;
  std::unique_ptr<DebugExit> debug_exit_;
  std::unique_ptr<FwCfg> fw_cfg_;
  std::unique_ptr<Device> perturbed_;  // test-only device-semantics wrapper
  std::vector<Device*> timed_;
  // Every device with state, for checkpoints and digests: a new device adds one line in create().
  std::vector<StatefulPart> stateful_;
  template <typename T>
  void add_stateful(std::string name, T& part) {
    stateful_.push_back(StatefulPart{std::move(name), [&part] { return part.save(); },
                                     [&part](std::span<const uint8_t> state) { return part.restore(state); }});
  }
  std::unique_ptr<Backend> backend_;
};

// Creates the backend named `name` ("kvm" or "interp") over `memory`, presenting CPU model `model`.
Result<std::unique_ptr<Backend>> make_backend(const std::string& name, GuestMemory& memory, const CpuModel& model,
                                              bool trap_rdtsc = true);

}  // namespace deja
