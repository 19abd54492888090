// Machine builder: the explicit wiring of the PC's devices (kvmtool-style, no static registration).
#include "vmm/machine.h"

#include "interp/interp_backend.h"
#include "kvm/kvm_backend.h"
#include "core/cpu_model.h"
#include "vmm/mp_table.h"

namespace deja {
namespace {

// Test-only perturbation of a device's semantics ("test:uart-lsr-temt" flips the UART's LSR.TEMT
// bit on reads), so the tests can prove that a changed device model is reported as divergence.
class PerturbedUart : public Device {
 public:
  explicit PerturbedUart(Device& inner) : inner_(inner) {}
  std::string_view name() const override { return inner_.name(); }
  void read(uint64_t offset, std::span<uint8_t> data) override {
    inner_.read(offset, data);
    if (offset == 5 && !data.empty()) data[0] ^= 0x40;
  }
  void write(uint64_t offset, std::span<const uint8_t> data) override { inner_.write(offset, data); }
  std::vector<uint8_t> save() const override { return inner_.save(); }
  Result<> restore(std::span<const uint8_t> state) override { return inner_.restore(state); }

 private:
  Device& inner_;
};

// The 8259A pair as the CPU's interrupt input (PicPair has the two calls, not the interface).
class PicInput : public InterruptController {
 public:
  explicit PicInput(PicPair& pic) : pic_(pic) {}
  bool interrupt_pending() override { return pic_.interrupt_pending(); }
  uint8_t acknowledge() override { return pic_.acknowledge(); }

 private:
  PicPair& pic_;
};

// pc-apic: every ISA IRQ reaches both the 8259A pair and the I/O APIC, as on the PIIX/ICH
// chipsets; the PIT's IRQ 0 is the I/O APIC's input 2 (input 0 would be the 8259A's INTR).
class IsaIrqRouter : public IrqSink {
 public:
  IsaIrqRouter(IrqSink& pic, IrqSink& ioapic) : pic_(pic), ioapic_(ioapic) {}
  void set_irq(unsigned line, bool level) override {
    pic_.set_irq(line, level);
    ioapic_.set_irq(line == 0 ? 2 : line, level);
  }

 private:
  IrqSink& pic_;
  IrqSink& ioapic_;
};

// The local APIC page at 0xFEE00000 is each processor's own: an access goes to the APIC of the vCPU that
// made it (Machine::select_vcpu). Its state is each LocalApic's, saved as theirs.
class LapicWindow : public Device {
 public:
  LapicWindow(const std::vector<std::unique_ptr<LocalApic>>& lapics, const size_t& current)
      : lapics_(lapics), current_(current) {}
  std::string_view name() const override { return "lapic"; }
  void read(uint64_t offset, std::span<uint8_t> data) override { lapics_[current_]->read(offset, data); }
  void write(uint64_t offset, std::span<const uint8_t> data) override { lapics_[current_]->write(offset, data); }
  std::vector<uint8_t> save() const override { return {}; }
  Result<> restore(std::span<const uint8_t>) override { return {}; }

