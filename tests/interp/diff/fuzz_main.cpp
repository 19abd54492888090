// interp_fuzz: random bytes as code under InterpBackend with an instruction budget; every run must end in an exit, never a crash or hang.
#include <chrono>
#include <cstdio>
#include <map>
#include <random>
#include <string>

#include <CLI/CLI.hpp>

#include "tests/interp/diff/generator.h"
#include "tests/interp/diff/machine.h"

int main(int argc, char** argv) {
  using namespace deja::difftest;
  CLI::App app{"interp_fuzz: random code bytes under deja's interpreter (no crash, no hang)"};
  uint64_t seed = std::random_device{}();
  int count = 20000;
  double seconds_limit = 20;
  int code_bytes = 48;
  app.add_option("--seed", seed, "random seed (printed at start, to reproduce a run)");
  app.add_option("--count", count, "maximum number of runs")->check(CLI::PositiveNumber);
  app.add_option("--seconds", seconds_limit, "stop after this much wall time");
  app.add_option("--bytes", code_bytes, "random code bytes per run")->check(CLI::Range(1, 4000));
  CLI11_PARSE(app, argc, argv);
  std::printf("interp_fuzz: seed %llu (reproduce with --seed %llu --count N)\n", static_cast<unsigned long long>(seed),
              static_cast<unsigned long long>(seed));

  std::mt19937_64 rng(seed);
  Generator state_generator(seed ^ 0xf022, false, false);
  std::map<std::string, int> endings;
  const auto start = std::chrono::steady_clock::now();
  int runs = 0;
  std::unique_ptr<GuestMachine> machine;
  for (; runs < count; ++runs) {
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() > seconds_limit) break;
    // A fresh machine now and then: random code may rewrite page tables, the IDT, or leave an exit unanswered.
    if (!machine || runs % 64 == 0) machine = GuestMachine::create();
    if (!machine) {
      std::fprintf(stderr, "interp_fuzz: cannot build the guest machine\n");
      return 2;
    }
    std::vector<uint8_t> code(static_cast<size_t>(code_bytes));
    // Mostly fully random bytes; sometimes biased toward prefixes and the two-byte opcode map.
    const bool biased = rng() % 4 == 0;
    for (auto& byte : code) {
      static constexpr uint8_t kInteresting[] = {0x0f, 0x66, 0xf2, 0xf3, 0x48, 0x4c, 0x41, 0xf0, 0x2e, 0x64, 0xc4, 0xc5, 0x62};
      byte = biased && rng() % 3 == 0 ? kInteresting[rng() % std::size(kInteresting)] : static_cast<uint8_t>(rng());
    }
    code.push_back(0xf4);
    RegisterFile regs = state_generator.registers();
    if (rng() % 2) regs.gpr[4] = kInitialRsp;  // sometimes a usable stack, sometimes garbage
    const Outcome out = machine->run(code, regs, state_generator.data(), 2000);
    ++endings[ending_name(out.ending)];
    if (out.ending == Ending::kOther) machine.reset();  // an exit we did not answer: start clean
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("interp_fuzz: %d runs in %.1f s, every one returned an exit;", runs, seconds);
  for (const auto& [name, n] : endings) std::printf(" %s=%d", name.c_str(), n);
  std::printf("\n");
  return 0;
}
