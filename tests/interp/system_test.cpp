// Interp backend: paging faults, IDT delivery (IST, privilege change), SYSCALL/SYSRET, interrupts, mode switches.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include "tests/interp/interp_test_util.h"

namespace deja::test {
namespace {

constexpr uint64_t kHandler = kCode + 0x800;

void handler(TestVm& vm, uint64_t at, const std::string& source) { vm.load(at, assemble(source, at)); }

TEST(InterpSystem, PageFaultNotPresentSetsCr2AndErrorCode) {
  TestVm vm = TestVm::long_mode();
  vm.idt_gate(14, kHandler);
  handler(vm, kHandler, "pop r14\n mov r15, cr2\n mov r13, [rsp]\n hlt\n");
  vm.code("mov rax, 0x40000010\n mov qword ptr [rax], 1\n hlt\n");
  ASSERT_EQ(vm.run().kind, ExitKind::kHlt);
  CpuState s = vm.state();
  EXPECT_EQ(s.gpr[kR14], 0x2u);  // write, not present, supervisor
  EXPECT_EQ(s.gpr[kR15], 0x40000010u);
  EXPECT_EQ(s.cr2, 0x40000010u);
  EXPECT_EQ(s.gpr[kR13], kCode + 7);  // the faulting instruction (after a 7-byte MOV), not the next one
}

TEST(InterpSystem, PageFaultProtectionAndDirtyBits) {
  TestVm vm = TestVm::long_mode();
  vm.idt_gate(14, kHandler);
  handler(vm, kHandler, "pop r14\n mov r15, cr2\n hlt\n");
  vm.write64(kPt + 0x1f0 * 8, 0x1f0000 | 0x5);  // present, user, read-only
  vm.code("mov qword ptr [0x1e0008], 7\n mov rax, [0x1f0000]\n mov qword ptr [0x1f0008], 1\n hlt\n");
  ASSERT_EQ(vm.run().kind, ExitKind::kHlt);
  CpuState s = vm.state();
  EXPECT_EQ(s.gpr[kR14], 0x3u);  // present + write (CR0.WP makes supervisor writes fault)
  EXPECT_EQ(s.gpr[kR15], 0x1f0008u);
  EXPECT_EQ(vm.read64(kPt + 0x1e0 * 8) & 0x60, 0x60u);  // accessed + dirty
  EXPECT_EQ(vm.read64(kPt + 0x1f0 * 8) & 0x60, 0x20u);  // accessed only
}

TEST(InterpSystem, NoExecutePageFaultsOnFetch) {
  TestVm vm = TestVm::long_mode();
  vm.idt_gate(14, kHandler);
  handler(vm, kHandler, "pop r14\n mov r15, cr2\n hlt\n");
  vm.write64(kPt + 0x1f0 * 8, 0x1f0000 | 0x3 | (1ull << 63));
  vm.code("mov rax, 0x1f0000\n call rax\n hlt\n");
  ASSERT_EQ(vm.run().kind, ExitKind::kHlt);
  EXPECT_EQ(vm.state().gpr[kR14], 0x11u);  // present + instruction fetch
  EXPECT_EQ(vm.state().gpr[kR15], 0x1f0000u);
}

TEST(InterpSystem, TlbHonoursInvlpgAndCr3Reload) {
  TestVm vm = TestVm::long_mode();
  vm.write64(0x1e0000, 0xaaaa);
  vm.write64(0x1d0000, 0xbbbb);
  vm.code(R"(
    mov rax, [0x1e0000]
    mov qword ptr [0x7000 + 0x1e0 * 8], 0x1d0007
    mov rbx, [0x1e0000]
    invlpg [0x1e0000]
    mov rcx, [0x1e0000]
    hlt
  )");
  ASSERT_EQ(vm.run().kind, ExitKind::kHlt);
  CpuState s = vm.state();
  EXPECT_EQ(s.gpr[kRax], 0xaaaau);
  EXPECT_EQ(s.gpr[kRbx], 0xaaaau);  // stale translation until INVLPG, as on hardware
  EXPECT_EQ(s.gpr[kRcx], 0xbbbbu);
}

// The TLB's size is machine model: a trace records it and a replay adopts it. Page 0x1e0000 and page 0x0e0000 share
// an entry of a 256-entry TLB, so the second evicts the first's stale translation; with 2048 entries it stays.
TEST(InterpSystem, TlbSizeDecidesWhichStaleTranslationsSurvive) {
  for (const uint32_t entries : {256u, kSoftwareTlbEntries}) {
    SCOPED_TRACE(entries);
    TestVm vm = TestVm::long_mode();
    ASSERT_TRUE(vm.cpu->adopt_software_tlb_entries(entries));
    vm.write64(0x1e0000, 0xaaaa);
    vm.write64(0x1d0000, 0xbbbb);
    vm.code(R"(
      mov rax, [0x1e0000]
      mov qword ptr [0x7000 + 0x1e0 * 8], 0x1d0007
      mov rbx, [0x0e0000]
      mov rcx, [0x1e0000]
      hlt
    )");
    ASSERT_EQ(vm.run().kind, ExitKind::kHlt);
    EXPECT_EQ(vm.state().gpr[kRcx], entries == 256 ? 0xbbbbu : 0xaaaau);
  }
  TestVm vm = TestVm::long_mode();
  for (const uint32_t entries : {0u, 8u, 1000u, 4096u}) EXPECT_FALSE(vm.cpu->adopt_software_tlb_entries(entries)) << entries;
}

// With CR4.PGE a global translation survives a CR3 reload; a non-global one is walked again.
TEST(InterpSystem, GlobalPagesSurviveCr3Reload) {
  TestVm vm = TestVm::long_mode();
  CpuState s = vm.state();
  s.cr4 |= cr4::kPge;
  vm.set_state(s);
  vm.write64(kPt + 0x1e0 * 8, 0x1e0000 | 0x107);  // global
  vm.write64(0x1e0000, 0xaaaa);
  vm.write64(0x1e1000, 0xcccc);
  vm.write64(0x1d0000, 0xbbbb);
  vm.code(R"(
    mov rax, [0x1e0000]
    mov rbx, [0x1e1000]
    mov qword ptr [0x7000 + 0x1e0 * 8], 0x1d0107
    mov qword ptr [0x7000 + 0x1e1 * 8], 0x1d0007
    mov rdx, cr3
    mov cr3, rdx
    mov rcx, [0x1e0000]
    mov rsi, [0x1e1000]
    hlt
  )");
  ASSERT_EQ(vm.run().kind, ExitKind::kHlt);
  s = vm.state();
  EXPECT_EQ(s.gpr[kRax], 0xaaaau);
  EXPECT_EQ(s.gpr[kRbx], 0xccccu);
  EXPECT_EQ(s.gpr[kRcx], 0xaaaau);  // global: still the old translation
  EXPECT_EQ(s.gpr[kRsi], 0xbbbbu);  // non-global: re-walked after the CR3 load
}

// IRETQ to ring 3, INT from ring 3 through a DPL-3 gate with IST, and through one using TSS.RSP0.
TEST(InterpSystem, InterruptFromRing3WithIstAndRsp0) {
  for (uint8_t ist : {1, 0}) {
    TestVm vm = TestVm::long_mode();
    vm.write64(kTss + 4, 0x70000);   // RSP0
    vm.write64(kTss + 36, 0x60000);  // IST1
    vm.idt_gate(0x80, kHandler, ist, 3);
    handler(vm, kHandler, "mov r12, [rsp]\n mov r13, [rsp + 8]\n mov r14, [rsp + 32]\n mov r15, rsp\n mov r11, cs\n hlt\n");
    vm.code(R"(
      push 0x23
      push 0x50000
      push 0x202
      push 0x2b
      lea rax, [rip + user]
      push rax
      iretq
    user:
      mov rbx, cs
      mov rcx, ss
      int 0x80
    )");
    ASSERT_EQ(vm.run().kind, ExitKind::kHlt);
    CpuState s = vm.state();
    EXPECT_EQ(s.gpr[kRbx], 0x2bu);
    EXPECT_EQ(s.gpr[kRcx], 0x23u);
    EXPECT_EQ(s.gpr[kR13], 0x2bu);
    EXPECT_EQ(s.gpr[kR14], 0x23u);
    EXPECT_EQ(s.gpr[kR15], (ist ? 0x60000u : 0x70000u) - 40);
    EXPECT_EQ(s.gpr[kR11], 0x08u);
    EXPECT_EQ(s.cs.dpl, 0);
    EXPECT_EQ(vm.read64((ist ? 0x60000u : 0x70000u) - 16), 0x50000u);  // the user RSP in the frame
  }
}

// Loading a descriptor into CS or SS sets its accessed bit in the GDT (SDM vol. 3A 3.4.5.1): here
// IRETQ loads CS 0x2b and SS 0x23, and the INT 0x80 gate loads CS 0x08.
TEST(InterpSystem, IretqAndEventDeliverySetDescriptorAccessedBits) {
  TestVm vm = TestVm::long_mode();
  for (uint64_t selector : {0x08, 0x20, 0x28}) vm.write64(kGdt + selector, vm.read64(kGdt + selector) & ~(1ull << 40));
  vm.write64(kTss + 4, 0x70000);
  vm.idt_gate(0x80, kHandler, 0, 3);
  handler(vm, kHandler, "hlt\n");
  vm.code("push 0x23\n push 0x50000\n push 0x2\n push 0x2b\n lea rax, [rip + 1f]\n push rax\n iretq\n 1: int 0x80\n");
  ASSERT_EQ(vm.run().kind, ExitKind::kHlt);
  for (uint64_t selector : {0x08, 0x20, 0x28}) EXPECT_TRUE(vm.read64(kGdt + selector) & (1ull << 40)) << selector;
  EXPECT_EQ(vm.state().cs.type & 1, 1);
}

TEST(InterpSystem, IntThroughDpl0GateFromRing3IsGeneralProtection) {
  TestVm vm = TestVm::long_mode();
  vm.write64(kTss + 4, 0x70000);
  vm.idt_gate(0x81, kHandler + 0x100, 0, 0);
  vm.idt_gate(13, kHandler);
  handler(vm, kHandler, "pop r14\n hlt\n");
  vm.code("push 0x23\n push 0x50000\n push 0x2\n push 0x2b\n lea rax, [rip + 1f]\n push rax\n iretq\n 1: int 0x81\n");
  ASSERT_EQ(vm.run().kind, ExitKind::kHlt);
  EXPECT_EQ(vm.state().gpr[kR14], 0x81u * 8 + 2);
}

TEST(InterpSystem, SyscallSysretRoundTrip) {
  TestVm vm = TestVm::long_mode();
  vm.code(R"(
    mov ecx, 0xc0000081
    xor eax, eax
    mov edx, 0x00180008
    wrmsr
    mov ecx, 0xc0000082
    lea rax, [rip + entry]
    mov rdx, rax
    shr rdx, 32
    wrmsr
    mov ecx, 0xc0000084
    mov eax, 0x200
    xor edx, edx
    wrmsr
    push 0x23
    push 0x50000
    push 0x202
    push 0x2b
    lea rax, [rip + user]
    push rax
    iretq
  user:
    mov rdi, 5
    syscall
    mov r12, cs
    mov r13, rdi
    pushfq
    pop r14
    xor edi, edi
    syscall
  entry:
    test rdi, rdi
    jz done
    mov r8, rcx
    mov r9, r11
    mov r10, cs
    pushfq
    pop rbx
    add rdi, 1
    sysretq
  done:
    hlt
  )");
  ASSERT_EQ(vm.run().kind, ExitKind::kHlt);
  CpuState s = vm.state();
  EXPECT_EQ(s.gpr[kR10], 0x08u);
  EXPECT_EQ(s.gpr[kR9] & 0x200, 0x200u);   // R11 holds the user RFLAGS
  EXPECT_EQ(s.gpr[kRbx] & 0x200, 0u);      // SFMASK cleared IF in the kernel
  EXPECT_EQ(s.gpr[kR12], 0x2bu);
  EXPECT_EQ(s.gpr[kR13], 6u);
  EXPECT_EQ(s.gpr[kR14] & 0x200, 0x200u);
  EXPECT_EQ(s.cs.selector, 0x08);
  EXPECT_EQ(s.ss.selector, 0x10);
}

// SYSCALL in compatibility mode: AMD's CPUs enter the 64-bit kernel at CSTAR (what Linux's 32-bit programs do on
// AMD); Intel's, and the models under deja's own vendor, raise #UD.
TEST(InterpSystem, CompatibilityModeSyscallFollowsTheVendor) {
  const std::string program = R"(
    mov ecx, 0xc0000080
    rdmsr
    or eax, 1
    wrmsr
    mov ecx, 0xc0000081
    xor eax, eax
    mov edx, 0x00180008
    wrmsr
    mov ecx, 0xc0000083
    lea rax, [rip + entry]
    mov rdx, rax
    shr rdx, 32
    wrmsr
    lea rax, [rip + compat]
    mov dword ptr [rip + compat_ptr], eax
    jmp fword ptr [rip + compat_ptr]
  compat_ptr:
    .long 0
    .word 0x18
  .code32
  compat:
    mov edi, 7
    syscall
  .code64
  entry:
    mov r8, rcx
    mov r10, cs
    hlt
  )";
  TestVm amd = TestVm::long_mode(16 << 20, CpuModel::x86_64_v1());
  amd.code(program);
  ASSERT_EQ(amd.run().kind, ExitKind::kHlt);
  CpuState s = amd.state();
  EXPECT_EQ(s.gpr[kR10], 0x08u);
  EXPECT_TRUE(s.cs.l);
  EXPECT_EQ(s.gpr[kRdi], 7u);
  EXPECT_NE(s.gpr[kR8], 0u) << "RCX holds the return address in the 32-bit code";

