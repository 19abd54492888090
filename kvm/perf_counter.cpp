// PerfCounter: rr's microarchitecture table, host CPU detection with CPUID, and the guest-only perf_event_open counter with overflow signals.
#include "kvm/perf_counter.h"

#include <cpuid.h>
#include <fcntl.h>
#include <pthread.h>
#include <linux/perf_event.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <initializer_list>

#include <fmt/format.h>

namespace deja {
namespace {

// rr's pmu_configs (src/PerfCounters.cc) and compute_cpu_microarch (src/PerfCounters_x86.h), with rr's
// CPUID.01H:EAX & 0xF0FF0 signatures rewritten as displayed family-6 model numbers. Event 0x5101c4 is
// BR_INST_RETIRED.CONDITIONAL (C4H umask 01H), 0x5111c4 BR_INST_RETIRED.COND (umask 11H, Ice Lake on),
// 0x517ec4 the Atom cores' conditional-branch umask; 0x51 in bits 16-23 is USR|INT|EN, which perf
// replaces with what exclude_* asks for.
struct IntelRow {
  std::initializer_list<uint32_t> models;
  const char* id;
  const char* name;
  uint64_t raw_event;  // 0: rr knows this core but has no usable conditional-branch counter for it
  uint64_t skid;
  bool hybrid_capable;
};
const IntelRow kIntelRows[] = {
    {{0x0f, 0x16}, "intel-merom", "Intel Merom", 0, 100, false},
    {{0x17, 0x1d}, "intel-penryn", "Intel Penryn", 0, 100, false},
    {{0x1a, 0x1e, 0x2e}, "intel-nehalem", "Intel Nehalem", 0x5101c4, 100, false},
    {{0x25, 0x2c, 0x2f}, "intel-westmere", "Intel Westmere", 0x5101c4, 100, false},
    {{0x2a, 0x2d, 0x3e}, "intel-sandybridge", "Intel Sandy Bridge", 0x5101c4, 100, false},
    {{0x3a}, "intel-ivybridge", "Intel Ivy Bridge", 0x5101c4, 100, false},
    {{0x3c, 0x3f, 0x45, 0x46}, "intel-haswell", "Intel Haswell", 0x5101c4, 100, false},
    {{0x3d, 0x47, 0x4f, 0x56}, "intel-broadwell", "Intel Broadwell", 0x5101c4, 100, false},
    {{0x4e, 0x55, 0x5e}, "intel-skylake", "Intel Skylake", 0x5101c4, 100, false},
    {{0x37, 0x4c, 0x57}, "intel-silvermont", "Intel Silvermont", 0x517ec4, 100, false},
    {{0x5f, 0x7a, 0x5c}, "intel-goldmont", "Intel Goldmont", 0x517ec4, 100, false},
    {{0x9c}, "intel-tremont", "Intel Tremont", 0x517ec4, 100, false},
    {{0x8e, 0x9e}, "intel-kabylake", "Intel Kabylake", 0x5101c4, 100, false},
    {{0xa5, 0xa6}, "intel-cometlake", "Intel Cometlake", 0x5101c4, 100, false},
    {{0x7e, 0x6a, 0x86}, "intel-icelake", "Intel Icelake", 0x5111c4, 100, false},
    {{0x8c, 0x8d}, "intel-tigerlake", "Intel Tigerlake", 0x5111c4, 100, false},
    {{0xa7}, "intel-rocketlake", "Intel Rocketlake", 0x5111c4, 100, false},
    {{0x97, 0x9a}, "intel-alderlake", "Intel Alderlake", 0x5111c4, 125, true},
    {{0xb7, 0xba, 0xbf}, "intel-raptorlake", "Intel Raptorlake", 0x5111c4, 125, true},
    {{0x8f}, "intel-sapphirerapids", "Intel SapphireRapid", 0x5111c4, 125, false},
    {{0xcf}, "intel-emeraldrapids", "Intel EmeraldRapid", 0x5111c4, 125, false},
    {{0xaa}, "intel-meteorlake", "Intel Meteorlake", 0x5111c4, 125, true},
    {{0xbd}, "intel-lunarlake", "Intel Lunarlake", 0x100005111c4, 125, true},
    {{0xc6}, "intel-arrowlake", "Intel Arrowlake", 0x100005111c4, 125, true},
};

// AMD: rr maps individual Zen models; every Zen generation uses the same event (0xd1,
// RETIRED_CONDITIONAL_BRANCH_INSTRUCTIONS) and skid (10000, "unbounded"), so deja accepts whole families
// and names the generation by AMD's model ranges.
struct AmdRange {
  uint32_t family;
  uint32_t first_model;
  uint32_t last_model;
  const char* id;
  const char* name;
};
const AmdRange kAmdRanges[] = {
    {0x17, 0x00, 0x2f, "amd-zen", "AMD Zen"},     // Naples, Summit/Pinnacle Ridge, Raven Ridge, Picasso, Dali
    {0x17, 0x30, 0xff, "amd-zen2", "AMD Zen 2"},  // Rome, Renoir, Lucienne, Matisse, Van Gogh, Mendocino
    {0x19, 0x00, 0x0f, "amd-zen3", "AMD Zen 3"},  // Milan, Chagall
    {0x19, 0x10, 0x1f, "amd-zen4", "AMD Zen 4"},  // Genoa, Storm Peak (rr labels 0x18 Zen 2; same event)
    {0x19, 0x20, 0x5f, "amd-zen3", "AMD Zen 3"},  // Vermeer, Rembrandt (Zen 3+), Cezanne
    {0x19, 0x60, 0xaf, "amd-zen4", "AMD Zen 4"},  // Raphael, Phoenix, Hawk Point, Bergamo
    {0x1a, 0x00, 0xff, "amd-zen5", "AMD Zen 5"},  // Strix Point, Granite Ridge, Turin
};
constexpr uint64_t kAmdZenEvent = 0x5100d1;
constexpr uint64_t kAmdZenSkid = 10000;

// The vCPU thread's kvm_run->immediate_exit: the overflow handler stops the next KVM_RUN through it if the
// signal is ever delivered outside KVM_RUN (the backend keeps it blocked there, so normally the pending
// signal itself makes KVM_RUN return EINTR and the backend drains it).
thread_local volatile uint8_t* t_immediate_exit = nullptr;

void on_overflow_signal(int, siginfo_t*, void*) {
  if (volatile uint8_t* flag = t_immediate_exit) *flag = 1;
}

int real_perf_event_open(perf_event_attr* attr, pid_t pid, int cpu, int group_fd, unsigned long flags) {
  return static_cast<int>(::syscall(SYS_perf_event_open, attr, pid, cpu, group_fd, flags));
}

std::optional<int> read_int_file(const std::string& path) {
  std::ifstream in(path);
  int value = 0;
  if (!(in >> value)) return std::nullopt;
  return value;
}

// Drops overflow signals still pending from an earlier arming, so they cannot stop a later run early.
void drain_overflow_signals() {
  sigset_t only;
  sigemptyset(&only);
  sigaddset(&only, pmu_overflow_signal());
  timespec zero{};
  while (::sigtimedwait(&only, nullptr, &zero) == pmu_overflow_signal()) {
  }
}

perf_event_attr guest_only_attr(uint32_t type, uint64_t config) {
  perf_event_attr attr{};
  attr.type = type;
  attr.size = sizeof(attr);
  attr.config = config;
  // Every guest ring counts (a guest kernel's branches are guest progress too); nothing of the host does.
  attr.exclude_user = 0;
  attr.exclude_kernel = 0;
  attr.exclude_hv = 0;
  attr.exclude_host = 1;
  attr.exclude_guest = 0;
  // Pinned: a multiplexed counter would silently miss branches while descheduled.
  attr.pinned = 1;
  return attr;
}

}  // namespace

CpuIdentity cpu_identity_from_signature(std::string vendor, uint32_t eax) {
  CpuIdentity id;
  id.vendor = std::move(vendor);
  uint32_t base_family = (eax >> 8) & 0xf;
  uint32_t base_model = (eax >> 4) & 0xf;
  id.family = base_family == 0xf ? base_family + ((eax >> 20) & 0xff) : base_family;
  id.model = (base_family == 0x6 || base_family == 0xf) ? (((eax >> 16) & 0xf) << 4) | base_model : base_model;
  id.stepping = eax & 0xf;
  return id;
}

CpuIdentity host_cpu_identity() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  char vendor[13] = {};
  if (__get_cpuid(0, &eax, &ebx, &ecx, &edx)) {
    std::memcpy(vendor, &ebx, 4);
    std::memcpy(vendor + 4, &edx, 4);
    std::memcpy(vendor + 8, &ecx, 4);
  }
  eax = ebx = ecx = edx = 0;
  __get_cpuid(1, &eax, &ebx, &ecx, &edx);
  CpuIdentity id = cpu_identity_from_signature(vendor, eax);
  id.hypervisor = (ecx >> 31) & 1;
  return id;
}

