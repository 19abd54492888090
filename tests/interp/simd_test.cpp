// MMX on the x87 stack and the faults of the SIMD extensions (#UD by CPUID, CR0.EM and CR4.OSFXSR, #NM, #MF, #GP): what the host-differential tester cannot set up.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "tests/interp/interp_test_util.h"

namespace deja::test {
namespace {

constexpr uint64_t kHandler = kCode + 0x800;
constexpr uint64_t kData = 0x200000;

// Runs `source` (ending in HLT) on `model`; every exception vector's handler puts its number in R15 and halts.
CpuState run(const std::string& source, const CpuModel& model, uint64_t cr0_set = 0, uint64_t cr4_clear = 0) {
  TestVm vm = TestVm::long_mode(16 << 20, model);
  static const std::vector<uint8_t> handlers = [] {  // (assembled once: `as` is most of this test's time)
    std::string source;
    for (int vector = 0; vector < 20; ++vector) source += ".org " + std::to_string(vector * 32) + "\n mov r15, " + std::to_string(vector) + "\n hlt\n";
    return assemble(source, kHandler);
  }();
  vm.load(kHandler, handlers);
  for (uint8_t vector : {6, 7, 13, 16, 19}) vm.idt_gate(vector, kHandler + vector * 32);
  vm.code(source);
  CpuState s = vm.state();
  s.gpr[kR15] = ~0ull;
  s.cr0 |= cr0_set;
  s.cr4 &= ~cr4_clear;
  vm.set_state(s);
  EXPECT_EQ(vm.run().kind, ExitKind::kHlt);
  return vm.state();
}

uint16_t word(const CpuState& s, size_t at) { return uint16_t(s.fxsave[at] | (s.fxsave[at + 1] << 8)); }
uint64_t mantissa(const CpuState& s, unsigned slot) {
  uint64_t v;
  std::memcpy(&v, &s.fxsave[32 + 16 * slot], 8);
  return v;
}

// MMn is physical register n: an MMX instruction sets TOP to 0 (the slots rotate with it), tags every register
// valid, and gives the register it writes an exponent of all ones (SDM vol. 1, 9.5).
TEST(InterpMmx, AliasesTheX87Registers) {
  const CpuState s = run(R"(
    fninit
    fld1
    fldz
    mov rax, 0x1122334455667788
    movq mm3, rax
    movq rbx, mm7
    hlt
  )", CpuModel::x86_64_v2());
  EXPECT_EQ((word(s, 2) >> 11) & 7, 0) << "TOP";
  EXPECT_EQ(s.fxsave[4], 0xff) << "abridged tags: all valid";
  EXPECT_EQ(mantissa(s, 3), 0x1122334455667788ull);
  EXPECT_EQ(word(s, 32 + 16 * 3 + 8), 0xffff);
  EXPECT_EQ(mantissa(s, 7), 0x8000000000000000ull) << "FLD1 went to physical register 7";
  EXPECT_EQ(s.gpr[kRbx], 0x8000000000000000ull);
  EXPECT_EQ(word(s, 32 + 16 * 7 + 8), 0x3fff) << "a register read keeps its exponent";
  EXPECT_EQ(mantissa(s, 6), 0u) << "FLDZ in physical register 6";
}

TEST(InterpMmx, EmmsEmptiesTheStack) {
  const CpuState s = run("fninit\n fld1\n movd mm0, eax\n emms\n hlt\n", CpuModel::x86_64_v2());
  EXPECT_EQ(s.fxsave[4], 0) << "every register empty";
  EXPECT_EQ((word(s, 2) >> 11) & 7, 0) << "TOP";
}

// The MMX state travels in the FXSAVE image, through FXSAVE/FXRSTOR and get_state/set_state (checkpoints).
TEST(InterpMmx, StateRoundTrips) {
  TestVm vm = TestVm::long_mode(16 << 20, CpuModel::x86_64_v2());
  vm.code(R"(
    mov rax, 0x0102030405060708
    movq mm5, rax
    fxsave [0x200000]
    emms
    fxrstor [0x200000]
    movq rbx, mm5
    hlt
  )");
  ASSERT_EQ(vm.run().kind, ExitKind::kHlt);
  const CpuState saved = vm.state();
  EXPECT_EQ(saved.gpr[kRbx], 0x0102030405060708ull);
  TestVm other = TestVm::long_mode(16 << 20, CpuModel::x86_64_v2());
  other.code("movq rcx, mm5\n hlt\n");
  CpuState s = saved;
  s.rip = kCode;
  s.halted = false;
  other.set_state(s);
  ASSERT_EQ(other.run().kind, ExitKind::kHlt);
  EXPECT_EQ(other.state().gpr[kRcx], 0x0102030405060708ull);
}

struct FaultCase {
  std::string source;
  const CpuModel* model;
  uint64_t cr0_set;
  uint64_t cr4_clear;
  uint64_t vector;  // ~0: no fault
};

TEST(InterpSimd, Faults) {
  const CpuModel* v2 = &CpuModel::x86_64_v2();
  const CpuModel* v1 = &CpuModel::x86_64_v1();
  const CpuModel* first = &CpuModel::deja_v1();
  const uint64_t none = ~0ull;
  // An unmasked x87 exception left pending (FLDZ; FDIV by zero with ZM clear): the next MMX instruction raises #MF.
  const std::string pending = "fninit\n sub rsp, 8\n fstcw [rsp]\n and word ptr [rsp], 0xfffb\n fldcw [rsp]\n fld1\n fldz\n fdivp st(1), st\n";
  const FaultCase cases[] = {
      {"paddb mm0, mm1\n hlt\n", v2, 0, 0, none},
      {"paddb mm0, mm1\n hlt\n", v2, cr0::kEm, 0, 6},
      {"paddb mm0, mm1\n hlt\n", v2, cr0::kTs, 0, 7},
      {"paddb mm0, mm1\n hlt\n", v2, cr0::kEm | cr0::kTs, 0, 6},
      {"paddb mm0, mm1\n hlt\n", v2, 0, cr4::kOsfxsr, none},  // MMX registers only: OSFXSR does not apply
      {"paddb mm0, mm1\n hlt\n", first, 0, 0, 6},             // no MMX in the model
      {"emms\n hlt\n", v2, cr0::kTs, 0, 7},
      {"emms\n hlt\n", first, 0, 0, 6},
      {"movd mm0, eax\n hlt\n", v1, 0, 0, none},
      {"pshufb mm0, mm1\n hlt\n", v1, 0, 0, 6},               // SSSE3's MMX form needs SSSE3
      {"pshufb mm0, mm1\n hlt\n", v2, 0, cr4::kOsfxsr, none},
      {"pshufb xmm0, xmm1\n hlt\n", v2, 0, cr4::kOsfxsr, 6},
      {"pshufb xmm0, xmm1\n hlt\n", v2, cr0::kEm, 0, 6},
      {"pshufb xmm0, xmm1\n hlt\n", v2, cr0::kTs, 0, 7},
      {"pshufb xmm0, xmm1\n hlt\n", v1, 0, 0, 6},
      {"cvtpi2ps xmm0, mm1\n hlt\n", v2, 0, cr4::kOsfxsr, 6},  // an XMM operand: OSFXSR applies
      {"addsubps xmm0, xmm1\n hlt\n", v1, 0, 0, 6},
      {"haddpd xmm0, xmm1\n hlt\n", v2, cr0::kTs, 0, 7},
      {"ptest xmm0, xmm1\n hlt\n", v1, 0, 0, 6},
      {"pcmpistri xmm0, xmm1, 0\n hlt\n", v1, 0, 0, 6},
      {"crc32 eax, bl\n hlt\n", v2, cr0::kEm | cr0::kTs, cr4::kOsfxsr, none},  // a general-register instruction
      {"crc32 eax, bl\n hlt\n", v1, 0, 0, 6},
      {"monitor\n hlt\n", v2, 0, 0, 6},
      {"mwait\n hlt\n", v2, 0, 0, 6},
      // 16-byte operands of the legacy forms must be aligned; the string compares' need not be.
      {"ptest xmm0, [0x200001]\n hlt\n", v2, 0, 0, 13},
      {"pshufb xmm0, [0x200008]\n hlt\n", v2, 0, 0, 13},
      {"pcmpistri xmm0, [0x200001], 0\n hlt\n", v2, 0, 0, none},
      {"lddqu xmm0, [0x200001]\n hlt\n", v2, 0, 0, none},
      {"cvtpd2pi mm0, [0x200008]\n hlt\n", v2, 0, 0, 13},
      {"cmpxchg16b [0x200008]\n hlt\n", v2, 0, 0, 13},
      {"lock cmpxchg16b [0x200010]\n hlt\n", v2, 0, 0, none},
      {pending + "paddb mm0, mm1\n hlt\n", v2, 0, 0, 16},
      {pending + "emms\n hlt\n", v2, 0, 0, 16},
      {pending + "cvtpi2ps xmm0, [0x200000]\n hlt\n", v2, 0, 0, none},  // no MMX register: no x87 state
      {pending + "pshufb xmm0, xmm1\n hlt\n", v2, 0, 0, none},
      {"fisttp word ptr [0x200000]\n hlt\n", v1, 0, 0, 6},
      {"fisttp word ptr [0x200000]\n hlt\n", v2, 0, 0, none},
  };
  for (const FaultCase& c : cases) {
    const CpuState s = run(c.source, *c.model, c.cr0_set, c.cr4_clear);
    EXPECT_EQ(s.gpr[kR15], c.vector) << c.source << "on " << c.model->name() << " with CR0 |= " << std::hex << c.cr0_set
                                     << ", CR4 &= ~" << c.cr4_clear;
  }
}

}  // namespace
}  // namespace deja::test