  TestVm other = TestVm::long_mode(16 << 20, *CpuModel::for_trace("x86-64-v1", 2));
  other.idt_gate(6, kHandler);
  handler(other, kHandler, "mov r15, 6\n hlt\n");
  other.code(program);
  ASSERT_EQ(other.run().kind, ExitKind::kHlt);
  EXPECT_EQ(other.state().gpr[kR15], 6u) << "#UD under DejaVuReplay";
}

TEST(InterpSystem, DoubleFaultThenTripleFaultShutdown) {
  TestVm vm = TestVm::long_mode();
  vm.idt_gate(8, kHandler);
  handler(vm, kHandler, "pop r14\n mov r15, 8\n hlt\n");
  // No #GP gate: #GP -> #NP while delivering (both contributory) -> #DF.
  vm.code("mov rax, 0x8000000000000000\n mov qword ptr [rax], 1\n hlt\n");
  ASSERT_EQ(vm.run().kind, ExitKind::kHlt);
  EXPECT_EQ(vm.state().gpr[kR15], 8u);
  EXPECT_EQ(vm.state().gpr[kR14], 0u);

  TestVm empty = TestVm::long_mode();
  CpuState s = empty.state();
  s.idt.limit = 0;
  empty.set_state(s);
  empty.code("ud2\n");
  VcpuExit exit = empty.run();
  ASSERT_EQ(exit.kind, ExitKind::kShutdown);
  EXPECT_NE(exit.detail.find("triple fault"), std::string::npos) << exit.detail;
}

TEST(InterpSystem, ProtectedModeFaultWithoutIdtTripleFaults) {
  TestVm vm = TestVm::protected_mode();
  vm.code("ud2\n", 32);
  VcpuExit exit = vm.run();
  EXPECT_EQ(exit.kind, ExitKind::kShutdown);
}

TEST(InterpSystem, HltExitAndWakeByInjection) {
  TestVm vm = TestVm::long_mode();
  vm.idt_gate(0x20, kHandler);
  handler(vm, kHandler, "mov r15, 0x20\n iretq\n");
  vm.code("sti\n hlt\n mov r14, 1\n hlt\n");
  VcpuExit exit = vm.run();
  ASSERT_EQ(exit.kind, ExitKind::kHlt);
  EXPECT_EQ(exit.rip, kCode + 1);
  EXPECT_EQ(vm.state().rip, kCode + 2);
  EXPECT_TRUE(vm.state().halted);
  // Still halted without an interrupt.
  ASSERT_EQ(vm.run().kind, ExitKind::kHlt);
  ASSERT_TRUE(vm.cpu->can_inject_interrupt());
  ASSERT_TRUE(vm.cpu->inject_interrupt(0x20).has_value());
  ASSERT_EQ(vm.run().kind, ExitKind::kHlt);
  EXPECT_EQ(vm.state().gpr[kR15], 0x20u);
  EXPECT_EQ(vm.state().gpr[kR14], 1u);
}

TEST(InterpSystem, StiShadowDelaysInterruptWindow) {
  TestVm vm = TestVm::long_mode();
  vm.code("sti\n nop\n nop\n hlt\n");
  vm.cpu->request_interrupt_window(true);
  VcpuExit exit = vm.run();
  ASSERT_EQ(exit.kind, ExitKind::kInterruptWindow);
  // Not after STI itself (the shadow covers the next instruction), but after the NOP.
  EXPECT_EQ(vm.state().rip, kCode + 2);
  EXPECT_EQ(*vm.cpu->instruction_count(), 2u);
}

// STI, POPF and IRET run inside blocks and end the run of blocks: an interrupt IF held back lands where the
// reference delivers it, in every executor.
TEST(InterpSystem, InterruptHeldByIfLandsAfterStiPopfAndIretInsideBlocks) {
  struct Case {
    const char* name;
    const char* code;
    uint64_t rbx;  // what the handler finds: the instructions before it ran, none after
  };
  const Case cases[] = {
      {"sti (after its shadow)", "mov rbx, 1\n sti\n mov rbx, 2\n mov rbx, 3\n hlt\n", 2},
      {"popfq", "mov rbx, 1\n push 0x202\n popfq\n mov rbx, 2\n hlt\n", 1},
      {"iretq", "mov rbx, 1\n mov rax, rsp\n push 0x10\n push rax\n push 0x202\n push 0x08\n"
                "lea rax, [rip + 1f]\n push rax\n iretq\n 1: mov rbx, 2\n hlt\n", 1},
  };
  for (const InterpMode mode : {InterpMode::kReference, InterpMode::kThreaded, InterpMode::kJit}) {
    for (const Case& c : cases) {
      SCOPED_TRACE(fmt::format("{} in {}", c.name, interp_mode_name(mode)));
      TestVm vm = TestVm::long_mode();
      vm.cpu->set_mode(mode);
      vm.idt_gate(0x20, kHandler);
      handler(vm, kHandler, "mov r15, rbx\n hlt\n");
      vm.code(c.code);
      ASSERT_TRUE(vm.cpu->inject_interrupt(0x20).has_value());  // IF is 0: it waits
      ASSERT_EQ(vm.run().kind, ExitKind::kHlt);
      EXPECT_EQ(vm.state().gpr[kR15], c.rbx);
      EXPECT_EQ(vm.state().rip, kHandler + 4);  // (after the handler's HLT)
    }
  }
}

TEST(InterpSystem, MovSsShadowBlocksInjection) {
  TestVm vm = TestVm::long_mode();
  vm.code("sti\n nop\n mov ax, 0x10\n mov ss, ax\n nop\n hlt\n");
  vm.cpu->set_instruction_budget(4);  // stop right after MOV SS
  ASSERT_EQ(vm.run().kind, ExitKind::kKicked);
  EXPECT_FALSE(vm.cpu->can_inject_interrupt());
  vm.cpu->set_instruction_budget(1);
  ASSERT_EQ(vm.run().kind, ExitKind::kKicked);
  EXPECT_TRUE(vm.cpu->can_inject_interrupt());
}

TEST(InterpSystem, UnownedMsrExitsAndFaultBecomesGp) {
  TestVm vm = TestVm::long_mode();
  vm.idt_gate(13, kHandler);
  handler(vm, kHandler, "pop r14\n mov r15, 13\n hlt\n");
  vm.code("mov ecx, 0x1b\n rdmsr\n mov ebx, eax\n mov r8d, edx\n wrmsr\n hlt\n");
  VcpuExit* exit = *vm.cpu->run();
  ASSERT_EQ(exit->kind, ExitKind::kMsrRead);
  EXPECT_EQ(exit->msr, 0x1bu);
  exit->value = 0x00000001fee00900ull;
  exit = *vm.cpu->run();
  ASSERT_EQ(exit->kind, ExitKind::kMsrWrite);
  EXPECT_EQ(exit->value, 0x00000001fee00900ull);
  exit->fault = true;
  ASSERT_EQ((*vm.cpu->run())->kind, ExitKind::kHlt);
  CpuState s = vm.state();
  EXPECT_EQ(s.gpr[kRbx], 0xfee00900u);
  EXPECT_EQ(s.gpr[kR8], 1u);
  EXPECT_EQ(s.gpr[kR15], 13u);
}

TEST(InterpSystem, OwnedMsrsAndEferRules) {
  TestVm vm = TestVm::long_mode();
  vm.idt_gate(13, kHandler);
  handler(vm, kHandler, "mov r15, 13\n hlt\n");
  vm.code(R"(
    mov ecx, 0xc0000100
    mov eax, 0x1000
    xor edx, edx
    wrmsr
    mov rbx, fs:[0x10]
    mov ecx, 0xc0000080
    rdmsr
    mov r12, rax
    and eax, ~0x100
    wrmsr
    hlt
  )");
  vm.write64(0x1010, 0x5555);
  ASSERT_EQ(vm.run().kind, ExitKind::kHlt);
  CpuState s = vm.state();
  EXPECT_EQ(s.fs.base, 0x1000u);
  EXPECT_EQ(s.gpr[kRbx], 0x5555u);
  EXPECT_EQ(s.gpr[kR12] & 0xd01, 0xd01u);  // SCE, LME, LMA, NXE
  EXPECT_EQ(s.gpr[kR15], 13u);  // clearing LME with paging on is #GP
}

// The Multiboot entry state (32-bit protected mode, paging off) switching into long mode.
TEST(InterpSystem, ProtectedModeToLongMode) {
  TestVm vm = TestVm::protected_mode();
  vm.code(R"(
    mov esi, eax
    mov eax, cr4
    or eax, 0x20
    mov cr4, eax
    mov eax, 0x1000
    mov cr3, eax
    mov ecx, 0xc0000080
    rdmsr
    or eax, 0x100
    wrmsr
    mov eax, cr0
    or eax, 0x80000001
    mov cr0, eax
    .byte 0xea
    .long long64
    .word 0x08
  .code64
  long64:
    mov ax, 0x10
    mov ds, ax
    mov ss, ax
    mov rax, 0x123456789
    push rax
    pop rdx
    mov dx, 0x3f8
    mov al, 'L'
    out dx, al
    hlt
  )", 32);
  VcpuExit exit = vm.run();
  ASSERT_EQ(exit.kind, ExitKind::kIoOut);
  EXPECT_EQ(exit.value, uint64_t('L'));
  ASSERT_EQ(vm.run().kind, ExitKind::kHlt);
  CpuState s = vm.state();
  EXPECT_TRUE(s.efer & efer::kLma);
  EXPECT_TRUE(s.cs.l);
  EXPECT_EQ(s.gpr[kRsi], 0x2badb002u);
  EXPECT_EQ(s.gpr[kRdx] >> 16, 0x12345u);
}

TEST(InterpSystem, SingleStepTrapAfterEachInstruction) {
  TestVm vm = TestVm::long_mode();
  vm.idt_gate(1, kHandler);
  handler(vm, kHandler, "inc r15\n iretq\n");
  vm.code("pushfq\n or qword ptr [rsp], 0x100\n popfq\n nop\n nop\n pushfq\n and qword ptr [rsp], ~0x100\n popfq\n hlt\n");
  ASSERT_EQ(vm.run().kind, ExitKind::kHlt);
  // Traps after: nop, nop, pushfq, and, popfq (the POPF that sets TF does not trap itself).
  EXPECT_EQ(vm.state().gpr[kR15], 5u);
}

// A window search's steps (Session::step_to_interrupt_windows) as KVM takes them: the trap flag, set again at every
// run, traps after an instruction that began with it, except SYSRET and SYSCALL, which trap on the flag they leave
// (R11's, FMASK's), and an exception's delivery through a gate clears it. The vCPU then runs unstepped to its next
// exit. Without step_as_trap_flag (traces before window_steps_trap_flag), a step after every instruction.
struct StepSeen {
  ExitKind kind;
  uint64_t rip;
  bool operator==(const StepSeen&) const = default;
};
void PrintTo(const StepSeen& s, std::ostream* os) { *os << fmt::format("{}@{:#x}", int(s.kind), s.rip); }

std::vector<StepSeen> steps_to_hlt(TestVm& vm, const DebugControl& steps) {
  std::vector<StepSeen> seen;
  VcpuExit* exit = *vm.cpu->run();
  EXPECT_EQ(exit->kind, ExitKind::kIoOut);  // where the search starts
  EXPECT_TRUE(vm.cpu->set_debug(steps).has_value());
  do {
    exit = *vm.cpu->run();
    seen.push_back({exit->kind, exit->rip});
  } while (exit->kind != ExitKind::kHlt && seen.size() < 20);
  EXPECT_EQ(vm.state().rflags & 0x100, 0u);  // the step's TF is the VMM's
  return seen;
}

// The program and stops of KvmTest.SingleStepEndsAtSysretAndSyscall (tests/kvm), which KVM gives in the nested harness.
TEST(InterpSystem, WindowStepsAsTrapFlagEndAtSysretAndSyscall) {
  const std::string program = R"(
    out 0x80, al
    nop
    sysretq
  user:
    nop
    out 0x80, al
    syscall
  entry:
    nop
    hlt
  )";
  const uint64_t kernel = kCode + 2, sysret = kCode + 3, user = kCode + 6, user_out = kCode + 7,
                 user_syscall = kCode + 9, entry = kCode + 0xb, halt = kCode + 0xc;
  auto start = [&](TestVm& vm) {
    vm.code(program);
    CpuState s = vm.state();
    s.msrs.star = (uint64_t{0x18} << 48) | (uint64_t{kCode64} << 32);  // SYSRET: CS 0x2b, SS 0x23
    s.msrs.lstar = entry;
    s.msrs.sfmask = rflags::kIf | rflags::kTf;  // as Linux's
    s.gpr[kRcx] = user;
    s.gpr[kR11] = 0x3202;  // IOPL 3: the user OUT exits
    vm.set_state(s);
  };
  {
    TestVm vm = TestVm::long_mode();
    start(vm);
    EXPECT_EQ(steps_to_hlt(vm, {.single_step = true, .step_as_trap_flag = true}),
              (std::vector<StepSeen>{{ExitKind::kDebug, kernel},
                                     {ExitKind::kDebug, sysret},
                                     {ExitKind::kIoOut, user_out},       // SYSRET left TF clear: user code unstepped
                                     {ExitKind::kDebug, user_syscall},  // armed again at the exit
                                     {ExitKind::kHlt, halt}}));          // FMASK cleared TF: the kernel unstepped
    // The guest sees the step's TF where KVM's guest does: SYSCALL saved it in R11.
    EXPECT_EQ(vm.state().gpr[kR11] & rflags::kTf, rflags::kTf);
  }
  {
    TestVm vm = TestVm::long_mode();
    start(vm);
    EXPECT_EQ(steps_to_hlt(vm, {.single_step = true}),
              (std::vector<StepSeen>{{ExitKind::kDebug, kernel},
                                     {ExitKind::kDebug, sysret},
                                     {ExitKind::kDebug, user},
                                     {ExitKind::kDebug, user_out},
                                     {ExitKind::kIoOut, user_out},
                                     {ExitKind::kDebug, user_syscall},
                                     {ExitKind::kDebug, entry},
                                     {ExitKind::kDebug, halt},
                                     {ExitKind::kHlt, halt}}));
  }
}