Result<PmuModel> pmu_model_for(const CpuIdentity& cpu) {
  if (cpu.vendor == "GenuineIntel") {
    if (cpu.family != 6) {
      return fail(ErrorKind::kUnsupported,
                  "Intel family {:#x} model {:#x} is not in deja's PMU table (rr's): only family 6 cores have a "
                  "known retired-conditional-branch event",
                  cpu.family, cpu.model);
    }
    for (const auto& row : kIntelRows) {
      for (uint32_t model : row.models) {
        if (model != cpu.model) continue;
        if (row.raw_event == 0) {
          return fail(ErrorKind::kUnsupported,
                      "{} (GenuineIntel family 6 model {:#x}) has no retired-conditional-branch counter that "
                      "deja (like rr) can trust",
                      row.name, cpu.model);
        }
        return PmuModel{.id = row.id, .name = row.name, .raw_event = row.raw_event, .skid = row.skid,
                        .intel_hybrid_capable = row.hybrid_capable};
      }
    }
    return fail(ErrorKind::kUnsupported,
                "Intel CPU GenuineIntel family 6 model {:#x} (stepping {}) is not in deja's PMU table (rr's "
                "src/PerfCounters_x86.h); if rr supports it, add its model to kIntelRows in kvm/perf_counter.cpp",
                cpu.model, cpu.stepping);
  }
  if (cpu.vendor == "AuthenticAMD") {
    for (const auto& range : kAmdRanges) {
      if (cpu.family == range.family && cpu.model >= range.first_model && cpu.model <= range.last_model) {
        return PmuModel{.id = range.id, .name = range.name, .raw_event = kAmdZenEvent, .skid = kAmdZenSkid,
                        .skid_unbounded = true, .amd_zen = true};
      }
    }
    if (cpu.family == 0x15) {
      return fail(ErrorKind::kUnsupported,
                  "AMD Family 15h (AuthenticAMD family 0x15 model {:#x}) counts only taken branches (rr's ticks "
                  "there); deja's coordinates need retired conditional branches",
                  cpu.model);
    }
    return fail(ErrorKind::kUnsupported,
                "AMD CPU AuthenticAMD family {:#x} model {:#x} is not supported: deja knows Zen (families 0x17, "
                "0x19, 0x1a) only",
                cpu.family, cpu.model);
  }
  return fail(ErrorKind::kUnsupported,
              "CPU vendor '{}' (family {:#x} model {:#x}) is not supported: deja's PMU table knows GenuineIntel "
              "and AuthenticAMD",
              cpu.vendor, cpu.family, cpu.model);
}

