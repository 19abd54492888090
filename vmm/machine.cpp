// Machine builder: the explicit wiring of the PC's devices (kvmtool-style, no static registration).
#include "vmm/machine.h"

#include "interp/interp_backend.h"
#include "kvm/kvm_backend.h"
#include "vmm/cpu_model.h"

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

}  // namespace

Result<std::unique_ptr<Backend>> make_backend(const std::string& name, GuestMemory& memory, const CpuModel& model,
                                              bool trap_rdtsc) {
  if (name == "kvm") return make_kvm_backend(memory, model, KvmOptions{.trap_rdtsc = trap_rdtsc});
  if (name == "interp") return make_interp_backend(memory, model);
  return fail(ErrorKind::kInvalidArgument, "unknown backend '{}' (use kvm or interp)", name);
}

Result<std::unique_ptr<Machine>> Machine::create(const MachineConfig& config, Clock& clock, ByteSink& serial_out) {
  auto memory = GuestMemory::create(config.memory_bytes);
  if (!memory) return std::unexpected(memory.error());
  std::unique_ptr<Machine> m(new Machine(std::move(*memory)));
  m->config_ = config;

  m->pic_ = std::make_unique<PicPair>();
  m->pit_ = std::make_unique<Pit8254>(clock, IrqLine(m->pic_.get(), 0));
  m->port61_ = std::make_unique<SystemControlPortB>(*m->pit_);
  m->uart_ = std::make_unique<Uart16550>(IrqLine(m->pic_.get(), 4), serial_out);
  m->rtc_ = std::make_unique<CmosRtc>(clock, config.rtc_epoch_unix_seconds, IrqLine(m->pic_.get(), 8));
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

  auto backend = make_backend(config.backend, m->memory_, *config.cpu_model, config.trap_rdtsc);
  if (!backend) return std::unexpected(backend.error());
  m->backend_ = std::move(*backend);
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

void Machine::advance_devices(uint64_t now_ns) {
  for (Device* d : timed_) d->advance(now_ns);
}

std::vector<std::vector<uint8_t>> Machine::device_states() const {
  return {pic_->save(), pit_->save(), port61_->save(), uart_->save(), rtc_->save(), debug_exit_->save(), fw_cfg_->save()};
}

}  // namespace deja