TEST(InterpSystem, WindowStepsAsTrapFlagEndAtGateDelivery) {
  for (const bool trap_flag : {true, false}) {
    TestVm vm = TestVm::long_mode();
    vm.idt_gate(6, kHandler);
    handler(vm, kHandler, "mov rbx, [rsp + 16]\n hlt\n");
    vm.code("out 0x80, al\n ud2\n");
    const std::vector<StepSeen> seen = steps_to_hlt(vm, {.single_step = true, .step_as_trap_flag = trap_flag});
    if (trap_flag) {
      // The step after OUT; the #UD's delivery cleared TF, so the handler ran unstepped to its HLT, and the RFLAGS
      // it found on its stack has the step's TF, as under KVM (an IRET would bring the step back).
      EXPECT_EQ(seen, (std::vector<StepSeen>{{ExitKind::kDebug, kCode + 2}, {ExitKind::kHlt, kHandler + 5}}));
      EXPECT_EQ(vm.state().gpr[kRbx] & 0x100, 0x100u);
    } else {
      EXPECT_EQ(seen, (std::vector<StepSeen>{{ExitKind::kDebug, kCode + 2},
                                             {ExitKind::kDebug, kHandler},
                                             {ExitKind::kDebug, kHandler + 5},
                                             {ExitKind::kHlt, kHandler + 5}}));
      EXPECT_EQ(vm.state().gpr[kRbx] & 0x100, 0u);
    }
  }
}

