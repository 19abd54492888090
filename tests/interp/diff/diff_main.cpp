// interp_diff: runs random instruction sequences on the host CPU and under InterpBackend and reports every difference.
#include <cpuid.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <random>
#include <string>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "tests/interp/diff/avx_generator.h"
#include "tests/interp/diff/generator.h"
#include "tests/interp/diff/machine.h"
#include "tests/interp/diff/xsave_generator.h"
#include "core/cpu_model.h"

namespace deja::difftest {
namespace {

constexpr uint64_t kComparedFlagsBase = 0x400;  // DF; the arithmetic flags are added per sequence
constexpr uint64_t kArith = 0x8d5;

const char* kGprNames[16] = {"rax", "rcx", "rdx", "rbx", "rsp", "rbp", "rsi", "rdi",
                             "r8",  "r9",  "r10", "r11", "r12", "r13", "r14", "r15"};

bool host_has_lzcnt() {
  unsigned eax, ebx, ecx, edx;
  return __get_cpuid(0x80000001, &eax, &ebx, &ecx, &edx) && (ecx & (1u << 5));
}
bool host_has_avx2() {
  unsigned eax, ebx, ecx, edx;
  return __get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) && (ebx & (1u << 5)) && (ebx & (1u << 8)) &&
         __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & (1u << 12)) && (ecx & (1u << 29));
}
bool host_is_intel() {
  unsigned eax, ebx, ecx, edx;
  return __get_cpuid(0, &eax, &ebx, &ecx, &edx) && ebx == 0x756e6547 && edx == 0x49656e69 && ecx == 0x6c65746e;
}
bool host_has_movbe() {
  unsigned eax, ebx, ecx, edx;
  return __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & (1u << 22));
}
bool host_has_bmi1() {
  unsigned eax, ebx, ecx, edx;
  return __get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) && (ebx & (1u << 3));
}

// Which x87 last-instruction pointers this host stores after an x87 instruction without an exception. Intel
// processors store FOP only for an unmasked exception (outside "FOP code compatibility mode"), and those with
// CPUID.(EAX=07H,ECX=0):EBX[6] (FDP_EXCPTN_ONLY) FDP likewise; AMD's, as deja's models, store both. A host's zero
// there says nothing about the interpreter.
struct HostX87Pointers {
  bool fop = true, fdp = true;
};
HostX87Pointers host_x87_pointers() {
  static const HostX87Pointers stored = [] {
    alignas(16) std::array<uint8_t, 28> env{};
    static const double one = 1.0;
    asm volatile("fninit\n fldl %1\n fnstenv %0\n fninit" : "=m"(env) : "m"(one));
    uint32_t op_word, fdp;
    std::memcpy(&op_word, &env[16], 4);
    std::memcpy(&fdp, &env[20], 4);
    return HostX87Pointers{.fop = (op_word >> 16 & 0x7ff) != 0, .fdp = fdp != 0};
  }();
  return stored;
}