std::vector<PmuModel> supported_pmu_models() {
  std::vector<PmuModel> models;
  for (const auto& row : kIntelRows) {
    if (row.raw_event != 0) {
      models.push_back({.id = row.id, .name = row.name, .raw_event = row.raw_event, .skid = row.skid,
                        .intel_hybrid_capable = row.hybrid_capable});
    }
  }
  for (const auto& range : kAmdRanges) {
    bool seen = false;
    for (const auto& m : models) seen = seen || m.id == range.id;
    if (!seen) {
      models.push_back({.id = range.id, .name = range.name, .raw_event = kAmdZenEvent, .skid = kAmdZenSkid,
                        .skid_unbounded = true, .amd_zen = true});
    }
  }
  return models;
}

std::string perf_permission_advice(const PerfHost& host) {
  auto paranoid = read_int_file(host.paranoid_path);
  std::string now = paranoid ? fmt::format("{} is {}", host.paranoid_path, *paranoid)
                             : fmt::format("{} is unreadable", host.paranoid_path);
  // Counting guest kernel mode is a kernel-mode event to perf (exclude_kernel = 0): level 2 forbids it
  // without CAP_PERFMON, and Debian/Ubuntu's level 3 and above forbid perf_event_open entirely.
  return now + "; counting guest kernel code needs 1 or lower (sudo sysctl kernel.perf_event_paranoid=1) or "
               "CAP_PERFMON for deja (sudo setcap cap_perfmon+ep $(which deja))";
}

PerfCounter::~PerfCounter() {
  if (overflow_fd_ >= 0) {
    ::ioctl(overflow_fd_, PERF_EVENT_IOC_DISABLE, 0);
    ::close(overflow_fd_);
    drain_overflow_signals();
  }
  if (count_fd_ >= 0) ::close(count_fd_);
  if (t_immediate_exit == immediate_exit_) t_immediate_exit = nullptr;
}

Result<std::unique_ptr<PerfCounter>> PerfCounter::open(const PmuModel& model, volatile uint8_t* immediate_exit,
                                                       const PerfHost& host) {
  std::unique_ptr<PerfCounter> counter(new PerfCounter());
  counter->model_ = model;
  counter->immediate_exit_ = immediate_exit;
  if (auto ok = counter->open_events(host); !ok) return std::unexpected(ok.error());
  return counter;
}