TEST(InterpSystem, DivideErrorIsFault) {
  TestVm vm = TestVm::long_mode();
  vm.idt_gate(0, kHandler);
  handler(vm, kHandler, "mov r14, [rsp]\n hlt\n");
  vm.code("xor ecx, ecx\n mov eax, 1\n div ecx\n hlt\n");
  ASSERT_EQ(vm.run().kind, ExitKind::kHlt);
  EXPECT_EQ(vm.state().gpr[kR14], kCode + 7);
}

// Far transfers: RETFQ, JMP m16:64, and a round trip through compatibility mode (CS.L=0 under LMA).
TEST(InterpSystem, FarTransfersAndCompatibilityMode) {
  TestVm vm = TestVm::long_mode();
  vm.code(R"(
    push 0x08
    lea rax, [rip + after_retf]
    push rax
    retfq
  after_retf:
    mov r8, 1
    lea rax, [rip + far_ptr]
    rex.w jmp fword ptr [rax]
  far_ptr:
    .quad after_jmp
    .word 0x08
  after_jmp:
    mov r9, 2
    lea rax, [rip + compat]
    mov dword ptr [rip + compat_ptr], eax
    jmp fword ptr [rip + compat_ptr]
  compat_ptr:
    .long 0
    .word 0x18
  .code32
  compat:
    mov ecx, 0x11223344
    push 0x08
    call 1f
  1:
    add dword ptr [esp], back64 - 1b
    retf
  .code64
  back64:
    mov r10, rcx
    hlt
  )");
  ASSERT_EQ(vm.run().kind, ExitKind::kHlt);
  CpuState s = vm.state();
  EXPECT_EQ(s.gpr[kR8], 1u);
  EXPECT_EQ(s.gpr[kR9], 2u);
  EXPECT_EQ(s.gpr[kR10], 0x11223344u);
  EXPECT_TRUE(s.cs.l);
  EXPECT_EQ(s.cs.selector, 0x08);
}

