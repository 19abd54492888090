// The PC machine: RAM, buses, devices wired to their ports and IRQ lines, and one vCPU backend.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "devices/bus.h"
#include "devices/cmos_rtc.h"
#include "devices/debug_exit.h"
#include "devices/fw_cfg.h"
#include "devices/pic8259.h"
#include "devices/pit8254.h"
#include "devices/uart16550.h"
#include "vmm/backend.h"
#include "vmm/cpu_model.h"
#include "vmm/guest_memory.h"

namespace deja {

// Version of the device semantics (all device models together); recorded in trace headers and
// bumped whenever any device's guest-visible behaviour changes.
constexpr uint32_t kDeviceModelVersion = 1;

struct MachineConfig {
  uint64_t memory_bytes = 256ull << 20;
  std::string cmdline;
  std::string backend = "interp";  // "kvm" or "interp"
  const CpuModel* cpu_model = &CpuModel::x86_64_v1();  // what CPUID answers (recorded in the trace header)
  int64_t rtc_epoch_unix_seconds = 0;
  // Test-only: perturbs a device's semantics so replay must report divergence (see tests).
  std::string device_semantics;
  // KVM: use the kvm-deja module's RDTSC exits when present (replay: only if the recording used them).
  bool trap_rdtsc = true;
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
  Uart16550& uart() { return *uart_; }
  DebugExit& debug_exit() { return *debug_exit_; }
  const MachineConfig& config() const { return config_; }

  // Earliest internal event of any timed device (virtual ns), and processing up to `now_ns`.
  std::optional<uint64_t> next_deadline_ns() const;
  void advance_devices(uint64_t now_ns);

  // Saved state of every device, in a fixed order (for digests and checkpoints).
  std::vector<std::vector<uint8_t>> device_states() const;

 private:
  explicit Machine(GuestMemory memory) : memory_(std::move(memory)) {}

  MachineConfig config_;
  GuestMemory memory_;
  Bus pio_{"port I/O"};
  Bus mmio_{"MMIO"};
  std::unique_ptr<PicPair> pic_;
  std::unique_ptr<Pit8254> pit_;
  std::unique_ptr<SystemControlPortB> port61_;
  std::unique_ptr<Uart16550> uart_;
  std::unique_ptr<CmosRtc> rtc_;
  std::unique_ptr<DebugExit> debug_exit_;
  std::unique_ptr<FwCfg> fw_cfg_;
  std::unique_ptr<Device> perturbed_;  // test-only device-semantics wrapper
  std::vector<Device*> timed_;
  std::unique_ptr<Backend> backend_;
};

// Creates the backend named `name` ("kvm" or "interp") over `memory`, presenting CPU model `model`.
Result<std::unique_ptr<Backend>> make_backend(const std::string& name, GuestMemory& memory, const CpuModel& model,
                                              bool trap_rdtsc = true);

}  // namespace deja