// Lists what differs between the host's and the interpreter's final state ("" when nothing does).
std::string compare(const Outcome& host, const Outcome& guest, const Sequence& seq) {
  const uint64_t undefined_flags = seq.undefined_flags;
  std::string diff;
  if (host.ending != guest.ending) {
    return fmt::format("  ending: host {} (signal {}), interp {} (vector/exit {})\n", ending_name(host.ending), host.detail,
                       ending_name(guest.ending), guest.detail);
  }
  if (host.ending != Ending::kCompleted) return "";  // the same exception class: state at a fault is not compared
  for (int i = 0; i < 16; ++i) {
    if (host.regs.gpr[i] != guest.regs.gpr[i])
      diff += fmt::format("  {}: host {:#018x} interp {:#018x}\n", kGprNames[i], host.regs.gpr[i], guest.regs.gpr[i]);
  }
  const uint64_t flags_mask = kComparedFlagsBase | (kArith & ~undefined_flags);
  if ((host.regs.rflags & flags_mask) != (guest.regs.rflags & flags_mask))
    diff += fmt::format("  rflags (compared {:#x}): host {:#x} interp {:#x}\n", flags_mask, host.regs.rflags & flags_mask,
                        guest.regs.rflags & flags_mask);
  if (host.regs.mxcsr != guest.regs.mxcsr)
    diff += fmt::format("  mxcsr: host {:#x} interp {:#x}\n", host.regs.mxcsr, guest.regs.mxcsr);
  for (int i = 0; i < 16; ++i) {
    if (host.regs.xmm[i] != guest.regs.xmm[i])
      diff += fmt::format("  xmm{}: host {:016x}:{:016x} interp {:016x}:{:016x}\n", i, host.regs.xmm[i][1],
                          host.regs.xmm[i][0], guest.regs.xmm[i][1], guest.regs.xmm[i][0]);
    if (host.regs.ymm && host.regs.ymmh[i] != guest.regs.ymmh[i])
      diff += fmt::format("  ymm{} bits 255:128: host {:016x}:{:016x} interp {:016x}:{:016x}\n", i, host.regs.ymmh[i][1],
                          host.regs.ymmh[i][0], guest.regs.ymmh[i][1], guest.regs.ymmh[i][0]);
  }
  // x87: control and status words, the abridged tags, the registers (10 bytes of each 16-byte slot), and the
  // instruction and data pointers once an instruction of the sequence has set them.
  auto word = [](const std::array<uint8_t, 512>& fx, size_t at) { return unsigned(fx[at] | (fx[at + 1] << 8)); };
  if (word(host.regs.fx, 0) != word(guest.regs.fx, 0))
    diff += fmt::format("  fcw: host {:#06x} interp {:#06x}\n", word(host.regs.fx, 0), word(guest.regs.fx, 0));
  const unsigned status_mask = 0xffffu & ~unsigned(seq.x87_undefined_status);
  if ((word(host.regs.fx, 2) & status_mask) != (word(guest.regs.fx, 2) & status_mask))
    diff += fmt::format("  fsw (compared {:#06x}): host {:#06x} interp {:#06x}\n", status_mask, word(host.regs.fx, 2),
                        word(guest.regs.fx, 2));
  if (host.regs.fx[4] != guest.regs.fx[4])
    diff += fmt::format("  ftw: host {:#04x} interp {:#04x}\n", host.regs.fx[4], guest.regs.fx[4]);
  for (int i = 0; i < 8; ++i) {
    const uint8_t* h = &host.regs.fx[32 + 16 * i];
    const uint8_t* g = &guest.regs.fx[32 + 16 * i];
    if (std::memcmp(h, g, 10) != 0) {
      uint64_t hs, gs;
      std::memcpy(&hs, h, 8);
      std::memcpy(&gs, g, 8);
      diff += fmt::format("  st{}: host {:04x}:{:016x} interp {:04x}:{:016x}\n", i, unsigned(h[8] | (h[9] << 8)), hs,
                          unsigned(g[8] | (g[9] << 8)), gs);
    }
  }

  auto env32 = [](const std::array<uint8_t, 28>& env, size_t at) {
    uint32_t v;
    std::memcpy(&v, &env[at], 4);
    return v;
  };  // After a stack fault (SF is sticky) AMD may leave FIP/FOP/FDP where they were; Intel points them at the
  // faulting instruction, as interp does. And on AMD hosts (X86_BUG_FXSAVE_LEAK) Linux resets them whenever it
  // restores the FPU of the child, so a FIP of zero (never a code address here) means they were lost.
  const bool pointers = !(word(host.regs.fx, 2) & 0x40) && env32(host.regs.env, 12) != 0;
  if (pointers && seq.x87_ip_defined && env32(host.regs.env, 12) != env32(guest.regs.env, 12))
    diff += fmt::format("  fip: host {:#x} interp {:#x}\n", env32(host.regs.env, 12), env32(guest.regs.env, 12));
  const HostX87Pointers stored = host_x87_pointers();
  if (pointers && seq.x87_ip_defined && stored.fop &&
      (env32(host.regs.env, 16) >> 16 & 0x7ff) != (env32(guest.regs.env, 16) >> 16 & 0x7ff))
    diff += fmt::format("  fop: host {:#x} interp {:#x}\n", env32(host.regs.env, 16) >> 16 & 0x7ff,
                        env32(guest.regs.env, 16) >> 16 & 0x7ff);
  if (pointers && seq.x87_dp_defined && stored.fdp && env32(host.regs.env, 20) != env32(guest.regs.env, 20))
    diff += fmt::format("  fdp: host {:#x} interp {:#x}\n", env32(host.regs.env, 20), env32(guest.regs.env, 20));
  for (size_t i = 0; i < host.data.size() && i < guest.data.size(); i += 8) {
    uint64_t h, g;
    std::memcpy(&h, &host.data[i], 8);
    std::memcpy(&g, &guest.data[i], 8);
    if (h != g) diff += fmt::format("  data[{:#x}]: host {:#018x} interp {:#018x}\n", kDataAddr + i, h, g);
  }
  return diff;
}