TEST(InterpSystem, AtomicsAndWideCompareExchange) {
  TestVm vm = TestVm::long_mode();
  vm.write64(0x200000, 5);
  vm.write64(0x200010, 0x1111);
  vm.write64(0x200018, 0x2222);
  vm.code(R"(
    mov rdi, 0x200000
    mov eax, 3
    lock xadd qword ptr [rdi], rax
    mov r8, rax
    mov eax, 8
    mov ecx, 42
    lock cmpxchg qword ptr [rdi], rcx
    setz r9b
    mov eax, 0x1111
    mov edx, 0x2222
    mov ebx, 0x3333
    mov ecx, 0x4444
    lock cmpxchg16b xmmword ptr [rdi + 16]
    setz r10b
    hlt
  )");
  ASSERT_EQ(vm.run().kind, ExitKind::kHlt);
  CpuState s = vm.state();
  EXPECT_EQ(s.gpr[kR8], 5u);
  EXPECT_EQ(s.gpr[kR9] & 0xff, 1u);
  EXPECT_EQ(vm.read64(0x200000), 42u);
  EXPECT_EQ(s.gpr[kR10] & 0xff, 1u);
  EXPECT_EQ(vm.read64(0x200010), 0x3333u);
  EXPECT_EQ(vm.read64(0x200018), 0x4444u);
}

