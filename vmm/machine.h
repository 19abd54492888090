// The PC machine: RAM, buses, devices wired to their ports and IRQ lines, and its vCPU backends.
#pragma once

#include <functional>
#include <memory>
#include <span>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "devices/apic_fabric.h"
#include "devices/bus.h"
#include "devices/cmos_rtc.h"
#include "devices/debug_exit.h"
#include "devices/fw_cfg.h"
#include "devices/interrupts.h"
#include "devices/ioapic.h"
#include "devices/lapic.h"
#include "devices/pci_host.h"
#include "devices/pic8259.h"
#include "devices/pit8254.h"
#include "devices/pit8254_v1.h"
#include "devices/uart16550.h"
#include "devices/virtio_blk.h"
#include "devices/virtio_net.h"
#include "devices/virtio_pci.h"
#include "devices/virtio_rng.h"
#include "core/backend.h"
#include "core/cpu_model.h"
#include "core/guest_memory.h"

namespace deja {

// Version of the device semantics (all device models together); recorded in trace headers and
// bumped whenever any device's guest-visible behaviour changes.
// Model 2: the PIT's datasheet timing (pit8254.h) and the pc-apic machine. Model 1 (pit8254_v1.h) is
// kept so that its traces replay; `MachineConfig::device_model_version` picks one.
// Model 3: PCI (a host bridge at 00:00.0 behind ports 0xCF8-0xCFF, ELCR level lines for PCI INTx, the MP table's
// PCI bus on pc-apic) and the virtio PCI devices. Models 1 and 2 build no PCI, as their traces saw none.
constexpr uint32_t kDeviceModelVersion = 3;
constexpr uint32_t kOldestDeviceModelVersion = 1;

// The machine types (`--machine`), recorded in the trace header.
//   pc       the PIC-only PC: 8259A pair, no local APIC (CPUID.1:EDX.APIC clear)
//   pc-apic  the same PC plus a local APIC and an I/O APIC, found through an MP table
constexpr std::string_view kMachinePc = "pc", kMachinePcApic = "pc-apic";

// vCPUs a machine may have (`--cpus`): more than one needs pc-apic (docs/smp.md).
constexpr uint32_t kMaxVcpus = 16;

// A virtio-blk disk: what it serves (a DiskImage, owned by the caller) and its GET_ID serial.
struct VirtioDiskSetup {
  BlockStore* store = nullptr;
  std::string serial;
};

// Where PCI devices go: the 32-bit MMIO window the builder assigns BARs from (as firmware would; Linux keeps
// them, or moves them) and the ISA lines PCI INTx pins are wired to, by slot (slot 1 -> 10, 2 -> 11, 3 -> 5, ...).
constexpr uint64_t kPciMmioBase = 0xe0000000, kPciMmioEnd = 0xfec00000;
constexpr uint8_t kPciIrqs[4] = {10, 11, 5, 9};

struct MachineConfig {
  uint64_t memory_bytes = 256ull << 20;
  std::string cmdline;
  uint32_t vcpus = 1;  // 1 to kMaxVcpus; more than one on pc-apic only
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
  // x86-TSO store buffers on the software CPU (`--tso`, docs/explore.md): part of the machine model, in the trace.
  std::optional<StoreBufferPlan> tso;
  // Virtio PCI devices (device model 3), placed on bus 0 in this order: disks, NICs, the entropy device.
  std::vector<VirtioDiskSetup> disks;
  unsigned nics = 0;
  std::vector<std::array<uint8_t, 6>> nic_macs;  // NIC i's MAC address; nic_mac(i) where none is given
  bool rng = false;
};

// The MAC address of NIC `index`: QEMU's default 52:54:00:12:34:56, counting up.
std::array<uint8_t, 6> nic_mac(unsigned index);

class Machine {
 public:
  // Builds RAM, devices and the backend. `clock` and `serial_out` must outlive the machine.
  // `entropy` and `network` are needed only with an entropy device or NICs.
  static Result<std::unique_ptr<Machine>> create(const MachineConfig& config, Clock& clock, ByteSink& serial_out,
                                                 Entropy* entropy = nullptr, NetworkPort* network = nullptr);