Result<> PerfCounter::open_events(const PerfHost& host) {
  PerfHost::OpenFn open_fn = host.perf_event_open ? host.perf_event_open : real_perf_event_open;
  std::string event = fmt::format("{} retired conditional branches (raw {:#x}, guest only)", model_.name,
                                  model_.raw_event);
  // Hybrid Intel: the event exists only in the P-cores' PMU, which has its own dynamic type (rr does the same).
  perf_type_ = PERF_TYPE_RAW;
  if (model_.intel_hybrid_capable) {
    if (auto type = read_int_file(host.event_source_dir + "/cpu_core/type")) {
      perf_type_ = static_cast<uint32_t>(*type);
      warnings_.push_back(
          "hybrid CPU: the counter counts only on P-cores (cpu_core PMU); pin deja to P-cores (taskset) or branches "
          "run on E-cores are missed");
    }
  }
  auto open_error = [&](const char* what, int error) {
    std::string why;
    switch (error) {
      case EACCES:
      case EPERM:
        why = perf_permission_advice(host);
        break;
      case ENOENT:
      case ENODEV:
      case EOPNOTSUPP:
        why = "this kernel has no hardware PMU that provides the event (no PMU, or a VM whose hypervisor hides "
              "it; `perf stat -e r" + fmt::format("{:x}", model_.raw_event) + " true` should count)";
        break;
      case EINVAL:
        why = "the kernel refused the event attributes (guest-only counting needs Linux 3.2+ perf on x86 with "
              "KVM; check that the raw event is valid for this CPU)";
        break;
      case EBUSY:
        why = "another user (e.g. the NMI watchdog or a profiler) holds the counters: try "
              "sudo sysctl kernel.nmi_watchdog=0";
        break;
      default:
        why = "unexpected error";
        break;
    }
    return fail(ErrorKind::kUnsupported, "perf_event_open of the {} for {} failed: {} ({})", what, event,
                std::strerror(error), why);
  };

  perf_event_attr count_attr = guest_only_attr(perf_type_, model_.raw_event);
  count_fd_ = open_fn(&count_attr, 0, -1, -1, PERF_FLAG_FD_CLOEXEC);
  if (count_fd_ < 0) {
    int error = errno;
    count_fd_ = -1;
    return open_error("counting event", error);
  }

  perf_event_attr overflow_attr = guest_only_attr(perf_type_, model_.raw_event);
  overflow_attr.disabled = 1;
  // Any nonzero period makes it a sampling event, which PERF_EVENT_IOC_PERIOD requires; arm() sets the real one.
  overflow_attr.sample_period = uint64_t{1} << 40;
  overflow_attr.wakeup_events = 1;
  overflow_fd_ = open_fn(&overflow_attr, 0, -1, -1, PERF_FLAG_FD_CLOEXEC);
  if (overflow_fd_ < 0) {
    int error = errno;
    overflow_fd_ = -1;
    return open_error("overflow (sampling) event", error);
  }

  // Blocked on this (the vCPU) thread from now on; KVM_SET_SIGNAL_MASK unblocks it inside KVM_RUN only.
  sigset_t block;
  sigemptyset(&block);
  sigaddset(&block, pmu_overflow_signal());
  if (int error = ::pthread_sigmask(SIG_BLOCK, &block, nullptr); error != 0) {
    return fail(ErrorKind::kHost, "blocking the PMU overflow signal failed: {}", std::strerror(error));
  }
  struct sigaction current {};
  ::sigaction(pmu_overflow_signal(), nullptr, &current);
  if (current.sa_handler == SIG_DFL) {
    struct sigaction action {};
    action.sa_sigaction = on_overflow_signal;
    action.sa_flags = SA_SIGINFO | SA_RESTART;
    sigemptyset(&action.sa_mask);
    if (::sigaction(pmu_overflow_signal(), &action, nullptr) < 0) {
      return fail(ErrorKind::kHost, "installing the handler of the PMU overflow signal (SIGRTMIN+2) failed: {}",
                  std::strerror(errno));
    }
  }
  f_owner_ex owner{.type = F_OWNER_TID, .pid = static_cast<pid_t>(::gettid())};
  if (::fcntl(overflow_fd_, F_SETOWN_EX, &owner) < 0 ||
      ::fcntl(overflow_fd_, F_SETFL, ::fcntl(overflow_fd_, F_GETFL) | O_ASYNC) < 0 ||
      ::fcntl(overflow_fd_, F_SETSIG, pmu_overflow_signal()) < 0) {
    return fail(ErrorKind::kHost,
                "making the {} overflow event signal the vCPU thread (F_SETOWN_EX/O_ASYNC/F_SETSIG) failed: {}", event,
                std::strerror(errno));
  }

  // x86 perf never programs fewer than 2 events before an overflow, and some CPUs' drivers refuse periods
  // below a floor (rr's check_for_ioc_period_bug): find the smallest period the kernel accepts.
  min_period_ = 0;
  for (uint64_t period : {uint64_t{2}, uint64_t{32}, uint64_t{128}}) {
    uint64_t value = period;
    if (::ioctl(overflow_fd_, PERF_EVENT_IOC_PERIOD, &value) == 0) {
      min_period_ = period;
      break;
    }
  }
  if (min_period_ == 0) {
    return fail(ErrorKind::kUnsupported, "PERF_EVENT_IOC_PERIOD on the {} overflow event fails for periods 2, 32 and "
                "128: {}", event, std::strerror(errno));
  }
  t_immediate_exit = immediate_exit_;
  return {};
}

