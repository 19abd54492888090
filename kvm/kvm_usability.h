// The KVM usability check: can this host's /dev/kvm run deja's guests? A calibration guest at CPL0 finds out, once a process.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kvm/host_check.h"
#include "core/backend.h"
#include "core/cpu_model.h"
#include "core/guest_memory.h"

namespace deja {

// KVM_GET_SUPPORTED_CPUID is not enough to know: a paravirtual KVM (kvm-pvm in cloud VMs) emulates every
// CPL0 instruction, stops at SSE with an emulation failure, answers CPUID from the host, and opens
// interrupt windows late (docs/kvm.md). So deja runs small guests on the vCPU itself and checks what it
// relies on: that guest code runs at hardware speed, that SSE and every feature of a CPU model execute with
// the right result, that CPUID answers from the model, that single-step and interrupt-window exits come
// where they must, and that the CPU state (long mode, 32-bit paging) loads as set. Every check runs (a failure does not stop the others,
// so a refusal names all of them), except that nothing runs when no VM can be created.
struct KvmUsability {
  std::vector<HostCheck> checks;
  // The CPU models (CpuModel::all() order) whose every feature executes correctly here, and why the others
  // do not ("x86-64-v2: POPCNT stops with an emulation failure").
  std::vector<const CpuModel*> models;
  std::vector<std::string> model_problems;
  // Where the vCPU departs from the architecture in guest-visible memory (Backend::cpu_quirks).
  std::vector<std::string> cpu_quirks;
  uint64_t elapsed_ns = 0;

  bool usable() const;
  // Every failed check with what was seen, or "" when usable.
  std::string failures() const;
  // One short line for messages: what the first two failed checks saw, and how many more failed.
  std::string summary() const;
  // The richest model for a default (`--cpu` not given): the first of `models`, or nullptr.
  const CpuModel* default_model() const;
  // Ok when `model`'s features execute here, else an error naming the model and what went wrong.
  Result<> supports(const CpuModel& model) const;
};

// The check's result for this process: run on the first call (on the calling thread), then kept.
const KvmUsability& kvm_usability();

// What the check runs on, for tests: a vCPU factory (make_kvm_backend by default) and the speed limit.
struct UsabilityProbeHost {
  std::function<Result<std::unique_ptr<Backend>>(GuestMemory&, const CpuModel&)> make_vcpu;
  // Above this a loop iteration counts as emulated (hardware KVM: about 1 ns; nested KVM under QEMU TCG:
  // about 7 ns; kvm-pvm's CPL0 emulation: about 2,200 ns).
  uint64_t max_ns_per_iteration = 50;
};
KvmUsability check_kvm_usability_with(const UsabilityProbeHost& host);

// True on a host whose /dev/kvm is the paravirtual kvm-pvm module (/sys/module/kvm_pvm exists).
bool host_kvm_is_pvm();

}  // namespace deja
