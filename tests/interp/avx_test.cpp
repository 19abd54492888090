// The software CPU's AVX state: XSAVE/XRSTOR, XGETBV/XSETBV, CR4.OSXSAVE, the #UD/#NM rules of VEX, gathers and masked moves at faults, checkpoints and digests of the new state.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cpuid.h>

#include <cmath>
#include <cstring>
#include <iterator>
#include <vector>

#include "interp/avx.h"
#include "replay/digest.h"
#include "snapshot/cpu_state_codec.h"
#include "tests/interp/interp_test_util.h"

namespace deja::test {
namespace {

constexpr uint64_t kHandlers = kCode + 0x4000;  // one 16-byte handler a vector: R15 = the vector, then HLT
constexpr uint64_t kNoFault = 0xff;

void install_handlers(TestVm& vm) {
  std::string source;
  for (int v = 0; v < 32; ++v) {
    vm.idt_gate(uint8_t(v), kHandlers + 16 * v);
    source += fmt::format(".balign 16\n mov r15d, {}\n hlt\n", v);
  }
  vm.load(kHandlers, assemble(source, kHandlers));
}

TestVm v3_vm() {
  TestVm vm = TestVm::long_mode(16 << 20, CpuModel::x86_64_v3());
  install_handlers(vm);
  CpuState s = vm.state();
  s.gpr[kR15] = kNoFault;
  vm.set_state(s);
  return vm;
}

// The same with the OS's part done: CR4.OSXSAVE and XCR0 = x87 | SSE | AVX.
TestVm avx_enabled_vm() {
  TestVm vm = v3_vm();
  CpuState s = vm.state();
  s.cr4 |= cr4::kOsxsave;
  s.xcr0 = 7;
  vm.set_state(s);
  return vm;
}

// Runs to the HLT at the end of the code or of a handler; the vector taken (kNoFault: none).
uint64_t run_to_hlt(TestVm& vm) {
  EXPECT_EQ(vm.run().kind, ExitKind::kHlt);
  return vm.state().gpr[kR15];
}

uint64_t ymm_q(const CpuState& s, int reg, int q) {
  uint64_t v;
  if (q < 2) std::memcpy(&v, &s.fxsave[160 + 16 * reg + 8 * q], 8);
  else std::memcpy(&v, &s.ymmh[16 * reg + 8 * (q - 2)], 8);
  return v;
}

TEST(InterpAvx, OsEnablesAvxWithOsxsaveAndXsetbv) {
  TestVm vm = v3_vm();
  vm.code(R"(
    mov eax, 1
    cpuid
    mov r8, rcx                 # OSXSAVE clear after reset
    mov rax, cr4
    or rax, 0x40000
    mov cr4, rax
    mov eax, 1
    cpuid
    mov r9, rcx                 # OSXSAVE set
    xor ecx, ecx
    xgetbv
    mov r10, rax                # XCR0 = 1
    mov eax, 0xd
    xor ecx, ecx
    cpuid
    mov r11, rbx                # 576: x87 and SSE only
    mov eax, 7
    xor edx, edx
    xor ecx, ecx
    xsetbv
    mov eax, 0xd
    xor ecx, ecx
    cpuid
    mov r12, rbx                # 832 with AVX state
    mov r13, rcx
    mov eax, 0xd
    mov ecx, 1
    cpuid
    mov r14, rax                # XSAVEOPT and XGETBV(1), not XSAVEC
    vpcmpeqb ymm0, ymm0, ymm0   # now AVX runs
    hlt
  )");
  EXPECT_EQ(run_to_hlt(vm), kNoFault);
  CpuState s = vm.state();
  EXPECT_EQ(s.gpr[kR8] & (1u << 27), 0u);
  EXPECT_NE(s.gpr[kR9] & (1u << 27), 0u);
  EXPECT_EQ(s.gpr[kR10], 1u);
  EXPECT_EQ(s.gpr[kR11], 576u);
  EXPECT_EQ(s.gpr[kR12], 832u);
  EXPECT_EQ(s.gpr[kR13], 832u);
  EXPECT_EQ(s.gpr[kR14], 5u);
  EXPECT_EQ(s.xcr0, 7u);
  EXPECT_EQ(ymm_q(s, 0, 3), ~0ull);
}

// In every executor: the JIT makes these checks once a block, by its first VEX template, and runs TZCNT and the
// BMI instructions as the host's own; the block puts a VEX instruction after a few that are not.
TEST(InterpAvx, VexIsUndefinedWithoutOsxsaveOrAvxStateAndNmWithTs) {
  struct Case {
    uint64_t cr4_osxsave, xcr0, cr0_ts;
    uint64_t vex, bmi;  // the vector each instruction takes
  } cases[] = {
      {cr4::kOsxsave, 7, 0, kNoFault, kNoFault},
      {0, 7, 0, 6, kNoFault},                 // no OSXSAVE: VEX #UD, BMI runs
      {cr4::kOsxsave, 3, 0, 6, kNoFault},     // XCR0 without AVX state
      {cr4::kOsxsave, 7, cr0::kTs, 7, kNoFault},  // CR0.TS: #NM (not for BMI)
  };
  const char* insns[] = {"vpaddb xmm1, xmm2, xmm3", "vmovdqu ymm4, [0x200001]", "vpmovmskb eax, ymm1",
                          "vzeroupper", "andn eax, ebx, ecx", "tzcnt eax, ebx"};
  std::vector<std::vector<uint8_t>> code;  // (assembled once: `as` is the slow part)
  for (const char* insn : insns)
    code.push_back(assemble(fmt::format("mov ebx, 0x10\n add ecx, ebx\n {}\n mov r14d, 1\n hlt\n", insn), kCode));
  for (const InterpMode mode : {InterpMode::kReference, InterpMode::kThreaded, InterpMode::kJit}) {
    TestVm vm = v3_vm();
    vm.cpu->set_mode(mode);
    const CpuState start = vm.state();
    for (const Case& c : cases) {
      for (size_t k = 0; k < std::size(insns); ++k) {
        const char* insn = insns[k];
        CpuState s = start;
        s.cr4 |= c.cr4_osxsave;
        s.xcr0 = c.xcr0;
        s.cr0 |= c.cr0_ts;
        vm.set_state(s);
        vm.load(kCode, code[k]);
        const bool vex = insn[0] == 'v';
        const uint64_t vector = vex ? c.vex : c.bmi;
        EXPECT_EQ(run_to_hlt(vm), vector) << interp_mode_name(mode) << ": " << insn << " cr4.osxsave=" << c.cr4_osxsave
                                          << " xcr0=" << c.xcr0 << " cr0.ts=" << c.cr0_ts;
        EXPECT_EQ(vm.state().gpr[kR14], vector == kNoFault ? 1u : 0u) << interp_mode_name(mode) << ": " << insn;
      }
    }
  }
}

// The aligned moves (VMOVDQA, VMOVAPS, VMOVAPD, VMOVNTDQ...) #GP on an operand not aligned to its size; the others
// and every other VEX memory operand take any address. In every executor.
TEST(InterpAvx, AlignedMovesFaultOnMisalignedOperands) {
  struct Case {
    const char* insn;
    uint64_t vector;
  } cases[] = {
      {"vmovdqa ymm0, [0x200010]", 13}, {"vmovdqa xmm0, [0x200010]", kNoFault}, {"vmovdqa xmm0, [0x200008]", 13},
      {"vmovaps [0x200020], ymm1", kNoFault}, {"vmovapd [0x200030], ymm1", 13}, {"vmovntdq [0x200008], xmm1", 13},
      {"vmovntdqa ymm2, [0x200010]", 13}, {"vmovdqu ymm0, [0x200003]", kNoFault}, {"vmovups [0x200001], ymm1", kNoFault},
      {"vpcmpeqb ymm1, ymm0, [0x200001]", kNoFault}, {"vpminub ymm1, ymm0, [0x200011]", kNoFault},
      {"movdqa xmm0, [0x200008]", 13},  // (the legacy form: 16 bytes)
  };
  std::vector<std::vector<uint8_t>> code;
  for (const Case& c : cases) code.push_back(assemble(fmt::format("mov ebx, 0x10\n {}\n mov r14d, 1\n hlt\n", c.insn), kCode));
  for (const InterpMode mode : {InterpMode::kReference, InterpMode::kThreaded, InterpMode::kJit}) {
    TestVm vm = avx_enabled_vm();
    vm.cpu->set_mode(mode);
    const CpuState start = vm.state();
    for (size_t k = 0; k < std::size(cases); ++k) {
      const Case& c = cases[k];
      vm.set_state(start);
      vm.load(kCode, code[k]);
      EXPECT_EQ(run_to_hlt(vm), c.vector) << interp_mode_name(mode) << ": " << c.insn;
      EXPECT_EQ(vm.state().gpr[kR14], c.vector == kNoFault ? 1u : 0u) << interp_mode_name(mode) << ": " << c.insn;
    }
  }
}

TEST(InterpAvx, ModelWithoutTheFeatureMakesItUndefined) {
  TestVm vm = TestVm::long_mode();  // deja-v1: no XSAVE, AVX or BMI
  install_handlers(vm);
  for (const char* code : {"vpaddb xmm1, xmm2, xmm3", "andn eax, ebx, ecx", "xgetbv", "bzhi eax, ebx, ecx",
                           "mov rax, cr4\n or rax, 0x40000\n mov cr4, rax"}) {
    CpuState s = vm.state();
    s.rip = kCode;
    s.halted = false;
    s.gpr[kRsp] = kStackTop;
    s.gpr[kR15] = kNoFault;
    s.cr4 |= (std::string_view(code) == "xgetbv") ? cr4::kOsxsave : 0;
    vm.set_state(s);
    vm.code(fmt::format("{}\n hlt\n", code));
    EXPECT_EQ(run_to_hlt(vm), std::string_view(code).starts_with("mov") ? 13u : 6u) << code;
  }
}

TEST(InterpAvx, XsetbvChecksItsValue) {
  // Valid: 1, 3, 7; #GP: 0 (no x87), 5 (AVX without SSE), 8+ (not supported), ECX != 0.
  struct Case {
    uint64_t value, index, vector;
  } cases[] = {{1, 0, kNoFault}, {3, 0, kNoFault}, {7, 0, kNoFault}, {0, 0, 13}, {5, 0, 13}, {0xf, 0, 13}, {7, 1, 13}};
  for (auto [value, index, vector] : cases) {
    TestVm vm = v3_vm();
    CpuState s = vm.state();
    s.cr4 |= cr4::kOsxsave;
    s.gpr[kRax] = value;
    s.gpr[kRdx] = 0;
    s.gpr[kRcx] = index;
    vm.set_state(s);
    vm.code("xsetbv\n hlt\n");
    EXPECT_EQ(run_to_hlt(vm), vector) << value << " " << index;
    if (vector == kNoFault) {
      EXPECT_EQ(vm.state().xcr0, value);
    }
  }
}

// Fills YMM0-15 and MXCSR with known values, XSAVEs them at 0x200000, clobbers them, XRSTORs them.
TEST(InterpAvx, XsaveAndXrstorStandardFormat) {
  TestVm vm = avx_enabled_vm();
  vm.code(R"(
    mov rcx, 0
  fill:
    lea rax, [rcx * 8 + 0x5000]
    vmovq xmm0, rax
    vpbroadcastq ymm0, xmm0
    mov rdi, rcx
    shl rdi, 5
    vmovdqu [0x300000 + rdi], ymm0
    inc rcx
    cmp rcx, 16
    jne fill
    vmovdqu ymm0, [0x300000]
    vmovdqu ymm1, [0x300020]
    vmovdqu ymm15, [0x3001e0]
    mov dword ptr [0x310000], 0x1f00
    ldmxcsr [0x310000]
    mov qword ptr [0x200200], 0x100    # an XSTATE_BV bit XSAVE must keep (not requested)
    mov eax, 7
    xor edx, edx
    xsave [0x200000]
    vpxor ymm0, ymm0, ymm0
    vpxor ymm1, ymm1, ymm1
    vzeroall
    mov dword ptr [0x310000], 0x1f80
    ldmxcsr [0x310000]
    mov qword ptr [0x200200], 7        # (XRSTOR: XSTATE_BV within XCR0)
    mov eax, 7
    xrstor [0x200000]
    hlt
  )");
  EXPECT_EQ(run_to_hlt(vm), kNoFault);
  CpuState s = vm.state();
  EXPECT_EQ(ymm_q(s, 0, 0), 0x5000u);
  EXPECT_EQ(ymm_q(s, 0, 3), 0x5000u);
  EXPECT_EQ(ymm_q(s, 1, 2), 0x5008u);
  EXPECT_EQ(ymm_q(s, 15, 3), 0x5078u);
  uint32_t mxcsr;
  std::memcpy(&mxcsr, &s.fxsave[24], 4);
  EXPECT_EQ(mxcsr, 0x1f00u);
}

TEST(InterpAvx, XsaveLayoutAndXsaveopt) {
  TestVm vm = avx_enabled_vm();
  vm.code(R"(
    vpcmpeqb ymm3, ymm3, ymm3
    mov qword ptr [0x200200], 0x100
    mov eax, 7
    xor edx, edx
    xsave [0x200000]
    mov eax, 4
    xsaveopt [0x201000]
    xsavec [0x202000]            # not offered by the model
    hlt
  )");
  EXPECT_EQ(run_to_hlt(vm), 6u);
  EXPECT_EQ(vm.read64(0x200200), 0x107u);             // XSTATE_BV: the requested components (in use) and the old bit
  EXPECT_EQ(vm.read64(0x200000 + 160 + 48), ~0ull);   // XMM3
  EXPECT_EQ(vm.read64(0x200000 + 576 + 48), ~0ull);   // YMM3's upper half
  EXPECT_EQ(vm.read64(0x200000 + 28) & 0xffffffff, 0xffffu);  // MXCSR_MASK
  EXPECT_EQ(vm.read64(0x201200), 4u);                 // XSAVEOPT of AVX state alone
  EXPECT_EQ(vm.read64(0x201000 + 576 + 48), ~0ull);
  EXPECT_EQ(vm.read64(0x201000 + 24) & 0xffffffff, 0x1f80u);  // MXCSR goes with AVX state too
  EXPECT_EQ(vm.read64(0x201000 + 160 + 48), 0u);      // XMM3 does not
}

TEST(InterpAvx, XrstorInitializesWhatXstateBvLacksAndChecksTheHeader) {
  struct Case {
    uint64_t xstate_bv, xcomp_bv, byte16;
    uint64_t vector;
    uint64_t ymm3_high;  // YMM3 bits 192-255 after
  } cases[] = {
      {7, 0, 0, kNoFault, 0x1111},
      {3, 0, 0, kNoFault, 0},          // AVX state initialized
      {0xf, 0, 0, 13, ~0ull},          // a component outside XCR0
      {7, 1, 0, 13, ~0ull},            // standard form: XCOMP_BV must be zero
      {7, 0, 1, 13, ~0ull},            // bytes 16-23 must be zero
      {7, 0x8000000000000007, 0, 13, ~0ull},          // compacted: the model has no XSAVEC
  };
  for (const Case& c : cases) {
    TestVm vm = avx_enabled_vm();
    vm.write64(0x200000 + 576 + 56, 0x1111);  // YMM3 bits 192-255 in the area
    vm.write64(0x200000 + 24, 0x1f80);        // MXCSR
    vm.write64(0x200200, c.xstate_bv);
    vm.write64(0x200208, c.xcomp_bv);
    vm.write64(0x200210, c.byte16);
    vm.code("vpcmpeqb ymm3, ymm3, ymm3\n mov eax, 7\n xor edx, edx\n xrstor [0x200000]\n hlt\n");
    EXPECT_EQ(run_to_hlt(vm), c.vector) << c.xstate_bv << " " << c.xcomp_bv;
    EXPECT_EQ(ymm_q(vm.state(), 3, 3), c.ymm3_high) << c.xstate_bv << " " << c.xcomp_bv;
  }
}

// XINUSE as Intel's processors track it (measured with XGETBV(1) on a Xeon; interp_diff --xsave compares the
// rest), in every executor: each line from the initial configuration of all three components, its XGETBV(1) in R8
// and its XSAVE's XSTATE_BV in R9.
TEST(InterpAvx, XinuseFollowsWhatPutsStateInAndOutOfUse) {
  struct Case {
    const char* code;
    uint64_t xinuse;
  } cases[] = {
      {"nop", 0},
      {"pxor xmm0, xmm0", 2},                           // a write, of zeros too
      {"movd eax, xmm0\n movdqa [0x201000], xmm0\n ucomiss xmm0, xmm1", 0},  // reads and stores
      {"ldmxcsr [0x201000]", 2},                       // (the MXCSR there: 1F80H)
      {"vpxor xmm0, xmm0, xmm0", 2},                   // VEX.128
      {"vpcmpeqb ymm0, ymm0, ymm0", 6},
      {"vpcmpeqb ymm0, ymm0, ymm0\n vzeroupper", 2},
      {"vpcmpeqb ymm0, ymm0, ymm0\n vzeroall", 0},
      {"vextracti128 xmm1, ymm0, 1", 6},               // a VEX.256 instruction's XMM destination
      {"vptest ymm0, ymm1\n vpmovmskb eax, ymm0", 0},
      {"pcmpistrm xmm1, xmm1, 0", 2},                  // writes XMM0
      {"fninit", 1},
      {"fnstcw [0x201000]\n fnstsw ax\n fxsave [0x202000]", 0},
      {"fld1\n fstp st(0)", 1},
      {"emms", 1},
      {"movq2dq xmm0, mm0", 3},
      {"fxsave [0x202000]\n fxrstor [0x202000]", 3},
      {"vpcmpeqb ymm0, ymm0, ymm0\n mov eax, 4\n xor edx, edx\n xrstor [0x200000]", 2},  // AVX initialized
      {"mov qword ptr [0x200200], 5\n mov eax, 7\n xor edx, edx\n xrstor [0x200000]", 5},  // loaded: in use
      {"mov dword ptr [0x200018], 0x1f00\n mov eax, 2\n xor edx, edx\n xrstor [0x200000]", 0},  // MXCSR 1F00H
  };
  for (const InterpMode mode : {InterpMode::kReference, InterpMode::kThreaded, InterpMode::kJit}) {
    for (const Case& c : cases) {
      TestVm vm = avx_enabled_vm();
      vm.cpu->set_mode(mode);
      vm.write64(0x200018, 0x1f80);  // the XRSTOR area: FCW and MXCSR as after FNINIT, XSTATE_BV 0
      vm.write64(0x200000, 0x37f);
      vm.write64(0x201000, 0x1f80);
      vm.code(fmt::format(R"(
        mov eax, 7
        xor edx, edx
        xrstor [0x200000]
        {}
        mov ecx, 1
        xgetbv
        mov r8, rax
        mov eax, 7
        xor edx, edx
        xsave [0x203000]
        mov r9, [0x203200]
        hlt
      )", c.code));
      EXPECT_EQ(run_to_hlt(vm), kNoFault) << c.code;
      const CpuState s = vm.state();
      const uint32_t mxcsr = uint32_t(vm.read64(0x203000 + 24));
      // XGETBV(1) has SSE in use while MXCSR is not 1F80H; XSAVE's XSTATE_BV is XINUSE itself.
      EXPECT_EQ(s.gpr[kR8], c.xinuse | (mxcsr != 0x1f80 ? 2 : 0)) << interp_mode_name(mode) << ": " << c.code;
      EXPECT_EQ(s.gpr[kR9], c.xinuse) << interp_mode_name(mode) << ": " << c.code;
      EXPECT_EQ(s.xinuse, c.xinuse) << interp_mode_name(mode) << ": " << c.code;
    }
  }
}

// XSAVEOPT (and a model's XSAVEC) leave a component that is not in use unwritten; XSAVE writes it.
TEST(InterpAvx, XsaveoptWritesOnlyTheComponentsInUse) {
  TestVm vm = avx_enabled_vm();
  vm.write64(0x200018, 0x1f80);
  vm.code(R"(
    mov eax, 7
    xor edx, edx
    xrstor [0x200000]              # all three in their initial configuration
    vpcmpeqb ymm1, ymm1, ymm1
    vzeroupper                     # SSE in use, AVX not
    xsaveopt [0x201000]
    xsave [0x202000]
    hlt
  )");
  for (uint64_t at = 0x201000; at < 0x201400; at += 8) vm.write64(at, 0xaaaaaaaaaaaaaaaa);
  vm.write64(0x201200, 0);
  EXPECT_EQ(run_to_hlt(vm), kNoFault);
  EXPECT_EQ(vm.read64(0x201200), 2u);
  EXPECT_EQ(vm.read64(0x201000), 0xaaaaaaaaaaaaaaaau);            // x87 (FCW...) left alone
  EXPECT_EQ(vm.read64(0x201000 + 24) & 0xffffffff, 0x1f80u);       // MXCSR written all the same
  EXPECT_EQ(vm.read64(0x201000 + 160 + 16), ~0ull);                // XMM1
  EXPECT_EQ(vm.read64(0x201000 + 576 + 16), 0xaaaaaaaaaaaaaaaau);  // YMM1's upper half left alone
  EXPECT_EQ(vm.read64(0x202200), 2u);
  EXPECT_EQ(vm.read64(0x202000) & 0xffff, 0x37fu);                 // XSAVE: x87 written, not in use
  EXPECT_EQ(vm.read64(0x202000 + 576 + 16), 0u);
}

// XSAVEOPT never uses the modified optimization: after an XRSTOR from the same area, bytes software changed there in
// between are overwritten (this Xeon leaves them: whether it may depends on XRSTOR_INFO, which VM exits reset, so no
// recording could say; docs/cpu-models.md, "XINUSE").
TEST(InterpAvx, XsaveoptWritesWhatXrstorLoadedFromTheSameArea) {
  TestVm vm = avx_enabled_vm();
  vm.write64(0x200000, 0x37f);
  vm.write64(0x200018, 0x1f80);
  vm.write64(0x200000 + 160, 0x1111);  // XMM0
  vm.write64(0x200200, 3);
  vm.code(R"(
    mov eax, 7
    xor edx, edx
    xrstor [0x200000]
    mov qword ptr [0x200000 + 160], 0x5555
    xsaveopt [0x200000]
    hlt
  )");
  EXPECT_EQ(run_to_hlt(vm), kNoFault);
  EXPECT_EQ(vm.read64(0x200000 + 160), 0x1111u);
}

// x86-64-v3 version 2 (its traces replay unchanged): no XGETBV(1), and all of XCR0 in use at all times.
TEST(InterpAvx, EarlierModelReportsAllOfXcr0InUse) {
  const CpuModel* v2 = CpuModel::for_trace("x86-64-v3", 2);
  ASSERT_NE(v2, nullptr);
  EXPECT_EQ(v2->cpuid(0xd, 1).eax, 1u);
  TestVm vm = TestVm::long_mode(16 << 20, *v2);
  install_handlers(vm);
  CpuState s = vm.state();
  s.gpr[kR15] = kNoFault;
  s.cr4 |= cr4::kOsxsave;
  s.xcr0 = 7;
  vm.set_state(s);
  vm.write64(0x200018, 0x1f80);
  vm.code(R"(
    mov eax, 7
    xor edx, edx
    xrstor [0x200000]
    vzeroupper
    mov eax, 7
    xor edx, edx
    xsaveopt [0x201000]
    mov ecx, 1
    xgetbv
    hlt
  )");
  EXPECT_EQ(run_to_hlt(vm), 13u);  // XGETBV(1)
  EXPECT_EQ(vm.read64(0x201200), 7u);
}

TEST(InterpAvx, XsaveNeedsAlignmentAndOsxsave) {
  TestVm vm = avx_enabled_vm();
  vm.code("mov eax, 7\n xor edx, edx\n xsave [0x200020]\n hlt\n");
  EXPECT_EQ(run_to_hlt(vm), 13u);
  TestVm off = v3_vm();
  off.code("mov eax, 7\n xor edx, edx\n xsave [0x200000]\n hlt\n");
  EXPECT_EQ(run_to_hlt(off), 6u);
}

TEST(InterpAvx, GatherFaultLeavesTheElementsBeforeItGathered) {
  TestVm vm = avx_enabled_vm();
  vm.write64(kPt + 0x1f1 * 8, 0);  // page 0x1f1000 not present
  for (int i = 0; i < 8; ++i) vm.write64(0x1f0000 + 0xff0 + 8 * i, 0x100 + i);
  // Dword indexes 0, 1, 2, 3 (qwords at 0x1f0ff0 + 8 i): elements 0 and 1 in the mapped page, 2 and 3 beyond it.
  vm.code(R"(
    mov eax, 0
    vmovd xmm1, eax
    mov eax, 1
    vpinsrd xmm1, xmm1, eax, 1
    mov eax, 2
    vpinsrd xmm1, xmm1, eax, 2
    mov eax, 3
    vpinsrd xmm1, xmm1, eax, 3
    vpcmpeqb ymm2, ymm2, ymm2
    vpxor ymm0, ymm0, ymm0
    mov rbx, 0x1f0ff0
    vpgatherdq ymm0, [rbx + xmm1 * 8], ymm2
    hlt
  )");
  EXPECT_EQ(run_to_hlt(vm), 14u);
  CpuState s = vm.state();
  EXPECT_EQ(ymm_q(s, 0, 0), 0x100u);
  EXPECT_EQ(ymm_q(s, 0, 1), 0x101u);
  EXPECT_EQ(ymm_q(s, 0, 2), 0u);
  EXPECT_EQ(ymm_q(s, 2, 0), 0u);      // gathered: mask element cleared
  EXPECT_EQ(ymm_q(s, 2, 1), 0u);
  EXPECT_EQ(ymm_q(s, 2, 2), ~0ull);   // not yet
  EXPECT_EQ(ymm_q(s, 2, 3), ~0ull);
}

TEST(InterpAvx, MaskedMovesTouchOnlyTheSelectedElements) {
  TestVm vm = avx_enabled_vm();
  vm.write64(kPt + 0x1f1 * 8, 0);  // page 0x1f1000 not present
  // A 32-byte store at 0x1f0ff0 whose last two qwords (in the absent page) are masked off: no fault.
  vm.code(R"(
    vpcmpeqb ymm0, ymm0, ymm0
    vpxor ymm1, ymm1, ymm1
    vpblendd ymm1, ymm1, ymm0, 0x0f
    vpmaskmovq [0x1f0ff0], ymm1, ymm0
    vpmaskmovq ymm3, ymm1, [0x1f0ff0]
    hlt
  )");
  EXPECT_EQ(run_to_hlt(vm), kNoFault);
  EXPECT_EQ(vm.read64(0x1f0ff8), ~0ull);
  EXPECT_EQ(ymm_q(vm.state(), 3, 1), ~0ull);
  EXPECT_EQ(ymm_q(vm.state(), 3, 2), 0u);
}

TEST(InterpAvx, ReciprocalApproximationsWithinTheArchitectedError) {
  // deja's own definition against the architected bound (|relative error| <= 1.5 * 2^-12), and the special cases.
  for (float x : {1.0f, 3.0f, 0.1f, 1e-30f, 7e30f, 123456.0f, -2.5f}) {
    uint32_t bits;
    std::memcpy(&bits, &x, 4);
    float r, q;
    const uint32_t rb = interp::avx::rcp(bits), qb = interp::avx::rsqrt(bits);
    std::memcpy(&r, &rb, 4);
    std::memcpy(&q, &qb, 4);
    EXPECT_LE(std::fabs(double(r) * x - 1), 1.5 / 4096) << x;
    if (x > 0) {
      EXPECT_LE(std::fabs(double(q) * std::sqrt(double(x)) - 1), 1.5 / 4096) << x;
    }
  }
  EXPECT_EQ(interp::avx::rcp(0x00000000), 0x7f800000u);   // +0: +inf
  EXPECT_EQ(interp::avx::rcp(0x80000001), 0xff800000u);   // a denormal: as zero
  EXPECT_EQ(interp::avx::rcp(0x7f800000), 0u);            // inf: 0
  EXPECT_EQ(interp::avx::rcp(0x7f7fffff), 0u);            // tiny result flushed
  EXPECT_EQ(interp::avx::rsqrt(0xbf800000), 0xffc00000u); // negative: default NaN
  EXPECT_EQ(interp::avx::rsqrt(0x7f800001), 0x7fc00001u); // SNaN quieted
}

TEST(InterpAvx, CheckpointCodecCarriesYmmAndXinuseAndReadsVersions1And2) {
  CpuState st;
  st.xcr0 = 7;
  st.xinuse = 6;
  for (size_t i = 0; i < st.ymmh.size(); ++i) st.ymmh[i] = uint8_t(i * 3);
  auto blob = encode_cpu_state(st);
  auto back = decode_cpu_state(blob);
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(*back, st);
  // A version-2 state (before XINUSE): x87 and SSE in use, and AVX with its upper halves not zero.
  std::vector<uint8_t> v2 = blob;
  v2[4] = 2;
  v2.erase(v2.end() - 2 - 8, v2.end() - 2);
  auto read2 = decode_cpu_state(v2);
  ASSERT_TRUE(read2.has_value()) << read2.error().message;
  CpuState expected = st;
  expected.xinuse = 7;
  EXPECT_EQ(*read2, expected);
  // A version-1 state (before the YMM halves): the same bytes without them either.
  CpuState old = st;
  old.ymmh = {};
  old.xinuse = 3;
  std::vector<uint8_t> v1 = encode_cpu_state(old);
  v1[4] = 1;
  v1.erase(v1.end() - 2 - 8 - 256, v1.end() - 2);
  auto read = decode_cpu_state(v1);
  ASSERT_TRUE(read.has_value()) << read.error().message;
  EXPECT_EQ(*read, old);
  // XINUSE with a component deja lacks is refused.
  std::vector<uint8_t> bad = blob;
  bad[bad.size() - 2 - 8] = 0x08;
  EXPECT_FALSE(decode_cpu_state(bad).has_value());
}

TEST(InterpAvx, DigestTakesXcr0OnlyOnceItLeavesItsResetValue) {
  auto memory = GuestMemory::create(1 << 20);
  ASSERT_TRUE(memory.has_value());
  CpuState st;
  const Digest before = cpu_ram_digest(st, *memory);
  st.ymmh[0] = 1;  // (vector registers are not digested)
  EXPECT_EQ(cpu_ram_digest(st, *memory), before);
  st.xcr0 = 7;
  EXPECT_NE(cpu_ram_digest(st, *memory), before);
}

}  // namespace
}  // namespace deja::test