// Delivery through a 32-bit IDT (interrupt gate) and IRETD, in the Multiboot entry state.
TEST(InterpSystem, ProtectedModeIdtDeliveryAndIretd) {
  TestVm vm = TestVm::protected_mode();
  const uint64_t handler32 = kCode + 0x800;
  uint64_t gate = (handler32 & 0xffff) | (uint64_t(kCode32) << 16) | (0xeull << 40) | (1ull << 47) |
                  (((handler32 >> 16) & 0xffff) << 48);
  vm.write64(kIdt + 0x30 * 8, gate);
  vm.load(handler32, assemble(".code32\n mov esi, [esp]\n mov edi, [esp + 4]\n pushfd\n pop ebp\n iretd\n", handler32));
  vm.code(R"(
    lidt [idt_desc]
    sti
    int 0x30
    pushfd
    pop ebx
    hlt
  idt_desc:
    .word 0x7ff
    .long 0x4000
  )", 32);
  ASSERT_EQ(vm.run().kind, ExitKind::kHlt);
  CpuState s = vm.state();
  EXPECT_EQ(s.gpr[kRsi], kCode + 10);  // return EIP: after LIDT (7), STI (1), INT 0x30 (2)
  EXPECT_EQ(s.gpr[kRdi], kCode32);
  EXPECT_EQ(s.gpr[kRbp] & 0x200, 0u);    // the interrupt gate cleared IF
  EXPECT_EQ(s.gpr[kRbx] & 0x200, 0x200u);  // IRETD restored it
}

