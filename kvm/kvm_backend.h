// The KVM backend: vCPUs on /dev/kvm with no in-kernel irqchip or PIT, deja's fixed CPUID, and every non-CPU MSR filtered to the VMM.
#pragma once

#include <memory>
#include <span>
#include <vector>

#include "core/backend.h"
#include "core/cpu_model.h"
#include "core/guest_memory.h"

namespace deja {

struct KvmOptions {
  // Use the kvm-deja module's RDTSC (and RDTSCP/RDRAND/RDSEED) exits when the host has it (docs/kvm-deja.md).
  // Replay sets this from the recording: a trace recorded without them must not meet trapped RDTSCs.
  bool trap_rdtsc = true;
};

// Opens /dev/kvm and builds a VM whose RAM is `memory` (one slot at guest-physical 0) and whose one vCPU
// answers CPUID exactly from `model`. Fails with kUnsupported, naming the missing piece, when this host
// cannot run that model (no /dev/kvm, wrong API version, a missing capability or CPU feature).
// `memory` must outlive the backend.
Result<std::unique_ptr<Backend>> make_kvm_backend(GuestMemory& memory, const CpuModel& model,
                                                  const KvmOptions& options = {});
// The same VM with one vCPU per model, vCPU i presenting models[i] (vCPU 0 the bootstrap processor). They share
// the VM (its RAM, MSR filter and dirty log); each is a Backend of its own, and the caller runs one at a time
// (docs/smp.md). With several, the kvm-deja module's PAUSE exits are enabled where it offers them.
Result<std::vector<std::unique_ptr<Backend>>> make_kvm_backends(GuestMemory& memory,
                                                                std::span<const CpuModel* const> models,
                                                                const KvmOptions& options = {});

// The KVM-specific surface that attach_pmu_counter (kvm/pmu.cpp) needs from a backend made by
// make_kvm_backend; other backends do not implement it, so a dynamic_cast tells them apart.
class KvmVcpu {
 public:
  virtual ~KvmVcpu() = default;
  // kvm_run->immediate_exit: setting it to 1 makes the current or next KVM_RUN return at once.
  virtual volatile uint8_t* immediate_exit_flag() = 0;
  // Makes `counter` (opened on the vCPU thread) the backend's progress_counter().
  virtual void adopt_progress_counter(std::unique_ptr<ProgressCounter> counter) = 0;
};

// Guest-physical pages KVM reserves for itself (VMX real-mode TSS and identity page table; unused on
// SVM but still registered). They sit just below the BIOS area at 4 GiB - 16 MiB, above the local APIC
// and HPET windows, so guest RAM must end below kKvmReservedBase.
constexpr uint64_t kKvmIdentityMapGpa = 0xfeffc000;
constexpr uint64_t kKvmTssGpa = 0xfeffd000;  // three pages
constexpr uint64_t kKvmReservedBase = kKvmIdentityMapGpa;

}  // namespace deja