 private:
  const std::vector<std::unique_ptr<LocalApic>>& lapics_;
  const size_t& current_;
};

// The I/O APIC's ID follows the processors' (0 to N-1), as firmware numbers them: 1 with one vCPU.
uint8_t ioapic_id(uint32_t vcpus) { return uint8_t(std::max<uint32_t>(vcpus, 1)); }

}  // namespace

Result<std::unique_ptr<Backend>> make_backend(const std::string& name, GuestMemory& memory, const CpuModel& model,
                                              bool trap_rdtsc) {
  if (name == "kvm") return make_kvm_backend(memory, model, KvmOptions{.trap_rdtsc = trap_rdtsc});
  if (name == "interp") return make_interp_backend(memory, model);
  return fail(ErrorKind::kInvalidArgument, "unknown backend '{}' (use kvm or interp)", name);
}

Result<std::vector<std::unique_ptr<Backend>>> make_backends(const std::string& name, GuestMemory& memory,
                                                            std::span<const CpuModel* const> models,
                                                            bool trap_rdtsc) {
  // KVM's vCPUs are one VM's.
  if (name == "kvm") return make_kvm_backends(memory, models, KvmOptions{.trap_rdtsc = trap_rdtsc});
  std::vector<std::unique_ptr<Backend>> vcpus;
  for (const CpuModel* model : models) {
    auto backend = make_backend(name, memory, *model, trap_rdtsc);
    if (!backend) return std::unexpected(backend.error());
    vcpus.push_back(std::move(*backend));
  }
  if (name == "interp" && vcpus.size() > 1) {
    std::vector<InterpBackend*> interp;
    for (auto& v : vcpus) interp.push_back(static_cast<InterpBackend*>(v.get()));
    InterpBackend::share_code(interp);
  }
  return vcpus;
}

std::array<uint8_t, 6> nic_mac(unsigned index) {
  return {0x52, 0x54, 0x00, 0x12, 0x34, uint8_t(0x56 + index)};
}

Result<std::unique_ptr<Machine>> Machine::create(const MachineConfig& config, Clock& clock, ByteSink& serial_out,
                                                 Entropy* entropy, NetworkPort* network) {
  auto memory = GuestMemory::create(config.memory_bytes);
  if (!memory) return std::unexpected(memory.error());
  std::unique_ptr<Machine> m(new Machine(std::move(*memory)));
  m->config_ = config;

  const bool apic = config.machine == kMachinePcApic;
  if (!apic && config.machine != kMachinePc) {
    return fail(ErrorKind::kInvalidArgument, "unknown machine '{}' (use {} or {})", config.machine, kMachinePc,
                kMachinePcApic);
  }
  if (config.vcpus < 1 || config.vcpus > kMaxVcpus) {
    return fail(ErrorKind::kInvalidArgument, "{} vCPUs: a machine has 1 to {}", config.vcpus, kMaxVcpus);
  }
  if (config.vcpus > 1 && !apic) {
    return fail(ErrorKind::kInvalidArgument, "{} vCPUs need --machine {}: the PIC-only PC has no way to start or "
                "interrupt a second processor", config.vcpus, kMachinePcApic);
  }
  const CpuModel& cpu_model = apic ? config.cpu_model->with_local_apic() : *config.cpu_model;
  if (config.device_model_version < kOldestDeviceModelVersion || config.device_model_version > kDeviceModelVersion) {
    return fail(ErrorKind::kUnsupported, "device model v{} is not one this deja implements (v{} to v{})",
                config.device_model_version, kOldestDeviceModelVersion, kDeviceModelVersion);
  }
  if (apic && config.device_model_version < 2) {
    return fail(ErrorKind::kUnsupported, "--machine {} needs device model v2 (this configuration asks for v{})",
                config.machine, config.device_model_version);
  }

  m->pic_ = std::make_unique<PicPair>();
  m->pic_input_ = std::make_unique<PicInput>(*m->pic_);
  m->isa_irqs_ = m->pic_.get();
  m->cpu_interrupts_ = m->pic_input_.get();
  std::vector<const CpuModel*> vcpu_models;
  for (uint32_t i = 0; i < config.vcpus; ++i) vcpu_models.push_back(&cpu_model.for_apic_id(uint8_t(i)));
  if (apic) {
    // One local APIC per vCPU, its ID the vCPU's CPUID.1 APIC ID, all on one APIC bus with the I/O APIC.
    std::vector<LocalApic*> lapics;
    for (uint32_t i = 0; i < config.vcpus; ++i) {
      CpuidResult leaf1 = vcpu_models[i]->cpuid(1, 0);
      LocalApicConfig lapic_config;
      lapic_config.apic_id = leaf1.ebx >> 24;
      lapic_config.bsp = i == 0;
      lapic_config.x2apic = leaf1.ecx & (1u << 21);
      lapic_config.tsc_deadline = leaf1.ecx & (1u << 24);
      lapic_config.tsc_hz = CpuModel::kTscHz;
      m->lapics_.push_back(std::make_unique<LocalApic>(clock, lapic_config, *m->pic_input_));
      lapics.push_back(m->lapics_.back().get());
    }
    m->apic_bus_ = std::make_unique<ApicFabric>(lapics);
    // One vCPU keeps device model 3's APIC, which drops NMI, INIT and STARTUP messages (its traces replay as
    // they were); with more, the vCPUs take them.
    CpuSignalSink* signals = config.vcpus > 1 ? m->apic_bus_.get() : nullptr;
    for (uint32_t i = 0; i < config.vcpus; ++i) m->lapics_[i]->attach_bus(m->apic_bus_.get(), signals, i);
    m->ioapic_ = std::make_unique<IoApic>(*m->apic_bus_, ioapic_id(config.vcpus));
    for (auto& lapic : m->lapics_) lapic->set_eoi_listener(m->ioapic_.get());
    m->isa_router_ = std::make_unique<IsaIrqRouter>(*m->pic_, *m->ioapic_);
    m->isa_irqs_ = m->isa_router_.get();
    m->lapic_window_ = std::make_unique<LapicWindow>(m->lapics_, m->current_vcpu_);
  }
  IrqSink* isa = m->isa_irqs_;
  if (config.device_model_version == 1) {
    m->pit_ = std::make_unique<Pit8254V1>(clock, IrqLine(isa, 0));
  } else {
    m->pit_ = std::make_unique<Pit8254>(clock, IrqLine(isa, 0));
  }
  m->port61_ = std::make_unique<SystemControlPortB>(*m->pit_);
  m->uart_ = std::make_unique<Uart16550>(IrqLine(isa, 4), serial_out);
  m->rtc_ = std::make_unique<CmosRtc>(clock, config.rtc_epoch_unix_seconds, IrqLine(isa, 8));
  m->rtc_->set_memory_size(config.memory_bytes);
  m->debug_exit_ = std::make_unique<DebugExit>();
  m->fw_cfg_ = std::make_unique<FwCfg>(FwCfgConfig{config.memory_bytes, 1, config.cmdline});

  Device* uart_ports = m->uart_.get();
  if (config.device_semantics == "test:uart-lsr-temt") {
    m->perturbed_ = std::make_unique<PerturbedUart>(*m->uart_);
    uart_ports = m->perturbed_.get();
  } else if (!config.device_semantics.empty()) {
    return fail(ErrorKind::kInvalidArgument, "unknown device semantics '{}'", config.device_semantics);
  }
  struct Mapping {
    uint64_t base, length;
    Device* device;
  };
  const Mapping mappings[] = {
      {0x20, 2, &m->pic_->master_ports()}, {0xa0, 2, &m->pic_->slave_ports()}, {0x4d0, 2, &m->pic_->elcr_ports()},
      {0x40, 4, m->pit_.get()},            {0x61, 1, m->port61_.get()},        {0x3f8, 8, uart_ports},
      {0x70, 2, m->rtc_.get()},            {0xf4, 4, m->debug_exit_.get()},    {0x510, 2, m->fw_cfg_.get()},
  };
  for (const auto& map : mappings) {
    if (auto added = m->pio_.add(map.base, map.length, map.device); !added) return std::unexpected(added.error());
  }
  m->timed_ = {m->pit_.get(), m->rtc_.get()};

  // PCI (device model 3): the host bridge, then the virtio devices in a fixed order, one slot each, with BARs
  // assigned from the PCI window and decoding enabled, as firmware leaves them.
  const bool has_virtio = !config.disks.empty() || config.nics > 0 || config.rng;
  std::vector<MpPciInterrupt> pci_interrupts;
  if (config.device_model_version >= 3) {
    m->pci_ = std::make_unique<PciHost>(m->pio_, m->mmio_, *isa);
    if (auto added = m->pio_.add(PciHost::kConfigAddressPort, PciHost::kPortCount, m->pci_.get()); !added) {
      return std::unexpected(added.error());
    }
  } else if (has_virtio) {
    return fail(ErrorKind::kUnsupported, "virtio devices need device model v3 (this configuration asks for v{})",
                config.device_model_version);
  }
  std::vector<VirtioDevice*> virtio;
  for (size_t i = 0; i < config.disks.size(); ++i) {
    if (!config.disks[i].store) return fail(ErrorKind::kInvalidArgument, "disk {} has no image", i);
    m->disks_.push_back(std::make_unique<VirtioBlk>(*config.disks[i].store, config.disks[i].serial));
    m->disks_.back()->set_name(fmt::format("virtio-blk{}", i));
    virtio.push_back(m->disks_.back().get());
  }
  if (config.nics > 0 && !network) return fail(ErrorKind::kInvalidArgument, "NICs need a network port");
  for (unsigned i = 0; i < config.nics; ++i) {
    m->nics_.push_back(
        std::make_unique<VirtioNet>(*network, i, i < config.nic_macs.size() ? config.nic_macs[i] : nic_mac(i)));
    virtio.push_back(m->nics_.back().get());
  }
  if (config.rng) {
    if (!entropy) return fail(ErrorKind::kInvalidArgument, "the entropy device needs an entropy port");
    m->rng_ = std::make_unique<VirtioRng>(*entropy);
    virtio.push_back(m->rng_.get());
  }
  if (virtio.size() > PciHost::kSlots - 1) {
    return fail(ErrorKind::kInvalidArgument, "{} PCI devices do not fit on one bus (at most {})", virtio.size(),
                PciHost::kSlots - 1);
  }
  if (!virtio.empty() && config.memory_bytes > kPciMmioBase) {
    return fail(ErrorKind::kUnsupported, "with PCI devices, guest RAM ends at {:#x} at most (the PCI window follows); "
                "--mem asks for {:#x}", kPciMmioBase, config.memory_bytes);
  }
  uint64_t next_bar = kPciMmioBase;
  for (size_t i = 0; i < virtio.size(); ++i) {
    const unsigned slot = unsigned(i + 1);
    // MSI-X where there is something to receive it (the local APIC of pc-apic).
    auto function = std::make_unique<VirtioPci>(*virtio[i], m->memory_, m->msi());
    for (unsigned bar = 0; bar < pci::kBarCount; ++bar) {
      const uint64_t size = function->bar_size(bar);
      if (function->bar_kind(bar) == PciBarKind::kNone || size == 0) continue;
      next_bar = (next_bar + size - 1) & ~(size - 1);
      function->set_bar_address(bar, next_bar);
      next_bar += size;
    }
    if (next_bar > kPciMmioEnd) return fail(ErrorKind::kInvalidArgument, "the PCI devices' BARs do not fit");
    function->enable_decoding(pci::kCommandMemory);
    const uint8_t irq = kPciIrqs[(slot - 1) % 4];
    if (auto attached = m->pci_->attach(slot, *function, irq); !attached) return std::unexpected(attached.error());
    pci_interrupts.push_back(MpPciInterrupt{uint8_t(slot), 1, irq});
    m->timed_.push_back(function.get());
    m->virtio_pci_.push_back(std::move(function));
  }
  // PCI interrupts are level-triggered: the firmware's ELCR set-up for the lines PCI devices use.
  if (!pci_interrupts.empty()) {
    uint16_t elcr = 0;
    for (const MpPciInterrupt& p : pci_interrupts) elcr |= uint16_t(1u << p.ioapic_pin);
    const uint8_t elcr_bytes[2] = {uint8_t(elcr), uint8_t(elcr >> 8)};
    m->pic_->elcr_ports().write(0, std::span(elcr_bytes, 1));
    m->pic_->elcr_ports().write(1, std::span(elcr_bytes + 1, 1));
  }
  if (apic) {
    // Every vCPU's local APIC is at kBase: the bus sends each access to the APIC of the vCPU that made it
    // (vmm/machine.cpp LapicWindow), as the page is each processor's own.
    if (auto added = m->mmio_.add(LocalApic::kBase, LocalApic::kMmioSize, m->lapic_window_.get()); !added) {
      return std::unexpected(added.error());
    }
    if (auto added = m->mmio_.add(IoApic::kBase, IoApic::kMmioSize, m->ioapic_.get()); !added) {
      return std::unexpected(added.error());
    }
    m->timed_.push_back(m->lapics_[0].get());
    // The firmware's MP table: how the OS finds the processors, the I/O APIC and the ISA interrupt routing.
    MpTableConfig mp;
    CpuidResult leaf1 = cpu_model.cpuid(1, 0);
    mp.apic_ids.clear();
    for (const CpuModel* model : vcpu_models) mp.apic_ids.push_back(uint8_t(model->cpuid(1, 0).ebx >> 24));
    mp.apic_version = uint8_t(LocalApic::kVersion);
    mp.cpu_signature = leaf1.eax;
    mp.cpu_features = leaf1.edx;
    mp.lapic_address = uint32_t(LocalApic::kBase);
    mp.ioapic_id = ioapic_id(config.vcpus);
    mp.ioapic_version = uint8_t(IoApic::kVersion);
    mp.ioapic_address = uint32_t(IoApic::kBase);
    mp.pci_bus = m->pci_ != nullptr;
    mp.pci_interrupts = pci_interrupts;
    auto tables = build_mp_tables(mp, kMpFloatingPointerAddress);
    if (auto written = m->memory_.write(Gpa{kMpFloatingPointerAddress}, tables); !written) {
      return fail(ErrorKind::kInvalidArgument, "--machine {} needs RAM at {:#x} for its MP table: {}", config.machine,
                  kMpFloatingPointerAddress, written.error().message);
    }
  }
  // Checkpoints and digests cover exactly these, in this order (digests of old traces depend on it).
  m->add_stateful("pic", *m->pic_);
  m->add_stateful("pit", *m->pit_);
  m->add_stateful("port61", *m->port61_);
  m->add_stateful("uart", *m->uart_);
  m->add_stateful("rtc", *m->rtc_);
  m->add_stateful("debug-exit", *m->debug_exit_);
  m->add_stateful("fw-cfg", *m->fw_cfg_);
  if (apic) {
    m->add_stateful("lapic", *m->lapics_[0]);
    m->add_stateful("ioapic", *m->ioapic_);
  }
  if (m->pci_) m->add_stateful("pci-host", *m->pci_);
  for (auto& function : m->virtio_pci_) m->add_stateful(std::string(function->name()), *function);
  // More vCPUs: their APICs and the APIC bus's vCPU states come last (a one-vCPU machine's list is as before).
  if (config.vcpus > 1) {
    for (uint32_t i = 1; i < config.vcpus; ++i) {
      m->timed_.push_back(m->lapics_[i].get());
      m->add_stateful(fmt::format("lapic{}", i), *m->lapics_[i]);
    }
    m->add_stateful("apic-bus", *m->apic_bus_);
  }

  auto vcpus = make_backends(config.backend, m->memory_, vcpu_models, config.trap_rdtsc);
  if (!vcpus) return std::unexpected(vcpus.error());
  m->vcpus_ = std::move(*vcpus);
  if (!config.interp_mode.empty()) {
    auto mode = parse_interp_mode(config.interp_mode);
    if (!mode) {
      return fail(ErrorKind::kInvalidArgument, "unknown interp mode '{}' (use reference, threaded or jit)",
                  config.interp_mode);
    }
    for (auto& vcpu : m->vcpus_) {
      if (auto* interp = dynamic_cast<InterpBackend*>(vcpu.get())) interp->set_mode(*mode);
    }
  }
  if (config.tso) {
    if (config.backend != "interp") {
      return fail(ErrorKind::kUnsupported, "--tso models store buffers on the software CPU: use --backend interp "
                  "(a recording with them replays there only)");
    }
    if (!config.interp_mode.empty() && config.interp_mode != interp_mode_name(InterpMode::kReference)) {
      return fail(ErrorKind::kInvalidArgument, "store buffers (--tso) run on the reference executor only: drop "
                  "--interp-mode {}", config.interp_mode);
    }
    // Each vCPU's buffer is a part of the machine's state: digests and checkpoints carry what it holds.
    for (uint32_t i = 0; i < m->vcpus_.size(); ++i) {
      auto& cpu = static_cast<InterpBackend&>(*m->vcpus_[i]);
      cpu.enable_store_buffer(*config.tso, i);
      interp::StoreBuffer& buffer = *cpu.store_buffer();
      m->stateful_.push_back(StatefulPart{fmt::format("store-buffer{}", i), [&buffer] { return buffer.save(); },
                                          [&buffer](std::span<const uint8_t> s) { return buffer.restore(s); }});
    }
  }
  return m;
}

std::optional<uint64_t> Machine::next_deadline_ns() const {
  std::optional<uint64_t> earliest;
  for (const Device* d : timed_) {
    auto t = d->next_deadline_ns();
    if (t && (!earliest || *t < *earliest)) earliest = t;
  }
  return earliest;
}

std::optional<LocalApic::MsrRead> Machine::read_msr(uint32_t index, size_t vcpu) {
  LocalApic* apic = lapic(vcpu);
  if (!apic || !apic->owns_msr(index)) return std::nullopt;
  return apic->read_msr(index);
}

std::optional<bool> Machine::write_msr(uint32_t index, uint64_t value, size_t vcpu) {
  LocalApic* apic = lapic(vcpu);
  if (!apic || !apic->owns_msr(index)) return std::nullopt;
  return apic->write_msr(index, value);
}

void Machine::advance_devices(uint64_t now_ns) {
  for (Device* d : timed_) d->advance(now_ns);
}

std::vector<std::vector<uint8_t>> Machine::device_states() const {
  std::vector<std::vector<uint8_t>> states;
  states.reserve(stateful_.size());
  for (const StatefulPart& part : stateful_) states.push_back(part.save());
  return states;
}

Result<> Machine::restore_device_states(std::span<const std::vector<uint8_t>> states) {
  if (states.size() != stateful_.size()) {
    return fail(ErrorKind::kInvalidArgument, "the saved machine has {} devices, this machine {}", states.size(),
                stateful_.size());
  }
  for (size_t i = 0; i < states.size(); ++i) {
    if (auto r = stateful_[i].restore(states[i]); !r) {
      return fail(ErrorKind::kInvalidArgument, "device {}: {}", stateful_[i].name, r.error().message);
    }
  }
  return {};
}

}  // namespace deja
