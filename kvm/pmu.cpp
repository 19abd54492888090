// The PMU self-test (rr-style start-up checks against the software CPU's exact count) and attaching the perf counter to a KVM vCPU.
#include "kvm/pmu.h"

#include <cstring>
#include <functional>
#include <string_view>

#include <fmt/format.h>

#include "interp/interp_backend.h"
#include "kvm/kvm_backend.h"
#include "kvm/kvm_usability.h"
#include "kvm/perf_counter.h"
#include "kvm/pmu_selftest.h"
#include "core/cpu_model.h"

namespace deja {
namespace {

constexpr uint64_t kGdt = 0x500;
constexpr uint16_t kData32 = 0x10, kCode32 = 0x18;
constexpr uint8_t kLoopPort = 0x81, kEndPort = 0x80;

// Plain loop: 100k branches. With exits: 40k iterations (80k branches) and 400 OUTs, so host work (exit
// handling, the VMM's own branches) happens between guest stretches. Overflow loop: long enough that AMD's
// 10000-branch skid fits many times.
constexpr uint32_t kPlainIterations = 100'000;
constexpr uint32_t kExitIterations = 40'000;
constexpr uint32_t kExitEvery = 100;
constexpr uint32_t kOverflowIterations = 2'000'000;

void put32(std::vector<uint8_t>& code, uint32_t value) {
  for (int i = 0; i < 4; ++i) code.push_back(static_cast<uint8_t>(value >> (8 * i)));
}

SegmentReg flat(uint16_t selector, uint8_t type) {
  return SegmentReg{.base = 0, .limit = 0xffffffff, .selector = selector, .type = type, .dpl = 0, .present = true,
                    .s = true, .db = true, .l = false, .g = true};
}

CpuState flat_protected_mode(uint64_t rip) {
  CpuState s;
  s.rip = rip;
  s.cs = flat(kCode32, 0xb);
  s.ds = s.es = s.fs = s.gs = s.ss = flat(kData32, 0x3);
  s.gdt = {kGdt, 4 * 8 - 1};
  s.cr0 = cr0::kPe | cr0::kEt;
  return s;
}

// "lock add" to a stack variable: AMD counts it as a SpecLockMapCommit when SpecLockMap is enabled.
void locked_add() {
  int value = 0;
  asm volatile("lock addl $1, %0" : "+m"(value));
}

struct Checks {
  PmuSelftest& result;
  std::vector<std::string> pending;  // names of the checks still to run, for marking them skipped