  GuestMemory& memory() { return memory_; }
  // The vCPUs, vCPU 0 the bootstrap processor.
  size_t vcpu_count() const { return vcpus_.size(); }
  // The vCPU whose exit the buses serve now: its local APIC answers at 0xFEE00000.
  void select_vcpu(size_t vcpu) { current_vcpu_ = vcpu; }
  size_t selected_vcpu() const { return current_vcpu_; }
  Backend& backend(size_t vcpu = 0) { return *vcpus_[vcpu]; }
  Bus& pio() { return pio_; }
  Bus& mmio() { return mmio_; }
  PicPair& pic() { return *pic_; }
  // A vCPU's interrupt input: the 8259A pair (pc), or its local APIC, the BSP's with the 8259A behind it (pc-apic).
  InterruptController& interrupts(size_t vcpu = 0) {
    return lapics_.empty() ? *cpu_interrupts_ : static_cast<InterruptController&>(*lapics_[vcpu]);
  }
  // Where ISA devices (and PCI INTx, on the line its Interrupt Line names) raise IRQs 0-15: the
  // 8259A pair, and on pc-apic also the I/O APIC input of the same number (IRQ 0 -> input 2).
  IrqSink& isa_irqs() { return *isa_irqs_; }
  // PCI MSI / MSI-X writes: the APIC bus (pc-apic), nullptr on the PIC-only PC.
  MsiSink* msi() { return apic_bus_.get(); }
  LocalApic* lapic(size_t vcpu = 0) { return vcpu < lapics_.size() ? lapics_[vcpu].get() : nullptr; }
  IoApic* ioapic() { return ioapic_.get(); }
  // The APIC bus (pc-apic): its vCPUs' NMI, INIT and STARTUP signals and activity states; nullptr on pc.
  ApicFabric* apic_bus() { return apic_bus_.get(); }

  // MSRs the machine's devices answer (vCPU `vcpu`'s local APIC's on pc-apic): nullopt when none does.
  std::optional<LocalApic::MsrRead> read_msr(uint32_t index, size_t vcpu = 0);
  // false: #GP; nullopt: no device has the MSR.
  std::optional<bool> write_msr(uint32_t index, uint64_t value, size_t vcpu = 0);
  Uart16550& uart() { return *uart_; }
  // PCI (device model 3): the host bridge, and the virtio devices by kind.
  PciHost* pci() { return pci_.get(); }
  const std::vector<std::unique_ptr<VirtioNet>>& nics() const { return nics_; }
  const std::vector<std::unique_ptr<VirtioBlk>>& disks() const { return disks_; }
  VirtioRng* rng() { return rng_.get(); }
  const std::vector<std::unique_ptr<VirtioPci>>& virtio_functions() const { return virtio_pci_; }
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
  std::vector<std::unique_ptr<LocalApic>> lapics_;  // pc-apic: one per vCPU
  std::unique_ptr<ApicFabric> apic_bus_;
  std::unique_ptr<Device> lapic_window_;
  size_t current_vcpu_ = 0;
  std::unique_ptr<IoApic> ioapic_;
  std::unique_ptr<PitChannels> pit_;
  std::unique_ptr<SystemControlPortB> port61_;
  std::unique_ptr<Uart16550> uart_;
  std::unique_ptr<CmosRtc> rtc_;
  std::unique_ptr<DebugExit> debug_exit_;
  std::unique_ptr<FwCfg> fw_cfg_;
  std::unique_ptr<PciHost> pci_;
  std::vector<std::unique_ptr<VirtioBlk>> disks_;
  std::vector<std::unique_ptr<VirtioNet>> nics_;
  std::unique_ptr<VirtioRng> rng_;
  std::vector<std::unique_ptr<VirtioPci>> virtio_pci_;  // the transports, in slot order (slot = index + 1)
  std::unique_ptr<Device> perturbed_;  // test-only device-semantics wrapper
  std::vector<Device*> timed_;
  // Every device with state, for checkpoints and digests: a new device adds one line in create().
  std::vector<StatefulPart> stateful_;
  template <typename T>
  void add_stateful(std::string name, T& part) {
    stateful_.push_back(StatefulPart{std::move(name), [&part] { return part.save(); },
                                     [&part](std::span<const uint8_t> state) { return part.restore(state); }});
  }
  std::vector<std::unique_ptr<Backend>> vcpus_;
};

// Creates the backend named `name` ("kvm" or "interp") over `memory`, presenting CPU model `model`.
Result<std::unique_ptr<Backend>> make_backend(const std::string& name, GuestMemory& memory, const CpuModel& model,
                                              bool trap_rdtsc = true);
// The same for the `models.size()` vCPUs of one machine, vCPU i presenting models[i].
Result<std::vector<std::unique_ptr<Backend>>> make_backends(const std::string& name, GuestMemory& memory,
                                                            std::span<const CpuModel* const> models,
                                                            bool trap_rdtsc = true);

}  // namespace deja
