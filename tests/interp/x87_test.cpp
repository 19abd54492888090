// The software CPU's x87: stack, tags, condition codes, stack faults, precision and rounding control, environment layouts, #NM/#MF (SDM-derived expectations), and the datapath against the host's x87.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "interp/x87_float.h"
#include "tests/interp/interp_test_util.h"

namespace deja::test {
namespace {

using interp::x87::Float80;
namespace fp = interp::x87;

constexpr uint64_t kHandler = kCode + 0x800;
constexpr uint64_t kData = 0x200000;  // scratch memory the snippets use

constexpr uint16_t kIe = 1, kDe = 2, kZe = 4, kOe = 8, kUe = 0x10, kPe = 0x20, kSf = 0x40, kEs = 0x80, kC0 = 0x100,
                   kC1 = 0x200, kC2 = 0x400, kC3 = 0x4000, kB = 0x8000;

uint16_t fcw(const CpuState& s) { return uint16_t(s.fxsave[0] | (s.fxsave[1] << 8)); }
uint16_t fsw(const CpuState& s) { return uint16_t(s.fxsave[2] | (s.fxsave[3] << 8)); }
unsigned top(const CpuState& s) { return (fsw(s) >> 11) & 7; }
uint8_t abridged_tags(const CpuState& s) { return s.fxsave[4]; }
uint16_t fop(const CpuState& s) { return uint16_t(s.fxsave[6] | (s.fxsave[7] << 8)); }
uint64_t quad(const CpuState& s, size_t offset) {
  uint64_t v;
  std::memcpy(&v, &s.fxsave[offset], 8);
  return v;
}
Float80 st(const CpuState& s, unsigned i) {
  Float80 v{};
  std::memcpy(&v.sig, &s.fxsave[32 + 16 * i], 8);
  std::memcpy(&v.sign_exp, &s.fxsave[32 + 16 * i + 8], 2);
  return v;
}
[[maybe_unused]] Float80 from_long_double(long double x) {
  Float80 v;
  std::memcpy(&v.sig, &x, 8);
  std::memcpy(&v.sign_exp, reinterpret_cast<const uint8_t*>(&x) + 8, 2);
  return v;
}
[[maybe_unused]] long double to_long_double(Float80 v) {
  long double x = 0;
  std::memcpy(&x, &v.sig, 8);
  std::memcpy(reinterpret_cast<uint8_t*>(&x) + 8, &v.sign_exp, 2);
  return x;
}

std::string describe(Float80 v) {
  char text[64];
  std::snprintf(text, sizeof(text), "%04x:%016llx", v.sign_exp, static_cast<unsigned long long>(v.sig));
  return text;
}

// Runs `source` (64-bit, ring 0, CR0.NE set) to its HLT; every exception vector halts in a handler that
// leaves the vector in R15 and the faulting RIP in R14.
CpuState run(const std::string& source, TestVm* keep = nullptr) {
  TestVm vm = TestVm::long_mode();
  for (uint8_t vector : {6, 7, 13, 14, 16}) {
    const uint64_t at = kHandler + vector * 32;
    vm.idt_gate(vector, at);
    vm.load(at, assemble("mov r15, " + std::to_string(vector) + "\n mov r14, [rsp]\n hlt\n", at));
  }
  vm.code(source);
  EXPECT_EQ(vm.run().kind, ExitKind::kHlt);
  CpuState s = vm.state();
  if (keep) *keep = std::move(vm);
  return s;
}

TEST(InterpX87, UsabilityProbeAddsOneAndOne) {
  TestVm vm;
  const CpuState s = run("fninit\n fld1\n fld1\n faddp\n fistp dword ptr [0x200000]\n mov eax, [0x200000]\n hlt\n", &vm);
  EXPECT_EQ(s.gpr[kRax], 2u);
  EXPECT_EQ(top(s), 0u);
  EXPECT_EQ(abridged_tags(s), 0);  // everything popped
  EXPECT_EQ(fsw(s) & 0x3f, 0);
  EXPECT_TRUE(vm.cpu->unimplemented_counts().empty());
}

TEST(InterpX87, PushesRotateTopAndTags) {
  const CpuState s = run(R"(
    fninit
    fld1
    fldz
    fldpi
    fnstenv [0x200000]
    mov eax, [0x200008]
    hlt
  )");
  EXPECT_EQ(top(s), 5u);
  EXPECT_EQ(abridged_tags(s), 0xe0);                   // physical registers 5, 6, 7
  EXPECT_EQ(st(s, 0), (Float80{0xc90fdaa22168c235ull, 0x4000}));  // pi, rounded to nearest
  EXPECT_EQ(st(s, 1), fp::kPositiveZero);
  EXPECT_EQ(st(s, 2), fp::kOne);
  // Full tag word: R7 (1.0) valid 00, R6 (0.0) zero 01, R5 (pi) valid 00, R0-R4 empty 11.
  EXPECT_EQ(s.gpr[kRax] & 0xffff, 0x13ffu);
  EXPECT_EQ(s.gpr[kRax] >> 16, 0xffffu);  // the reserved upper half
  EXPECT_EQ(fcw(s), 0x037f | 0x3f);        // FNSTENV masked every exception
}

TEST(InterpX87, FreeIncrementDecrementAndExchange) {
  const CpuState s = run(R"(
    fninit
    fld1
    fldz
    fxch st(1)
    fincstp
    fdecstp
    fdecstp
    ffree st(1)
    hlt
  )");
  // After FXCH: ST0 = 1.0 (R6), ST1 = 0.0 (R7). FINCSTP, FDECSTP, FDECSTP: TOP = 5, R5 empty; FFREE ST(1) = R6.
  EXPECT_EQ(top(s), 5u);
  EXPECT_EQ(abridged_tags(s), 0x80);
  EXPECT_EQ(st(s, 1), fp::kOne);
  EXPECT_EQ(st(s, 2), fp::kPositiveZero);
  EXPECT_EQ(fsw(s) & kC1, 0);
}

TEST(InterpX87, MaskedStackOverflowAndUnderflow) {
  const CpuState over = run("fninit\n fld1\n fld1\n fld1\n fld1\n fld1\n fld1\n fld1\n fld1\n fldz\n hlt\n");
  EXPECT_EQ(fsw(over) & (kIe | kSf | kC1 | kEs), kIe | kSf | kC1);  // C1 = 1: overflow
  EXPECT_EQ(st(over, 0), fp::kIndefinite);
  EXPECT_EQ(top(over), 7u);  // nine pushes wrap around

  const CpuState under = run("fninit\n fld1\n faddp st(1), st\n hlt\n");
  EXPECT_EQ(fsw(under) & (kIe | kSf | kC1), kIe | kSf);  // C1 = 0: underflow
  // The masked response writes the indefinite to ST(1) and pops it into ST(0).
  EXPECT_EQ(st(under, 0), fp::kIndefinite);
  EXPECT_EQ(abridged_tags(under), 0x01);

  const CpuState store = run("fninit\n fstp qword ptr [0x200000]\n mov rax, [0x200000]\n hlt\n");
  EXPECT_EQ(store.gpr[kRax], 0xfff8000000000000ull);  // the double indefinite
  EXPECT_EQ(fsw(store) & (kIe | kSf), kIe | kSf);
}

TEST(InterpX87, UnmaskedFaultIsReportedAtTheNextWaitingInstruction) {
  // FSTP of an empty register with IM clear changes nothing but IE, SF, ES and B. FNSTSW and FNINIT do not
  // wait, so FNINIT discards the pending exception and the FWAIT after it passes.
  const CpuState cleared = run(R"(
    fninit
    mov word ptr [0x200000], 0x037e
    fldcw [0x200000]
    fstp st(0)
    fnstsw ax
    fninit
    fwait
    hlt
  )");
  EXPECT_EQ(cleared.gpr[kR15], 0u);
  EXPECT_EQ(cleared.gpr[kRax] & 0xffff, kB | kEs | kSf | kIe);

  const CpuState s = run(R"(
    lea r12, [rip + faulting]
    lea r13, [rip + waiting]
    fninit
    mov word ptr [0x200000], 0x037e
    fldcw [0x200000]
  faulting:
    fstp st(0)
    fnstsw ax
  waiting:
    fwait
    hlt
  )");
  EXPECT_EQ(s.gpr[kR15], 16u);  // #MF, reported at the FWAIT
  EXPECT_EQ(s.gpr[kR14], s.gpr[kR13]);
  EXPECT_EQ(quad(s, 8), s.gpr[kR12]);  // FIP: the FSTP that raised it
  EXPECT_EQ(fop(s), 0x5d8);            // its opcode: DD D8
  EXPECT_EQ(quad(s, 16), 0u);          // FDP: FLDCW is a control instruction and leaves it
  EXPECT_EQ(abridged_tags(s), 0);      // nothing was popped

  // Without CR0.NE the error would go to FERR#/IRQ 13, which deja's PCs do not wire: nothing is raised.
  TestVm vm = TestVm::long_mode();
  vm.idt_gate(16, kHandler);
  vm.load(kHandler, assemble("mov r15, 16\n hlt\n", kHandler));
  vm.code("fninit\n mov word ptr [0x200000], 0x037e\n fldcw [0x200000]\n fstp st(0)\n fwait\n fld1\n hlt\n");
  CpuState no_ne = vm.state();
  no_ne.cr0 &= ~cr0::kNe;
  vm.set_state(no_ne);
  ASSERT_EQ(vm.run().kind, ExitKind::kHlt);
  EXPECT_EQ(vm.state().gpr[kR15], 0u);
  EXPECT_EQ(st(vm.state(), 0), fp::kOne);
}

TEST(InterpX87, UnmaskedOverflowAndUnderflowStoreBiasAdjustedResults) {
  TestVm vm = TestVm::long_mode();
  vm.idt_gate(16, kHandler);
  vm.load(kHandler, assemble("mov r15, 16\n hlt\n", kHandler));
  vm.write64(kData, 0xc000000000000000ull);
  vm.write64(kData + 8, 0x7ff0);  // 1.5 * 2^16369
  vm.write64(kData + 16, 0xc000000000000000ull);
  vm.write64(kData + 24, 0x0010);  // 1.5 * 2^-16367
  vm.code(R"(
    fninit
    mov word ptr [0x200100], 0x0367
    fldcw [0x200100]
    fld tbyte ptr [0x200000]
    fmul st, st(0)
    fnstsw ax
    mov r8, rax
    fnclex
    fld tbyte ptr [0x200010]
    fmul st, st(0)
    fnstsw ax
    fnop
    hlt
  )");
  ASSERT_EQ(vm.run().kind, ExitKind::kHlt);
  const CpuState s = vm.state();
  EXPECT_EQ(s.gpr[kR15], 16u);  // the FNOP waits, and UE is pending
  // 2.25 * 2^32738 and 2.25 * 2^-32734, with the exponent wrapped by 24576 (SDM vol. 1, 8.5.4.2, 8.5.5.2); both
  // products are exact, so no PE.
  EXPECT_EQ(st(s, 1), (Float80{0x9000000000000000ull, 0x5fe2}));
  EXPECT_EQ(st(s, 0), (Float80{0x9000000000000000ull, 0x2022}));
  EXPECT_EQ(s.gpr[kR8] & 0xffff & ~fp::flag::kAll, kB | kEs | (7u << 11));  // one register pushed
  EXPECT_EQ(s.gpr[kR8] & 0xff, kEs | kOe);
  EXPECT_EQ(s.gpr[kRax] & 0xff, kEs | kUe);

  // Masked, the same products are infinity and zero, each flagged with PE.
  TestVm masked;
  const CpuState m = run(R"(
    mov rax, 0xc000000000000000
    mov [0x200000], rax
    mov [0x200010], rax
    mov word ptr [0x200008], 0x7ff0
    mov word ptr [0x200018], 0x0010
    fninit
    fld tbyte ptr [0x200000]
    fmul st, st(0)
    fnstsw ax
    mov r8, rax
    fld tbyte ptr [0x200010]
    fmul st, st(0)
    fnstsw ax
    hlt
  )", &masked);
  EXPECT_EQ(st(m, 1), (Float80{0x8000000000000000ull, 0x7fff}));
  EXPECT_EQ(st(m, 0), fp::kPositiveZero);
  EXPECT_EQ(m.gpr[kR8] & 0x3f, kOe | kPe);
  EXPECT_EQ(m.gpr[kRax] & 0x3f, kOe | kUe | kPe);
}

TEST(InterpX87, DeviceNotAvailable) {
  struct Case {
    uint64_t cr0_bits;
    const char* insn;
    uint64_t vector;
  };
  for (const Case& c : {Case{cr0::kTs, "fld1", 7}, Case{cr0::kEm, "fninit", 7}, Case{cr0::kTs | cr0::kMp, "fwait", 7},
                        Case{cr0::kTs, "fwait", 0}, Case{cr0::kEm, "fwait", 0}}) {
    TestVm vm = TestVm::long_mode();
    vm.idt_gate(7, kHandler);
    vm.load(kHandler, assemble("mov r15, 7\n hlt\n", kHandler));
    vm.code(std::string(c.insn) + "\n hlt\n");
    CpuState s = vm.state();
    s.cr0 = (s.cr0 & ~cr0::kMp) | c.cr0_bits;
    vm.set_state(s);
    ASSERT_EQ(vm.run().kind, ExitKind::kHlt);
    EXPECT_EQ(vm.state().gpr[kR15], c.vector) << c.insn << " with CR0 bits " << std::hex << c.cr0_bits;
  }
}

TEST(InterpX87, CompareConditionCodesAndEflags) {
  const CpuState s = run(R"(
    fninit
    fld1
    fldz
    fcom st(1)
    fnstsw ax
    mov r8, rax
    fxch st(1)
    fcom st(1)
    fnstsw ax
    mov r9, rax
    fcom st(0)
    fnstsw ax
    mov r10, rax
    mov eax, 0x8d5
    push rax
    popfq
    fcomi st, st(1)
    pushfq
    pop r11
    fldz
    fdiv st, st(0)
    fucom st(1)
    fnstsw ax
    mov r12, rax
    fnclex
    fcom st(1)
    fnstsw ax
    mov rbx, rax
    fcomip st, st(1)
    pushfq
    pop r13
    ftst
    fnstsw ax
    mov rcx, rax
    hlt
  )");
  EXPECT_EQ(s.gpr[kR8] & (kC3 | kC2 | kC0), kC0);   // 0 < 1
  EXPECT_EQ(s.gpr[kR9] & (kC3 | kC2 | kC0), 0u);    // 1 > 0
  EXPECT_EQ(s.gpr[kR10] & (kC3 | kC2 | kC0), kC3);  // equal
  EXPECT_EQ(s.gpr[kR11] & 0x8d5, 0u);                // FCOMI 1 > 0: ZF PF CF clear, and OF SF AF cleared
  // 0/0 is the indefinite (IE); FUCOM of a QNaN is unordered without raising IE; FCOM of one raises it.
  EXPECT_EQ(s.gpr[kR12] & (kC3 | kC2 | kC0 | kIe), kC3 | kC2 | kC0 | kIe);
  EXPECT_EQ(s.gpr[kRbx] & (kC3 | kC2 | kC0 | kIe), kC3 | kC2 | kC0 | kIe);
  EXPECT_EQ(s.gpr[kR13] & 0x8d5, 0x45u);  // FCOMIP unordered: ZF PF CF
  EXPECT_EQ(s.gpr[kRcx] & (kC3 | kC2 | kC0), 0u);  // FTST: 1.0 > 0
  EXPECT_EQ(top(s), 6u);
}

TEST(InterpX87, ExamineClassifiesEveryClass) {
  struct Case {
    Float80 value;
    uint16_t codes;  // C3 C2 C1 C0
  };
  const Case cases[] = {
      {{0x8000000000000000ull, 0x3fff}, kC2},        // +normal
      {{0x8000000000000000ull, 0xbfff}, kC2 | kC1},  // -normal
      {{0, 0}, kC3},                                 // +0
      {{0x8000000000000000ull, 0x7fff}, kC2 | kC0},  // +infinity
      {{0xc000000000000000ull, 0xffff}, kC0 | kC1},  // -QNaN
      {{0x0000000000000001ull, 0x0000}, kC3 | kC2},  // denormal
      {{0x4000000000000000ull, 0x3fff}, 0},          // unnormal: unsupported
  };
  for (const Case& c : cases) {
    TestVm vm = TestVm::long_mode();
    vm.write64(kData, c.value.sig);
    vm.write64(kData + 8, c.value.sign_exp);
    vm.code("fninit\n fld tbyte ptr [0x200000]\n fxam\n fnstsw ax\n hlt\n");
    ASSERT_EQ(vm.run().kind, ExitKind::kHlt);
    EXPECT_EQ(vm.state().gpr[kRax] & (kC3 | kC2 | kC1 | kC0), c.codes) << describe(c.value);
  }
  const CpuState empty = run("fninit\n fxam\n fnstsw ax\n hlt\n");
  EXPECT_EQ(empty.gpr[kRax] & (kC3 | kC2 | kC0), kC3 | kC0);
}

TEST(InterpX87, PrecisionAndRoundingControl) {
  // 1/3 at 24, 53 and 64 bits rounded to nearest, then at 64 bits rounded down, up and toward zero.
  const std::pair<uint16_t, uint64_t> cases[] = {
      {0x007f, 0xaaaaab0000000000ull}, {0x027f, 0xaaaaaaaaaaaaa800ull}, {0x037f, 0xaaaaaaaaaaaaaaabull},
      {0x077f, 0xaaaaaaaaaaaaaaaaull}, {0x0b7f, 0xaaaaaaaaaaaaaaabull}, {0x0f7f, 0xaaaaaaaaaaaaaaaaull},
  };
  for (const auto& [control, sig] : cases) {
    TestVm vm = TestVm::long_mode();
    vm.write64(kData, control);
    vm.code("fninit\n fldcw [0x200000]\n fld1\n fld1\n fld1\n faddp st(1), st\n fadd st, st(1)\n fdivp st(1), st\n"
            "fnstsw ax\n hlt\n");
    ASSERT_EQ(vm.run().kind, ExitKind::kHlt);
    const CpuState s = vm.state();
    EXPECT_EQ(st(s, 0), (Float80{sig, 0x3ffd})) << std::hex << control;
    EXPECT_EQ(s.gpr[kRax] & kPe, kPe);
    const bool rounded_up = (sig & 0xff) == 0xab || sig == 0xaaaaab0000000000ull;
    EXPECT_EQ((s.gpr[kRax] & kC1) != 0, rounded_up) << std::hex << control;
  }
  // FIST rounds per RC: 2.5 and -2.5 to nearest-even, down, up and toward zero.
  const int32_t expected[4][2] = {{2, -2}, {2, -3}, {3, -2}, {2, -2}};
  for (unsigned rc = 0; rc < 4; ++rc) {
    TestVm vm = TestVm::long_mode();
    vm.write64(kData, 0x037f | (rc << 10));
    vm.write64(kData + 8, 0x4004000000000000ull);  // 2.5
    vm.code("fninit\n fldcw [0x200000]\n fld qword ptr [0x200008]\n fist dword ptr [0x200010]\n fchs\n"
            "fistp dword ptr [0x200014]\n hlt\n");
    ASSERT_EQ(vm.run().kind, ExitKind::kHlt);
    const uint64_t both = vm.read64(kData + 0x10);
    EXPECT_EQ(int32_t(uint32_t(both)), expected[rc][0]) << "RC " << rc;
    EXPECT_EQ(int32_t(uint32_t(both >> 32)), expected[rc][1]) << "RC " << rc;
  }
  // The constants are rounded per RC without a precision exception: pi down, log2(e) up, log2(10) nearest/up.
  const CpuState c = run(R"(
    fninit
    mov word ptr [0x200000], 0x077f
    fldcw [0x200000]
    fldpi
    mov word ptr [0x200000], 0x0b7f
    fldcw [0x200000]
    fldl2e
    fldl2t
    mov word ptr [0x200000], 0x037f
    fldcw [0x200000]
    fldl2t
    fldlg2
    fldln2
    fnstsw ax
    hlt
  )");
  EXPECT_EQ(st(c, 5), (Float80{0xc90fdaa22168c234ull, 0x4000}));
  EXPECT_EQ(st(c, 4), (Float80{0xb8aa3b295c17f0bcull, 0x3fff}));
  EXPECT_EQ(st(c, 3), (Float80{0xd49a784bcd1b8affull, 0x4000}));
  EXPECT_EQ(st(c, 2), (Float80{0xd49a784bcd1b8afeull, 0x4000}));
  EXPECT_EQ(st(c, 1), (Float80{0x9a209a84fbcff799ull, 0x3ffd}));
  EXPECT_EQ(st(c, 0), (Float80{0xb17217f7d1cf79acull, 0x3ffe}));
  EXPECT_EQ(c.gpr[kRax] & 0x3f, 0u);
}

TEST(InterpX87, IntegerAndBcdConversions) {
  TestVm vm;
  const CpuState s = run(R"(
    fninit
    mov dword ptr [0x200000], 0x7fffffff
    fild dword ptr [0x200000]
    fld st(0)
    fadd st, st(0)
    fistp dword ptr [0x200004]
    fnstsw ax
    mov r8, rax
    fnclex
    fistp dword ptr [0x200008]
    mov rax, -123456789012345678
    mov [0x200010], rax
    fild qword ptr [0x200010]
    fbstp tbyte ptr [0x200020]
    fbld tbyte ptr [0x200020]
    fistp qword ptr [0x200030]
    mov word ptr [0x200040], -7
    fild word ptr [0x200040]
    fiadd word ptr [0x200040]
    fistp word ptr [0x200042]
    hlt
  )", &vm);
  EXPECT_EQ(s.gpr[kR8] & (kIe | kPe), kIe);  // 2^32 - 2 does not fit 32 bits: #IA and the integer indefinite
  EXPECT_EQ(vm.read64(kData + 4) & 0xffffffff, 0x80000000u);
  EXPECT_EQ(vm.read64(kData + 8) & 0xffffffff, 0x7fffffffu);
  EXPECT_EQ(vm.read64(kData + 0x20), 0x3456789012345678ull);  // 18 packed digits, low pair first
  EXPECT_EQ(vm.read64(kData + 0x28) & 0xffff, 0x8012u);         // then the sign byte
  EXPECT_EQ(int64_t(vm.read64(kData + 0x30)), -123456789012345678ll);
  EXPECT_EQ(vm.read64(kData + 0x40) >> 16 & 0xffff, 0xfff2u);  // -14
  EXPECT_EQ(top(s), 0u);
}

TEST(InterpX87, SaveAndRestoreLayouts) {
  TestVm vm;
  const CpuState s = run(R"(
    lea r12, [rip + last]
    fninit
    fld1
    fldz
    mov word ptr [0x200200], 0x0f7f
    fldcw [0x200200]
    mov rax, 0x4000000000000000
    mov [0x200208], rax
  last:
    fld qword ptr [0x200208]
    fnsave [0x200000]
    fnstcw [0x200300]
    fld1
    frstor [0x200000]
    .byte 0x66
    fnsave [0x200100]
    .byte 0x66
    frstor [0x200100]
    hlt
  )", &vm);
  // The 108-byte image of 32- and 64-bit code: FCW, FSW and the tag word with 0xffff above them, FIP, FOP
  // above FCS, FDP, FDS (the selectors read as zero), then the registers in stack order.
  EXPECT_EQ(vm.read64(kData) & 0xffffffff, 0xffff0f7fu);
  EXPECT_EQ(vm.read64(kData + 4) & 0xffffffff, 0xffff0000u | (5u << 11));
  EXPECT_EQ(vm.read64(kData + 8) & 0xffffffff, 0xffff13ffu);  // R5 valid, R6 zero, R7 valid, R0-R4 empty
  EXPECT_EQ(vm.read64(kData + 12) & 0xffffffff, s.gpr[kR12] & 0xffffffff);
  EXPECT_EQ(vm.read64(kData + 16) & 0xffffffff, 0x05040000u);  // FOP DD 04 (ModRM with a SIB byte), FCS 0
  EXPECT_EQ(vm.read64(kData + 20) & 0xffffffff, 0x200208u);
  EXPECT_EQ(vm.read64(kData + 24) & 0xffffffff, 0xffff0000u);
  EXPECT_EQ(vm.read64(kData + 28), 0x8000000000000000ull);  // ST0 = 2.0
  EXPECT_EQ(vm.read64(kData + 36) & 0xffff, 0x4000u);
  EXPECT_EQ(vm.read64(kData + 48), 0x8000000000000000ull);  // ST2 = 1.0
  EXPECT_EQ(vm.read64(kData + 56) & 0xffff, 0x3fffu);
  EXPECT_EQ(vm.read64(kData + 0x300) & 0xffff, 0x037fu);  // FNSAVE ends with FNINIT
  // The 94-byte image of a 16-bit operand size: 14 bytes of environment without FOP, then the registers.
  EXPECT_EQ(vm.read64(kData + 0x100) & 0xffffffffffffull, 0x13ff28000f7full);
  EXPECT_EQ(vm.read64(kData + 0x106) & 0xffff, s.gpr[kR12] & 0xffff);
  EXPECT_EQ(vm.read64(kData + 0x108) & 0xffffffffffffull, 0x000002080000ull);  // FCS 0, FDP low, FDS 0
  EXPECT_EQ(vm.read64(kData + 0x10e), 0x8000000000000000ull);
  // Both FRSTORs brought the state back.
  EXPECT_EQ(fcw(s), 0x0f7f);
  EXPECT_EQ(top(s), 5u);
  EXPECT_EQ(abridged_tags(s), 0xe0);
  EXPECT_EQ(st(s, 0), (Float80{0x8000000000000000ull, 0x4000}));
  EXPECT_EQ(st(s, 2), fp::kOne);
  EXPECT_EQ(quad(s, 8), s.gpr[kR12] & 0xffff);  // the 16-bit image kept only 16 bits of FIP
}

TEST(InterpX87, RealModeEnvironmentLayouts) {
  // Real mode stores the pointers as 20-bit values split across two fields (FCS is not kept, so they are the
  // offsets); a 16-bit operand size gives 14 bytes, 0x66 gives 28.
  TestVm vm = TestVm::protected_mode();
  CpuState s = vm.state();
  s.cr0 = cr0::kEt;
  s.cs = SegmentReg{0x10000, 0xffff, 0x1000, 0xb, 0, true, true, false, false, false, false, false};
  s.ds = SegmentReg{0, 0xffff, 0, 0x3, 0, true, true, false, false, false, false, false};
  s.rip = 0;
  vm.set_state(s);
  vm.load(0x10000, assemble(R"(
    .code16
    fninit
    fld1
  stored:
    fstp dword ptr [0x8000]
    fnstenv [0x8100]
    .byte 0x66
    fnstenv [0x8200]
    hlt
  after:
  )", 0, 32));
  ASSERT_EQ(vm.run().kind, ExitKind::kHlt);
  const uint64_t fip = 4;  // `stored`: after FNINIT (2 bytes) and FLD1 (2 bytes)
  EXPECT_EQ(vm.read64(0x8000) & 0xffffffff, 0x3f800000u);
  EXPECT_EQ(vm.read64(0x8100), 0x0000ffff0000037full | (fip << 48));
  // FIP[19:16] << 12 | FOP (D9 /3 with a disp16: ModRM 1e), FDP[15:0], FDP[19:16] << 12.
  EXPECT_EQ(vm.read64(0x8108) & 0xffffffffffffull, 0x000080000000ull | 0x11eu);
  EXPECT_EQ(vm.read64(0x8200), 0xffff0000ffff037full);
  EXPECT_EQ(vm.read64(0x8208), 0xffff0000ffffffffull | (fip << 32));
  EXPECT_EQ(vm.read64(0x8210), 0xffff80000000011eull);
  EXPECT_EQ(vm.read64(0x8218) & 0xffffffff, 0u);
}

TEST(InterpX87, LoadEnvironmentWithAnotherTopKeepsPhysicalRegisters) {
  const CpuState s = run(R"(
    fninit
    fld1
    fldz
    fnstenv [0x200000]
    or word ptr [0x200004], 0x3800
    fldenv [0x200000]
    hlt
  )");
  // TOP 6 -> 7: ST(0) is now R7 (1.0), ST(7) is R6 (0.0); the tags stay with R6 and R7.
  EXPECT_EQ(top(s), 7u);
  EXPECT_EQ(abridged_tags(s), 0xc0);
  EXPECT_EQ(st(s, 0), fp::kOne);
  EXPECT_EQ(st(s, 7), fp::kPositiveZero);
  EXPECT_EQ(fcw(s), 0x037f);  // FLDENV restored what FNSTENV masked
}

TEST(InterpX87, StackArithmeticAndPartialRemainder) {
  const CpuState s = run(R"(
    fninit
    mov dword ptr [0x200000], 10
    mov dword ptr [0x200004], 3
    mov dword ptr [0x200008], 11
    fild dword ptr [0x200004]
    fild dword ptr [0x200000]
    fprem
    fnstsw ax
    mov r8, rax
    fstp st(0)
    fild dword ptr [0x200008]
    fprem1
    fnstsw ax
    mov r9, rax
    fistp dword ptr [0x20000c]
    fild dword ptr [0x200000]
    fxtract
    fistp dword ptr [0x200010]
    fistp dword ptr [0x200014]
    fild dword ptr [0x200000]
    fxtract
    fscale
    fistp dword ptr [0x200018]
    fstp st(0)
    stc
    fld1
    fldz
    fcmovb st, st(1)
    fistp dword ptr [0x20001c]
    hlt
  )");
  EXPECT_EQ(s.gpr[kR8] & (kC3 | kC2 | kC1 | kC0), kC3 | kC1);  // 10 rem 3 = 1, quotient 3 = 011
  EXPECT_EQ(s.gpr[kR9] & (kC3 | kC2 | kC1 | kC0), kC0);        // 11 rem1 3 = -1, quotient 4 = 100
  TestVm unused;
  (void)unused;
}

TEST(InterpX87, IncompleteRemainderSetsC2) {
  const CpuState s = run(R"(
    fninit
    fld1
    mov rax, 0x4630000000000000
    mov [0x200000], rax
    fld qword ptr [0x200000]
    fprem
    fnstsw ax
    hlt
  )");
  EXPECT_EQ(s.gpr[kRax] & kC2, kC2);  // 2^100 rem 1: the exponents differ by 100
}

TEST(InterpX87, TranscendentalsAreComputedInSoftware) {
  TestVm vm;
  const CpuState s = run(R"(
    fninit
    mov rax, 0x400921fb54442d18
    mov [0x200000], rax
    fld qword ptr [0x200000]
    fsin
    fstp tbyte ptr [0x200010]
    mov rax, 0x43e0000000000000
    mov [0x200000], rax
    fld qword ptr [0x200000]
    fsin
    fnstsw ax
    mov r8, rax
    fstp st(0)
    fld1
    fld1
    fpatan
    fstp tbyte ptr [0x200020]
    fld1
    fldz
    fsincos
    fstp tbyte ptr [0x200030]
    fstp tbyte ptr [0x200040]
    mov word ptr [0x200000], 3
    mov word ptr [0x200002], 8
    fild word ptr [0x200000]
    fild word ptr [0x200002]
    fnclex
    fyl2x
    fnstsw ax
    mov r9, rax
    fstp tbyte ptr [0x200050]
    fstp st(0)
    hlt
  )", &vm);
  auto tbyte = [&](uint64_t at) { return Float80{vm.read64(at), uint16_t(vm.read64(at + 8))}; };
  // Intel's FSIN reduces with a 66-bit pi: sin(double pi) is pi - double pi computed with that pi.
  EXPECT_EQ(tbyte(kData + 0x10), (Float80{0x8d30000000000000ull, 0x3fca}));
  EXPECT_EQ(s.gpr[kR8] & kC2, kC2);  // 2^63 is out of range: C2 set, the operand stays
  EXPECT_EQ(tbyte(kData + 0x20), (Float80{0xc90fdaa22168c235ull, 0x3ffe}));  // atan2(1, 1) = pi/4
  EXPECT_EQ(tbyte(kData + 0x30), fp::kOne);                                   // cos 0
  EXPECT_EQ(tbyte(kData + 0x40), fp::kPositiveZero);                          // sin 0
  EXPECT_EQ(tbyte(kData + 0x50), (Float80{0x9000000000000000ull, 0x4002}));   // 3 * log2(8) = 9, exactly
  EXPECT_EQ(s.gpr[kR9] & kPe, 0u);
  EXPECT_EQ(top(s), 0u);
  EXPECT_TRUE(vm.cpu->unimplemented_counts().empty());
}

TEST(InterpX87, FisttpNeedsSse3) {
  TestVm vm;
  const CpuState s = run("fninit\n fld1\n fisttp dword ptr [0x200000]\n hlt\n", &vm);
  EXPECT_EQ(s.gpr[kR15], 6u);  // deja-v1 and x86-64-v1 have no SSE3
  EXPECT_TRUE(vm.cpu->unimplemented_counts().empty());
}

TEST(InterpX87, StateSurvivesGetAndSetState) {
  TestVm vm;
  CpuState s = run("fninit\n fld1\n fldpi\n hlt\n", &vm);
  vm.set_state(s);
  vm.code("faddp st(1), st\n hlt\n");
  s.rip = kCode;
  s.halted = false;
  vm.set_state(s);
  ASSERT_EQ(vm.run().kind, ExitKind::kHlt);
  EXPECT_EQ(st(vm.state(), 0), (Float80{0x8487ed5110b4611aull, 0x4001}));  // pi + 1
}

// The datapath against the host's own x87 (every x86-64 host has one): random operands of every class, all
// rounding and precision controls, masked and (for what Intel and AMD agree on) unmasked exceptions.
struct HostResult {
  Float80 value;
  uint16_t status;
};
struct alignas(16) Saved {
  uint16_t control, r0, status, r1, tags, r2;
  uint32_t fip, fop, fdp, fds;
  uint8_t st[80];
};

HostResult host_binary(unsigned operation, Float80 a, Float80 b, uint16_t control) {
  Saved saved{};
  uint16_t status = 0;
  asm volatile("fninit\n fldcw %0" ::"m"(control));
  asm volatile("fldt %0\n fldt %1" ::"m"(b), "m"(a) : "memory");  // ST0 = a, ST1 = b
  switch (operation) {
    case 0: asm volatile("fadd %%st(1), %%st\n fnstsw %0" : "=m"(status)::"memory"); break;
    case 1: asm volatile(".byte 0xd8, 0xe1\n fnstsw %0" : "=m"(status)::"memory"); break;  // FSUB ST, ST(1)
    case 2: asm volatile("fmul %%st(1), %%st\n fnstsw %0" : "=m"(status)::"memory"); break;
    case 3: asm volatile(".byte 0xd8, 0xf1\n fnstsw %0" : "=m"(status)::"memory"); break;  // FDIV ST, ST(1)
    case 4: asm volatile("fsqrt\n fnstsw %0" : "=m"(status)::"memory"); break;
    case 5: asm volatile("fprem\n fnstsw %0" : "=m"(status)::"memory"); break;
    case 6: asm volatile("fprem1\n fnstsw %0" : "=m"(status)::"memory"); break;
    default: asm volatile("frndint\n fnstsw %0" : "=m"(status)::"memory"); break;
  }
  asm volatile("fnsave %0\n fninit" : "=m"(saved)::"memory");
  Float80 result;
  std::memcpy(&result.sig, &saved.st[0], 8);
  std::memcpy(&result.sign_exp, &saved.st[8], 2);
  return {result, status};
}

Float80 random_value(std::mt19937_64& rng) {
  uint64_t sig = rng() | (1ull << 63);
  uint16_t exponent = uint16_t(0x3fff + int(rng() % 200) - 100);
  switch (rng() % 12) {
    case 0: sig = 0; exponent = 0; break;
    case 1: sig = rng() >> (rng() % 64); exponent = 0; break;
    case 2: sig = 1ull << 63; exponent = 0x7fff; break;
    case 3: sig |= rng() % 2 ? 1ull << 62 : 0; exponent = 0x7fff; break;
    case 4: exponent = uint16_t(1 + rng() % 80); break;
    case 5: exponent = uint16_t(0x7ffe - rng() % 80); break;
    case 6: sig <<= rng() % 64; sig |= 1ull << 63; exponent = uint16_t(0x3fff + rng() % 64); break;
    default: break;
  }
  return {sig, uint16_t(exponent | (rng() % 2 ? 0x8000 : 0))};
}

TEST(InterpX87, DatapathAgreesWithTheHostX87) {
  std::mt19937_64 rng(87);
  int mismatches = 0;
  for (int i = 0; i < 40000 && mismatches < 10; ++i) {
    const Float80 a = random_value(rng), b = random_value(rng);
    uint16_t control = uint16_t(0x037f | ((rng() % 4) << 10) | ((rng() % 4) << 8));
    if (rng() % 4 == 0) control = uint16_t(control & ~(rng() & 0x3e));  // #I stays masked
    const unsigned operation = unsigned(rng() % 8);
    const fp::Control c{control};
    fp::Result r;
    uint16_t codes = 0;
    switch (operation) {
      case 0: r = fp::add(a, b, c); break;
      case 1: r = fp::subtract(a, b, c); break;
      case 2: r = fp::multiply(a, b, c); break;
      case 3: r = fp::divide(a, b, c); break;
      case 4: r = fp::square_root(a, c); break;
      case 5:
      case 6: {
        const fp::PartialRemainder p = fp::partial_remainder(a, b, operation == 6, c);
        r = p.result;
        codes = uint16_t((p.incomplete ? kC2 : 0) | ((p.quotient_low & 4) ? kC0 : 0) |
                         ((p.quotient_low & 2) ? kC3 : 0));
        r.rounded_up = p.quotient_low & 1;
        break;
      }
      default: r = fp::round_to_integer(a, c); break;
    }
    // Where Intel and AMD part: FPREM/FPREM1 of a denormal by an infinity with underflow unmasked. AMD (the vendor of
    // deja's models, and of the host this was written on) raises #U and delivers the result with its exponent biased
    // by 24576, as the model does; Intel Xeons return the denormal with only DE.
    const bool denormal_a = (a.sign_exp & 0x7fff) == 0 && a.sig != 0;
    const bool infinite_b = (b.sign_exp & 0x7fff) == 0x7fff && b.sig == 1ull << 63;
    if ((operation == 5 || operation == 6) && denormal_a && infinite_b && !(control & kUe)) continue;
    const HostResult h = host_binary(operation, a, b, control);
    // The model of an x87 instruction: an unmasked #I, #D or #Z leaves the register and flags only those.
    Float80 expected_value = r.value;
    uint16_t expected_status = uint16_t(r.flags | (r.rounded_up ? kC1 : 0) | codes);
    if (r.flags & ~control & (kIe | kDe | kZe)) {
      expected_value = a;
      expected_status = uint16_t(r.flags & (kIe | kDe | kZe));
    }
    const uint16_t compared = uint16_t(0x3f | kC1 | (operation == 5 || operation == 6 ? kC0 | kC2 | kC3 : 0));
    if (h.value != expected_value || (h.status & compared) != (expected_status & compared)) {
      ++mismatches;
      ADD_FAILURE() << "operation " << operation << " control " << std::hex << control << " a " << describe(a)
                    << " b " << describe(b) << ": host " << describe(h.value) << " status " << (h.status & compared)
                    << ", interp " << describe(expected_value) << " status " << (expected_status & compared);
    }
  }
}

TEST(InterpX87, StoresAndLoadsAgreeWithTheHostX87) {
  std::mt19937_64 rng(88);
  int mismatches = 0;
  for (int i = 0; i < 20000 && mismatches < 10; ++i) {
    const Float80 a = random_value(rng);
    const uint16_t control = uint16_t(0x037f | ((rng() % 4) << 10));
    const fp::Control c{control};
    uint64_t host_bits = 0, host64 = 0;
    uint32_t host32 = 0;
    uint16_t host16 = 0, status = 0;
    const unsigned operation = unsigned(rng() % 5);
    asm volatile("fninit\n fldcw %0\n fldt %1" ::"m"(control), "m"(a) : "memory");
    fp::Stored s;
    switch (operation) {
      case 0:
        asm volatile("fstps %0\n fnstsw %1" : "=m"(host32), "=m"(status)::"memory");
        host_bits = host32;
        s = fp::to_float32(a, c);
        break;
      case 1:
        asm volatile("fstpl %0\n fnstsw %1" : "=m"(host64), "=m"(status)::"memory");
        host_bits = host64;
        s = fp::to_float64(a, c);
        break;
      case 2:
        asm volatile("fistps %0\n fnstsw %1" : "=m"(host16), "=m"(status)::"memory");
        host_bits = host16;
        s = fp::to_integer(a, 16, false, c);
        break;
      case 3:
        asm volatile("fistpl %0\n fnstsw %1" : "=m"(host32), "=m"(status)::"memory");
        host_bits = host32;
        s = fp::to_integer(a, 32, false, c);
        break;
      default:
        asm volatile("fistpll %0\n fnstsw %1" : "=m"(host64), "=m"(status)::"memory");
        host_bits = host64;
        s = fp::to_integer(a, 64, false, c);
        break;
    }
    asm volatile("fninit");
    const uint16_t expected = uint16_t(s.flags | (s.rounded_up ? kC1 : 0));
    if (host_bits != s.bits || (status & (0x3f | kC1)) != expected) {
      ++mismatches;
      ADD_FAILURE() << "store " << operation << " control " << std::hex << control << " of " << describe(a) << ": host "
                    << host_bits << " status " << (status & (0x3f | kC1)) << ", interp " << s.bits << " status "
                    << expected;
    }
  }
}

}  // namespace
}  // namespace deja::test
