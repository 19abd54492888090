// Tests of the KVM backend with tiny hand-assembled guests; they need /dev/kvm (run them via scripts/kvm-nested.sh).
#include <cpuid.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include <fmt/format.h>

#include "kvm/kvm_backend.h"
#include "tests/kvm/kvm_test_support.h"
#include "kvm/perf_counter.h"
#include "kvm/pmu.h"
#include "kvm/pmu_selftest.h"

namespace deja {
namespace {

constexpr uint64_t kRamSize = 2 << 20;
constexpr uint64_t kGdt = 0x500;
constexpr uint64_t kPml4 = 0x1000, kPdpt = 0x2000, kPd = 0x3000;
constexpr uint64_t kIdt = 0x4000;
constexpr uint64_t kStackTop = 0x9000;
constexpr uint64_t kCode = 0x10000;
constexpr uint64_t kTimerHandler = 0x11000;   // vector 0x20: reports itself on port 0x90, then IRETQ
constexpr uint64_t kGpHandler = 0x11100;      // vector 13: r15 = 13, HLT
constexpr uint64_t kData = 0x12000;
constexpr uint64_t kMmio = 0x200010;          // the page tables map 0-4 MiB; RAM ends at 2 MiB

constexpr uint16_t kCode64 = 0x08, kData32 = 0x10, kCode32 = 0x18;

bool have_kvm() { return ::access("/dev/kvm", F_OK) == 0; }
// The nested harness: QEMU's software CPU announces itself in the hypervisor CPUID leaf.
bool under_qemu_tcg() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  __cpuid(0x40000000, eax, ebx, ecx, edx);
  char signature[13] = {};
  std::memcpy(signature, &ebx, 4);
  std::memcpy(signature + 4, &ecx, 4);
  std::memcpy(signature + 8, &edx, 4);
  return std::strcmp(signature, "TCGTCGTCGTCG") == 0;
}

class KvmTest : public ::testing::Test {
 protected:
  void SetUp() override {
    DEJA_REQUIRE_USABLE_KVM();
    auto memory = GuestMemory::create(kRamSize);
    ASSERT_TRUE(memory) << memory.error().message;
    memory_.emplace(std::move(*memory));
    auto backend = make_kvm_backend(*memory_, kvm_test_model());
    ASSERT_TRUE(backend) << backend.error().message;
    backend_ = std::move(*backend);
    write_tables();
  }

  void write_tables() {
    // GDT: null, 64-bit code, flat data, 32-bit code (the Multiboot entry's).
    const uint64_t gdt[] = {0, 0x00af9b000000ffffull, 0x00cf93000000ffffull, 0x00cf9b000000ffffull};
    write(kGdt, gdt, sizeof(gdt));
    // Identity map of 0-4 MiB with two 2 MiB pages.
    write_u64(kPml4, kPdpt | 0x3);
    write_u64(kPdpt, kPd | 0x3);
    write_u64(kPd, 0x000000 | 0x83);
    write_u64(kPd + 8, 0x200000 | 0x83);
    set_gate(0x20, kTimerHandler);
    set_gate(13, kGpHandler);
    // push rax; mov al, 0x20; out 0x90, al; pop rax; iretq
    load(kTimerHandler, {0x50, 0xb0, 0x20, 0xe6, 0x90, 0x58, 0x48, 0xcf});
    // mov r15d, 13; hlt
    load(kGpHandler, {0x41, 0xbf, 0x0d, 0x00, 0x00, 0x00, 0xf4});
  }

  void write(uint64_t gpa, const void* data, size_t size) {
    auto ok = memory_->write(Gpa{gpa}, std::span(static_cast<const uint8_t*>(data), size));
    ASSERT_TRUE(ok) << ok.error().message;
  }
  void write_u64(uint64_t gpa, uint64_t value) { write(gpa, &value, sizeof(value)); }
  uint64_t read_u64(uint64_t gpa) {
    uint64_t value = 0;
    EXPECT_TRUE(memory_->read(Gpa{gpa}, std::span(reinterpret_cast<uint8_t*>(&value), sizeof(value))));
    return value;
  }
  void load(uint64_t gpa, std::vector<uint8_t> code) { write(gpa, code.data(), code.size()); }

  // A 64-bit interrupt gate (SDM Vol. 3, 6.14.1) to `handler` in the 64-bit code segment.
  void set_gate(uint8_t vector, uint64_t handler) {
    uint64_t low = (handler & 0xffff) | (uint64_t{kCode64} << 16) | (uint64_t{0x8e} << 40) |
                   (((handler >> 16) & 0xffff) << 48);
    write_u64(kIdt + vector * 16, low);
    write_u64(kIdt + vector * 16 + 8, handler >> 32);
  }

  static SegmentReg flat(uint16_t selector, uint8_t type, bool code64) {
    return SegmentReg{.base = 0, .limit = 0xffffffff, .selector = selector, .type = type, .dpl = 0, .present = true,
                      .s = true, .db = !code64, .l = code64, .g = true};
  }

  // 64-bit long mode with paging, as the ELF64 direct-boot loader hands over.
  static CpuState long_mode(uint64_t rip) {
    CpuState s;
    s.rip = rip;
    s.gpr[kRsp] = kStackTop;
    s.cs = flat(kCode64, 0xb, true);
    s.ds = s.es = s.fs = s.gs = s.ss = flat(kData32, 0x3, false);
    s.tr = SegmentReg{.limit = 0x67, .type = 0xb, .present = true};
    s.gdt = {kGdt, 4 * 8 - 1};
    s.idt = {kIdt, 256 * 16 - 1};
    s.cr0 = cr0::kPe | cr0::kMp | cr0::kEt | cr0::kNe | cr0::kWp | cr0::kPg;
    s.cr3 = kPml4;
    s.cr4 = cr4::kPae | cr4::kOsfxsr | cr4::kOsxmmexcpt;
    s.efer = efer::kLme | efer::kLma | efer::kSce | efer::kNxe;
    return s;
  }

  // 32-bit flat protected mode without paging, as a Multiboot loader hands over.
  static CpuState protected_mode(uint64_t rip) {
    CpuState s;
    s.rip = rip;
    s.cs = flat(kCode32, 0xb, false);
    s.ds = s.es = s.fs = s.gs = s.ss = flat(kData32, 0x3, false);
    s.gdt = {kGdt, 4 * 8 - 1};
    s.cr0 = cr0::kPe | cr0::kEt;
    return s;
  }

  void start(const CpuState& state) {
    auto ok = backend_->set_state(state);
    ASSERT_TRUE(ok) << ok.error().message;
  }

  VcpuExit* run() {
    auto exit = backend_->run();
    EXPECT_TRUE(exit) << exit.error().message;
    return exit ? *exit : nullptr;
  }

  CpuState state() {
    auto state = backend_->get_state();
    EXPECT_TRUE(state) << state.error().message;
    return state ? *state : CpuState{};
  }