std::string PerfCounter::describe() const {
  return fmt::format("pmu {} raw {:#x} skid {}", model_.id, model_.raw_event, skid());
}

uint64_t PerfCounter::read() {
  uint64_t value = 0;
  ssize_t got = ::read(count_fd_, &value, sizeof(value));
  if (got != static_cast<ssize_t>(sizeof(value)) && read_error_.empty()) {
    read_error_ = fmt::format("reading the {} counter returned {}: {}", model_.name, got, std::strerror(errno));
  }
  return value + offset_;
}

Result<> PerfCounter::rebase(uint64_t count) {
  disarm();
  offset_ = 0;
  uint64_t raw = read();
  if (!read_error_.empty()) return fail(ErrorKind::kHost, "rebasing the PMU count: {}", read_error_);
  offset_ = count - raw;  // modular: read() = raw' + offset_ counts on from `count`
  return {};
}

Result<> PerfCounter::arm(uint64_t at) {
  disarm();
  t_immediate_exit = immediate_exit_;
  uint64_t now = read();
  if (!read_error_.empty()) return fail(ErrorKind::kHost, "arming the PMU overflow: {}", read_error_);
  armed_ = true;
  if (at <= now) {
    // Already there: stop before the next guest instruction, as kick() would.
    if (immediate_exit_ != nullptr) __atomic_store_n(immediate_exit_, 1, __ATOMIC_SEQ_CST);
    return {};
  }
  // The overflow interrupt fires after `period` more events, never before; limit_period floors may make it
  // later, which skid() includes.
  uint64_t period = std::max(at - now, min_period_);
  period = std::min(period, uint64_t{1} << 62);
  if (::ioctl(overflow_fd_, PERF_EVENT_IOC_PERIOD, &period) < 0) {
    return fail(ErrorKind::kHost, "PERF_EVENT_IOC_PERIOD({}) on the {} overflow event failed: {}", period,
                model_.name, std::strerror(errno));
  }
  if (::ioctl(overflow_fd_, PERF_EVENT_IOC_RESET, 0) < 0 || ::ioctl(overflow_fd_, PERF_EVENT_IOC_ENABLE, 0) < 0) {
    return fail(ErrorKind::kHost, "resetting/enabling the {} overflow event failed: {}", model_.name,
                std::strerror(errno));
  }
  return {};
}

void PerfCounter::disarm() {
  if (!armed_) return;
  armed_ = false;
  ::ioctl(overflow_fd_, PERF_EVENT_IOC_DISABLE, 0);
  drain_overflow_signals();
}

std::optional<uint64_t> count_host_event(uint64_t raw_event, void (*body)(), const PerfHost& host) {
  PerfHost::OpenFn open_fn = host.perf_event_open ? host.perf_event_open : real_perf_event_open;
  perf_event_attr attr{};
  attr.type = PERF_TYPE_RAW;
  attr.size = sizeof(attr);
  attr.config = raw_event;
  attr.exclude_kernel = 1;
  attr.exclude_guest = 1;
  int fd = open_fn(&attr, 0, -1, -1, PERF_FLAG_FD_CLOEXEC);
  if (fd < 0) return std::nullopt;
  uint64_t before = 0, after = 0;
  bool ok = ::read(fd, &before, sizeof(before)) == sizeof(before);
  body();
  ok = ok && ::read(fd, &after, sizeof(after)) == sizeof(after);
  ::close(fd);
  if (!ok) return std::nullopt;
  return after - before;
}

}  // namespace deja
