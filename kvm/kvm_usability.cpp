// The KVM usability check: calibration snippets (kvm/usability_guest.S) run on a probe vCPU, each compared with what deja relies on.
#include "kvm/kvm_usability.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <optional>

#include <fmt/format.h>

#include "kvm/kvm_backend.h"

extern "C" const uint8_t deja_usability_guest_begin[], deja_usability_guest_end[], deja_probe_accessed[],
    deja_probe_fxsave[], deja_probe_fnstenv[];
extern "C" const uint8_t deja_probe_loop[], deja_probe_sse[], deja_probe_sse2[], deja_probe_fpu[], deja_probe_cmov[],
    deja_probe_cx8[], deja_probe_cx16[], deja_probe_popcnt[], deja_probe_lzcnt[], deja_probe_movbe[],
    deja_probe_fxsr[], deja_probe_lahf[], deja_probe_clflush[], deja_probe_tsc[], deja_probe_mmx[], deja_probe_sse3[],
    deja_probe_ssse3[], deja_probe_sse41[], deja_probe_sse42[], deja_probe_avx[], deja_probe_avx2[], deja_probe_fma[],
    deja_probe_f16c[], deja_probe_bmi1[], deja_probe_bmi2[], deja_probe_xsave[], deja_probe_xsetbv[],
    deja_probe_cpuid[], deja_probe_step[], deja_probe_user_step[], deja_probe_halt[], deja_probe_vectors[],
    deja_probe_window[];