  // Each run() stops with a single step at the next of `rips`, in the exit and in the vCPU's state.
  void expect_steps(std::initializer_list<uint64_t> rips) {
    for (uint64_t next : rips) {
      VcpuExit* exit = run();
      ASSERT_NE(exit, nullptr);
      ASSERT_EQ(exit->kind, ExitKind::kDebug) << "expected a step to " << std::hex << next << ", got "
                                              << exit_kind_name(exit->kind);
      EXPECT_EQ(exit->rip, next);
      EXPECT_EQ(state().rip, next);
    }
  }

  std::optional<GuestMemory> memory_;
  std::unique_ptr<Backend> backend_;
};

TEST(KvmFactory, FailsClearlyWithoutDevKvm) {
  if (have_kvm()) GTEST_SKIP() << "this host has /dev/kvm";
  auto memory = GuestMemory::create(kRamSize);
  ASSERT_TRUE(memory);
  auto backend = make_kvm_backend(*memory, CpuModel::deja_v1());
  ASSERT_FALSE(backend);
  EXPECT_EQ(backend.error().kind, ErrorKind::kUnsupported);
  EXPECT_NE(backend.error().message.find("/dev/kvm does not exist"), std::string::npos) << backend.error().message;
  EXPECT_NE(backend.error().message.find("kvm-nested.sh"), std::string::npos) << backend.error().message;
}

TEST_F(KvmTest, BackendNameAndNoExactProgress) {
  EXPECT_EQ(backend_->name(), "kvm");
  EXPECT_EQ(backend_->progress_counter(), nullptr) << "no counter until attach_pmu_counter succeeds";
  EXPECT_FALSE(backend_->branch_count().has_value());
  EXPECT_FALSE(backend_->instruction_count().has_value());
}

// The nested harness (QEMU TCG) has no PMU: attaching must fail clearly and leave no counter behind. On a host
// with a supported PMU it must succeed and count.
TEST_F(KvmTest, AttachPmuCounterSucceedsOrFailsClearly) {
  auto ok = attach_pmu_counter(*backend_);
  if (ok) {
    ASSERT_NE(backend_->progress_counter(), nullptr);
    EXPECT_TRUE(backend_->progress_counter()->describe().starts_with("pmu ")) << backend_->progress_counter()->describe();
    return;
  }
  EXPECT_EQ(ok.error().kind, ErrorKind::kUnsupported);
  EXPECT_EQ(backend_->progress_counter(), nullptr);
  const std::string& message = ok.error().message;
  bool unknown_cpu = message.find("not supported") != std::string::npos ||
                     message.find("not in deja's PMU table") != std::string::npos;
  bool no_pmu = message.find("perf_event_open of the counting event") != std::string::npos;
  EXPECT_TRUE(unknown_cpu || no_pmu) << message;

  // Whatever the CPU, the real perf path on the vCPU thread must fail with the event named, not crash.
  PmuModel zen = supported_pmu_models().back();
  auto forced = attach_pmu_counter_with(*backend_, zen, {});
  if (!forced) {
    EXPECT_NE(forced.error().message.find(zen.name + " retired conditional branches"), std::string::npos)
        << forced.error().message;
    EXPECT_EQ(backend_->progress_counter(), nullptr);
  }
}

// The self-test's calibration guests run on KVM to their HLT with every port exit, as on the software CPU.
TEST_F(KvmTest, CalibrationGuestsRunToTheirHlt) {
  for (const CalibrationGuest& guest : {calibration_loop(100'000), calibration_loop_with_exits(4'000, 100)}) {
    auto run = run_calibration_guest(*backend_, *memory_, guest);
    ASSERT_TRUE(run) << run.error().message;
    EXPECT_EQ(run->port_exits, guest.port_exits);
    EXPECT_EQ(run->stop_rip, kCalibrationEntry + guest.code.size() - 1);
    EXPECT_FALSE(run->branches.has_value()) << "no PMU counter attached";
    EXPECT_EQ(state().gpr[kRcx], 0u);
  }
}

TEST_F(KvmTest, SingleStepVisitsEachInstructionInOrder) {
  load(kCode, {
                  0x90,                          // 10000: nop
                  0xb8, 0x01, 0x00, 0x00, 0x00,  // 10001: mov eax, 1
                  0x01, 0xc0,                    // 10006: add eax, eax
                  0xff, 0xc3,                    // 10008: inc ebx
                  0xe6, 0x80,                    // 1000a: out 0x80, al
                  0x90,                          // 1000c: nop
                  0xf4,                          // 1000d: hlt
              });
  start(long_mode(kCode));
  ASSERT_TRUE(backend_->set_debug({.single_step = true}));
  ASSERT_NO_FATAL_FAILURE(expect_steps({0x10001u, 0x10006u, 0x10008u, 0x1000au}));
  EXPECT_EQ(state().gpr[kRax], 2u);
  EXPECT_EQ(state().rflags & rflags::kTf, 0u) << "the VMM's trap flag stays hidden from the guest state";
  // The OUT still exits to the VMM; its step completes on the next run().
  VcpuExit* exit = run();
  ASSERT_EQ(exit->kind, ExitKind::kIoOut);
  EXPECT_EQ(exit->port, 0x80);
  EXPECT_EQ(exit->value, 2u);
  EXPECT_EQ(exit->rip, 0x1000au);
  exit = run();
  ASSERT_EQ(exit->kind, ExitKind::kDebug) << exit_kind_name(exit->kind);
  EXPECT_EQ(exit->rip, 0x1000cu);
  exit = run();
  ASSERT_EQ(exit->kind, ExitKind::kDebug);
  EXPECT_EQ(exit->rip, 0x1000du);
  // Cleared, the guest runs freely to its HLT.
  ASSERT_TRUE(backend_->set_debug({}));
  exit = run();
  EXPECT_EQ(exit->kind, ExitKind::kHlt);
}

// KVM's emulator writes RFLAGS back without the trap flag of a single step once RIP has moved: after an MMIO access
// the vCPU ran on unstepped to its next exit, so stepping to an interrupt window (docs/smp.md) skipped the window
// the software CPU stopped at. Every instruction is a step here, the MMIO ones and those after them.
TEST_F(KvmTest, SingleStepGoesOnPastMmioAccesses) {
  load(kCode, {
                  0x48, 0xc7, 0xc3, 0x10, 0x00, 0x20, 0x00,  // 10000: mov rbx, 0x200010
                  0x8b, 0x03,                                // 10007: mov eax, [rbx]
                  0x90,                                      // 10009: nop
                  0x89, 0x43, 0x08,                          // 1000a: mov [rbx+8], eax
                  0x90,                                      // 1000d: nop
                  0xff, 0xc0,                                // 1000e: inc eax
                  0xf4,                                      // 10010: hlt
              });
  start(long_mode(kCode));
  ASSERT_TRUE(backend_->set_debug({.single_step = true}));
  VcpuExit* exit = run();
  ASSERT_EQ(exit->kind, ExitKind::kDebug);
  EXPECT_EQ(exit->rip, 0x10007u);
  exit = run();
  ASSERT_EQ(exit->kind, ExitKind::kMmioRead);
  exit->value = 0x1234;
  ASSERT_NO_FATAL_FAILURE(expect_steps({0x10009u, 0x1000au}));
  exit = run();
  ASSERT_EQ(exit->kind, ExitKind::kMmioWrite);
  EXPECT_EQ(exit->value, 0x1234u);
  // KVM finished the write before it exited; its step is reported without running, then the steps go on.
  ASSERT_NO_FATAL_FAILURE(expect_steps({0x1000du, 0x1000eu, 0x10010u}));
  EXPECT_EQ(state().gpr[kRax], 0x1235u);
  EXPECT_EQ(state().rflags & rflags::kTf, 0u) << "the VMM's trap flag stays hidden from the guest state";
  ASSERT_TRUE(backend_->set_debug({}));
  EXPECT_EQ(run()->kind, ExitKind::kHlt);
}

// KVM's step is the trap flag, which SYSRET (RFLAGS from R11) and SYSCALL (FMASK) leave clear: no step is reported
// after either, and the vCPU runs unstepped to its next exit. The software CPU's window steps do the same
// (InterpSystem.WindowStepsAsTrapFlagEndAtSysretAndSyscall, the same program and the same stops).
TEST_F(KvmTest, SingleStepEndsAtSysretAndSyscall) {
  const uint64_t user_data = 0x00cff3000000ffffull, user_code64 = 0x00affb000000ffffull;  // selectors 0x23, 0x2b
  write_u64(kGdt + 0x20, user_data);
  write_u64(kGdt + 0x28, user_code64);
  write_u64(kPml4, kPdpt | 0x7);  // user pages too
  write_u64(kPdpt, kPd | 0x7);
  write_u64(kPd, 0x000000 | 0x87);
  load(kCode, {
                  0xe6, 0x80,        // 10000: out 0x80, al
                  0x90,              // 10002: nop
                  0x48, 0x0f, 0x07,  // 10003: sysretq
                  0x90,              // 10006: user: nop
                  0xe6, 0x80,        // 10007: out 0x80, al (IOPL 3)
                  0x0f, 0x05,        // 10009: syscall
                  0x90,              // 1000b: entry: nop
                  0xf4,              // 1000c: hlt
              });
  CpuState s = long_mode(kCode);
  s.gdt = {kGdt, 6 * 8 - 1};
  s.msrs.star = (uint64_t{0x18} << 48) | (uint64_t{kCode64} << 32);
  s.msrs.lstar = 0x1000b;
  s.msrs.sfmask = rflags::kIf | rflags::kTf;  // as Linux's
  s.gpr[kRcx] = 0x10006;
  s.gpr[kR11] = 0x3202;
  start(s);
  VcpuExit* exit = run();
  ASSERT_EQ(exit->kind, ExitKind::kIoOut);
  ASSERT_TRUE(backend_->set_debug({.single_step = true}));
  ASSERT_NO_FATAL_FAILURE(expect_steps({0x10002u, 0x10003u}));
  exit = run();
  ASSERT_EQ(exit->kind, ExitKind::kIoOut) << "no step after SYSRET: " << exit_kind_name(exit->kind);
  EXPECT_EQ(exit->rip, 0x10007u);
  EXPECT_EQ(state().cs.selector, 0x2b);
  ASSERT_NO_FATAL_FAILURE(expect_steps({0x10009u}));
  exit = run();
  ASSERT_EQ(exit->kind, ExitKind::kHlt) << "no step after SYSCALL: " << exit_kind_name(exit->kind);
  EXPECT_EQ(exit->rip, 0x1000cu);
  EXPECT_EQ(state().gpr[kR11] & rflags::kTf, rflags::kTf) << "SYSCALL saved the step's TF, which the guest sees";
  ASSERT_TRUE(backend_->set_debug({}));
}

// An exception's delivery clears the step's trap flag and saves it in the frame: the handler runs unstepped
// (InterpSystem.WindowStepsAsTrapFlagEndAtGateDelivery).
TEST_F(KvmTest, SingleStepEndsAtAnExceptionsDelivery) {
  constexpr uint64_t kUdHandler = 0x11200;
  set_gate(6, kUdHandler);
  load(kUdHandler, {0x48, 0x8b, 0x5c, 0x24, 0x10, 0xf4});  // 11200: mov rbx, [rsp + 16] (RFLAGS); 11205: hlt
  load(kCode, {0xe6, 0x80, 0x0f, 0x0b});                   // 10000: out 0x80, al; 10002: ud2
  start(long_mode(kCode));
  VcpuExit* exit = run();
  ASSERT_EQ(exit->kind, ExitKind::kIoOut);
  ASSERT_TRUE(backend_->set_debug({.single_step = true}));
  ASSERT_NO_FATAL_FAILURE(expect_steps({0x10002u}));
  exit = run();
  ASSERT_EQ(exit->kind, ExitKind::kHlt) << "no step in the handler: " << exit_kind_name(exit->kind);
  EXPECT_EQ(exit->rip, 0x11205u);
  EXPECT_EQ(state().gpr[kRbx] & rflags::kTf, rflags::kTf) << "the frame holds the step's TF";
  ASSERT_TRUE(backend_->set_debug({}));
}

TEST_F(KvmTest, BreakpointStopsBeforeTheInstructionEveryIteration) {
  load(kCode, {
                  0xb9, 0x05, 0x00, 0x00, 0x00,  // 10000: mov ecx, 5
                  0x31, 0xc0,                    // 10005: xor eax, eax
                  0xff, 0xc0,                    // 10007: loop: inc eax
                  0xff, 0xc9,                    // 10009: dec ecx
                  0x75, 0xfa,                    // 1000b: jnz loop
                  0xe6, 0x80,                    // 1000d: out 0x80, al
                  0xf4,                          // 1000f: hlt
              });
  start(long_mode(kCode));
  const uint64_t dec_ecx = 0x10009;
  for (uint64_t iteration = 1; iteration <= 5; ++iteration) {
    ASSERT_TRUE(backend_->set_debug({.breakpoint = dec_ecx}));
    VcpuExit* exit = run();
    if (iteration == 1 && exit->kind == ExitKind::kIoOut && under_qemu_tcg()) {
      // QEMU's TCG before 9.1 loads DR7 from the VMCB on VMRUN without arming its breakpoints ("target/i386:
      // disable/enable breakpoints on vmentry/vmexit", June 2024), so L1 KVM's hardware breakpoints never fire in
      // the nested harness. The guest must then simply run on, undisturbed, to its OUT with the loop done.
      EXPECT_EQ(exit->value, 5u);
      EXPECT_EQ(exit->rip, 0x1000du);
      std::printf("[   INFO   ] hardware breakpoint not delivered: known QEMU TCG (< 9.1) nested-SVM limitation\n");
      return;
    }
    ASSERT_EQ(exit->kind, ExitKind::kDebug) << "iteration " << iteration << ": " << exit_kind_name(exit->kind);
    EXPECT_EQ(exit->rip, dec_ecx);
    CpuState s = state();
    EXPECT_EQ(s.rip, dec_ecx);
    EXPECT_EQ(s.gpr[kRax], iteration) << "inc eax ran";
    EXPECT_EQ(s.gpr[kRcx], 6 - iteration) << "dec ecx has not run yet (fault-like)";
    // Past it: clear the breakpoint and single-step once.
    ASSERT_TRUE(backend_->set_debug({.single_step = true}));
    exit = run();
    ASSERT_EQ(exit->kind, ExitKind::kDebug);
    EXPECT_EQ(exit->rip, 0x1000bu);
    EXPECT_EQ(state().gpr[kRcx], 5 - iteration);
  }
  ASSERT_TRUE(backend_->set_debug({.breakpoint = dec_ecx}));
  VcpuExit* exit = run();
  ASSERT_EQ(exit->kind, ExitKind::kIoOut) << "the loop is over: no sixth stop";
  EXPECT_EQ(exit->value, 5u);
}

TEST_F(KvmTest, SingleStepStopsOncePerRepIteration) {
  const uint64_t source = kData, destination = kData + 0x100;
  load(source, {0x11, 0x22, 0x33, 0x44});
  load(kCode, {
                  0xb9, 0x04, 0x00, 0x00, 0x00,  // 10000: mov ecx, 4
                  0xbe, 0x00, 0x20, 0x01, 0x00,  // 10005: mov esi, 0x12000
                  0xbf, 0x00, 0x21, 0x01, 0x00,  // 1000a: mov edi, 0x12100
                  0xfc,                          // 1000f: cld
                  0xf3, 0xa4,                    // 10010: rep movsb
                  0xe6, 0x80,                    // 10012: out 0x80, al
                  0xf4,                          // 10014: hlt
              });
  start(long_mode(kCode));
  ASSERT_TRUE(backend_->set_debug({.single_step = true}));
  for (uint64_t next : {0x10005u, 0x1000au, 0x1000fu, 0x10010u}) {
    VcpuExit* exit = run();
    ASSERT_EQ(exit->kind, ExitKind::kDebug);
    EXPECT_EQ(exit->rip, next);
  }
  for (uint64_t remaining = 3;; --remaining) {
    VcpuExit* exit = run();
    ASSERT_EQ(exit->kind, ExitKind::kDebug);
    CpuState s = state();
    EXPECT_EQ(s.gpr[kRcx], remaining);
    EXPECT_EQ(s.gpr[kRdi], destination + 4 - remaining) << "one byte copied per stop";
    if (remaining == 0) {
      EXPECT_EQ(exit->rip, 0x10012u) << "after the last iteration RIP moves on";
      break;
    }
    EXPECT_EQ(exit->rip, 0x10010u) << "between iterations RIP stays on the REP instruction";
  }
  EXPECT_EQ(read_u64(destination) & 0xffffffff, 0x44332211u);
  ASSERT_TRUE(backend_->set_debug({}));
  EXPECT_EQ(run()->kind, ExitKind::kIoOut);
  EXPECT_EQ(run()->kind, ExitKind::kHlt);
}

TEST_F(KvmTest, DebugControlsLeaveIoExitsAlone) {
  load(kCode, {
                  0xb0, 0x41,  // 10000: mov al, 0x41
                  0xe6, 0x80,  // 10002: out 0x80, al
                  0xe4, 0x81,  // 10004: in al, 0x81
                  0xe6, 0x82,  // 10006: out 0x82, al
                  0xf4,        // 10008: hlt
              });
  start(long_mode(kCode));
  // A breakpoint the guest never reaches changes nothing.
  ASSERT_TRUE(backend_->set_debug({.breakpoint = kCode + 0x1000}));
  VcpuExit* exit = run();
  ASSERT_EQ(exit->kind, ExitKind::kIoOut);
  EXPECT_EQ(exit->value, 0x41u);
  EXPECT_EQ(exit->rip, 0x10002u);
  exit = run();
  ASSERT_EQ(exit->kind, ExitKind::kIoIn);
  EXPECT_EQ(exit->port, 0x81);
  exit->value = 0x99;
  exit = run();
  ASSERT_EQ(exit->kind, ExitKind::kIoOut);
  EXPECT_EQ(exit->port, 0x82);
  EXPECT_EQ(exit->value, 0x99u) << "the IN's answer reached the guest";
  EXPECT_EQ(run()->kind, ExitKind::kHlt);

  // Single-stepping an IN: the exit comes first, the answer lands, then the step completes.
  start(long_mode(kCode + 4));
  ASSERT_TRUE(backend_->set_debug({.single_step = true}));
  exit = run();
  ASSERT_EQ(exit->kind, ExitKind::kIoIn);
  exit->value = 0x37;
  exit = run();
  ASSERT_EQ(exit->kind, ExitKind::kDebug);
  EXPECT_EQ(exit->rip, 0x10006u);
  EXPECT_EQ(state().gpr[kRax] & 0xff, 0x37u);
  ASSERT_TRUE(backend_->set_debug({}));
  exit = run();
  ASSERT_EQ(exit->kind, ExitKind::kIoOut);
  EXPECT_EQ(exit->value, 0x37u);
}

TEST_F(KvmTest, PortOutAndInExitWithValuesAndRip) {
  load(kCode, {
                  0xb0, 0x42,              // 10000: mov al, 0x42
                  0xe6, 0x80,              // 10002: out 0x80, al
                  0xe4, 0x81,              // 10004: in al, 0x81
                  0x89, 0xc3,              // 10006: mov ebx, eax
                  0x66, 0xba, 0x34, 0x12,  // 10008: mov dx, 0x1234
                  0x66, 0xed,              // 1000c: in ax, dx
                  0x89, 0xc1,              // 1000e: mov ecx, eax
                  0xf4,                    // 10010: hlt
              });
  start(long_mode(kCode));
  VcpuExit* exit = run();
  ASSERT_EQ(exit->kind, ExitKind::kIoOut);
  EXPECT_EQ(exit->port, 0x80);
  EXPECT_EQ(exit->size, 1);
  EXPECT_EQ(exit->value, 0x42u);
  EXPECT_EQ(exit->rip, 0x10002u);

  exit = run();
  ASSERT_EQ(exit->kind, ExitKind::kIoIn);
  EXPECT_EQ(exit->port, 0x81);
  EXPECT_EQ(exit->size, 1);
  EXPECT_EQ(exit->rip, 0x10004u);
  exit->value = 0x5a;

  exit = run();
  ASSERT_EQ(exit->kind, ExitKind::kIoIn);
  EXPECT_EQ(exit->port, 0x1234);
  EXPECT_EQ(exit->size, 2);
  EXPECT_EQ(exit->rip, 0x1000cu);
  exit->value = 0xbeef;

  exit = run();
  ASSERT_EQ(exit->kind, ExitKind::kHlt);
  EXPECT_EQ(exit->rip, 0x10010u);
  CpuState s = state();
  EXPECT_EQ(s.rip, 0x10011u);
  EXPECT_EQ(s.gpr[kRbx], 0x5au);
  EXPECT_EQ(s.gpr[kRcx], 0xbeefu);
  EXPECT_TRUE(s.halted);
}

TEST_F(KvmTest, RepStringIoIsSplitIntoOneExitPerElement) {
  load(kData, {'a', 'b', 'c', 'd'});
  load(kCode, {
                  0x66, 0xba, 0x92, 0x00,                    // mov dx, 0x92
                  0x48, 0xc7, 0xc6, 0x00, 0x20, 0x01, 0x00,  // mov rsi, 0x12000
                  0xb9, 0x04, 0x00, 0x00, 0x00,              // mov ecx, 4
                  0xf3, 0x6e,                                // rep outsb
                  0x66, 0xba, 0x93, 0x00,                    // mov dx, 0x93
                  0x48, 0xc7, 0xc7, 0x00, 0x21, 0x01, 0x00,  // mov rdi, 0x12100
                  0xb9, 0x03, 0x00, 0x00, 0x00,              // mov ecx, 3
                  0xf3, 0x6c,                                // rep insb
                  0xf4,                                      // hlt
              });
  start(long_mode(kCode));
  std::string out;
  VcpuExit* exit = nullptr;
  while ((exit = run()) && exit->kind == ExitKind::kIoOut) {
    EXPECT_EQ(exit->port, 0x92);
    EXPECT_EQ(exit->size, 1);
    out += static_cast<char>(exit->value);
  }
  EXPECT_EQ(out, "abcd");
  uint8_t next = 1;
  for (; exit && exit->kind == ExitKind::kIoIn; exit = run()) {
    EXPECT_EQ(exit->port, 0x93);
    exit->value = next++;
  }
  EXPECT_EQ(next, 4) << "expected exactly three IN exits";
  ASSERT_TRUE(exit);
  EXPECT_EQ(exit->kind, ExitKind::kHlt);
  EXPECT_EQ(read_u64(0x12100) & 0xffffffff, 0x00030201u);
  CpuState s = state();
  EXPECT_EQ(s.gpr[kRcx], 0u);
  EXPECT_EQ(s.gpr[kRdi], 0x12103u);
}

TEST_F(KvmTest, CpuidAnswersExactlyFromTheModel) {
  load(kCode, {0x0f, 0xa2, 0xf4});  // cpuid; hlt
  const CpuModel& model = kvm_test_model();
  const std::pair<uint32_t, uint32_t> queries[] = {
      {0, 0},          {1, 0},          {2, 0},          {4, 0},          {4, 1},          {4, 3},
      {4, 4},          {7, 0},          {7, 1},          {0xd, 0},        {0x40000000, 0}, {0x40000001, 0},
      {0x80000000, 0}, {0x80000001, 0}, {0x80000002, 0}, {0x80000004, 0}, {0x80000008, 0}, {0x80000009, 0},
      {0x8000ffff, 0}, {0xc0000000, 0}, {0x12345, 0}};
  for (auto [leaf, subleaf] : queries) {
    CpuState s = long_mode(kCode);
    s.gpr[kRax] = leaf;
    s.gpr[kRcx] = subleaf;
    start(s);
    VcpuExit* exit = run();
    ASSERT_EQ(exit->kind, ExitKind::kHlt) << "CPUID must not exit on KVM";
    CpuState after = state();
    CpuidResult expected = model.cpuid(leaf, subleaf);
    CpuidResult actual{uint32_t(after.gpr[kRax]), uint32_t(after.gpr[kRbx]), uint32_t(after.gpr[kRcx]),
                       uint32_t(after.gpr[kRdx])};
    EXPECT_EQ(actual, expected) << fmt::format("leaf {:#x}.{}: kvm {:08x} {:08x} {:08x} {:08x}, model {:08x} {:08x} "
                                               "{:08x} {:08x}",
                                               leaf, subleaf, actual.eax, actual.ebx, actual.ecx, actual.edx,
                                               expected.eax, expected.ebx, expected.ecx, expected.edx);
  }
}

TEST_F(KvmTest, UnownedMsrsExitOwnedMsrsStayInTheCpu) {
  load(kCode, {
                  0xb9, 0x10, 0x00, 0x00, 0x00,  // 10000: mov ecx, 0x10 (TSC)
                  0x0f, 0x32,                    // 10005: rdmsr
                  0x49, 0x89, 0xc0,              // 10007: mov r8, rax
                  0x49, 0x89, 0xd1,              // 1000a: mov r9, rdx
                  0xb9, 0x1b, 0x00, 0x00, 0x00,  // 1000d: mov ecx, 0x1b (APIC base)
                  0xb8, 0x00, 0x09, 0xe0, 0xfe,  // 10012: mov eax, 0xfee00900
                  0x31, 0xd2,                    // 10017: xor edx, edx
                  0x0f, 0x30,                    // 10019: wrmsr
                  0xb9, 0x81, 0x00, 0x00, 0xc0,  // 1001b: mov ecx, 0xc0000081 (STAR)
                  0xb8, 0x44, 0x33, 0x22, 0x11,  // mov eax, 0x11223344
                  0xba, 0x10, 0x00, 0x23, 0x00,  // mov edx, 0x00230010
                  0x0f, 0x30,                    // wrmsr
                  0x31, 0xc0,                    // xor eax, eax
                  0x31, 0xd2,                    // xor edx, edx
                  0x0f, 0x32,                    // rdmsr
                  0xf4,                          // hlt
              });
  start(long_mode(kCode));
  VcpuExit* exit = run();
  ASSERT_EQ(exit->kind, ExitKind::kMsrRead);
  EXPECT_EQ(exit->msr, msr::kTsc);
  EXPECT_EQ(exit->rip, 0x10005u);
  exit->value = 0x1122334455667788ull;

  exit = run();
  ASSERT_EQ(exit->kind, ExitKind::kMsrWrite);
  EXPECT_EQ(exit->msr, msr::kApicBase);
  EXPECT_EQ(exit->value, 0xfee00900u);
  EXPECT_EQ(exit->rip, 0x10019u);

  exit = run();
  ASSERT_EQ(exit->kind, ExitKind::kHlt) << "STAR is CPU-owned and must not exit";
  CpuState s = state();
  EXPECT_EQ(s.gpr[kR8], 0x55667788u);
  EXPECT_EQ(s.gpr[kR9], 0x11223344u);
  EXPECT_EQ(s.msrs.star, 0x0023001011223344ull);
  EXPECT_EQ(s.gpr[kRax], 0x11223344u);
  EXPECT_EQ(s.gpr[kRdx], 0x00230010u);
}

// Every MSR the CPU model answers by itself (the AMD MSRs and the legacy performance counters, docs/cpu-models.md)
// exits to the VMM on KVM, read and write, so that the session answers them on KVM exactly as on the software CPU;
// KVM's own answers (HWCR, DE_CFG, PATCH_LEVEL, its PMU's) never reach the guest.
TEST_F(KvmTest, ModelMsrsExitToTheVmm) {
  const CpuModel& model = CpuModel::x86_64_v2();
  ASSERT_FALSE(model.msrs().empty());
  auto v2 = make_kvm_backend(*memory_, model);
  ASSERT_TRUE(v2) << v2.error().message;
  backend_ = std::move(*v2);
  load(kCode, {0x0f, 0x32,   // rdmsr
               0x0f, 0x30,   // wrmsr: what it read, back
               0xf4});
  for (const ModelMsr& m : model.msrs()) {
    SCOPED_TRACE(fmt::format("MSR {:#x}", m.index));
    CpuState s = long_mode(kCode);
    s.gpr[kRcx] = m.index;
    start(s);
    VcpuExit* exit = run();
    ASSERT_EQ(exit->kind, ExitKind::kMsrRead) << exit_kind_name(exit->kind);
    EXPECT_EQ(exit->msr, m.index);
    exit->value = m.value;
    exit = run();
    ASSERT_EQ(exit->kind, ExitKind::kMsrWrite) << exit_kind_name(exit->kind);
    EXPECT_EQ(exit->msr, m.index);
    EXPECT_EQ(exit->value, m.value);
    ASSERT_EQ(run()->kind, ExitKind::kHlt);
  }
}

TEST_F(KvmTest, MsrFaultAnswerRaisesGeneralProtection) {
  load(kCode, {
                  0xb9, 0x78, 0x56, 0x34, 0x12,  // 10000: mov ecx, 0x12345678
                  0x0f, 0x32,                    // 10005: rdmsr
                  0xf4,                          // 10007: hlt (never reached)
              });
  start(long_mode(kCode));
  VcpuExit* exit = run();
  ASSERT_EQ(exit->kind, ExitKind::kMsrRead);
  EXPECT_EQ(exit->msr, 0x12345678u);
  exit->fault = true;
  exit = run();
  ASSERT_EQ(exit->kind, ExitKind::kHlt);
  EXPECT_EQ(exit->rip, kGpHandler + 6);
  CpuState s = state();
  EXPECT_EQ(s.gpr[kR15], 13u);
  // #GP pushes an error code (0) above the interrupted RIP, which is the RDMSR itself (a fault).
  EXPECT_EQ(read_u64(s.gpr[kRsp]), 0u);
  EXPECT_EQ(read_u64(s.gpr[kRsp] + 8), 0x10005u);
}

TEST_F(KvmTest, InjectedInterruptRunsTheIdtHandler) {
  load(kCode, {
                  0xfb,        // 10000: sti
                  0xf4,        // 10001: hlt
                  0xeb, 0xfd,  // 10002: jmp 10001
              });
  start(long_mode(kCode));
  VcpuExit* exit = run();
  ASSERT_EQ(exit->kind, ExitKind::kHlt);
  EXPECT_EQ(exit->rip, 0x10001u);
  ASSERT_TRUE(backend_->can_inject_interrupt());
  auto injected = backend_->inject_interrupt(0x20);
  ASSERT_TRUE(injected) << injected.error().message;
  EXPECT_FALSE(backend_->can_inject_interrupt()) << "one interrupt is already pending";

  exit = run();
  ASSERT_EQ(exit->kind, ExitKind::kIoOut);
  EXPECT_EQ(exit->port, 0x90);
  EXPECT_EQ(exit->value, 0x20u);
  EXPECT_EQ(exit->rip, kTimerHandler + 3);
  CpuState s = state();
  // Frame after `push rax`: saved rax, then RIP (past the HLT), CS, RFLAGS (IF set), RSP, SS.
  EXPECT_EQ(read_u64(s.gpr[kRsp] + 8), 0x10002u);
  EXPECT_EQ(read_u64(s.gpr[kRsp] + 16), kCode64);
  EXPECT_NE(read_u64(s.gpr[kRsp] + 24) & rflags::kIf, 0u);
  EXPECT_EQ(s.rflags & rflags::kIf, 0u) << "an interrupt gate clears IF";

  exit = run();
  ASSERT_EQ(exit->kind, ExitKind::kHlt);
  EXPECT_EQ(exit->rip, 0x10001u);
}

TEST_F(KvmTest, InterruptWindowOpensAfterStiShadow) {
  load(kCode, {
                  0xfa,        // 10000: cli
                  0xe6, 0x91,  // 10001: out 0x91, al
                  0xfb,        // 10003: sti
                  0x90,        // 10004: nop (in the STI shadow)
                  0x90,        // 10005: nop
                  0xf4,        // 10006: hlt
              });
  start(long_mode(kCode));
  VcpuExit* exit = run();
  ASSERT_EQ(exit->kind, ExitKind::kIoOut);
  EXPECT_FALSE(backend_->can_inject_interrupt()) << "IF is clear";
  backend_->request_interrupt_window(true);
  exit = run();
  ASSERT_EQ(exit->kind, ExitKind::kInterruptWindow);
  EXPECT_GE(exit->rip, 0x10005u) << "the window cannot open inside the STI shadow";
  ASSERT_TRUE(backend_->can_inject_interrupt());
  backend_->request_interrupt_window(false);
  ASSERT_TRUE(backend_->inject_interrupt(0x20));
  exit = run();
  ASSERT_EQ(exit->kind, ExitKind::kIoOut);
  EXPECT_EQ(exit->port, 0x90);
  exit = run();
  ASSERT_EQ(exit->kind, ExitKind::kHlt);
  EXPECT_EQ(exit->rip, 0x10006u);
}

TEST_F(KvmTest, MmioOutsideRamExitsAsReadAndWrite) {
  load(kCode, {
                  0x48, 0xc7, 0xc3, 0x10, 0x00, 0x20, 0x00,  // 10000: mov rbx, 0x200010
                  0x8b, 0x03,                                // 10007: mov eax, [rbx]
                  0xc7, 0x43, 0x08, 0x78, 0x56, 0x34, 0x12,  // 10009: mov dword [rbx+8], 0x12345678
                  0xf4,                                      // 10010: hlt
              });
  start(long_mode(kCode));
  VcpuExit* exit = run();
  ASSERT_EQ(exit->kind, ExitKind::kMmioRead);
  EXPECT_EQ(exit->address, kMmio);
  EXPECT_EQ(exit->size, 4);
  EXPECT_EQ(exit->rip, 0x10007u);
  exit->value = 0xcafef00d;
  exit = run();
  ASSERT_EQ(exit->kind, ExitKind::kMmioWrite);
  EXPECT_EQ(exit->address, kMmio + 8);
  EXPECT_EQ(exit->size, 4);
  EXPECT_EQ(exit->value, 0x12345678u);
  EXPECT_EQ(exit->rip, 0x10010u);  // KVM completes an MMIO write before it exits (core/backend.h)
  exit = run();
  ASSERT_EQ(exit->kind, ExitKind::kHlt);
  EXPECT_EQ(state().gpr[kRax], 0xcafef00du);
}

TEST_F(KvmTest, TripleFaultStopsWithDiagnostic) {
  load(kCode, {0xe6, 0x80, 0x0f, 0x0b});  // out 0x80, al; ud2 with no IDT: #UD -> #GP -> #DF -> shutdown
  CpuState s = long_mode(kCode);
  s.idt = {0, 0};
  start(s);
  VcpuExit* exit = run();
  ASSERT_EQ(exit->kind, ExitKind::kIoOut);
  exit = run();
  ASSERT_EQ(exit->kind, ExitKind::kShutdown);
  EXPECT_NE(exit->detail.find("triple fault"), std::string::npos) << exit->detail;
  EXPECT_NE(exit->detail.find("cr0="), std::string::npos) << exit->detail;
  EXPECT_NE(exit->detail.find("last 1 exits"), std::string::npos) << exit->detail;
  EXPECT_NE(exit->detail.find("io-out rip=0x10000 at=0x80"), std::string::npos) << exit->detail;
  if (exit->detail.find("rip =000000000000fff0") != std::string::npos) {
    EXPECT_NE(exit->detail.find("resets the vCPU"), std::string::npos) << "SVM reset state must be flagged";
  }
}

TEST_F(KvmTest, KickStopsARunningAndTheNextRun) {
  load(kCode, {0xeb, 0xfe});  // jmp $
  start(long_mode(kCode));
  backend_->kick();
  VcpuExit* exit = run();
  ASSERT_EQ(exit->kind, ExitKind::kKicked) << "a kick before run() stops the next run()";

  std::thread kicker([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    backend_->kick();
  });
  exit = run();
  kicker.join();
  ASSERT_EQ(exit->kind, ExitKind::kKicked);
  EXPECT_EQ(exit->rip, kCode);
  EXPECT_EQ(state().rip, kCode);

  // A consumed kick does not linger: the guest runs on until the next OUT.
  load(kCode, {0xe6, 0x80, 0xf4});  // out 0x80, al; hlt
  start(long_mode(kCode));
  exit = run();
  EXPECT_EQ(exit->kind, ExitKind::kIoOut);
}

// The PMU overflow signal follows the kick signal's discipline: it interrupts a running KVM_RUN, one sent outside
// KVM_RUN stops the next run() instead of being lost, and a delivered one does not linger. Sent by hand here, as
// the kernel would with F_SETSIG, since the nested guest has no PMU to overflow.
TEST_F(KvmTest, PmuOverflowSignalStopsKvmRunLikeAKick) {
  load(kCode, {0xeb, 0xfe});  // jmp $
  start(long_mode(kCode));
  backend_->kick();
  ASSERT_EQ(run()->kind, ExitKind::kKicked);  // the first run() installs the signal mask

  // A run() that the signal fails to stop is ended by a kick after 3 s, and the test fails on the time taken.
  pthread_t vcpu = ::pthread_self();
  auto timed_run = [&](int signal_after_ms) {
    std::thread overflow([&] {
      if (signal_after_ms >= 0) {
        std::this_thread::sleep_for(std::chrono::milliseconds(signal_after_ms));
        ::pthread_kill(vcpu, pmu_overflow_signal());
      }
    });
    std::atomic<bool> returned{false};
    std::thread watchdog([&] {
      for (int i = 0; i < 60 && !returned.load(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
      if (!returned.load()) backend_->kick();
    });
    auto begin = std::chrono::steady_clock::now();
    VcpuExit* exit = run();
    returned.store(true);
    double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
    overflow.join();
    watchdog.join();
    EXPECT_EQ(exit->kind, ExitKind::kKicked);
    return seconds;
  };

  ASSERT_EQ(::pthread_kill(vcpu, pmu_overflow_signal()), 0);  // outside KVM_RUN: blocked, stays pending
  EXPECT_LT(timed_run(-1), 1.0) << "an overflow outside KVM_RUN must stop the next one, not be lost";
  EXPECT_LT(timed_run(200), 2.0) << "an overflow during KVM_RUN must interrupt it";
  EXPECT_EQ(state().rip, kCode);

  load(kCode, {0xe6, 0x80, 0xf4});  // out 0x80, al; hlt
  start(long_mode(kCode));
  EXPECT_EQ(run()->kind, ExitKind::kIoOut) << "a consumed overflow signal does not linger";
}

TEST_F(KvmTest, StateRoundTrips) {
  CpuState s = long_mode(kCode);
  for (int i = 0; i < kGprCount; ++i) s.gpr[i] = 0x1111111111111111ull * (i + 1);
  s.gpr[kRsp] = kStackTop;
  s.rflags = 0x2 | rflags::kCf | rflags::kZf;
  s.cr2 = 0xdeadb000;
  s.msrs.lstar = 0xffffffff81000000ull;
  s.msrs.sfmask = 0x47700;
  s.msrs.kernel_gs_base = 0xffff888000000000ull;
  s.msrs.sysenter_esp = 0x7000;
  s.msrs.tsc_aux = 3;
  s.fs.base = 0x7fff00001000ull;
  uint16_t fcw = 0x27f;
  uint32_t mxcsr = 0x1fa0;
  std::memcpy(&s.fxsave[0], &fcw, 2);
  std::memcpy(&s.fxsave[24], &mxcsr, 4);
  for (int i = 0; i < 256; ++i) s.fxsave[160 + i] = static_cast<uint8_t>(i * 7);
  start(s);
  CpuState got = state();
  EXPECT_EQ(got.gpr, s.gpr);
  EXPECT_EQ(got.rip, s.rip);
  EXPECT_EQ(got.rflags, s.rflags);
  EXPECT_EQ(got.cs, s.cs);
  EXPECT_EQ(got.fs.base, s.fs.base);
  EXPECT_EQ(got.cr0, s.cr0);
  EXPECT_EQ(got.cr2, s.cr2);
  EXPECT_EQ(got.cr3, s.cr3);
  EXPECT_EQ(got.cr4, s.cr4);
  EXPECT_EQ(got.efer, s.efer);
  EXPECT_EQ(got.msrs, s.msrs);
  EXPECT_EQ(got.fxsave, s.fxsave);

  // The loaded state is what the guest computes with: add rax, rbx; movq rcx, xmm0; hlt.
  load(kCode, {0x48, 0x01, 0xd8, 0x66, 0x48, 0x0f, 0x7e, 0xc1, 0xf4});
  VcpuExit* exit = run();
  ASSERT_EQ(exit->kind, ExitKind::kHlt);
  CpuState after = state();
  EXPECT_EQ(after.gpr[kRax], s.gpr[kRax] + s.gpr[kRbx]);
  uint64_t xmm0_low = 0;
  std::memcpy(&xmm0_low, &s.fxsave[160], 8);
  EXPECT_EQ(after.gpr[kRcx], xmm0_low);
}

// The AVX state (the upper halves of the YMM registers) and XCR0 go in and come out, and are what the guest
// computes with: on the x86-64-v3 model, where this host's KVM has it.
TEST_F(KvmTest, YmmStateAndXcr0RoundTrip) {
  auto v3 = make_kvm_backend(*memory_, CpuModel::x86_64_v3());
  if (!v3) GTEST_SKIP() << "no x86-64-v3 on this host's KVM: " << v3.error().message;
  backend_ = std::move(*v3);
  CpuState s = long_mode(kCode);
  s.cr4 |= cr4::kOsxsave;
  s.xcr0 = 7;
  for (int i = 0; i < 256; ++i) s.ymmh[size_t(i)] = static_cast<uint8_t>(i * 5 + 1);
  for (int i = 0; i < 256; ++i) s.fxsave[160 + i] = static_cast<uint8_t>(i * 7);
  uint32_t mxcsr = 0x1f80;
  std::memcpy(&s.fxsave[24], &mxcsr, 4);
  start(s);
  CpuState got = state();
  EXPECT_EQ(got.xcr0, 7u);
  EXPECT_EQ(got.ymmh, s.ymmh);
  EXPECT_EQ(got.fxsave, s.fxsave);
  // vextracti128 xmm1, ymm0, 1; vmovq rcx, xmm1; xor ecx... : RCX = YMM0 bits 128-191; xgetbv: RAX = XCR0; then
  // vpcmpeqb ymm2, ymm2, ymm2 (all ones); hlt.
  load(kCode, {0xc4, 0xe3, 0x7d, 0x39, 0xc1, 0x01,  // vextracti128 xmm1, ymm0, 1
               0xc4, 0xe1, 0xf9, 0x7e, 0xc9,        // vmovq rcx, xmm1
               0x48, 0x89, 0xcb,                    // mov rbx, rcx
               0x31, 0xc9,                          // xor ecx, ecx
               0x0f, 0x01, 0xd0,                    // xgetbv
               0xc5, 0xed, 0x74, 0xd2,              // vpcmpeqb ymm2, ymm2, ymm2
               0xf4});
  VcpuExit* exit = run();
  ASSERT_EQ(exit->kind, ExitKind::kHlt);
  CpuState after = state();
  uint64_t ymm0_high = 0;
  std::memcpy(&ymm0_high, &s.ymmh[0], 8);
  EXPECT_EQ(after.gpr[kRbx], ymm0_high);
  EXPECT_EQ(after.gpr[kRax], 7u);
  for (int i = 0; i < 16; ++i) EXPECT_EQ(after.ymmh[32 + i], 0xff) << i;
}

// The guest's own XSETBV must reach KVM, which keeps the guest's XCR0 across exits and reports it in get_state. QEMU's
// TCG (the nested harness) does not intercept XSETBV for a nested guest, so there L1 KVM never sees it and restores
// XCR0 = 1 at the next entry: the usability check then refuses x86-64-v3 (docs/kvm.md).
TEST_F(KvmTest, GuestXsetbvReachesKvm) {
  auto v3 = make_kvm_backend(*memory_, CpuModel::x86_64_v3());
  if (!v3) GTEST_SKIP() << "no x86-64-v3 on this host's KVM: " << v3.error().message;
  backend_ = std::move(*v3);
  CpuState s = long_mode(kCode);
  s.cr4 |= cr4::kOsxsave;
  load(kCode, {0x31, 0xc9,                    // xor ecx, ecx
               0xb8, 0x07, 0x00, 0x00, 0x00,  // mov eax, 7: x87, SSE and AVX state
               0x31, 0xd2,                    // xor edx, edx
               0x0f, 0x01, 0xd1,              // xsetbv
               0xf4});
  start(s);
  VcpuExit* exit = run();
  ASSERT_EQ(exit->kind, ExitKind::kHlt) << exit->detail;
  const uint64_t xcr0 = state().xcr0;
  if (xcr0 == 1 && under_qemu_tcg()) {
    std::printf("[   INFO   ] the guest's XSETBV did not reach KVM: known QEMU 7.2 TCG nested-SVM limitation\n");
    return;
  }
  EXPECT_EQ(xcr0, 7u);
}

TEST_F(KvmTest, ProtectedModeMultibootEntryRuns) {
  load(kCode, {
                  0xb8, 0x02, 0xb0, 0xad, 0x2b,  // 10000: mov eax, 0x2badb002
                  0xe6, 0x80,                    // 10005: out 0x80, al
                  0xf4,                          // 10007: hlt
              });
  CpuState s = protected_mode(kCode);
  s.gpr[kRbx] = 0x9500;  // Multiboot info pointer
  start(s);
  VcpuExit* exit = run();
  ASSERT_EQ(exit->kind, ExitKind::kIoOut) << exit->detail;
  EXPECT_EQ(exit->value, 0x02u);
  EXPECT_EQ(exit->rip, 0x10005u);
  exit = run();
  ASSERT_EQ(exit->kind, ExitKind::kHlt);
  CpuState after = state();
  EXPECT_EQ(after.gpr[kRax], 0x2badb002u);
  EXPECT_EQ(after.gpr[kRbx], 0x9500u);
  EXPECT_FALSE(after.cs.l);
  EXPECT_TRUE(after.cs.db);
  EXPECT_EQ(after.efer & efer::kLma, 0u);
}

TEST_F(KvmTest, ExitRate) {
  load(kCode, {0xe6, 0x80, 0xeb, 0xfc});  // out 0x80, al; jmp back
  start(long_mode(kCode));
  constexpr int kExits = 2000;
  auto begin = std::chrono::steady_clock::now();
  for (int i = 0; i < kExits; ++i) {
    VcpuExit* exit = run();
    ASSERT_EQ(exit->kind, ExitKind::kIoOut);
    ASSERT_EQ(exit->rip, kCode);
  }
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
  double rate = kExits / seconds;
  RecordProperty("exits_per_second", static_cast<int>(rate));
  std::printf("[   INFO   ] %d port-I/O exits in %.3f s: %.0f exits/s, %.1f us per exit\n", kExits, seconds, rate,
              1e6 / rate);
}

}  // namespace
}  // namespace deja