TEST(InterpSystem, RepOutsbExitsOncePerByte) {
  TestVm vm = TestVm::long_mode();
  vm.load(0x200000, {'a', 'b', 'c'});
  vm.code("mov rsi, 0x200000\n mov ecx, 3\n mov dx, 0x3f8\n rep outsb\n hlt\n");
  std::string text;
  for (;;) {
    VcpuExit exit = vm.run();
    if (exit.kind != ExitKind::kIoOut) {
      EXPECT_EQ(exit.kind, ExitKind::kHlt);
      break;
    }
    text += char(exit.value);
    EXPECT_EQ(exit.rip, kCode + 7 + 5 + 4);
  }
  EXPECT_EQ(text, "abc");
  EXPECT_EQ(*vm.cpu->instruction_count(), 5u);
}

TEST(InterpSystem, VerrAndVerwCheckSelectorsWithoutFaulting) {
  // Each check leaves ZF in one bit of R8: data DPL0, code DPL0 (read, write), user data with RPL 3, data DPL0
  // with RPL 3, the TSS, the null selector, a selector beyond the GDT limit, and a register operand.
  TestVm vm = TestVm::long_mode();
  vm.idt_gate(6, kHandler);
  handler(vm, kHandler, "mov r15, 6\n hlt\n");
  vm.code(R"(
    xor r8d, r8d
    mov word ptr [0x200000], 0x10
    verw word ptr [0x200000]
    setz al
    or r8b, al
    mov cx, 0x08
    verr cx
    setz al
    shl al, 1
    or r8b, al
    verw cx
    setz al
    shl al, 2
    or r8b, al
    mov cx, 0x23
    verw cx
    setz al
    shl al, 3
    or r8b, al
    mov cx, 0x13
    verw cx
    setz al
    shl al, 4
    or r8b, al
    mov cx, 0x30
    verr cx
    setz al
    shl al, 5
    or r8b, al
    xor ecx, ecx
    verw cx
    setz al
    shl al, 6
    or r8b, al
    mov cx, 0x1000
    verr cx
    setz al
    shl al, 7
    or r8b, al
    hlt
  )");
  ASSERT_EQ(vm.run().kind, ExitKind::kHlt);
  const CpuState s = vm.state();
  EXPECT_EQ(s.gpr[kR15], 0u);           // no #UD: interp has VERR/VERW
  EXPECT_EQ(s.gpr[kR8] & 0xff, 0x0bu);  // data writable, code readable, user data writable; the rest not
  EXPECT_TRUE(vm.cpu->unimplemented_counts().empty());
}

}  // namespace
}  // namespace deja::test