std::string describe_start(const RegisterFile& r) {
  std::string out = "  start:";
  for (int i = 0; i < 16; ++i) out += fmt::format(" {}={:#x}", kGprNames[i], r.gpr[i]);
  out += fmt::format(" rflags={:#x} mxcsr={:#x}\n", r.rflags, r.mxcsr);
  for (int i = 0; i < 16; ++i) {
    if (r.ymm) out += fmt::format("  ymm{}={:016x}:{:016x}:", i, r.ymmh[i][1], r.ymmh[i][0]);
    else out += fmt::format("  xmm{}=", i);
    out += fmt::format("{:016x}:{:016x}", r.xmm[i][1], r.xmm[i][0]);
  }
  out += fmt::format("\n  fcw={:#06x} fsw={:#06x} ftw={:#04x}", unsigned(r.fx[0] | (r.fx[1] << 8)),
                     unsigned(r.fx[2] | (r.fx[3] << 8)), r.fx[4]);
  for (int i = 0; i < 8; ++i) {
    uint64_t sig;
    std::memcpy(&sig, &r.fx[32 + 16 * i], 8);
    out += fmt::format(" st{}={:04x}:{:016x}", i, unsigned(r.fx[40 + 16 * i] | (r.fx[41 + 16 * i] << 8)), sig);
  }
  return out + "\n";
}

}  // namespace
}  // namespace deja::difftest

