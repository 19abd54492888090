// kvm-deja support inside the KVM backend: the capability handshake and the kvm_deja_exit round trip (kvm/kvm_deja_abi.h).
#include "kvm/kvm_deja.h"

#include <linux/kvm.h>
#include <sys/ioctl.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include <fmt/format.h>

namespace deja::kvm_deja {
namespace {

static_assert(sizeof(kvm_deja_exit) == 32, "kvm_deja_exit must keep the layout the module writes");
static_assert(sizeof(kvm_deja_exit) <= sizeof(kvm_run::padding), "kvm_deja_exit must fit kvm_run's exit union");
// The module and deja agree on the place: the start of kvm_run's exit union, where `io` and `msr` live too.
static_assert(offsetof(kvm_run, padding) == offsetof(kvm_run, msr));

bool disabled_by_environment() {
  const char* value = std::getenv("DEJA_KVM_DEJA");
  if (value == nullptr) return false;
  std::string_view v(value);
  return v == "off" || v == "0" || v == "no";
}

}  // namespace

Result<Enabled> enable(int kvm_fd, int vm_fd, bool wanted, bool pause) {
  Enabled result;
  // Stock KVM does not know the private number and answers 0, like for any unknown extension.
  int available = ::ioctl(kvm_fd, KVM_CHECK_EXTENSION, KVM_CAP_DEJA_EXITS);
  result.available = available > 0 ? static_cast<uint32_t>(available) & KVM_DEJA_ALL : 0;
  if (result.available == 0) {
    result.why_not = result.pause_why_not =
        "this host runs stock KVM (no kvm-deja module: KVM_CHECK_EXTENSION(KVM_CAP_DEJA_EXITS) is 0)";
    return result;
  }
  if (disabled_by_environment()) {
    result.why_not = result.pause_why_not = "DEJA_KVM_DEJA=off asks deja not to use the kvm-deja module";
    return result;
  }
  const uint32_t mask =
      (wanted ? result.available & ~KVM_DEJA_PAUSE : 0) | (pause ? result.available & KVM_DEJA_PAUSE : 0);
  if (mask != 0) {
    kvm_enable_cap cap{};
    cap.cap = KVM_CAP_DEJA_EXITS;
    cap.args[0] = mask;
    if (::ioctl(vm_fd, KVM_ENABLE_CAP, &cap) < 0) {
      return fail(ErrorKind::kHost,
                  "the kvm-deja module offers exits {:#x} but KVM_ENABLE_CAP(KVM_CAP_DEJA_EXITS, {:#x}) failed: {}",
                  result.available, mask, std::strerror(errno));
    }
  }
  result.mask = mask;
  if (!wanted) {
    result.why_not = "the recording being replayed did not trap RDTSC";
  } else if (!(mask & KVM_DEJA_RDTSC)) {
    result.why_not = fmt::format("the kvm-deja module does not offer RDTSC exits (offered {:#x}; kvm.deja_rdtsc=0?)",
                                 result.available);
  }
  if (!(result.available & KVM_DEJA_PAUSE)) {
    result.pause_why_not = fmt::format(
        "the kvm-deja module does not offer PAUSE exits (offered {:#x}: Intel VMX, or kvm.deja_pause=0)",
        result.available);
  } else if (!pause) {
    result.pause_why_not = "PAUSE exits are enabled only for a VM with several vCPUs";
  }
  return result;
}

bool translate(const void* exit_area, VcpuExit& exit) {
  kvm_deja_exit e;
  std::memcpy(&e, exit_area, sizeof(e));
  switch (e.insn) {
    case KVM_DEJA_RDTSC:
    case KVM_DEJA_RDTSCP:
      exit.kind = ExitKind::kRdtsc;
      exit.is_rdtscp = e.insn == KVM_DEJA_RDTSCP;
      return true;
    case KVM_DEJA_RDRAND:
    case KVM_DEJA_RDSEED:
      exit.kind = ExitKind::kRdrand;
      exit.is_rdseed = e.insn == KVM_DEJA_RDSEED;
      exit.size = e.size;
      return true;
    case KVM_DEJA_PAUSE:
      // The module skipped it before exiting (RIP is past it), as the software CPU reports PAUSE: `rip` the PAUSE.
      exit.kind = ExitKind::kPause;
      exit.rip = e.value;
      return true;
    default:
      exit.detail = fmt::format("the kvm-deja module reported instruction code {:#x}, which this deja does not know",
                                e.insn);
      return false;
  }
}

bool pause_ended_step(const void* exit_area) {
  kvm_deja_exit e;
  std::memcpy(&e, exit_area, sizeof(e));
  return e.insn == KVM_DEJA_PAUSE && (e.flags & KVM_DEJA_FLAG_STEP);
}

void complete(void* exit_area, const VcpuExit& exit, uint64_t tsc_aux) {
  kvm_deja_exit e;
  std::memcpy(&e, exit_area, sizeof(e));
  e.value = exit.value;
  e.flags = 0;
  if (exit.kind == ExitKind::kRdrand && exit.ok) e.flags |= KVM_DEJA_FLAG_CF;
  if (exit.kind == ExitKind::kRdtsc && exit.is_rdtscp) e.aux = tsc_aux & 0xffffffffu;
  std::memcpy(exit_area, &e, sizeof(e));
}

}  // namespace deja::kvm_deja