namespace deja {

std::string failed_checks(const std::vector<HostCheck>& checks) {
  std::string out;
  for (const auto& c : checks) {
    if (!c.passed && !c.skipped) out += (out.empty() ? "" : "; ") + c.name + ": " + c.detail;
  }
  return out;
}

namespace {

// The probe VM's layout: GDT, 4-level page tables identity-mapping 2 MiB with one user-accessible large
// page, an IDT for the exception stubs, a scratch page the snippets use, the snippets, and a stack.
constexpr uint64_t kRam = 2 << 20;
constexpr uint64_t kGdt = 0x500, kPml4 = 0x1000, kPdpt = 0x2000, kPd = 0x3000, kIdt = 0x4000, kTss = 0x5000,
                   kFxsaveArea = 0x7000, kCode = 0x10000, kStackTop = 0x80000, kKernelStackTop = 0x7f000;
constexpr uint16_t kCode64 = 0x08, kData = 0x10, kCode32 = 0x18, kUserData = 0x20, kUserCode64 = 0x28, kTr = 0x30,
                   kCode64Unaccessed = 0x40;
constexpr uint64_t kGdtEntries[] = {0,
                                    0x00af9b000000ffffull,   // 0x08 code, 64-bit
                                    0x00cf93000000ffffull,   // 0x10 data
                                    0x00cf9b000000ffffull,   // 0x18 code, 32-bit
                                    0x00cff3000000ffffull,   // 0x20 user data (DPL 3)
                                    0x00affb000000ffffull,   // 0x28 user code, 64-bit (DPL 3)
                                    // 0x30 the 64-bit TSS (base kTss, limit 0x67, busy), so that an exception
                                    // at CPL3 reaches its stub on RSP0 instead of triple-faulting
                                    0x0000890000000067ull | (kTss & 0xffffff) << 16 | (kTss >> 24) << 56, 0,
                                    0x00af9a000000ffffull};  // 0x40 code, 64-bit, accessed bit clear
constexpr uint16_t kVectorPort = 0xe0;  // the exception stubs report their vector here
constexpr uint32_t kLoopIterations = 20'000;  // the messages say 20,000
constexpr int kLoopRepeats = 3;
constexpr uint64_t kWindowShadow = 2;  // STI and the one instruction its shadow covers
constexpr uint64_t kWindowLateMax = 16;

constexpr const char* kOpens = "/dev/kvm opens";
constexpr const char* kStateLoads = "CPU state loads";
constexpr const char* kNativeSpeed = "guest code runs natively";
constexpr const char* kSse = "SSE executes";
constexpr const char* kFeatures = "CPU model features execute";
constexpr const char* kCpuid = "CPUID answers from the model";
constexpr const char* kSingleStep = "single-step";
constexpr const char* kWindow = "interrupt window";
constexpr const char* kQuirks = "architectural details";

uint64_t offset_of(const uint8_t* snippet) { return uint64_t(snippet - deja_usability_guest_begin); }

// Feature -> the snippet that executes it and the RAX it must leave. Features without a snippet (PSE, PGE,
// PAE, MSR, PAT, SYSCALL, NX, LM) are covered by KVM_GET_SUPPORTED_CPUID and the state check.
struct FeatureProbe {
  std::string_view feature;
  const uint8_t* snippet;
  uint64_t expected;
  const char* wrong_answer_hint = "";
};
const FeatureProbe kFeatureProbes[] = {
    {"FPU", deja_probe_fpu, 2},
    {"SSE", deja_probe_sse, 0x40000000},
    {"SSE2", deja_probe_sse2, 0x2468acf02468acf0},
    {"CMOV", deja_probe_cmov, 7},
    {"CX8", deja_probe_cx8, 9},
    {"CX16", deja_probe_cx16, 9},
    {"POPCNT", deja_probe_popcnt, 8},
    {"ABM/LZCNT", deja_probe_lzcnt, 31, " (BSR's answer: the instruction was run as BSR)"},
    {"MOVBE", deja_probe_movbe, 0x44332211},
    {"FXSR", deja_probe_fxsr, 1},
    {"LAHF_LM", deja_probe_lahf, 0xd7},
    {"CLFSH", deja_probe_clflush, 1},
    {"TSC", deja_probe_tsc, 1},
    {"MMX", deja_probe_mmx, 9},
    {"SSE3", deja_probe_sse3, 0x12345678},
    {"SSSE3", deja_probe_ssse3, 5},
    {"SSE4.1", deja_probe_sse41, 7},
    {"SSE4.2", deja_probe_sse42, 0x93ad1061},
    {"XSAVE", deja_probe_xsave, 0x112233445566778f},
    {"AVX", deja_probe_avx, 0x40000000},
    {"AVX2", deja_probe_avx2, 0x2468acf02468acf0},
    {"FMA", deja_probe_fma, 7},
    {"F16C", deja_probe_f16c, 0x40000000},
    {"BMI1", deja_probe_bmi1, 0xf},
    {"BMI2", deja_probe_bmi2, 0xb0},
};

SegmentReg flat(uint16_t selector, uint8_t type, bool code64) {
  return SegmentReg{.base = 0, .limit = 0xffffffff, .selector = selector, .type = type, .dpl = 0, .present = true,
                    .s = true, .db = !code64, .l = code64, .g = true};
}

// 64-bit CPL0 with paging, PGE and PSE on (Linux runs so), x87 and SSE enabled, interrupts off.
CpuState long_mode(uint64_t rip) {
  CpuState s;
  s.rip = rip;
  s.rflags = 0x2;
  s.gpr[kRsp] = kStackTop;
  s.cs = flat(kCode64, 0xb, true);
  s.ds = s.es = s.fs = s.gs = s.ss = flat(kData, 0x3, false);
  s.tr = SegmentReg{.base = kTss, .limit = 0x67, .selector = kTr, .type = 0xb, .present = true};
  s.gdt = {kGdt, uint16_t(sizeof(kGdtEntries) - 1)};
  s.idt = {kIdt, 32 * 16 - 1};
  s.cr0 = cr0::kPe | cr0::kMp | cr0::kEt | cr0::kNe | cr0::kWp | cr0::kPg;
  s.cr3 = kPml4;
  s.cr4 = cr4::kPae | cr4::kPse | cr4::kPge | cr4::kOsfxsr | cr4::kOsxmmexcpt;
  s.efer = efer::kLme | efer::kLma | efer::kSce | efer::kNxe;
  const uint16_t fcw = 0x037f;
  const uint32_t mxcsr = 0x1f80;
  std::memcpy(s.fxsave.data(), &fcw, sizeof(fcw));
  std::memcpy(s.fxsave.data() + 24, &mxcsr, sizeof(mxcsr));
  return s;
}

// XSAVE's state components of `model` (CPUID.0DH:EDX:EAX), 0 without XSAVE.
uint64_t xsave_components(const CpuModel& model) {
  if (!model.has(feature("XSAVE"))) return 0;
  const CpuidResult r = model.cpuid(0xd, 0);
  return uint64_t{r.edx} << 32 | r.eax;
}

// long_mode as an OS leaves it for `model`: with XSAVE, CR4.OSXSAVE set and every state component enabled in XCR0.
CpuState os_state(const CpuModel& model, uint64_t rip) {
  CpuState s = long_mode(rip);
  if (uint64_t components = xsave_components(model)) {
    s.cr4 |= cr4::kOsxsave;
    s.xcr0 = components;
  }
  return s;
}

// 32-bit protected mode with 32-bit paging (a Multiboot guest that enabled paging; checkpoints restore it).
CpuState paged_protected_mode(uint64_t rip) {
  CpuState s = long_mode(rip);
  s.cs = flat(kCode32, 0xb, false);
  s.cr0 = cr0::kPe | cr0::kEt | cr0::kPg;
  s.cr3 = kPd;
  s.cr4 = cr4::kPse;
  s.efer = 0;
  return s;
}

// One probe VM: memory (on the heap: backends keep a reference to it) and its vCPU.
struct ProbeVm {
  std::unique_ptr<GuestMemory> memory;
  std::unique_ptr<Backend> cpu;
};

Result<ProbeVm> make_probe_vm(const UsabilityProbeHost& host, const CpuModel& model) {
  auto memory = GuestMemory::create(kRam);
  if (!memory) return std::unexpected(memory.error());
  ProbeVm vm{std::make_unique<GuestMemory>(std::move(*memory)), nullptr};
  auto blob = std::span(deja_usability_guest_begin, deja_usability_guest_end);
  // 64-bit interrupt gates (SDM Vol. 3, 6.14.1) to the stubs.
  uint64_t idt[64] = {};
  for (uint64_t v = 0; v < 32; ++v) {
    uint64_t handler = kCode + offset_of(deja_probe_vectors) + 8 * v;
    idt[2 * v] = (handler & 0xffff) | (uint64_t{kCode64} << 16) | (uint64_t{0x8e} << 40) | ((handler >> 16) << 48);
    idt[2 * v + 1] = handler >> 32;
  }
  // Pages present, writable, user-accessible (the CPL3 single-step runs there), 2 MiB.
  uint8_t tss[0x68] = {};
  std::memcpy(tss + 4, &kKernelStackTop, 8);  // RSP0
  for (auto ok : {vm.memory->write_obj(Gpa{kGdt}, kGdtEntries), vm.memory->write_obj(Gpa{kIdt}, idt),
                  vm.memory->write_obj(Gpa{kTss}, tss),
                  vm.memory->write_obj(Gpa{kPml4}, kPdpt | 0x7), vm.memory->write_obj(Gpa{kPdpt}, kPd | 0x7),
                  vm.memory->write_obj(Gpa{kPd}, uint64_t{0x87}), vm.memory->write(Gpa{kCode}, blob)}) {
    if (!ok) return std::unexpected(ok.error());
  }
  auto cpu = host.make_vcpu(*vm.memory, model);
  if (!cpu) return std::unexpected(cpu.error());
  vm.cpu = std::move(*cpu);
  return vm;
}

// How a snippet ended: at its HLT with these registers, or somewhere else (described).
struct SnippetRun {
  std::optional<CpuState> at_hlt;
  std::string problem;  // "stops with an emulation failure (KVM_EXIT_INTERNAL_ERROR)", ...
  std::vector<uint64_t> debug_rips;  // kDebug exits on the way
  std::optional<uint64_t> window_rip;
};

std::string describe_stop(const VcpuExit& e) {
  if (e.detail.find("emulation failure") != std::string::npos) {
    return "stops with an emulation failure (KVM_EXIT_INTERNAL_ERROR)";
  }
  std::string first_line = e.detail.substr(0, e.detail.find('\n'));
  return fmt::format("stops with a {} exit at rip {:#x}{}{}", exit_kind_name(e.kind), e.rip,
                     first_line.empty() ? "" : ": ", first_line);
}

SnippetRun run_snippet(Backend& cpu, const CpuState& state, bool stop_at_window = false) {
  SnippetRun out;
  if (auto ok = cpu.set_state(state); !ok) {
    out.problem = "its state was refused: " + ok.error().message;
    return out;
  }
  // Every snippet reaches its HLT within a few thousand instructions; a bound keeps a broken host from
  // looping here (a debug exit per instruction on the 4 KiB window sled is the most there is).
  std::string last;
  for (int exits = 0; exits < 10'000; ++exits) {
    auto exit = cpu.run();
    if (!exit) {
      out.problem = "running it failed: " + exit.error().message;
      return out;
    }
    VcpuExit& e = **exit;
    last = fmt::format("{} at rip {:#x}", exit_kind_name(e.kind), e.rip);
    switch (e.kind) {
      case ExitKind::kHlt: {
        auto regs = cpu.get_state();
        if (!regs) {
          out.problem = "reading its registers failed: " + regs.error().message;
        } else {
          out.at_hlt = *regs;
        }
        return out;
      }
      case ExitKind::kRdtsc:  // KVM with the kvm-deja module hands RDTSC to the VMM
        e.value = 0;
        continue;
      case ExitKind::kDebug:
        out.debug_rips.push_back(e.rip);
        continue;
      case ExitKind::kInterruptWindow:
        out.window_rip = e.rip;
        cpu.request_interrupt_window(false);
        if (stop_at_window) return out;
        continue;
      case ExitKind::kKicked:
        continue;
      case ExitKind::kIoOut:
        if (e.port == kVectorPort) {
          static constexpr const char* kNames[] = {"#DE", "#DB", "NMI", "#BP", "#OF", "#BR", "#UD", "#NM",
                                                   "#DF", "?9",  "#TS", "#NP", "#SS", "#GP", "#PF", "?15",
                                                   "#MF", "#AC", "#MC", "#XM"};
          out.problem = fmt::format("raises {} (vector {})", e.value < std::size(kNames) ? kNames[e.value] : "?",
                                    e.value);
          return out;
        }
        [[fallthrough]];
      default:
        out.problem = describe_stop(e);
        return out;
    }
  }
  out.problem = "did not reach its HLT within 10,000 exits (the last: " + last + ")";
  return out;
}

// A value as printf's %#x writes it: "0" for zero (fmt's {:#x} would write "0x0").
std::string hex_value(uint64_t value) { return value == 0 ? "0" : fmt::format("{:#x}", value); }

// Runs a snippet (from `entry`, long_mode by default) that leaves its answer in RAX; "" when it equals `expected`.
std::string answer_problem(Backend& cpu, const uint8_t* snippet, uint64_t expected, const char* hint = "",
                           std::optional<CpuState> entry = std::nullopt) {
  CpuState state = entry.value_or(long_mode(0));
  state.rip = kCode + offset_of(snippet);
  SnippetRun run = run_snippet(cpu, state);
  if (!run.at_hlt) return run.problem;
  uint64_t got = run.at_hlt->gpr[kRax];
  if (got == expected) return {};
  return fmt::format("returned {} where {} is right{}", hex_value(got), hex_value(expected), hint);
}

uint64_t now_ns() {
  return uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(
                      std::chrono::steady_clock::now().time_since_epoch())
                      .count());
}

struct Checks {
  KvmUsability& result;
  void add(const char* name, const std::string& problem, std::string ok_detail) {
    result.checks.push_back({name, problem.empty(), false, problem.empty() ? std::move(ok_detail) : problem});
  }
};

// Long mode on the main probe vCPU; 32-bit paging on one of its own (a host that mishandles it may leave
// the vCPU unable to run the other checks).
std::string check_state_loads(Backend& cpu, const UsabilityProbeHost& host) {
  auto other = make_probe_vm(host, CpuModel::x86_64_v1());
  if (!other) return other.error().message;
  for (auto [vcpu, wanted] : {std::pair<Backend*, CpuState>{&cpu, long_mode(kCode)},
                              std::pair<Backend*, CpuState>{other->cpu.get(), paged_protected_mode(kCode)}}) {
    if (auto ok = vcpu->set_state(wanted); !ok) return "KVM refused a valid state: " + ok.error().message;
    auto got = vcpu->get_state();
    if (!got) return "reading the state back failed: " + got.error().message;
    const char* mode = wanted.efer ? "long mode" : "32-bit paging";
    if ((got->cr0 & cr0::kPg) != (wanted.cr0 & cr0::kPg)) {
      return fmt::format("{}: CR0.PG was cleared (set CR0 {:#x}, read back {:#x})", mode, wanted.cr0, got->cr0);
    }
    if (got->cr4 != wanted.cr4 || got->efer != wanted.efer || got->cr3 != wanted.cr3) {
      return fmt::format("{}: set CR3/CR4/EFER {:#x}/{:#x}/{:#x}, read back {:#x}/{:#x}/{:#x}", mode, wanted.cr3,
                         wanted.cr4, wanted.efer, got->cr3, got->cr4, got->efer);
    }
  }
  return {};
}

// The loop's cost per iteration: the difference between the fastest long and the fastest one-iteration run of a
// few tries (so that the fixed cost of entering the guest cancels). Each minimum is taken on its own: noise only
// adds time, and a delay in one short run must not cancel a long run (a difference of 0 passed an emulating KVM).
std::string check_native_speed(Backend& cpu, uint64_t limit_ns, std::string& detail) {
  auto timed = [&](uint32_t iterations) -> Result<uint64_t> {
    CpuState s = long_mode(kCode + offset_of(deja_probe_loop));
    s.gpr[kRdi] = iterations;
    uint64_t start = now_ns();
    SnippetRun run = run_snippet(cpu, s);
    uint64_t took = now_ns() - start;
    if (!run.at_hlt) return std::unexpected(Error{ErrorKind::kHost, "the loop " + run.problem});
    return took;
  };
  uint64_t best_one = UINT64_MAX, best_long = UINT64_MAX;
  for (int i = 0; i < kLoopRepeats; ++i) {
    auto one = timed(1);
    if (!one) return one.error().message;
    auto many = timed(kLoopIterations + 1);
    if (!many) return many.error().message;
    best_one = std::min(best_one, *one);
    best_long = std::min(best_long, *many);
  }
  double per_iteration = double(best_long > best_one ? best_long - best_one : 0) / kLoopIterations;
  detail = fmt::format("a 20,000-iteration loop took {:.3f} ms ({:.1f} ns an iteration)", best_long / 1e6,
                       per_iteration);
  if (per_iteration <= double(limit_ns)) return {};
  return fmt::format("guest kernel code is emulated: {}, where hardware KVM takes about 1 ns{}", detail,
                     host_kvm_is_pvm() ? " (this /dev/kvm is kvm-pvm: /sys/module/kvm_pvm)" : "");
}

// CPUID in the guest for `leaves` from `entry` (its CR4 and XCR0 decide the run-time bits) against the model's answers.
std::string check_cpuid(Backend& cpu, const CpuModel& model, std::span<const std::pair<uint32_t, uint32_t>> leaves,
                        const CpuState& entry) {
  for (auto [leaf, subleaf] : leaves) {
    CpuState s = entry;
    s.rip = kCode + offset_of(deja_probe_cpuid);
    s.gpr[kRdi] = leaf;
    s.gpr[kRsi] = subleaf;
    SnippetRun run = run_snippet(cpu, s);
    if (!run.at_hlt) return "CPUID " + run.problem;
    const auto& g = run.at_hlt->gpr;
    CpuidResult got{uint32_t(g[kRax]), uint32_t(g[kRbx]), uint32_t(g[kRcx]), uint32_t(g[kRdx])};
    CpuidResult want = model.cpuid(leaf, subleaf, s.cr4, s.xcr0);
    if (got != want) {
      return fmt::format("leaf {:#x}{}: the guest read {:08x} {:08x} {:08x} {:08x}, model {} says {:08x} {:08x} {:08x} "
                         "{:08x}{}",
                         leaf, subleaf ? fmt::format(".{}", subleaf) : "", got.eax, got.ebx, got.ecx, got.edx,
                         model.name(), want.eax, want.ebx, want.ecx, want.edx,
                         s.cr4 & cr4::kOsxsave ? fmt::format(" with CR4.OSXSAVE set and XCR0 = {:#x}", s.xcr0) : "");
    }
  }
  return {};
}

constexpr std::pair<uint32_t, uint32_t> kBaselineLeaves[] = {{0, 0}, {1, 0}, {7, 0}, {0x80000000, 0}, {0x80000001, 0}};
// Leaf 1 (OSXSAVE follows CR4) and leaf 0DH (its sizes follow XCR0), read under each XCR0 an OS may set.
constexpr std::pair<uint32_t, uint32_t> kXsaveLeaves[] = {{1, 0}, {0xd, 0}, {0xd, 1}, {0xd, 2}};

// Three steps over NOPs, each a debug exit after exactly one instruction, at CPL0 and at CPL3 (where a
// seeker stops user code); the debug controls are then cleared so the end (HLT, SYSCALL) runs freely.
std::string check_single_step(Backend& cpu) {
  CpuState user = long_mode(kCode + offset_of(deja_probe_user_step));
  user.cs = flat(kUserCode64, 0xb, true);
  user.cs.dpl = 3;
  user.cs.selector |= 3;
  user.ss = flat(kUserData, 0x3, false);
  user.ss.dpl = 3;
  user.ss.selector |= 3;
  user.msrs.lstar = kCode + offset_of(deja_probe_halt);
  user.msrs.star = uint64_t{kCode64} << 32 | uint64_t{kCode32 | 3} << 48;
  for (const auto& [level, state] : {std::pair<const char*, CpuState>{"CPL0", long_mode(kCode + offset_of(deja_probe_step))},
                                     std::pair<const char*, CpuState>{"CPL3", user}}) {
    if (auto ok = cpu.set_state(state); !ok) return std::string(level) + ": its state was refused: " + ok.error().message;
    if (auto ok = cpu.set_debug(DebugControl{.single_step = true}); !ok) return ok.error().message;
    std::string problem;
    for (uint64_t step = 1; step <= 3 && problem.empty(); ++step) {
      auto exit = cpu.run();
      if (!exit) {
        problem = exit.error().message;
      } else if ((*exit)->kind != ExitKind::kDebug) {
        problem = fmt::format("step {} ended with a {} exit at {:+#x}", step, exit_kind_name((*exit)->kind),
                              int64_t((*exit)->rip - state.rip));
      } else if ((*exit)->rip != state.rip + step) {
        problem = fmt::format("step {} stopped at {:+#x} where {:+#x} is right", step, int64_t((*exit)->rip - state.rip),
                              int64_t(step));
      }
    }
    (void)cpu.set_debug(DebugControl{});
    if (!problem.empty()) return fmt::format("{}: {}", level, problem);
    auto exit = cpu.run();
    if (!exit || (*exit)->kind != ExitKind::kHlt) {
      return fmt::format("{}: with single-step cleared, the guest did not run on to its HLT ({})", level,
                         exit ? std::string(exit_kind_name((*exit)->kind)) : exit.error().message);
    }
  }
  return {};
}

// Architectural details that do not stop deja but show in guest memory, so that traces carry them
// (Backend::cpu_quirks) and a replay on the software CPU can do the same: whether IRET sets a code
// descriptor's accessed bit, and what FXSAVE writes besides the registers.
std::string check_quirks(Backend& cpu, GuestMemory& memory, std::vector<std::string>& quirks, std::string& detail) {
  CpuState s = long_mode(kCode + offset_of(deja_probe_accessed));
  s.gpr[kRdi] = kGdt + kCode64Unaccessed + 5;
  s.gpr[kRsi] = kCode64Unaccessed;
  SnippetRun run = run_snippet(cpu, s);
  if (!run.at_hlt) return "IRETQ to a fresh code descriptor " + run.problem;
  const bool accessed_set = run.at_hlt->gpr[kRax] & 1;
  if (!accessed_set) quirks.emplace_back(kCpuQuirkAccessedBitOnlyBySegmentLoads);

  // Runs a snippet that stores x87 state at RDI over 0xaa bytes, and reads what it stored (and left) back.
  std::array<uint8_t, 512> image;
  auto store_probe = [&](const uint8_t* probe, const char* name) -> std::string {
    image.fill(0xaa);
    if (auto ok = memory.write(Gpa{kFxsaveArea}, image); !ok) return ok.error().message;
    CpuState state = long_mode(kCode + offset_of(probe));
    state.gpr[kRdi] = kFxsaveArea;
    SnippetRun stored = run_snippet(cpu, state);
    if (!stored.at_hlt) return name + stored.problem;
    if (auto ok = memory.read(Gpa{kFxsaveArea}, image); !ok) return ok.error().message;
    return {};
  };
  if (auto problem = store_probe(deja_probe_fxsave, "FXSAVE64 "); !problem.empty()) return problem;
  uint16_t fop = 0;
  uint64_t fip = 0;
  std::memcpy(&fop, image.data() + 6, 2);
  std::memcpy(&fip, image.data() + 8, 8);
  const bool pointers_kept = fop == 0x1e8 && fip == kCode + offset_of(deja_probe_fxsave) + 2;
  const bool reserved_kept = image[32 + 10] == 0xaa;  // ST0's slot: bytes 10-15 are reserved
  if (!pointers_kept) quirks.emplace_back(kCpuQuirkFxsaveNoX87Pointers);
  if (reserved_kept) quirks.emplace_back(kCpuQuirkFxsaveSkipsReservedBytes);

  if (auto problem = store_probe(deja_probe_fnstenv, "FNSTENV "); !problem.empty()) return problem;
  uint32_t control = 0, env_fip = 0;
  std::memcpy(&control, image.data(), 4);
  std::memcpy(&env_fip, image.data() + 12, 4);
  // FOP and FCS, FDP, FDS: a processor writes FLD1's opcode 0x1e8 at bits 16-26 of the word at 16.
  const bool rest_zero = std::all_of(image.begin() + 16, image.begin() + 28, [](uint8_t b) { return b == 0; });
  if ((control >> 16) == 0 && rest_zero) quirks.emplace_back(kCpuQuirkX87EnvironmentZeroExtended);
  detail = fmt::format("IRET {} a code descriptor's accessed bit; FXSAVE {} FOP/FIP (FOP {:#x}, FIP {:#x}) and {} "
                       "the reserved bytes of the register slots; FNSTENV writes FCW as {:#010x} and FIP as {:#x}{}",
                       accessed_set ? "sets" : "leaves clear", pointers_kept ? "stores" : "does not store", fop, fip,
                       reserved_kept ? "leaves" : "writes", control, env_fip,
                       quirks.empty() ? ", as the SDM says" : " (QEMU's TCG does): traces name the quirks");
  return {};
}

std::string check_interrupt_window(Backend& cpu, std::string& detail) {
  uint64_t entry = kCode + offset_of(deja_probe_window);
  CpuState s = long_mode(entry);
  s.rflags &= ~rflags::kIf;
  cpu.request_interrupt_window(true);
  SnippetRun run = run_snippet(cpu, s, /*stop_at_window=*/true);
  cpu.request_interrupt_window(false);
  if (!run.window_rip) {
    return run.problem.empty() ? "no interrupt-window exit came before the guest halted" : "the guest " + run.problem;
  }
  uint64_t opens = entry + kWindowShadow;
  if (*run.window_rip < opens) {
    // Harmless: KVM reports ready_for_interrupt_injection = 0 there, so deja injects nothing inside the shadow
    // and asks for the window again (seen now and then under QEMU's TCG, the nested harness).
    detail = fmt::format("exit {} instruction{} early, inside STI's shadow (deja does not inject there)",
                         opens - *run.window_rip, opens - *run.window_rip == 1 ? "" : "s");
    return {};
  }
  uint64_t late = *run.window_rip - opens;
  detail = late == 0 ? "exit right after STI's shadow" : fmt::format("exit {} instructions after STI's shadow", late);
  if (late <= kWindowLateMax) return {};
  return fmt::format("the interrupt-window exit came {} instructions after the window opened (at most {} tolerated)",
                     late, kWindowLateMax);
}

// Every feature probe of `model` on a fresh VM of that model (an emulation failure may leave a vCPU unusable), in the
// state an OS leaves for it; with XSAVE, also the guest's own XSETBV and CPUID's run-time bits under XCR0 = x87 alone
// and every component.
std::string check_model(const UsabilityProbeHost& host, const CpuModel& model) {
  auto vm = make_probe_vm(host, model);
  if (!vm) return vm.error().message;
  const CpuState entry = os_state(model, kCode);
  for (const FeatureProbe& p : kFeatureProbes) {
    if (!model.has(feature(p.feature))) continue;
    std::string problem = answer_problem(*vm->cpu, p.snippet, p.expected, p.wrong_answer_hint, entry);
    if (!problem.empty()) return std::string(p.feature) + " " + problem;
  }
  if (entry.xcr0 > 1) {
    CpuState x87_only = entry;
    x87_only.xcr0 = xcr0::kX87;
    if (std::string problem = answer_problem(*vm->cpu, deja_probe_xsetbv, 0x40000000, "", x87_only); !problem.empty()) {
      return "XSETBV in the guest: the AVX state it enabled was lost at the next exit to KVM (the sum " + problem +
             "): KVM never saw the XSETBV (QEMU 7.2's TCG does not intercept it for a nested guest)";
    }
    for (const CpuState& s : {x87_only, entry}) {
      std::string problem = check_cpuid(*vm->cpu, model, kXsaveLeaves, s);
      if (!problem.empty()) return "CPUID " + problem;
    }
  }
  return {};
}

}  // namespace

