// Interp backend: instruction execution, exits, progress counting and the decode cache.
#include <gtest/gtest.h>

#include <cstdlib>

#include "tests/interp/interp_test_util.h"

namespace deja::test {
namespace {

TEST(InterpBasic, SerialOutputThenExitPort) {
  TestVm vm = TestVm::long_mode();
  vm.code(R"(
    mov dx, 0x3f8
    mov al, 'O'
    out dx, al
    mov al, 'K'
    out dx, al
    mov al, 0x31
    out 0xf4, al
  )");
  std::string text;
  for (;;) {
    VcpuExit exit = vm.run();
    ASSERT_EQ(exit.kind, ExitKind::kIoOut);
    if (exit.port == 0xf4) {
      EXPECT_EQ(exit.value, 0x31u);
      EXPECT_EQ(exit.size, 1);
      break;
    }
    EXPECT_EQ(exit.port, 0x3f8);
    text += char(exit.value);
  }
  EXPECT_EQ(text, "OK");
  EXPECT_EQ(*vm.cpu->instruction_count(), 6u);  // the final OUT has not retired yet
}

TEST(InterpBasic, ArithmeticLoopAndCounts) {
  TestVm vm = TestVm::long_mode();
  vm.code(R"(
    xor eax, eax
    mov ecx, 100
  1:
    add rax, rcx
    dec ecx
    jnz 1b
    imul rax, rax, 3
    mov rbx, 7
    xor edx, edx
    div rbx
    hlt
  )");
  VcpuExit exit = vm.run();
  ASSERT_EQ(exit.kind, ExitKind::kHlt);
  CpuState s = vm.state();
  EXPECT_EQ(s.gpr[kRax], 5050u * 3 / 7);
  EXPECT_EQ(s.gpr[kRdx], 5050u * 3 % 7);
  EXPECT_EQ(*vm.cpu->branch_count(), 100u);
  EXPECT_EQ(*vm.cpu->instruction_count(), 2u + 300 + 5);
}

// Every conditional-branch kind counts once per execution, taken or not; JMP/CALL/RET do not count.
TEST(InterpBasic, ConditionalBranchKindsCount) {
  struct Case {
    const char* name;
    const char* body;
    uint64_t branches;
  } cases[] = {
      {"jz not taken", "cmp eax, 1\n jz 1f\n 1:", 1},
      {"jz taken", "cmp eax, eax\n jz 1f\n nop\n 1:", 1},
      {"jnz rel32", "cmp eax, 1\n .byte 0x0f, 0x85\n .long 0\n", 1},
      {"jrcxz", "xor ecx, ecx\n jrcxz 1f\n 1:\n mov ecx, 1\n jrcxz 2f\n 2:", 2},
      {"jecxz", "xor ecx, ecx\n jecxz 1f\n 1:", 1},
      {"loop", "mov ecx, 5\n 1: loop 1b", 5},
      {"loope", "mov ecx, 5\n cmp eax, eax\n 1: loope 1b", 5},
      {"loopne", "mov ecx, 5\n cmp eax, 1\n 1: loopne 1b", 5},
      {"all 16 jcc", "jo 1f\n 1: jno 1f\n 1: jb 1f\n 1: jae 1f\n 1: je 1f\n 1: jne 1f\n 1: jbe 1f\n 1: ja 1f\n 1:"
                     "js 1f\n 1: jns 1f\n 1: jp 1f\n 1: jnp 1f\n 1: jl 1f\n 1: jge 1f\n 1: jle 1f\n 1: jg 1f\n 1:", 16},
      {"unconditional", "jmp 1f\n 1: call 2f\n jmp 3f\n 2: ret\n 3: lea rax, [rip + 4f]\n jmp rax\n 4:", 0},
      {"cmov/setcc", "cmp eax, ebx\n cmovz eax, ebx\n setz cl", 0},
  };
  for (const Case& c : cases) {
    TestVm vm = TestVm::long_mode();
    vm.code(std::string(c.body) + "\n hlt\n");
    ASSERT_EQ(vm.run().kind, ExitKind::kHlt) << c.name;
    EXPECT_EQ(*vm.cpu->branch_count(), c.branches) << c.name;
  }
}

TEST(InterpBasic, SelfModifyingCodeInSamePage) {
  TestVm vm = TestVm::long_mode();
  vm.code(R"(
    mov ecx, 2
  1:
    lea rbx, [rip + 2f]
    mov eax, 0
  2:
    mov edx, 0x11111111
    add eax, edx
    mov dword ptr [rbx + 1], 0x22222222
    dec ecx
    jnz 1b
    hlt
  )");
  ASSERT_EQ(vm.run().kind, ExitKind::kHlt);
  // First pass executes the original immediate, the second the stored one: the cached decode was dropped.
  EXPECT_EQ(vm.state().gpr[kRax], 0x22222222u);
  EXPECT_GE(vm.cpu->decode_invalidations(), 1u);
}

TEST(InterpBasic, VmmWriteInvalidatesDecodedCode) {
  TestVm vm = TestVm::long_mode();
  vm.code("mov eax, 1\n hlt\n");
  ASSERT_EQ(vm.run().kind, ExitKind::kHlt);
  EXPECT_EQ(vm.state().gpr[kRax], 1u);
  vm.code("mov eax, 2\n hlt\n");
  CpuState s = vm.state();
  s.rip = kCode;
  s.halted = false;
  vm.set_state(s);
  ASSERT_EQ(vm.run().kind, ExitKind::kHlt);
  EXPECT_EQ(vm.state().gpr[kRax], 2u);
}

TEST(InterpBasic, PortInputExit) {
  TestVm vm = TestVm::long_mode();
  vm.code("mov dx, 0x3fd\n in al, dx\n mov ebx, eax\n in eax, 0x40\n hlt\n");
  VcpuExit* exit = *vm.cpu->run();
  ASSERT_EQ(exit->kind, ExitKind::kIoIn);
  EXPECT_EQ(exit->port, 0x3fd);
  EXPECT_EQ(exit->size, 1);
  EXPECT_EQ(exit->rip, kCode + 4);
  exit->value = 0x60;
  exit = *vm.cpu->run();
  ASSERT_EQ(exit->kind, ExitKind::kIoIn);
  EXPECT_EQ(exit->port, 0x40);
  EXPECT_EQ(exit->size, 4);
  exit->value = 0xdeadbeef;
  ASSERT_EQ((*vm.cpu->run())->kind, ExitKind::kHlt);
  EXPECT_EQ(vm.state().gpr[kRbx], 0x60u);
  EXPECT_EQ(vm.state().gpr[kRax], 0xdeadbeefu);
}

// RDTSC, IN and OUT end their block and, when they exit, leave it unretired: the exit names them, counts
// only the instructions before them, and the instruction runs again with the answer. In every executor.
TEST(InterpBasic, ExitsInsideBlocksLeaveTheInstructionUnretired) {
  for (const InterpMode mode : {InterpMode::kReference, InterpMode::kThreaded, InterpMode::kJit}) {
    SCOPED_TRACE(interp_mode_name(mode));
    TestVm vm = TestVm::long_mode();
    vm.cpu->set_mode(mode);
    vm.code("mov rbx, 1\n mov ecx, 2\n rdtsc\n mov esi, eax\n in al, 0x40\n mov edi, eax\n out 0x41, al\n"
            "add ebx, 1\n hlt\n");
    VcpuExit* exit = *vm.cpu->run();
    ASSERT_EQ(exit->kind, ExitKind::kRdtsc);
    EXPECT_EQ(exit->rip, kCode + 12);  // mov rbx, 1 (7 bytes), mov ecx, 2 (5 bytes)
    EXPECT_EQ(vm.state().rip, kCode + 12);
    EXPECT_EQ(*vm.cpu->instruction_count(), 2u);
    exit->value = 0x1234;
    exit = *vm.cpu->run();
    ASSERT_EQ(exit->kind, ExitKind::kIoIn);
    EXPECT_EQ(exit->port, 0x40);
    EXPECT_EQ(exit->rip, kCode + 16);  // rdtsc (2), mov esi, eax (2)
    EXPECT_EQ(*vm.cpu->instruction_count(), 4u);
    exit->value = 0x56;
    exit = *vm.cpu->run();
    ASSERT_EQ(exit->kind, ExitKind::kIoOut);
    EXPECT_EQ(exit->port, 0x41);
    EXPECT_EQ(exit->value, 0x56u);
    EXPECT_EQ(*vm.cpu->instruction_count(), 6u);
    ASSERT_EQ((*vm.cpu->run())->kind, ExitKind::kHlt);
    const CpuState s = vm.state();
    EXPECT_EQ(s.gpr[kRsi], 0x1234u);
    EXPECT_EQ(s.gpr[kRdi], 0x1256u);  // IN AL keeps the rest of RAX (RDTSC's value)
    EXPECT_EQ(s.gpr[kRbx], 2u);
    EXPECT_EQ(*vm.cpu->instruction_count(), 9u);
  }
}

// An RDTSC answered inline (derived time, answer_rdtsc_inline) makes no exit, and the clock it asks sees the
// instructions before it retired, inside a block too: the value the exit's answer would have had. In every executor.
TEST(InterpBasic, InlineRdtscSeesTheInstructionsBeforeIt) {
  for (const InterpMode mode : {InterpMode::kReference, InterpMode::kThreaded, InterpMode::kJit}) {
    SCOPED_TRACE(interp_mode_name(mode));
    TestVm vm = TestVm::long_mode();
    vm.cpu->set_mode(mode);
    Backend& cpu = *vm.cpu;
    ASSERT_TRUE(cpu.answer_rdtsc_inline([&cpu] { return 1000 + *cpu.instruction_count(); }));
    vm.code("mov rbx, 1\n mov ecx, 2\n rdtsc\n mov esi, eax\n mov rbx, 3\n rdtsc\n mov edi, eax\n hlt\n");
    ASSERT_EQ((*vm.cpu->run())->kind, ExitKind::kHlt);
    const CpuState s = vm.state();
    EXPECT_EQ(s.gpr[kRsi], 1002u);
    EXPECT_EQ(s.gpr[kRdi], 1005u);
    EXPECT_EQ(*vm.cpu->instruction_count(), 8u);
  }
}

// BT and ROL change CF (and OF) only: after an ADD or CMP earlier in the same block the JIT merges their
// bits into that producer's flags computed inline. Every flag must come out as the reference's.
TEST(InterpBasic, PartialFlagWritersKeepTheOtherFlagsOfAKnownProducer) {
  const char* cases[] = {
      "mov eax, 0x7fffffff\n mov ebx, 1\n add eax, 1\n bt ebx, 0\n pushfq\n pop rcx\n hlt\n",
      "mov eax, 0x0f\n add al, 0xf1\n bt ebx, 3\n pushfq\n pop rcx\n hlt\n",
      "mov eax, 0x80000000\n cmp eax, 1\n rol edx, 1\n pushfq\n pop rcx\n hlt\n",
      "mov rax, 5\n mov rbx, 0x10\n sub rax, rbx\n bt rbx, 4\n pushfq\n pop rcx\n hlt\n",
      "mov ax, 0x8000\n sub ax, 1\n ror edx, 3\n pushfq\n pop rcx\n hlt\n",
  };
  for (const char* code : cases) {
    SCOPED_TRACE(code);
    uint64_t reference_flags = 0;
    for (const InterpMode mode : {InterpMode::kReference, InterpMode::kThreaded, InterpMode::kJit}) {
      TestVm vm = TestVm::long_mode();
      vm.cpu->set_mode(mode);
      vm.code(code);
      ASSERT_EQ(vm.run().kind, ExitKind::kHlt);
      const uint64_t flags = vm.state().gpr[kRcx] & 0x8d5;  // OF SF ZF AF PF CF
      if (mode == InterpMode::kReference) reference_flags = flags;
      else EXPECT_EQ(flags, reference_flags) << interp_mode_name(mode);
    }
  }
}

TEST(InterpBasic, MmioReadAndWriteExit) {
  TestVm vm = TestVm::long_mode();
  vm.code("mov rbx, 0x10000000\n mov eax, [rbx + 8]\n add eax, 1\n mov [rbx + 16], eax\n hlt\n");
  VcpuExit* exit = *vm.cpu->run();
  ASSERT_EQ(exit->kind, ExitKind::kMmioRead);
  EXPECT_EQ(exit->address, 0x10000008u);
  EXPECT_EQ(exit->size, 4);
  uint64_t read_rip = exit->rip;
  exit->value = 41;
  exit = *vm.cpu->run();
  ASSERT_EQ(exit->kind, ExitKind::kMmioWrite);
  EXPECT_EQ(exit->address, 0x10000010u);
  EXPECT_EQ(exit->value, 42u);
  // A read names its own instruction; a write the next one, as KVM's completed MMIO writes do
  // (mov eax, [rbx+8]; add eax, 1; mov [rbx+16], eax: 3 bytes each).
  EXPECT_EQ(exit->rip, read_rip + 9);
  ASSERT_EQ((*vm.cpu->run())->kind, ExitKind::kHlt);
}

TEST(InterpBasic, FxsaveLeavesTheReservedAndAvailableBytesAlone) {
  TestVm vm = TestVm::long_mode();
  for (uint64_t offset = 0; offset < 512; offset += 8) vm.write64(0x200000 + offset, 0xaaaaaaaaaaaaaaaaull);
  vm.code("mov rbx, 0x200000\n fxsave [rbx]\n hlt\n");
  ASSERT_EQ(vm.run().kind, ExitKind::kHlt);
  EXPECT_EQ(vm.read64(0x200000 + 160), 0u) << "XMM0 is written";
  EXPECT_EQ(vm.read64(0x200000 + 408), 0u) << "XMM15 is written";
  for (uint64_t offset = 416; offset < 512; offset += 8) {
    EXPECT_EQ(vm.read64(0x200000 + offset), 0xaaaaaaaaaaaaaaaaull) << "byte " << offset;
  }
}

TEST(InterpBasic, RdtscExitAndCpuidFromModel) {
  TestVm vm = TestVm::long_mode();
  vm.code("rdtsc\n mov r8, rax\n mov r9, rdx\n xor eax, eax\n cpuid\n hlt\n");
  VcpuExit* exit = *vm.cpu->run();
  ASSERT_EQ(exit->kind, ExitKind::kRdtsc);
  EXPECT_FALSE(exit->is_rdtscp);
  exit->value = 0x123456789abcdefull;
  ASSERT_EQ((*vm.cpu->run())->kind, ExitKind::kHlt);
  CpuState s = vm.state();
  EXPECT_EQ(s.gpr[kR8], 0x89abcdefu);
  EXPECT_EQ(s.gpr[kR9], 0x01234567u);
  CpuidResult leaf0 = CpuModel::deja_v1().cpuid(0, 0);
  EXPECT_EQ(s.gpr[kRax], leaf0.eax);
  EXPECT_EQ(s.gpr[kRbx], leaf0.ebx);
  EXPECT_EQ(s.gpr[kRcx], leaf0.ecx);
  EXPECT_EQ(s.gpr[kRdx], leaf0.edx);
}

TEST(InterpBasic, HiddenFeaturesAreUndefinedOpcode) {
  // The model hides RDTSCP and RDRAND, so both raise #UD (vector 6) instead of exiting.
  for (const char* insn : {"rdtscp", "rdrand eax"}) {
    TestVm vm = TestVm::long_mode();
    vm.idt_gate(6, kCode + 0x800);
    vm.load(kCode + 0x800, assemble("mov r15, 6\n hlt\n", kCode + 0x800));
    vm.code(std::string(insn) + "\n hlt\n");
    ASSERT_EQ(vm.run().kind, ExitKind::kHlt) << insn;
    EXPECT_EQ(vm.state().gpr[kR15], 6u) << insn;
    EXPECT_TRUE(vm.cpu->unimplemented_counts().empty()) << insn;
  }
}

TEST(InterpBasic, UnimplementedInstructionCountedByMnemonic) {
  TestVm vm = TestVm::long_mode();
  vm.idt_gate(6, kCode + 0x800);
  vm.load(kCode + 0x800, assemble("mov r15, [rsp]\n add qword ptr [rsp], 2\n inc r14\n iretq\n", kCode + 0x800));
  // SYSENTER (2 bytes), which interp does not implement.
  vm.code("sysenter\n sysenter\n hlt\n");
  ASSERT_EQ(vm.run().kind, ExitKind::kHlt);
  EXPECT_EQ(vm.state().gpr[kR14], 2u);
  EXPECT_EQ(vm.state().gpr[kR15], kCode + 2);
  auto counts = vm.cpu->unimplemented_counts();
  ASSERT_EQ(counts.count("sysenter"), 1u);
  EXPECT_EQ(counts["sysenter"], 2u);
}

TEST(InterpBasic, StringAndBitInstructions) {
  TestVm vm = TestVm::long_mode();
  vm.code(R"(
    mov rdi, 0x200000
    mov al, 0x5a
    mov ecx, 16
    rep stosb
    mov rdi, 0x200000
    mov ecx, 32
    repe scasb
    mov r8, rcx
    mov eax, 0x80
    bsf r9d, eax
    bsr r10d, eax
    popcnt r11d, eax
    mov r12, 0xff00
    bt r12, 9
    setc r13b
    bswap eax
    mov r14d, eax
    hlt
  )");
  ASSERT_EQ(vm.run().kind, ExitKind::kHlt);
  CpuState s = vm.state();
  EXPECT_EQ(vm.read64(0x200000), 0x5a5a5a5a5a5a5a5aull);
  EXPECT_EQ(s.gpr[kRdi], 0x200000u + 17);  // stops after the first mismatching byte
  EXPECT_EQ(s.gpr[kR8], 32u - 17);
  EXPECT_EQ(s.gpr[kR9], 7u);
  EXPECT_EQ(s.gpr[kR10], 7u);
  EXPECT_EQ(s.gpr[kR11], 1u);
  EXPECT_EQ(s.gpr[kR13] & 0xff, 1u);
  EXPECT_EQ(s.gpr[kR14], 0x80000000u);
}

TEST(InterpBasic, InstructionBudgetKicks) {
  TestVm vm = TestVm::long_mode();
  vm.code("1: inc rax\n jmp 1b\n");
  vm.cpu->set_instruction_budget(1001);
  ASSERT_EQ(vm.run().kind, ExitKind::kKicked);
  EXPECT_EQ(*vm.cpu->instruction_count(), 1001u);
  EXPECT_EQ(vm.state().gpr[kRax], 501u);
  vm.cpu->kick();
  ASSERT_EQ(vm.run().kind, ExitKind::kKicked);
  EXPECT_EQ(*vm.cpu->instruction_count(), 1001u);
}

TEST(InterpBasic, SseMovesAndXor) {
  TestVm vm = TestVm::long_mode();
  vm.write64(0x200000, 0x1111111111111111ull);
  vm.write64(0x200008, 0x2222222222222222ull);
  vm.code(R"(
    mov rax, 0x200000
    movdqa xmm0, [rax]
    pxor xmm1, xmm1
    movups [rax + 16], xmm0
    movups [rax + 32], xmm1
    movq rbx, xmm0
    paddq xmm0, xmm0
    movhps [rax + 48], xmm0
    hlt
  )");
  ASSERT_EQ(vm.run().kind, ExitKind::kHlt);
  EXPECT_EQ(vm.read64(0x200010), 0x1111111111111111ull);
  EXPECT_EQ(vm.read64(0x200018), 0x2222222222222222ull);
  EXPECT_EQ(vm.read64(0x200020), 0u);
  EXPECT_EQ(vm.state().gpr[kRbx], 0x1111111111111111ull);
  EXPECT_EQ(vm.read64(0x200030), 0x4444444444444444ull);
}

// A store that drops the running block's page's last block earns the page fast write tags; the block
// translated next on that page must take them away again, or its own stores into its code go unseen
// (interp_fastdiff --seed 11: `add [rax], al` over its own code, the threaded and JIT modes ran stale
// instructions).
TEST(InterpBasic, SelfModifyingCodeAfterTheLastBlockOfItsPageWasDropped) {
  for (InterpMode mode : {InterpMode::kReference, InterpMode::kThreaded, InterpMode::kJit}) {
    TestVm vm = TestVm::long_mode();
    vm.cpu->set_mode(mode);
    vm.code(R"(
      lea rbx, [rip + 2f]
      lea rcx, [rip + 1f]
      mov dword ptr [rbx + 1], 4
      mov eax, 1
      mov byte ptr [rcx + 1], 2
    1:
      mov edx, 1
    2:
      mov esi, 3
      hlt
    )");
    ASSERT_EQ(vm.run().kind, ExitKind::kHlt) << interp_mode_name(mode);
    EXPECT_EQ(vm.state().gpr[kRax], 1u) << interp_mode_name(mode);
    EXPECT_EQ(vm.state().gpr[kRdx], 2u) << interp_mode_name(mode);
    EXPECT_EQ(vm.state().gpr[kRsi], 4u) << interp_mode_name(mode);
  }
}

// One physical code page mapped at two linear addresses (a shared library in two processes under ASLR): the
// blocks of the second mapping are copies of the first's with their addresses moved (BlockCache::find_same_code,
// checked byte for byte against compiling them with DEJA_JIT_CHECK_CLONES). Every way the code can change must
// reach both mappings: a store through one mapping into a translated block's bytes, a store elsewhere in the page
// (data beside code), a store spanning the page's end and the next page's code, and a VMM (DMA) write.
TEST(InterpBasic, CodeMappedAtTwoAddressesFollowsEveryWrite) {
  setenv("DEJA_JIT_CHECK_CLONES", "1", 1);
  struct Outcome {
    uint64_t rbx, instructions, relocated;
  };
  std::vector<Outcome> outcomes;
  for (InterpMode mode : {InterpMode::kReference, InterpMode::kThreaded, InterpMode::kJit}) {
    TestVm vm = TestVm::long_mode();
    vm.cpu->set_mode(mode);
    // Linear 0x180000 and 0x181000 map the physical pages of `func` (0x101000) and of the page after it.
    vm.write64(kPt + 0x180 * 8, 0x101007);
    vm.write64(kPt + 0x181 * 8, 0x102007);
    vm.code(R"(
      xor ebx, ebx
      mov r12d, 8
    1:
      call func
      add ebx, eax
      mov rax, 0x180000
      call rax
      add ebx, eax
      cmp r12d, 6
      jne 2f
      mov byte ptr [bump + 0x7f002], 3
    2:
      cmp r12d, 4
      jne 3f
      mov dword ptr [value], 100
    3:
      cmp r12d, 2
      jne 4f
      mov rax, 0x0000020500000010
      mov qword ptr [0x180ffc], rax
    4:
      dec r12d
      jnz 1b
      hlt
      .org 0x1000
    func:
      mov eax, dword ptr [rip + value]
      call bump
      call tail
      ret
    bump:
      .byte 0x83, 0xc0, 0x01
      ret
    value:
      .long 10
      .org 0x1ffb
    tail:
      .byte 0x05, 1, 0, 0, 0
      .byte 0x05, 1, 0, 0, 0
      ret
    )");
    ASSERT_EQ(vm.run().kind, ExitKind::kHlt) << interp_mode_name(mode);
    // A device's DMA rewrites the first instruction of the page after `func` (add eax, 5; ret); the loop runs again.
    vm.write64(0x102000, 0x0000c30000000505ull);
    CpuState s = vm.state();
    const uint64_t first_rbx = s.gpr[kRbx];
    s.rip = kCode;
    s.halted = false;
    vm.set_state(s);
    ASSERT_EQ(vm.run().kind, ExitKind::kHlt) << interp_mode_name(mode);
    outcomes.push_back({first_rbx + (vm.state().gpr[kRbx] << 32), *vm.cpu->instruction_count(),
                        vm.cpu->fast_stats().blocks_relocated});
  }
  unsetenv("DEJA_JIT_CHECK_CLONES");
  for (size_t k = 1; k < outcomes.size(); ++k) {
    EXPECT_EQ(outcomes[k].rbx, outcomes[0].rbx) << k;
    EXPECT_EQ(outcomes[k].instructions, outcomes[0].instructions) << k;
    EXPECT_GT(outcomes[k].relocated, 0u) << k;  // (the second mapping's blocks were copies)
  }
  // The reference, by hand: per call value + bump + the two tail adds; the first pass of 8 iterations.
  uint64_t expected = 0;
  for (int r12 = 8; r12 >= 1; --r12) {
    const uint64_t value = r12 < 4 ? 100 : 10, bump = r12 < 6 ? 3 : 1, tail = r12 < 2 ? 16 + 2 : 1 + 1;
    expected += 2 * (value + bump + tail);
  }
  EXPECT_EQ(outcomes[0].rbx & 0xffffffffu, expected);
}

// Blocks link across pages (a call into another page, the return out of it); a link into another page is
// followed only while the TLB maps that page where the linked block came from. Here the callee's page is
// remapped (PTE write, INVLPG) under a call site that has linked to it: the same call must reach the new code.
TEST(InterpBasic, CrossPageLinkFollowsARemappedPage) {
  for (InterpMode mode : {InterpMode::kReference, InterpMode::kThreaded, InterpMode::kJit}) {
    TestVm vm = TestVm::long_mode();
    vm.cpu->set_mode(mode);
    vm.code(R"(
      xor ebx, ebx
      mov r12d, 10
    1:
      cmp r12d, 5
      jne 3f
      mov qword ptr [0x7000 + 0x101 * 8], 0x102007
      invlpg [func]
    3:
      call func
      add ebx, eax
      dec r12d
      jnz 1b
      hlt
      .balign 4096
    func:
      mov eax, 1
      ret
      .balign 4096
      mov eax, 2
      ret
    )");
    ASSERT_EQ(vm.run().kind, ExitKind::kHlt) << interp_mode_name(mode);
    EXPECT_EQ(vm.state().gpr[kRbx], 15u) << interp_mode_name(mode);
    EXPECT_EQ(*vm.cpu->instruction_count(), 85u) << interp_mode_name(mode);  // (2 + 10 * 8 + 2, the HLT)
  }
}

// JIT code's exits to a fixed RIP jump straight to the linked block, the jump written into their code. A
// block so linked to (in another page) is rewritten after the loop has run through it: the jump must be
// undone with the block, so that the next pass runs the new code; the pass after that links again.
TEST(InterpBasic, DirectExitsFollowTheirTargetsRewrite) {
  for (InterpMode mode : {InterpMode::kReference, InterpMode::kThreaded, InterpMode::kJit}) {
    TestVm vm = TestVm::long_mode();
    vm.cpu->set_mode(mode);
    vm.code(R"(
      xor ebx, ebx
      mov r12d, 10
      lea rdi, [rip + target]
    1:
      cmp r12d, 5
      jne 3f
      mov dword ptr [rdi + 1], 2
    3:
      jmp target
    back:
      add ebx, eax
      dec r12d
      jnz 1b
      hlt
      .balign 4096
    target:
      mov eax, 1
      jmp back
    )");
    ASSERT_EQ(vm.run().kind, ExitKind::kHlt) << interp_mode_name(mode);
    EXPECT_EQ(vm.state().gpr[kRbx], 15u) << interp_mode_name(mode);  // 5 passes of 1, then 5 of 2
  }
}

// A budget stops the run loop on its instruction exactly, also inside a REP string instruction that is not the
// first instruction of its block (its iterations counted from where the block started stopped it late: the
// instructions before it in the block were not counted yet).
TEST(InterpBasic, BudgetStopsInsideARepStringAfterOtherInstructionsOfItsBlock) {
  for (InterpMode mode : {InterpMode::kReference, InterpMode::kThreaded, InterpMode::kJit}) {
    for (const char* string : {"rep stosb", "rep movsb", "repe cmpsb", "rep stosq"}) {
      TestVm vm = TestVm::long_mode();
      vm.cpu->set_mode(mode);
      vm.code(fmt::format(R"(
        mov edi, 0x200000
        mov esi, 0x210000
        mov ecx, 100
        xor eax, eax
        {}
        hlt
      )", string));
      for (uint64_t budget : {7u, 10u, 30u}) {
        vm.cpu->set_instruction_budget(budget);
        const uint64_t before = vm.cpu->retired_steps();
        ASSERT_EQ(vm.run().kind, ExitKind::kKicked) << interp_mode_name(mode) << " " << string;
        EXPECT_EQ(vm.cpu->retired_steps() - before, budget) << interp_mode_name(mode) << " " << string;
      }
    }
  }
}

}  // namespace
}  // namespace deja::test

namespace deja::test {
namespace {

// Exploration's PCT counts locked instructions among its scheduling events: with lock exits on, each one retired is
// a kLocked exit naming it, on every executor; with them off (every plain run), none is.
TEST(InterpExits, LockedInstructionsExitOnlyWhenAsked) {
  for (const InterpMode mode : {InterpMode::kReference, InterpMode::kThreaded, InterpMode::kJit}) {
    SCOPED_TRACE(interp_mode_name(mode));
    for (const bool on : {true, false}) {
      TestVm vm = TestVm::long_mode();
      vm.cpu->set_mode(mode);
      ASSERT_TRUE(vm.cpu->set_lock_exits(on));
      vm.code("mov rax, 0x180000\n add rbx, 1\n lock inc qword ptr [rax]\n xchg [rax], rcx\n xchg rcx, rdx\n"
              "lock xadd [rax], rbx\n hlt\n");
      std::vector<uint64_t> rips;
      VcpuExit exit = vm.run();
      for (; exit.kind == ExitKind::kLocked; exit = vm.run()) rips.push_back(exit.rip - kCode);
      EXPECT_EQ(exit.kind, ExitKind::kHlt);
      EXPECT_EQ(rips, on ? std::vector<uint64_t>({11, 15, 21}) : std::vector<uint64_t>{});
      EXPECT_EQ(vm.read64(0x180000), 1u);  // (INC: 1; the XCHG stored RCX = 0; XADD added RBX = 1)
    }
  }
}

}  // namespace
}  // namespace deja::test
