// Runs the project's freestanding guests (Multiboot, 32-bit entry -> long mode) on the interp backend with a minimal port loop.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "interp/interp_backend.h"
#include "boot/loader.h"

namespace deja::test {
namespace {

struct GuestResult {
  std::string serial;
  int exit_code = -1;
  std::string stop;
  uint64_t instructions = 0;
};

// Just enough of a PC for the guests that need no interrupts: a transmit-only 16550, isa-debug-exit.
GuestResult run_guest(const std::string& name, const std::string& cmdline = "", uint64_t max_exits = 2'000'000) {
  GuestResult result;
  auto memory = GuestMemory::create(256 << 20);  // the size the .expected files assume
  if (!memory) {
    result.stop = memory.error().message;
    return result;
  }
  auto image = load_guest_image(*memory, std::string(DEJA_GUEST_DIR) + "/" + name + ".elf", LoadOptions{cmdline, {}});
  if (!image) {
    result.stop = image.error().message;
    return result;
  }
  InterpBackend cpu(*memory, CpuModel::deja_v1());
  EXPECT_TRUE(cpu.set_state(image->initial_state).has_value());
  uint64_t tsc = 0;
  bool divisor_latch = false;  // LCR.DLAB: writes to 0x3f8 set the baud divisor instead of sending
  for (uint64_t i = 0; i < max_exits; ++i) {
    auto exit_or = cpu.run();
    if (!exit_or) {
      result.stop = exit_or.error().message;
      break;
    }
    VcpuExit& exit = **exit_or;
    if (exit.kind == ExitKind::kIoOut) {
      if (exit.port == 0x3fb) divisor_latch = exit.value & 0x80;
      if (exit.port == 0x3f8 && !divisor_latch) result.serial += char(exit.value);
      if (exit.port == 0xf4) {
        result.exit_code = int(exit.value);
        break;
      }
      continue;
    }
    if (exit.kind == ExitKind::kIoIn) {
      exit.value = exit.port == 0x3fd ? 0x60 : 0;
      continue;
    }
    if (exit.kind == ExitKind::kRdtsc) {
      exit.value = tsc += 1000;
      continue;
    }
    if (exit.kind == ExitKind::kMsrRead || exit.kind == ExitKind::kMsrWrite) {
      exit.fault = true;
      continue;
    }
    if (exit.kind == ExitKind::kMmioRead) {
      exit.value = ~0ull;
      continue;
    }
    if (exit.kind == ExitKind::kMmioWrite) continue;
    result.stop = std::string(exit_kind_name(exit.kind)) + " " + exit.detail;
    break;
  }
  result.instructions = *cpu.instruction_count();
  for (const auto& [mnemonic, count] : cpu.unimplemented_counts()) {
    result.stop += " unimplemented:" + mnemonic + "=" + std::to_string(count);
  }
  return result;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

class InterpGuest : public ::testing::TestWithParam<std::string> {};

TEST_P(InterpGuest, MatchesExpectedSerialOutput) {
  const std::string name = GetParam();
  const std::string expected_path = std::string(DEJA_GUEST_SOURCE_DIR) + "/" + name + ".expected";
  std::ifstream probe(std::string(DEJA_GUEST_DIR) + "/" + name + ".elf");
  if (!probe) GTEST_SKIP() << name << ".elf is not built";
  // cpu-bound's .expected is for the small n the guest tests pass on the command line.
  GuestResult result = run_guest(name, name == "cpu-bound" ? "n=100000" : "");
  EXPECT_EQ(result.exit_code, 0) << result.stop << "\nserial:\n" << result.serial;
  EXPECT_EQ(result.serial, read_file(expected_path)) << result.stop;
  std::cout << name << ": " << result.instructions << " instructions\n";
}

INSTANTIATE_TEST_SUITE_P(Guests, InterpGuest, ::testing::Values("hello", "exceptions", "paging", "cpu-bound"));
// (memory, ~700 M instructions, runs through `deja` in tests/guests; throughput is measured by bench/rr_bench.py,
// not by a timed test.)

}  // namespace
}  // namespace deja::test