bool KvmUsability::usable() const {
  return !checks.empty() && std::all_of(checks.begin(), checks.end(), [](const HostCheck& c) { return c.passed; });
}

std::string KvmUsability::failures() const { return failed_checks(checks); }

std::string KvmUsability::summary() const {
  std::string out;
  int shown = 0, more = 0;
  for (const auto& c : checks) {
    if (c.passed || c.skipped) continue;
    if (shown++ < 2) {
      out += (out.empty() ? "" : "; ") + c.detail;
    } else {
      ++more;
    }
  }
  if (more > 0) out += fmt::format("; and {} more check{} failed (`deja selftest` lists them)", more, more > 1 ? "s" : "");
  return out;
}

const CpuModel* KvmUsability::default_model() const { return models.empty() ? nullptr : models.front(); }

Result<> KvmUsability::supports(const CpuModel& model) const {
  if (!usable()) return fail(ErrorKind::kUnsupported, "KVM on this host cannot run deja's guests: {}", summary());
  if (std::find(models.begin(), models.end(), &model) != models.end()) return {};
  for (const auto& problem : model_problems) {
    if (problem.starts_with(std::string(model.name()) + ":")) {
      return fail(ErrorKind::kUnsupported, "this host's KVM cannot run CPU model {}", problem);
    }
  }
  return fail(ErrorKind::kUnsupported, "this host's KVM cannot run CPU model {}", model.name());
}

