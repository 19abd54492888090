// interp_fastdiff: the fast path (threaded or JIT) against the reference executor, in lockstep, compared at every block boundary.
//
// Both run the same program from the same state: random instruction sequences (the interp_diff
// generator), random code bytes (the interp_fuzz recipe) and the project's guest images. The fast
// side stops after every block it runs (InterpBackend::set_block_stepping); the reference is then run
// to the same step count with the instruction budget, and the complete CPU state, the counts (steps,
// instructions, branches) and, every few boundaries and at the end, the pages either side wrote must
// be identical. Exits (port I/O, MMIO, RDTSC, MSRs, HLT) must happen at the same step with the same
// fields and are answered identically. A second pass runs each program with chaining (no stepping) and
// compares at every exit and at the end.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <optional>
#include <random>
#include <string>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "tests/interp/diff/avx_generator.h"
#include "tests/interp/diff/generator.h"
#include "tests/interp/diff/machine.h"
#include "core/cpu_model.h"
#include "boot/loader.h"

namespace deja::difftest {
namespace {

struct Side {
  GuestMemory* memory;
  InterpBackend* cpu;
};

// Deterministic answers to exits, shared by both sides (the same answer goes to both).
struct Answerer {
  uint64_t tsc = 0;
  uint64_t input = 0x1234;
  bool divisor_latch = false;
  std::string serial;
  std::optional<int> exit_code;
  void answer(VcpuExit& e) {
    input = input * 6364136223846793005ull + 1442695040888963407ull;
    switch (e.kind) {
      case ExitKind::kIoIn: e.value = e.port == 0x3fd ? 0x60 : (input >> 32) & ((1ull << (8 * e.size)) - 1); break;
      case ExitKind::kIoOut:
        if (e.port == 0x3fb) divisor_latch = e.value & 0x80;
        if (e.port == 0x3f8 && !divisor_latch) serial += char(e.value);
        if (e.port == 0xf4) exit_code = int(e.value);
        break;
      case ExitKind::kRdtsc: e.value = tsc += 1000; break;
      case ExitKind::kRdrand: e.value = input; e.ok = true; break;
      case ExitKind::kMsrRead: e.fault = (input >> 7) & 1; e.value = input; break;
      case ExitKind::kMsrWrite: e.fault = (input >> 7) & 1; break;
      case ExitKind::kMmioRead: e.value = input & ((e.size >= 8) ? ~0ull : ((1ull << (8 * e.size)) - 1)); break;
      default: break;
    }
  }
};

std::string describe_exit(const VcpuExit& e) {
  return fmt::format("{} port={:#x} size={} address={:#x} msr={:#x} value={:#x} rip={:#x} {}", exit_kind_name(e.kind), e.port,
                     e.size, e.address, e.msr, e.value, e.rip, e.detail.substr(0, 200));
}

bool same_exit(const VcpuExit& a, const VcpuExit& b) {
  return a.kind == b.kind && a.port == b.port && a.size == b.size && a.address == b.address && a.msr == b.msr &&
         a.value == b.value && a.rip == b.rip && a.is_rdtscp == b.is_rdtscp && a.is_rdseed == b.is_rdseed;
}

std::string state_diff(Side ref, Side fast) {
  CpuState a = *ref.cpu->get_state(), b = *fast.cpu->get_state();
  std::string out;
  if (ref.cpu->retired_steps() != fast.cpu->retired_steps() || ref.cpu->instruction_count() != fast.cpu->instruction_count() ||
      ref.cpu->step_count() != fast.cpu->step_count() || ref.cpu->branch_count() != fast.cpu->branch_count()) {
    out += fmt::format("  counts (steps/instructions/executed/branches): reference {}/{}/{}/{} fast {}/{}/{}/{}\n",
                       ref.cpu->retired_steps(), *ref.cpu->instruction_count(), *ref.cpu->step_count(),
                       *ref.cpu->branch_count(), fast.cpu->retired_steps(), *fast.cpu->instruction_count(),
                       *fast.cpu->step_count(), *fast.cpu->branch_count());
  }
  if (a == b) return out;
  static const char* names[16] = {"rax", "rcx", "rdx", "rbx", "rsp", "rbp", "rsi", "rdi",
                                  "r8",  "r9",  "r10", "r11", "r12", "r13", "r14", "r15"};
  for (int i = 0; i < 16; ++i)
    if (a.gpr[i] != b.gpr[i]) out += fmt::format("  {}: reference {:#x} fast {:#x}\n", names[i], a.gpr[i], b.gpr[i]);
  if (a.rip != b.rip) out += fmt::format("  rip: reference {:#x} fast {:#x}\n", a.rip, b.rip);
  if (a.rflags != b.rflags) out += fmt::format("  rflags: reference {:#x} fast {:#x}\n", a.rflags, b.rflags);
  if (a.fxsave != b.fxsave) out += "  fxsave (x87/SSE) differs\n";
  if (a.ymmh != b.ymmh) out += "  YMM upper halves differ\n";
  if (a.xcr0 != b.xcr0) out += fmt::format("  xcr0: reference {:#x} fast {:#x}\n", a.xcr0, b.xcr0);
  if (a.xinuse != b.xinuse) out += fmt::format("  xinuse: reference {:#x} fast {:#x}\n", a.xinuse, b.xinuse);
  if (a.cr2 != b.cr2) out += fmt::format("  cr2: reference {:#x} fast {:#x}\n", a.cr2, b.cr2);
  if (out.empty()) out = "  system state (segments, control registers, MSRs, shadow, halt) differs\n";
  return out;
}

// Compares every page either side wrote since the last call (and clears the dirty bits).
std::string memory_diff(Side ref, Side fast) {
  std::vector<uint64_t> pages = ref.memory->take_dirty_pages();
  std::vector<uint64_t> more = fast.memory->take_dirty_pages();
  pages.insert(pages.end(), more.begin(), more.end());
  std::sort(pages.begin(), pages.end());
  pages.erase(std::unique(pages.begin(), pages.end()), pages.end());
  for (uint64_t page : pages) {
    const uint8_t* a = ref.memory->host_base() + page * 4096;
    const uint8_t* b = fast.memory->host_base() + page * 4096;
    if (std::memcmp(a, b, 4096) != 0) {
      size_t i = 0;
      while (a[i] == b[i]) ++i;
      return fmt::format("  memory differs at guest-physical {:#x}: reference {:#04x} fast {:#04x}\n", page * 4096 + i, a[i],
                         b[i]);
    }
  }
  return "";
}

struct LockstepResult {
  std::string mismatch;  // empty: identical all the way
  uint64_t boundaries = 0;
  uint64_t exits = 0;
  bool ended = false;  // stopped by HLT with interrupts off, shutdown, or the guest's exit port
};

// Runs both to the end (a terminal exit or `max_steps`), comparing as described at the top.
// How the fast side is stopped: after every block, only at exits, or by small random instruction budgets
// (which cut blocks and REP strings anywhere, as timeslices and the debugger's step targets do).
enum class Pass { kStepping, kChained, kBudgets };
const char* pass_name(Pass p) { return p == Pass::kStepping ? "block stepping" : p == Pass::kChained ? "chained" : "random budgets"; }

LockstepResult lockstep(Side ref, Side fast, Answerer& answerer, uint64_t max_steps, Pass pass,
                        const std::function<bool(const VcpuExit&, const CpuState&)>& terminal, uint64_t seed = 0) {
  LockstepResult result;
  std::mt19937_64 budgets(seed);
  const bool stepping = pass == Pass::kStepping;
  fast.cpu->set_block_stepping(stepping);
  (void)ref.memory->take_dirty_pages();
  (void)fast.memory->take_dirty_pages();
  for (;;) {
    const uint64_t room = max_steps > fast.cpu->retired_steps() ? max_steps - fast.cpu->retired_steps() : 0;
    uint64_t budget = room == 0 ? 1 : room;
    if (pass == Pass::kBudgets) budget = std::min<uint64_t>(budget, 1 + budgets() % 40);
    fast.cpu->set_instruction_budget(budget);
    const uint64_t start = fast.cpu->retired_steps();
    VcpuExit* ef = *fast.cpu->run();
    const uint64_t target = fast.cpu->retired_steps();
    if (!stepping && ef->kind == ExitKind::kKicked && target != start + budget) {
      // Only the budget stops a run here, and it must stop it on its step, as the reference's run loop does.
      result.mismatch = fmt::format("a budget of {} steps stopped the fast path after {}\n", budget, target - start);
      return result;
    }
    VcpuExit* er = nullptr;
    if (ef->kind == ExitKind::kKicked) {
      ++result.boundaries;
      while (ref.cpu->retired_steps() < target) {
        ref.cpu->set_instruction_budget(target - ref.cpu->retired_steps());
        er = *ref.cpu->run();
        if (er->kind != ExitKind::kKicked) {
          result.mismatch = fmt::format("the reference stopped with {} at step {}, the fast path ran to step {} without it\n",
                                        describe_exit(*er), ref.cpu->retired_steps(), target);
          return result;
        }
      }
      if (ref.cpu->retired_steps() != target) {
        result.mismatch = fmt::format("the reference is at step {}, the fast path at {}\n", ref.cpu->retired_steps(), target);
        return result;
      }
      // Faults are steps the budget does not count (nothing retired): single-step the reference over
      // as many as the fast path took at the end of its block.
      while (*ref.cpu->step_count() < *fast.cpu->step_count()) {
        (void)ref.cpu->set_debug(DebugControl{.single_step = true});
        er = *ref.cpu->run();
        (void)ref.cpu->set_debug(DebugControl{});
        if (er->kind != ExitKind::kDebug || ref.cpu->retired_steps() != target) {
          result.mismatch = fmt::format("the fast path faulted at step {}; the reference, single-stepped there, stopped with "
                                        "{} at step {}\n", target, describe_exit(*er), ref.cpu->retired_steps());
          return result;
        }
      }
    } else {
      ++result.exits;
      ref.cpu->set_instruction_budget(target >= ref.cpu->retired_steps() ? target - ref.cpu->retired_steps() + 1 : 1);
      er = *ref.cpu->run();
      if (!same_exit(*ef, *er)) {
        result.mismatch = fmt::format("exits differ at step {}:\n  reference {}\n  fast      {}\n", target, describe_exit(*er),
                                      describe_exit(*ef));
        return result;
      }
    }
    ref.cpu->set_instruction_budget(0);
    std::string diff = state_diff(ref, fast);
    if (diff.empty() && (result.boundaries % 64 == 0 || ef->kind != ExitKind::kKicked)) diff = memory_diff(ref, fast);
    if (!diff.empty()) {
      result.mismatch = fmt::format("state differs at step {} after {} ({}):\n{}", target, exit_kind_name(ef->kind),
                                    pass_name(pass), diff);
      return result;
    }
    if (ef->kind == ExitKind::kKicked && fast.cpu->retired_steps() >= max_steps) return result;
    if (ef->kind != ExitKind::kKicked) {
      if (terminal(*ef, *fast.cpu->get_state())) {
        result.ended = true;
        return result;
      }
      answerer.answer(*ef);
      er->value = ef->value;
      er->ok = ef->ok;
      er->fault = ef->fault;
    }
  }
}

// ---- random programs ----------------------------------------------------------------------------

struct Pair {
  std::unique_ptr<GuestMachine> ref, fast;
  Pair(InterpMode mode, const CpuModel* model)
      : ref(GuestMachine::create(InterpMode::kReference, model)), fast(GuestMachine::create(mode, model)) {}
  Side ref_side() { return {&ref->memory(), &ref->cpu()}; }
  Side fast_side() { return {&fast->memory(), &fast->cpu()}; }
};

bool program_terminal(const VcpuExit& e, const CpuState&) {
  // Every HLT ends a random program (its tail, or an exception handler); so does anything unanswerable.
  return e.kind == ExitKind::kHlt || e.kind == ExitKind::kShutdown || e.kind == ExitKind::kFault;
}

// `avx`: the x86-64-v3 model, with VEX sequences (interp_diff --avx's generator) among the others.
int run_programs(InterpMode mode, uint64_t seed, int sequences, int fuzz_runs, int max_length, int show, int only, bool trace,
                 const std::vector<std::string>& classes, bool avx) {
  Generator generator(seed, false, false);
  generator.simd_classes = classes;
  generator.mix_original = true;
  AvxGenerator avx_generator(seed);
  const CpuModel* model = avx ? &CpuModel::x86_64_v3() : nullptr;
  std::mt19937_64 rng(seed ^ 0xfa57);
  int failures = 0;
  uint64_t boundaries = 0;
  auto pair = std::make_unique<Pair>(mode, model);
  for (int i = 0; i < sequences + fuzz_runs; ++i) {
    const bool fuzz = i >= sequences;
    if (!pair->ref || !pair->fast || i % 64 == 0) pair = std::make_unique<Pair>(mode, model);
    std::vector<uint8_t> code;
    std::vector<std::string> listing;
    if (!fuzz) {
      // Several sequences back to back (more blocks, branches between them), each possibly in a loop.
      const int parts = 1 + int(rng() % 3);
      for (int p = 0; p < parts; ++p) {
        const int length = 1 + int(rng() % max_length);
        Sequence seq = avx && rng() % 3 != 0
                           ? avx_generator.sequence(length, avx_classes()[rng() % avx_classes().size()])
                           : generator.sequence(length);
        code.insert(code.end(), seq.code.begin(), seq.code.end());
        listing.insert(listing.end(), seq.listing.begin(), seq.listing.end());
      }
    } else {
      code.resize(16 + rng() % 64);
      for (auto& byte : code) {
        static constexpr uint8_t kInteresting[] = {0x0f, 0x66, 0xf2, 0xf3, 0x48, 0x4c, 0x41, 0xf0, 0x2e, 0x64, 0xc4, 0xc5, 0xe8, 0xeb, 0x75};
        byte = rng() % 3 == 0 ? kInteresting[rng() % std::size(kInteresting)] : uint8_t(rng());
      }
    }
    for (uint8_t b : guest_tail()) code.push_back(b);
    RegisterFile regs = avx ? avx_generator.registers() : generator.registers();
    if (fuzz && rng() % 2) regs.gpr[4] = kInitialRsp;
    const std::vector<uint8_t> data = generator.data();
    if (only >= 0 && i != only) continue;  // (generated all the same: the programs after it stay the same)
    if (only >= 0 && trace) {
      // The fast side's first blocks, then the reference's path, one instruction a line (RIP, the bytes there,
      // some registers).
      auto m = GuestMachine::create(InterpMode::kReference, model);
      if (!m->prepare(code, regs, data)) return 2;
      auto f = GuestMachine::create(mode, model);
      if (!f->prepare(code, regs, data)) return 2;
      f->cpu().set_block_stepping(true);
      for (int k = 0; k < 40; ++k) {
        f->cpu().set_instruction_budget(0);
        VcpuExit* e = *f->cpu().run();
        CpuState st = *f->cpu().get_state();
        std::printf("fast: %s steps=%llu rip=%#llx rax=%llx rcx=%llx rdx=%llx rsp=%llx fl=%llx\n",
                    std::string(exit_kind_name(e->kind)).c_str(), (unsigned long long)f->cpu().retired_steps(),
                    (unsigned long long)st.rip, (unsigned long long)st.gpr[0], (unsigned long long)st.gpr[1],
                    (unsigned long long)st.gpr[2], (unsigned long long)st.gpr[4], (unsigned long long)st.rflags);
        if (e->kind != ExitKind::kKicked) break;
      }
      for (int k = 0; k < 200; ++k) {
        CpuState st = *m->cpu().get_state();
        uint8_t bytes[8] = {};
        (void)m->memory().read(Gpa{st.rip}, std::span<uint8_t>(bytes, 8));
        std::printf("%3d rip=%#llx  %02x %02x %02x %02x %02x %02x %02x %02x rax=%llx rcx=%llx rdx=%llx rsp=%llx fl=%llx\n", k,
                    (unsigned long long)st.rip, bytes[0], bytes[1], bytes[2], bytes[3], bytes[4], bytes[5], bytes[6],
                    bytes[7], (unsigned long long)st.gpr[0], (unsigned long long)st.gpr[1], (unsigned long long)st.gpr[2],
                    (unsigned long long)st.gpr[4], (unsigned long long)st.rflags);
        m->cpu().set_instruction_budget(1);
        VcpuExit* e = *m->cpu().run();
        if (e->kind != ExitKind::kKicked) {
          std::printf("exit %s\n", describe_exit(*e).c_str());
          if (program_terminal(*e, st)) break;
        }
      }
    }
    if (!pair->ref->prepare(code, regs, data) || !pair->fast->prepare(code, regs, data)) {
      std::fprintf(stderr, "interp_fastdiff: cannot load program %d\n", i);
      return 2;
    }
    // Every pass on the same program.
    for (Pass pass : {Pass::kStepping, Pass::kChained, Pass::kBudgets}) {
      if (pass != Pass::kStepping && (!pair->ref->prepare(code, regs, data) || !pair->fast->prepare(code, regs, data)))
        return 2;
      Answerer answerer;
      LockstepResult r =
          lockstep(pair->ref_side(), pair->fast_side(), answerer, 20000, pass, program_terminal, seed + uint64_t(i));
      boundaries += r.boundaries;
      if (r.mismatch.empty()) continue;
      ++failures;
      if (failures <= show) {
        std::printf("MISMATCH in %s %d (%s):\n%s", fuzz ? "random code" : "sequence", i, pass_name(pass),
                    r.mismatch.c_str());
        if (!fuzz)
          for (const auto& line : listing) std::printf("    %s\n", line.c_str());
        std::printf("  code:");
        for (uint8_t b : code) std::printf(" %02x", b);
        std::printf("\n");
      }
      pair.reset(new Pair(mode, model));  // the machines may be in any state now
      break;
    }
  }
  std::printf("interp_fastdiff: %d sequences and %d random-code runs, %llu block boundaries compared, %d mismatches\n",
              sequences, fuzz_runs, static_cast<unsigned long long>(boundaries), failures);
  return failures;
}

// ---- guest images -------------------------------------------------------------------------------

int run_guest(InterpMode mode, const std::string& path, const std::string& cmdline, uint64_t max_steps, Pass pass) {
  auto ref_memory = GuestMemory::create(256 << 20);
  auto fast_memory = GuestMemory::create(256 << 20);
  if (!ref_memory || !fast_memory) return 2;
  auto ref_image = load_guest_image(*ref_memory, path, LoadOptions{cmdline, {}});
  auto fast_image = load_guest_image(*fast_memory, path, LoadOptions{cmdline, {}});
  if (!ref_image || !fast_image) {
    std::fprintf(stderr, "interp_fastdiff: cannot load %s\n", path.c_str());
    return 2;
  }
  InterpBackend ref(*ref_memory, CpuModel::deja_v1()), fast(*fast_memory, CpuModel::deja_v1());
  ref.set_mode(InterpMode::kReference);
  fast.set_mode(mode);
  (void)ref.set_state(ref_image->initial_state);
  (void)fast.set_state(fast_image->initial_state);
  Answerer answerer;
  auto terminal = [&](const VcpuExit& e, const CpuState& s) {
    // No interrupt source here: a HLT ends the guest as surely as its exit port does.
    (void)s;
    if (e.kind == ExitKind::kShutdown || e.kind == ExitKind::kFault || e.kind == ExitKind::kHlt) return true;
    return e.kind == ExitKind::kIoOut && e.port == 0xf4;
  };
  const auto start = std::chrono::steady_clock::now();
  LockstepResult r = lockstep({&*ref_memory, &ref}, {&*fast_memory, &fast}, answerer, max_steps, pass, terminal, 7);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("interp_fastdiff: %s (%s): %llu stops compared, %llu exits, %llu instructions, %.1f s%s\n", path.c_str(),
              pass_name(pass),
              static_cast<unsigned long long>(r.boundaries), static_cast<unsigned long long>(r.exits),
              static_cast<unsigned long long>(*fast.instruction_count()), seconds,
              r.ended ? "" : " (stopped at the step limit)");
  if (!r.mismatch.empty()) {
    std::printf("MISMATCH in %s:\n%s", path.c_str(), r.mismatch.c_str());
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace deja::difftest

int main(int argc, char** argv) {
  using namespace deja::difftest;
  CLI::App app{"interp_fastdiff: deja's fast interpreter path against its reference executor, block by block"};
  uint64_t seed = std::random_device{}();
  int sequences = 2000, fuzz_runs = 2000, max_length = 12, show = 5, only = -1;
  bool trace = false, avx = false;
  std::string mode_name = "jit";
  std::vector<std::string> guests;
  std::string cmdline;
  uint64_t max_steps = 50'000'000;
  app.add_option("--seed", seed, "random seed (printed at start, to reproduce a run)");
  app.add_option("--sequences", sequences, "random instruction sequences");
  app.add_option("--fuzz", fuzz_runs, "random-code runs");
  app.add_option("--length", max_length, "maximum instructions per generated sequence part")->check(CLI::Range(1, 200));
  app.add_option("--show", show, "mismatches printed in full");
  app.add_option("--only", only, "run program N alone (on fresh machines), to reproduce a mismatch");
  app.add_flag("--trace", trace, "with --only: print where the fast side's blocks end and the reference's first 200 steps");
  app.add_option("--mode", mode_name, "the fast mode to check: threaded or jit");
  app.add_option("--guest", guests, "guest images (Multiboot ELF) to run in lockstep too");
  app.add_option("--cmdline", cmdline, "command line for the guest images");
  app.add_option("--max-steps", max_steps, "step limit per guest");
  std::vector<std::string> classes = {"simd"};
  app.add_option("--classes", classes,
                 "SIMD instruction classes (interp_diff's) to mix into half of the sequences' instructions; none: "
                 "the original mix only")
      ->delimiter(',');
  app.add_flag("--avx", avx, "the x86-64-v3 model, with VEX sequences (and VEX prefixes in the random code)");
  CLI11_PARSE(app, argc, argv);
  if (classes.size() == 1 && classes[0] == "simd") classes = Generator::simd_class_names();
  if (classes.size() == 1 && classes[0] == "none") classes.clear();
  auto mode = deja::parse_interp_mode(mode_name);
  if (!mode || *mode == deja::InterpMode::kReference) {
    std::fprintf(stderr, "interp_fastdiff: --mode must be threaded or jit\n");
    return 2;
  }
  std::printf("interp_fastdiff: mode %s, seed %llu (reproduce with --seed %llu)\n", mode_name.c_str(),
              static_cast<unsigned long long>(seed), static_cast<unsigned long long>(seed));
  int failures = run_programs(*mode, seed, sequences, fuzz_runs, max_length, show, only, trace, classes, avx);
  for (const std::string& guest : guests) {
    failures += run_guest(*mode, guest, cmdline, max_steps, Pass::kStepping);
    failures += run_guest(*mode, guest, cmdline, max_steps / 10, Pass::kBudgets);
  }
  return failures == 0 ? 0 : 1;
}
