// CoordinateSeeker on the software CPU: every instruction boundary of a tricky program is reached exactly, with exact and PMU-like counters.
#include <gtest/gtest.h>

#include "tests/interp/interp_test_util.h"
#include "replay/coordinate_seeker.h"
#include "replay/digest.h"

namespace deja::test {
namespace {

// Loops with conditional branches, a REP string instruction, a loop with no conditional branch at all
// (it leaves through CMOV + indirect JMP), an STI interrupt shadow and LOOP.
constexpr const char* kProgram = R"(
    xor eax, eax
    xor ebx, ebx
    mov ecx, 40
  1:
    add rax, rcx
    dec ecx
    jnz 1b
    mov rsi, 0x200000
    mov rdi, 0x300000
    mov ecx, 64
    cld
    rep movsb
    lea rbx, [rip + 3f]
    lea r8, [rip + 2f]
    xor edx, edx
  2:
    inc rdx
    mov r9, r8
    cmp rdx, 30
    cmove r9, rbx
    jmp r9
  3:
    sti
    nop
    cli
    mov ecx, 20
  4:
    loop 4b
    hlt
)";

struct Boundary {
  CpuState state;
  uint64_t branches;
};

TestVm program_vm() {
  TestVm vm = TestVm::long_mode();
  std::vector<uint8_t> source(64);
  for (size_t i = 0; i < source.size(); ++i) source[i] = uint8_t(i * 7 + 1);
  vm.load(0x200000, source);
  static const std::vector<uint8_t> program = assemble(kProgram, kCode);
  vm.load(kCode, program);
  return vm;
}

// Every instruction boundary (and every REP iteration) of the program, in order, from a reference run.
std::vector<Boundary> all_boundaries() {
  TestVm vm = program_vm();
  std::vector<Boundary> points;
  for (;;) {
    points.push_back({vm.state(), *vm.cpu->branch_count()});
    vm.cpu->set_instruction_budget(1);
    VcpuExit exit = vm.run();
    if (exit.kind == ExitKind::kHlt) break;
    EXPECT_EQ(exit.kind, ExitKind::kKicked);
    if (exit.kind != ExitKind::kKicked) break;
  }
  return points;
}

SeekTarget target_of(const Boundary& b) {
  return SeekTarget{Coordinate{0, b.branches, b.state.rip, b.state.gpr[kRcx]}, gpr_digest(b.state)};
}

// Runs the seeker like the session does: overflow stops come back as kKicked, and a target in a
// halted state is found when run() is called again after the kHlt exit.
VcpuExit seek(CoordinateSeeker& seeker) {
  for (int guard = 0; guard < 100000; ++guard) {
    auto exit = seeker.run();
    EXPECT_TRUE(exit.has_value());
    if (!exit) return VcpuExit{};
    if ((*exit)->kind == ExitKind::kHlt && seeker.target()) {
      exit = seeker.run();
      if (!exit) return VcpuExit{};
    }
    if ((*exit)->kind != ExitKind::kKicked) return **exit;
  }
  ADD_FAILURE() << "the seeker never stopped";
  return VcpuExit{};
}

class SeekerSkid : public ::testing::TestWithParam<uint64_t> {};

TEST_P(SeekerSkid, ReachesEveryBoundaryExactly) {
  const uint64_t skid = GetParam();
  std::vector<Boundary> points = all_boundaries();
  ASSERT_GT(points.size(), 300u);
  int in_shadow = 0, mid_rep = 0;
  for (size_t i = 0; i < points.size(); ++i) {
    TestVm vm = program_vm();
    vm.cpu->emulate_pmu_skid(skid, 1000 + i);
    CoordinateSeeker seeker(*vm.cpu, *vm.cpu->progress_counter());
    seeker.set_target(target_of(points[i]));
    VcpuExit exit = seek(seeker);
    ASSERT_EQ(exit.kind, ExitKind::kCoordinateReached) << "boundary " << i << ": " << exit.detail;
    CpuState got = vm.state();
    EXPECT_EQ(got.rip, points[i].state.rip) << "boundary " << i;
    EXPECT_EQ(got.gpr, points[i].state.gpr) << "boundary " << i;
    EXPECT_EQ(got.interrupt_shadow, points[i].state.interrupt_shadow) << "boundary " << i;
    EXPECT_EQ(*vm.cpu->branch_count(), points[i].branches) << "boundary " << i;
    EXPECT_FALSE(seeker.target().has_value());
    in_shadow += got.interrupt_shadow;
    mid_rep += got.gpr[kRcx] > 0 && got.gpr[kRcx] < 64 && got.gpr[kRsi] > 0x200000 && got.gpr[kRsi] < 0x200040;
    // Afterwards the guest runs on to its end untouched by the seeker's debug controls.
    EXPECT_EQ(seek(seeker).kind, ExitKind::kHlt) << "boundary " << i;
  }
  EXPECT_EQ(in_shadow, 1);  // the NOP after STI
  EXPECT_EQ(mid_rep, 63);   // every REP MOVSB iteration boundary
}

INSTANTIATE_TEST_SUITE_P(Skids, SeekerSkid, ::testing::Values(0, 1, 7, 100, 1'000'000'000),
                         [](const auto& info) { return "skid" + std::to_string(info.param); });

TEST(Seeker, AllTargetsInOneRunLikeAReplay) {
  std::vector<Boundary> points = all_boundaries();
  TestVm vm = program_vm();
  vm.cpu->emulate_pmu_skid(50, 7);
  CoordinateSeeker seeker(*vm.cpu, *vm.cpu->progress_counter());
  for (size_t i = 0; i < points.size(); i += 3) {
    seeker.set_target(target_of(points[i]));
    VcpuExit exit = seek(seeker);
    ASSERT_EQ(exit.kind, ExitKind::kCoordinateReached) << "boundary " << i << ": " << exit.detail;
    ASSERT_EQ(vm.state().gpr, points[i].state.gpr) << "boundary " << i;
  }
  EXPECT_GT(seeker.stats().single_steps, 0u);
  EXPECT_GT(seeker.stats().breakpoint_hits, 0u);
}

TEST(Seeker, ReportsATargetTheGuestNeverReaches) {
  std::vector<Boundary> points = all_boundaries();
  const Boundary& b = points[20];
  for (uint64_t skid : {0u, 3u, 1000u}) {
    TestVm vm = program_vm();
    vm.cpu->emulate_pmu_skid(skid, 99);
    CoordinateSeeker seeker(*vm.cpu, *vm.cpu->progress_counter());
    SeekTarget t = target_of(b);
    t.at.rcx ^= 0x5555;  // the same place with a register value the guest never has there
    seeker.set_target(t);
    VcpuExit exit = seek(seeker);
    ASSERT_EQ(exit.kind, ExitKind::kCoordinateMissed) << "skid " << skid;
    EXPECT_NE(exit.detail.find("past the target " + std::to_string(b.branches)), std::string::npos) << exit.detail;
    EXPECT_LE(*vm.cpu->branch_count(), b.branches + 1 + skid);
  }
}

TEST(Seeker, NoticesAnUnreachableRipWithinTheSkidOfTheTargetCount) {
  // The target RIP is never executed, so no breakpoint hit can show the overshoot: the counter armed
  // just past the target must, long before the loop ends.
  const std::vector<uint8_t> loop = assemble("mov ecx, 1000000\n 1: dec ecx\n jnz 1b\n hlt\n", kCode);
  for (uint64_t skid : {0u, 5u, 500u}) {
    TestVm vm = TestVm::long_mode();
    vm.load(kCode, loop);
    vm.cpu->emulate_pmu_skid(skid, 3);
    CoordinateSeeker seeker(*vm.cpu, *vm.cpu->progress_counter());
    seeker.set_target(SeekTarget{Coordinate{0, 1000, kCode + 0x800, 0}, std::nullopt});
    VcpuExit exit = seek(seeker);
    ASSERT_EQ(exit.kind, ExitKind::kCoordinateMissed) << "skid " << skid;
    EXPECT_LE(*vm.cpu->branch_count(), 1000u + 1 + skid) << "skid " << skid;
  }
}

TEST(Seeker, WithoutTargetRunsLikeTheBackend) {
  TestVm vm = program_vm();
  CoordinateSeeker seeker(*vm.cpu, *vm.cpu->progress_counter());
  EXPECT_EQ(seek(seeker).kind, ExitKind::kHlt);
  EXPECT_EQ(*vm.cpu->branch_count(), 40u + 20u);
}

TEST(EmulatedPmu, OverflowLandsLateWithinTheSkidNeverEarly) {
  std::vector<uint64_t> lateness;
  const std::vector<uint8_t> loop = assemble("mov ecx, 100000\n 1: dec ecx\n jnz 1b\n hlt\n", kCode);
  for (uint64_t seed = 0; seed < 200; ++seed) {
    TestVm vm = TestVm::long_mode();
    vm.load(kCode, loop);
    vm.cpu->emulate_pmu_skid(300, seed);
    ProgressCounter& counter = *vm.cpu->progress_counter();
    EXPECT_EQ(counter.skid(), 300u);
    EXPECT_EQ(counter.describe(), "emulated-pmu:300");
    ASSERT_TRUE(counter.arm(5000).has_value());
    ASSERT_EQ(vm.run().kind, ExitKind::kKicked);
    uint64_t at = counter.read();
    ASSERT_GE(at, 5000u);
    ASSERT_LE(at, 5300u);
    lateness.push_back(at - 5000);
    counter.disarm();
    EXPECT_EQ(vm.run().kind, ExitKind::kHlt);  // disarmed: no further stop
  }
  // Spread over the skid like hardware, not always on time.
  EXPECT_GT(*std::max_element(lateness.begin(), lateness.end()), 200u);
  EXPECT_LT(*std::min_element(lateness.begin(), lateness.end()), 100u);
}

TEST(EmulatedPmu, ExactCounterStopsOnTheBranch) {
  TestVm vm = TestVm::long_mode();
  vm.code("mov ecx, 1000\n 1: dec ecx\n jnz 1b\n hlt\n");
  ProgressCounter& counter = *vm.cpu->progress_counter();
  EXPECT_EQ(counter.skid(), 0u);
  EXPECT_EQ(counter.describe(), "interp");
  ASSERT_TRUE(counter.arm(123).has_value());
  ASSERT_EQ(vm.run().kind, ExitKind::kKicked);
  EXPECT_EQ(counter.read(), 123u);
  EXPECT_EQ(vm.state().gpr[kRcx], 1000u - 123u);
}

TEST(InterpDebug, SingleStepAndBreakpoint) {
  TestVm vm = TestVm::long_mode();
  vm.code("mov ecx, 3\n 1: nop\n dec ecx\n jnz 1b\n hlt\n");
  ASSERT_TRUE(vm.cpu->set_debug(DebugControl{.single_step = true}).has_value());
  ASSERT_EQ(vm.run().kind, ExitKind::kDebug);
  EXPECT_EQ(vm.state().rip, kCode + 5);
  ASSERT_EQ(vm.run().kind, ExitKind::kDebug);
  EXPECT_EQ(vm.state().rip, kCode + 6);
  // A breakpoint on the NOP stops before it on each of the remaining iterations.
  ASSERT_TRUE(vm.cpu->set_debug(DebugControl{.breakpoint = kCode + 5}).has_value());
  for (uint64_t rcx : {2u, 1u}) {
    ASSERT_EQ(vm.run().kind, ExitKind::kDebug);
    EXPECT_EQ(vm.state().rip, kCode + 5);
    EXPECT_EQ(vm.state().gpr[kRcx], rcx);
    EXPECT_EQ(vm.run().kind, ExitKind::kDebug) << "a breakpoint keeps stopping until cleared";
    ASSERT_TRUE(vm.cpu->set_debug(DebugControl{.single_step = true}).has_value());
    ASSERT_EQ(vm.run().kind, ExitKind::kDebug);
    ASSERT_TRUE(vm.cpu->set_debug(DebugControl{.breakpoint = kCode + 5}).has_value());
  }
  ASSERT_TRUE(vm.cpu->set_debug(DebugControl{}).has_value());
  EXPECT_EQ(vm.run().kind, ExitKind::kHlt);
}

}  // namespace
}  // namespace deja::test