bool host_kvm_is_pvm() {
  struct stat st {};
  return ::stat("/sys/module/kvm_pvm", &st) == 0;
}

KvmUsability check_kvm_usability_with(const UsabilityProbeHost& host) {
  KvmUsability result;
  Checks checks{result};
  uint64_t start = now_ns();
  const CpuModel& baseline = CpuModel::x86_64_v1();

  auto vm = make_probe_vm(host, baseline);
  if (!vm) {
    checks.add(kOpens, vm.error().message, "");
    result.elapsed_ns = now_ns() - start;
    return result;
  }
  checks.add(kOpens, "", fmt::format("created a VM with CPU model {}", baseline.name()));
  Backend& cpu = *vm->cpu;

  std::string speed;
  std::string slow = check_native_speed(cpu, host.max_ns_per_iteration, speed);
  checks.add(kNativeSpeed, slow, speed);
  std::string sse = answer_problem(cpu, deja_probe_sse, 0x40000000);
  if (sse.empty()) sse = answer_problem(cpu, deja_probe_sse2, 0x2468acf02468acf0);
  checks.add(kSse, sse.empty() ? "" : "SSE " + sse, "ADDSS and PADDQ give the right results");

  for (const CpuModel* model : CpuModel::all()) {
    std::string problem = check_model(host, *model);
    if (problem.empty()) {
      result.models.push_back(model);
    } else {
      result.model_problems.push_back(std::string(model->name()) + ": " + problem);
    }
  }
  std::string runnable;
  for (const CpuModel* m : result.models) runnable += (runnable.empty() ? "" : ", ") + std::string(m->name());
  std::string not_runnable;
  for (const auto& p : result.model_problems) not_runnable += "; " + p;
  checks.add(kFeatures,
             result.models.empty() ? "no CPU model runs here: " + not_runnable.substr(2) : std::string(),
             "models " + runnable + not_runnable);

  checks.add(kCpuid, check_cpuid(cpu, baseline, kBaselineLeaves, long_mode(kCode)),
             fmt::format("leaves 0, 1, 7, 0x80000000-1 match {}", baseline.name()));
  checks.add(kSingleStep, check_single_step(cpu), "a debug exit after each instruction, at CPL0 and CPL3");
  std::string window;
  std::string late = check_interrupt_window(cpu, window);
  checks.add(kWindow, late, window);
  checks.add(kStateLoads, check_state_loads(cpu, host), "long mode and 32-bit paging read back as set");
  std::string quirks;
  std::string quirk_problem = check_quirks(cpu, *vm->memory, result.cpu_quirks, quirks);
  checks.add(kQuirks, quirk_problem, quirks);
  result.elapsed_ns = now_ns() - start;
  return result;
}

const KvmUsability& kvm_usability() {
  static const KvmUsability result = check_kvm_usability_with(
      UsabilityProbeHost{.make_vcpu = [](GuestMemory& memory, const CpuModel& model) {
        return make_kvm_backend(memory, model);
      }});
  return result;
}

}  // namespace deja
