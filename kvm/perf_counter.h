// The host PMU's retired-conditional-branch event (rr's per-microarchitecture table) as a guest-only ProgressCounter for a KVM vCPU thread.
#pragma once

#include <sys/types.h>

#include <csignal>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/progress_counter.h"

struct perf_event_attr;

namespace deja {

// The signal an armed overflow sends to the vCPU thread (F_SETSIG). Like the kick signal it is blocked
// on the vCPU thread except inside KVM_RUN (kvm_backend.cpp), so an overflow outside KVM_RUN stays
// pending and stops the next KVM_RUN at once instead of being lost.
inline int pmu_overflow_signal() { return SIGRTMIN + 2; }

// What CPUID says about the host: vendor string and the *displayed* family and model (SDM Vol. 2,
// CPUID.01H:EAX: family = base + extended when base is 0xF; model = extended << 4 | base when the
// family is 6 or 0xF). Keeping detection a function of these makes the table testable anywhere.
struct CpuIdentity {
  std::string vendor;  // "GenuineIntel", "AuthenticAMD", ...
  uint32_t family = 0;
  uint32_t model = 0;
  uint32_t stepping = 0;
  bool hypervisor = false;  // CPUID.01H:ECX[31]: deja itself runs in a VM, whose PMU is virtual
};
CpuIdentity host_cpu_identity();
// Decodes a raw CPUID.01H:EAX signature, e.g. 0x000906ea -> family 6, model 0x9e, stepping 0xa.
CpuIdentity cpu_identity_from_signature(std::string vendor, uint32_t eax);

// One row of the table: which raw event counts retired conditional branches on this core and how late
// its overflow interrupt may land (rr's PerfCounters.cc pmu_configs, src/PerfCounters_x86.h).
struct PmuModel {
  std::string id;         // short, for traces and messages: "intel-skylake", "amd-zen3"
  std::string name;       // rr's: "Intel Skylake", "AMD Zen 3"
  uint64_t raw_event = 0; // perf_event_attr.config for PERF_TYPE_RAW
  uint64_t skid = 0;      // branches an overflow may land late (rr's skid_size)
  bool skid_unbounded = false;  // rr's PMU_SKID_UNBOUNDED: the skid is usually, not always, respected
  bool amd_zen = false;         // subject to the SpecLockMap check and the AMD caveats (docs/pmu-hosts.md)
  bool intel_hybrid_capable = false;  // Alder Lake and later: only the P-cores' PMU has the event
};

// The row for this CPU, or kUnsupported naming vendor, family and model and why (a microarchitecture
// rr knows but that has no usable conditional-branch counter, or one nobody has mapped yet).
Result<PmuModel> pmu_model_for(const CpuIdentity& cpu);
// Every microarchitecture the table supports, for docs and tests.
std::vector<PmuModel> supported_pmu_models();

// The syscall and files the counter uses, replaceable so tests can make them fail deterministically.
struct PerfHost {
  using OpenFn = int (*)(perf_event_attr* attr, pid_t pid, int cpu, int group_fd, unsigned long flags);
  OpenFn perf_event_open = nullptr;  // nullptr: the real syscall
  std::string paranoid_path = "/proc/sys/kernel/perf_event_paranoid";
  std::string event_source_dir = "/sys/bus/event_source/devices";  // for hybrid Intel's cpu_core PMU
};

// "/proc/sys/kernel/perf_event_paranoid is 4; set it to 2 or lower ..." for EACCES/EPERM messages.
std::string perf_permission_advice(const PerfHost& host);

// The guest-only branch counter of the calling thread (the vCPU thread): one pinned counting event that
// is never reset (read() is exact) and one sampling event whose overflow sends pmu_overflow_signal() to
// this thread and sets *immediate_exit (kvm_run->immediate_exit), so KVM_RUN returns EINTR.
class PerfCounter final : public ProgressCounter {
 public:
  // Opens both events for `model` on the calling thread. `immediate_exit` may be nullptr (no vCPU yet,
  // as in tests of the open path); arm() then only relies on the signal.
  static Result<std::unique_ptr<PerfCounter>> open(const PmuModel& model, volatile uint8_t* immediate_exit,
                                                   const PerfHost& host = {});
  ~PerfCounter() override;

  std::string describe() const override;
  uint64_t read() override;
  Result<> arm(uint64_t at) override;
  void disarm() override;
  uint64_t skid() const override { return model_.skid + min_period_ - 1; }
  Result<> rebase(uint64_t count) override;

  const PmuModel& model() const { return model_; }
  // Errors of read() (which cannot return one): the first failure's text, empty if none.
  const std::string& read_error() const { return read_error_; }
  // Non-fatal findings at open: hybrid CPU (pin the vCPU thread to P-cores), running under a hypervisor.
  const std::vector<std::string>& warnings() const { return warnings_; }

 private:
  PerfCounter() = default;
  Result<> open_events(const PerfHost& host);

  PmuModel model_;
  uint32_t perf_type_ = 4;  // PERF_TYPE_RAW, or the cpu_core PMU's dynamic type on hybrid Intel
  int count_fd_ = -1;
  int overflow_fd_ = -1;
  uint64_t min_period_ = 1;  // some CPUs' drivers refuse periods below 32 (rr's ioc_period_bug check)
  volatile uint8_t* immediate_exit_ = nullptr;
  bool armed_ = false;
  uint64_t offset_ = 0;  // added to the hardware count (rebase: a checkpoint restore sets the count)
  std::string read_error_;
  std::vector<std::string> warnings_;
};

// Runs a raw event opened with `host` on the calling thread in host mode and returns its count over
// `body` (for the AMD SpecLockMap check); nullopt when the event cannot be opened.
std::optional<uint64_t> count_host_event(uint64_t raw_event, void (*body)(), const PerfHost& host = {});

}  // namespace deja