  void pass(const std::string& name, std::string detail) { record(name, true, std::move(detail)); }
  PmuSelftest& failed(const std::string& name, std::string detail) {
    record(name, false, std::move(detail));
    for (const auto& rest : pending) result.checks.push_back({rest, false, true, "skipped after a failed check"});
    pending.clear();
    return result;
  }
  void record(const std::string& name, bool passed, std::string detail) {
    std::erase(pending, name);
    result.checks.push_back({name, passed, false, std::move(detail)});
  }
};

constexpr const char* kKvmUsable = "/dev/kvm usable";
constexpr const char* kCpuKnown = "CPU microarchitecture";
constexpr const char* kSpecLockMap = "AMD SpecLockMap off";
constexpr const char* kOpens = "counter opens";
constexpr const char* kExact = "counts guest only";
constexpr const char* kDeterministic = "deterministic";
constexpr const char* kOverflow = "overflow within skid";

// Backends keep a reference to their memory, so it lives on the heap and never moves.
struct Rig {
  std::unique_ptr<GuestMemory> memory;
  std::unique_ptr<Backend> cpu;
};

using VcpuFactory = std::function<Result<std::unique_ptr<Backend>>(GuestMemory&)>;

Result<Rig> make_rig(const VcpuFactory& make_vcpu) {
  auto memory = GuestMemory::create(kCalibrationRam);
  if (!memory) return std::unexpected(memory.error());
  Rig rig{std::make_unique<GuestMemory>(std::move(*memory)), nullptr};
  auto cpu = make_vcpu(*rig.memory);
  if (!cpu) return std::unexpected(cpu.error());
  rig.cpu = std::move(*cpu);
  return rig;
}

Result<uint64_t> interp_branches(const CalibrationGuest& guest) {
  auto rig = make_rig([](GuestMemory& memory) { return make_interp_backend(memory, CpuModel::deja_v1()); });
  if (!rig) return std::unexpected(rig.error());
  auto run = run_calibration_guest(*rig->cpu, *rig->memory, guest);
  if (!run) return std::unexpected(run.error());
  if (!run->branches) return fail(ErrorKind::kHost, "the software CPU reported no branch count");
  return *run->branches;
}

}  // namespace

bool PmuSelftest::usable() const {
  if (checks.empty()) return false;
  for (const auto& c : checks) {
    if (!c.passed) return false;
  }
  return true;
}

std::string PmuSelftest::first_failure() const {
  for (const auto& c : checks) {
    if (!c.passed && !c.skipped) return c.name + ": " + c.detail;
  }
  return checks.empty() ? "no checks ran" : "";
}

CalibrationGuest calibration_loop(uint32_t iterations) {
  CalibrationGuest guest;
  auto& c = guest.code;
  c.push_back(0xb9);  // mov ecx, iterations
  put32(c, iterations);
  c.insert(c.end(), {0x49, 0x75, 0xfd});                    // 1: dec ecx; jnz 1b
  c.insert(c.end(), {0xe6, kEndPort, 0xf4});                // out 0x80, al; hlt
  guest.branches = iterations;
  guest.port_exits = 1;
  return guest;
}

CalibrationGuest calibration_loop_with_exits(uint32_t iterations, uint32_t exit_every) {
  CalibrationGuest guest;
  auto& c = guest.code;
  c.push_back(0xb9);  // mov ecx, iterations
  put32(c, iterations);
  c.push_back(0xbb);  // mov ebx, exit_every
  put32(c, exit_every);
  // loop: dec ebx; jnz skip; out 0x81, al; mov ebx, exit_every; skip: dec ecx; jnz loop
  c.insert(c.end(), {0x4b, 0x75, 0x07, 0xe6, kLoopPort, 0xbb});
  put32(c, exit_every);
  c.insert(c.end(), {0x49, 0x75, 0xf3});
  c.insert(c.end(), {0xe6, kEndPort, 0xf4});  // out 0x80, al; hlt
  guest.branches = 2 * uint64_t{iterations};
  guest.port_exits = iterations / exit_every + 1;
  return guest;
}

Result<CalibrationRun> run_calibration_guest(Backend& cpu, GuestMemory& memory, const CalibrationGuest& guest,
                                             std::optional<uint64_t> arm_at) {
  const uint64_t gdt[] = {0, 0x00af9b000000ffffull, 0x00cf93000000ffffull, 0x00cf9b000000ffffull};
  if (auto ok = memory.write(Gpa{kGdt}, std::span(reinterpret_cast<const uint8_t*>(gdt), sizeof(gdt))); !ok) {
    return std::unexpected(ok.error());
  }
  if (auto ok = memory.write(Gpa{kCalibrationEntry}, guest.code); !ok) return std::unexpected(ok.error());
  if (auto ok = cpu.set_state(flat_protected_mode(kCalibrationEntry)); !ok) return std::unexpected(ok.error());

  ProgressCounter* counter = cpu.progress_counter();
  if (arm_at && counter == nullptr) {
    return fail(ErrorKind::kUnsupported, "the {} backend has no progress counter to arm", cpu.name());
  }
  uint64_t base = counter ? counter->read() : 0;
  if (arm_at) {
    if (auto ok = counter->arm(base + *arm_at); !ok) return std::unexpected(ok.error());
  }
  CalibrationRun run;
  // Spurious kicks are tolerated only a few times; a guest that never halts is a failure, not a hang.
  for (uint64_t spurious = 0;;) {
    auto exit = cpu.run();
    if (!exit) {
      if (counter) counter->disarm();
      return std::unexpected(exit.error());
    }
    VcpuExit& e = **exit;
    if (e.kind == ExitKind::kIoOut && (e.port == kLoopPort || e.port == kEndPort)) {
      ++run.port_exits;
      continue;
    }
    if (e.kind == ExitKind::kHlt) {
      run.stop_rip = e.rip;
      break;
    }
    if (e.kind == ExitKind::kKicked) {
      if (arm_at) {
        run.stopped_by_overflow = true;
        run.stop_rip = e.rip;
        break;
      }
      if (++spurious < 16) continue;
    }
    if (counter) counter->disarm();
    return fail(ErrorKind::kHost, "the calibration guest stopped on {} with {} at rip {:#x}{}{}", cpu.name(),
                exit_kind_name(e.kind), e.rip, e.detail.empty() ? "" : ": ", e.detail);
  }
  if (counter) {
    counter->disarm();
    run.counter_at_stop = counter->read();
    run.branches = *run.counter_at_stop - base;
  }
  return run;
}

Result<> attach_pmu_counter_with(Backend& kvm_backend, const PmuModel& model, const PerfHost& host) {
  auto* vcpu = dynamic_cast<KvmVcpu*>(&kvm_backend);
  if (vcpu == nullptr) {
    return fail(ErrorKind::kUnsupported,
                "a host PMU counter can only be attached to a KVM backend, not to the '{}' backend (which {})",
                kvm_backend.name(),
                kvm_backend.progress_counter() ? "has its own exact counter" : "has no progress counter");
  }
  auto counter = PerfCounter::open(model, vcpu->immediate_exit_flag(), host);
  if (!counter) return std::unexpected(counter.error());
  vcpu->adopt_progress_counter(std::move(*counter));
  return {};
}

Result<> attach_pmu_counter(Backend& kvm_backend) {
  if (dynamic_cast<KvmVcpu*>(&kvm_backend) == nullptr) return attach_pmu_counter_with(kvm_backend, {}, {});
  auto model = pmu_model_for(host_cpu_identity());
  if (!model) return std::unexpected(model.error());
  return attach_pmu_counter_with(kvm_backend, *model, {});
}

PmuSelftest run_pmu_selftest() { return run_pmu_selftest_with(SelftestHost{}); }

PmuSelftest run_pmu_selftest_with(const SelftestHost& environment) {
  const PerfHost& host = environment.perf;
  PmuSelftest result;
  Checks checks{result, {kKvmUsable, kCpuKnown, kOpens, kExact, kDeterministic, kOverflow}};

  // (a) Everything below runs small VMs.
  VcpuFactory make_vcpu = environment.make_vcpu;
  if (!make_vcpu) {
    // The PMU matters only where deja can use KVM at all (kvm/kvm_usability.h).
    const KvmUsability& kvm = kvm_usability();
    if (!kvm.usable()) return checks.failed(kKvmUsable, kvm.summary());
    make_vcpu = [model = kvm.default_model()](GuestMemory& memory) { return make_kvm_backend(memory, *model); };
  }
  auto rig = make_rig(make_vcpu);
  if (!rig) return checks.failed(kKvmUsable, rig.error().message);
  checks.pass(kKvmUsable, "created a VM with one vCPU on /dev/kvm");

  // (b) Which event counts retired conditional branches here, and how late its overflow lands.
  CpuIdentity cpu = environment.identify ? environment.identify() : host_cpu_identity();
  auto model = pmu_model_for(cpu);
  if (!model) {
    return checks.failed(kCpuKnown,
                         model.error().message + " (docs/pmu-hosts.md lists the supported CPUs)" +
                             (cpu.hypervisor ? "; note: deja runs in a VM (CPUID hypervisor bit), so this is the "
                                               "hypervisor's CPU model, and most hypervisors (QEMU TCG included) "
                                               "give their guests no PMU"
                                             : ""));
  }
  std::string cpu_detail = fmt::format("{} ({} family {:#x} model {:#x} stepping {}): raw event {:#x}, skid {}{}",
                                       model->name, cpu.vendor, cpu.family, cpu.model, cpu.stepping, model->raw_event,
                                       model->skid, model->skid_unbounded ? " (rr: usually, not always, respected)" : "");
  if (cpu.hypervisor) {
    cpu_detail += "; warning: deja itself runs in a VM (CPUID hypervisor bit), whose PMU is virtualized by the "
                  "outer hypervisor: counts and overflow interrupts are only as good as its emulation";
  }
  checks.pass(kCpuKnown, cpu_detail);

  // rr's Zen check: with SpecLockMap enabled the branch counter is not deterministic (rr issue #2034). When
  // disabled, RETIRED_LOCK_INSTRUCTIONS.SPECLOCKMAPCOMMIT (0x510825) stays 0 across a locked add.
  if (model->amd_zen) {
    auto commits = count_host_event(0x510825, locked_add, host);
    if (!commits) {
      checks.pass(kSpecLockMap,
                  "could not be checked (RETIRED_LOCK_INSTRUCTIONS raw 0x510825 does not open); if replays diverge, "
                  "see docs/pmu-hosts.md");
    } else if (*commits != 0) {
      return checks.failed(
          kSpecLockMap,
          fmt::format("a locked add counted {} SpecLockMap commits: the hardware SpecLockMap optimization is on, which "
                      "makes branch counts nondeterministic; disable it (MSR 0xc0011020 bit 54, rr's "
                      "scripts/zen_workaround.py, https://github.com/rr-debugger/rr/wiki/Zen){}",
                      *commits, cpu.hypervisor ? "; inside a VM this must be done on the physical host" : ""));
    } else {
      checks.pass(kSpecLockMap, "SpecLockMapCommit stayed 0 across a locked add");
    }
  }

  // (c) The real counter on the real vCPU thread (this one).
  auto attached = environment.attach ? environment.attach(*rig->cpu, *model)
                                     : attach_pmu_counter_with(*rig->cpu, *model, host);
  if (!attached) return checks.failed(kOpens, attached.error().message);
  ProgressCounter* counter = rig->cpu->progress_counter();
  if (counter == nullptr) return checks.failed(kOpens, "attaching succeeded but the backend has no progress counter");
  result.counter = counter->describe();
  std::string open_detail = result.counter;
  if (auto* perf = dynamic_cast<PerfCounter*>(counter)) {
    for (const auto& w : perf->warnings()) open_detail += "; warning: " + w;
  }
  checks.pass(kOpens, open_detail);

  // (d) The same guests on the software CPU give the reference count.
  CalibrationGuest plain = calibration_loop(kPlainIterations);
  CalibrationGuest with_exits = calibration_loop_with_exits(kExitIterations, kExitEvery);
  auto reference_plain = interp_branches(plain);
  auto reference_exits = interp_branches(with_exits);
  if (!reference_plain || !reference_exits) {
    return checks.failed(kExact, "the software CPU could not run the calibration guest: " +
                                     (reference_plain ? reference_exits.error() : reference_plain.error()).message);
  }
  auto measure = [&](const CalibrationGuest& guest) -> Result<uint64_t> {
    auto run = run_calibration_guest(*rig->cpu, *rig->memory, guest);
    if (!run) return std::unexpected(run.error());
    auto* perf = dynamic_cast<PerfCounter*>(counter);
    if (perf != nullptr && !perf->read_error().empty()) return fail(ErrorKind::kHost, "{}", perf->read_error());
    return *run->branches;
  };
  auto kvm_plain = measure(plain);
  auto kvm_exits = measure(with_exits);
  if (!kvm_plain || !kvm_exits) {
    return checks.failed(kExact, "running the calibration guest on KVM failed: " +
                                     (kvm_plain ? kvm_exits.error() : kvm_plain.error()).message);
  }
  std::string counts = fmt::format("plain loop: KVM counted {}, software CPU {}; loop with {} port exits: KVM {}, "
                                   "software CPU {}",
                                   *kvm_plain, *reference_plain, with_exits.port_exits, *kvm_exits, *reference_exits);
  if (*kvm_plain != *reference_plain || *kvm_exits != *reference_exits) {
    // Excess that grows with the number of exits is host work counted as guest work.
    int64_t excess_plain = int64_t(*kvm_plain) - int64_t(*reference_plain);
    int64_t excess_exits = int64_t(*kvm_exits) - int64_t(*reference_exits);
    bool host_leak = excess_exits > 0 && excess_exits > excess_plain;
    return checks.failed(
        kExact, counts + (host_leak ? " - the extra branches come with exits, so the counter also counts host code: "
                                      "this kernel does not honour exclude_host for this event"
                                    : fmt::format(" - the event does not count exactly the guest's conditional "
                                                  "branches; check `perf stat -e r{:x}` on a known loop and report the "
                                                  "CPU model",
                                                  model->raw_event)));
  }
  checks.pass(kExact, counts);

  // (e) Host scheduling, interrupts and exits must not change the count.
  auto again = measure(with_exits);
  auto third = measure(with_exits);
  if (!again || !third) {
    return checks.failed(kDeterministic, "rerunning the calibration guest failed: " +
                                             (again ? third.error() : again.error()).message);
  }
  if (*again != *kvm_exits || *third != *kvm_exits) {
    return checks.failed(kDeterministic, fmt::format("three runs of the same guest counted {}, {} and {} branches",
                                                     *kvm_exits, *again, *third));
  }
  checks.pass(kDeterministic, fmt::format("three runs counted {} branches each", *kvm_exits));

  // (f) An armed overflow stops KVM_RUN no earlier than the target and at most skid() later.
  CalibrationGuest long_loop = calibration_loop(kOverflowIterations);
  const uint64_t target = kOverflowIterations / 2;
  auto stopped = run_calibration_guest(*rig->cpu, *rig->memory, long_loop, target);
  if (!stopped) return checks.failed(kOverflow, "arming or running failed: " + stopped.error().message);
  if (!stopped->stopped_by_overflow) {
    return checks.failed(kOverflow, fmt::format("armed at {} of {} branches, the guest ran to its HLT: the overflow "
                                                "signal never interrupted KVM_RUN",
                                                target, long_loop.branches));
  }
  uint64_t landed = *stopped->branches;
  std::string where = fmt::format("armed at {} branches, stopped at {} (late by {}, skid {})", target, landed,
                                  landed >= target ? landed - target : 0, counter->skid());
  if (landed < target || landed > target + counter->skid()) {
    return checks.failed(kOverflow, where + (landed < target ? " - stopped EARLY, which must never happen"
                                                             : " - later than the table's skid for this CPU"));
  }
  checks.pass(kOverflow, where);
  return result;
}

}  // namespace deja
