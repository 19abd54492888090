// kvm-deja support inside the KVM backend: detect and enable the module's RDTSC/RDTSCP/RDRAND/RDSEED and PAUSE exits, turn them into VcpuExits, hand the answers back.
#pragma once

#include <cstdint>
#include <string>

#include "kvm/kvm_deja_abi.h"
#include "core/backend.h"
#include "core/error.h"

namespace deja::kvm_deja {

// The result of asking the host for the exits (docs/kvm-deja.md).
struct Enabled {
  uint32_t mask = 0;      // KVM_DEJA_* bits enabled on the VM; 0 on stock KVM
  uint32_t available = 0; // what the host offered (KVM_CHECK_EXTENSION)
  std::string why_not;    // when RDTSC is not trapped: the reason, for messages ("stock KVM", "DEJA_KVM_DEJA=off")
  std::string pause_why_not;  // the same for PAUSE exits
};

// Enables the instruction exits the host offers on `vm_fd` when `wanted`, and its PAUSE exits when `pause` (several
// vCPUs), unless DEJA_KVM_DEJA=off. Must run before the first vCPU is created (the module sets the intercepts at
// vCPU creation). Fails only when the module offers the exits and then refuses to enable them.
Result<Enabled> enable(int kvm_fd, int vm_fd, bool wanted, bool pause);

// Fills `exit` (kind, is_rdtscp / is_rdseed, size; for PAUSE its rip) from the exit area of kvm_run (offset of its
// exit union). False, with `exit.detail` set, for an instruction code this deja does not know.
bool translate(const void* exit_area, VcpuExit& exit);
// A PAUSE exit that also ended a host single step (KVM_DEJA_FLAG_STEP): the step's exit is owed after it.
bool pause_ended_step(const void* exit_area);

// Writes the VMM's answer in `exit` into the exit area before the next KVM_RUN. `tsc_aux` is the IA32_TSC_AUX
// value RDTSCP loads into ECX (deja's CPU model owns it, not KVM).
void complete(void* exit_area, const VcpuExit& exit, uint64_t tsc_aux);

}  // namespace deja::kvm_deja
