// The host PMU as deja's progress counter on KVM: the start-up self-test and attaching a guest-only branch counter to a KVM vCPU.
#pragma once

#include <string>
#include <vector>

#include "kvm/host_check.h"
#include "core/backend.h"

namespace deja {

// One check of the self-test (docs/pmu-hosts.md), in the order they run; later checks are skipped
// (passed = false, skipped = true) once one fails.
using PmuCheck = HostCheck;

struct PmuSelftest {
  std::vector<PmuCheck> checks;
  std::string counter;  // what would count: "pmu intel-skylake raw 0x5101c4 skid 100", or "" if none
  bool usable() const;
  // "<check name>: <detail>" of the first failed check, or "" when usable.
  std::string first_failure() const;
};

// Runs the self-test on this thread (it creates its own small VMs on /dev/kvm). Never throws or exits.
PmuSelftest run_pmu_selftest();

// Gives `kvm_backend` (from make_kvm_backend, used on this thread only) a progress counter over the
// host PMU: retired conditional branches in guest mode, with overflow interrupts that stop KVM_RUN.
// Fails with kUnsupported naming the reason when the PMU is unusable.
Result<> attach_pmu_counter(Backend& kvm_backend);

}  // namespace deja