int main(int argc, char** argv) {
  using namespace deja::difftest;
  CLI::App app{"interp_diff: random non-privileged instruction sequences, host CPU vs deja's interpreter"};
  uint64_t seed = std::random_device{}();
  int count = 3000;
  int max_length = 12;
  int show = 10;
  app.add_option("--seed", seed, "random seed (printed at start, to reproduce a run)");
  app.add_option("--count", count, "number of sequences")->check(CLI::PositiveNumber);
  app.add_option("--length", max_length, "maximum instructions per sequence; a third of the sequences have one")
      ->check(CLI::Range(1, 200));
  app.add_option("--show", show, "failures printed in full");
  bool avoid_xadd_same_register = false;
  bool avoid_unmasked_underflow = false;
  app.add_flag("--avoid-unmasked-underflow", avoid_unmasked_underflow,
               "known approximation: with MXCSR.UM clear, an exact tiny SSE result raises #XM on hardware, not in "
               "interp");
  app.add_flag("--avoid-xadd-same-register", avoid_xadd_same_register,
               "known interp defect: XADD r, r with one register writes the old value instead of the sum");
  std::string cpu;
  app.add_option("--cpu", cpu, "CPU model of the interpreter (default: the richest it implements)");
  std::vector<std::string> classes;
  app.add_option("--classes", classes,
                 "draw instructions from these SIMD classes only (mmx, mmx-sse, sse3, ssse3, sse4.1, sse4.2, "
                 "x86-64-v2; simd = all of them) instead of the original mix; with --avx, these VEX classes (avx-int, "
                 "avx-fp, fma, f16c, bmi1, bmi2, gather; default all), --count sequences of each in turn")
      ->delimiter(',');
  bool mix = false;
  app.add_flag("--mix", mix, "with --classes: half of the instructions from the original mix");
  bool avx = false;
  app.add_flag("--avx", avx, "VEX instructions (AVX, AVX2, FMA, F16C, BMI1/2, gathers) on the x86-64-v3 model");
  bool xsave = false;
  app.add_flag("--xsave", xsave,
               "XINUSE on the x86-64-v3 model: XRSTOR to a known XINUSE, random events that put state in and out of "
               "use, XGETBV(1), XSAVE or XSAVEOPT (the host must be Intel's: deja tracks XINUSE as Intel's do)");
  CLI11_PARSE(app, argc, argv);
  const deja::CpuModel* model = (avx || xsave) ? &deja::CpuModel::x86_64_v3() : nullptr;
  if (!cpu.empty() && !(model = deja::CpuModel::find(cpu))) {
    std::fprintf(stderr, "interp_diff: no CPU model '%s' (one of %s)\n", cpu.c_str(), deja::CpuModel::names().c_str());
    return 2;
  }
  if (classes.size() == 1 && classes[0] == "simd") classes = Generator::simd_class_names();
  if (avx && classes.empty())
    for (std::string_view c : avx_classes()) classes.emplace_back(c);
  for (const auto& c : classes) {
    const auto& known = Generator::simd_class_names();
    const bool found = avx ? std::find(avx_classes().begin(), avx_classes().end(), c) != avx_classes().end()
                           : std::find(known.begin(), known.end(), c) != known.end();
    if (!found) {
      std::fprintf(stderr, "interp_diff: no instruction class '%s'\n", c.c_str());
      return 2;
    }
  }
  if (xsave && !host_is_intel()) {
    std::printf("interp_diff: this host is not Intel's: deja's XINUSE follows Intel's processors\n");
    return 0;
  }
  if ((avx || xsave) && !host_has_avx2()) {
    std::printf("interp_diff: this host has no AVX2: nothing to compare the VEX instructions with\n");
    return 0;
  }
  const int total = avx ? count * int(classes.size()) : count;

  std::printf("interp_diff: seed %llu, %d sequences (reproduce with --seed %llu --count %d --length %d)\n",
              static_cast<unsigned long long>(seed), count, static_cast<unsigned long long>(seed), count, max_length);
  auto machine = GuestMachine::create(std::nullopt, model);
  if (!machine) {
    std::fprintf(stderr, "interp_diff: cannot build the guest machine\n");
    return 2;
  }
  const deja::CpuModel& used = machine->model();
  std::printf("interp_diff: CPU model %s\n", std::string(used.name()).c_str());
  Generator generator(seed, host_has_bmi1() && (used.cpuid(7, 0).ebx & (1u << 3)),
                      host_has_lzcnt() && (used.cpuid(0x80000001, 0).ecx & (1u << 5)));
  generator.avoid_xadd_same_register = avoid_xadd_same_register;
  generator.movbe = host_has_movbe() && (used.cpuid(1, 0).ecx & (1u << 22));
  generator.avoid_unmasked_underflow = avoid_unmasked_underflow;
  generator.simd_classes = avx ? std::vector<std::string>{} : classes;
  generator.mix_original = mix;
  XsaveGenerator xsave_generator(seed);
  AvxGenerator avx_generator(seed);
  avx_generator.legacy().avoid_xadd_same_register = avoid_xadd_same_register;
  avx_generator.legacy().movbe = generator.movbe;
  avx_generator.legacy().avoid_unmasked_underflow = avoid_unmasked_underflow;
  std::mt19937_64 lengths(seed ^ 0x5eed);
  const auto start = std::chrono::steady_clock::now();
  int failures = 0, faults_agreed = 0, instructions = 0, unimplemented_runs = 0, host_preempted = 0;
  std::map<std::string, int> class_counts;
  std::map<std::string, int> failing_single;  // single-instruction failures by disassembly (exact attribution)
  for (int i = 0; i < total; ++i) {
    const int length = (i % 3 == 0) ? 1 : 1 + static_cast<int>(lengths() % max_length);
    const Sequence seq = xsave ? xsave_generator.sequence(length - 1)
                         : avx ? avx_generator.sequence(length, classes[size_t(i) % classes.size()])
                               : generator.sequence(length);
    const RegisterFile regs = xsave ? xsave_generator.registers() : avx ? avx_generator.registers() : generator.registers();
    const std::vector<uint8_t> data = xsave ? xsave_generator.data() : avx ? avx_generator.data() : generator.data();
    std::vector<uint8_t> host_code = seq.code, guest_code = seq.code;
    for (uint8_t byte : host_tail()) host_code.push_back(byte);
    for (uint8_t byte : guest_tail()) guest_code.push_back(byte);
    const Outcome host = run_native(host_code, regs, data);
    const auto unimplemented_before = machine->cpu().unimplemented_counts();
    const Outcome guest = machine->run(guest_code, regs, data, 10000);
    // A #UD the interpreter itself reports as "not implemented" is a known gap, listed at the end, not a mismatch.
    if (guest.ending == Ending::kInvalidOpcode && host.ending != Ending::kInvalidOpcode &&
        machine->cpu().unimplemented_counts() != unimplemented_before) {
      ++unimplemented_runs;
      continue;
    }
    instructions += static_cast<int>(seq.listing.size());
    for (const auto& c : seq.classes) ++class_counts[c];
    if (host.ending == guest.ending && host.ending != Ending::kCompleted) ++faults_agreed;
    std::string diff = compare(host, guest, seq);
    // XINUSE is per-thread state that the host's kernel saves with XSAVES and restores: a context switch inside
    // the sequence can leave SSE in use (XSAVES reports it while MXCSR is not 1F80H) where the sequence put it in
    // its initial configuration. The host runs such a sequence again: if one of three runs agrees, it was that.
    for (int again = 0; xsave && !diff.empty() && again < 3; ++again) {
      if (compare(run_native(host_code, regs, data), guest, seq).empty()) {
        diff.clear();
        ++host_preempted;
      }
    }
    if (diff.empty()) continue;
    ++failures;
    if (seq.listing.size() == 1) ++failing_single[seq.listing[0].substr(0, seq.listing[0].find(' '))];
    if (failures <= show) {
      std::printf("MISMATCH in sequence %d (undefined flags at end %#llx):\n", i,
                  static_cast<unsigned long long>(seq.undefined_flags));
      for (const auto& line : seq.listing) std::printf("    %s\n", line.c_str());
      std::printf("%s%s", describe_start(regs).c_str(), diff.c_str());
    }
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("interp_diff: %d sequences, %d instructions, %d ended in the same exception class, %d stopped at an "
              "instruction the interp does not implement, %d mismatches, %.1f s\n",
              total, instructions, faults_agreed, unimplemented_runs, failures, seconds);
  if (host_preempted) std::printf("interp_diff: %d sequences agreed only when the host ran them again\n", host_preempted);
  std::printf("coverage by class:");
  for (const auto& [name, n] : class_counts) std::printf(" %s=%d", name.c_str(), n);
  std::printf("\n");
  if (!failing_single.empty()) {
    std::printf("single-instruction mismatches by mnemonic:");
    for (const auto& [name, n] : failing_single) std::printf(" %s=%d", name.c_str(), n);
    std::printf("\n");
  }
  auto unimplemented = machine->cpu().unimplemented_counts();
  if (!unimplemented.empty()) {
    std::printf("interp reported unimplemented (#UD, not counted as mismatches):");
    for (const auto& [name, n] : unimplemented) std::printf(" %s=%llu", name.c_str(), static_cast<unsigned long long>(n));
    std::printf("\n");
  }
  return failures == 0 ? 0 : 1;
}
