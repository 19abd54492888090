// The differential tester's XSAVE class: XRSTOR to a known XINUSE, random events, XGETBV(1) and XSAVE/XSAVEOPT.
#include "tests/interp/diff/xsave_generator.h"

#include <fmt/format.h>

#include <iterator>
#include <string>

namespace deja::difftest {
namespace {

// RBX holds kDataAddr throughout: the XRSTOR area at [rbx], the XSAVE area at [rbx + 0x400].
const std::vector<std::vector<uint8_t>>& events() {
  static const std::vector<std::vector<uint8_t>> list = {
      {0xc5, 0xf8, 0x77},                                              // vzeroupper
      {0xc5, 0xfc, 0x77},                                              // vzeroall
      {0x66, 0x0f, 0xef, 0xdb},                                        // pxor xmm3, xmm3
      {0xc5, 0xd5, 0x74, 0xed},                                        // vpcmpeqb ymm5, ymm5, ymm5
      {0xc5, 0xc9, 0xef, 0xf7},                                        // vpxor xmm6, xmm6, xmm7 (VEX.128)
      {0xd9, 0xe8, 0xdb, 0xe3},                                        // fld1; fninit
      {0xdb, 0xe3},                                                    // fninit
      {0x0f, 0x77},                                                    // emms
      {0x48, 0x0f, 0x6e, 0xc0, 0x0f, 0x77},                            // movq mm0, rax; emms
      {0x0f, 0xae, 0x53, 0x18},                                        // ldmxcsr [rbx + 24]
      {0x66, 0x0f, 0x7e, 0xc8},                                        // movd eax, xmm1 (a read)
      {0xc4, 0xe2, 0x7d, 0x17, 0xc1},                                  // vptest ymm0, ymm1 (a VEX.256 read)
      {0xc4, 0xe3, 0x7d, 0x39, 0xda, 0x01},                            // vextracti128 xmm2, ymm3, 1
      {0x66, 0x0f, 0x3a, 0x62, 0xc9, 0x00},                            // pcmpistrm xmm1, xmm1, 0 (writes XMM0)
      {0xc5, 0xfe, 0x6f, 0xa3, 0x40, 0x03, 0x00, 0x00},                // vmovdqu ymm4, [rbx + 0x340]
      {0xd9, 0xbb, 0x00, 0x03, 0x00, 0x00},                            // fnstcw [rbx + 0x300]
      {0xc4, 0x62, 0x79, 0x18, 0x8b, 0x44, 0x03, 0x00, 0x00},          // vbroadcastss xmm9, [rbx + 0x344]
      {0xf3, 0x44, 0x0f, 0xd6, 0xc1, 0x0f, 0x77},                      // movq2dq xmm8, mm1; emms
  };
  return list;
}

void put32(std::vector<uint8_t>& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(uint8_t(v >> (8 * i)));
}

// mov qword [rbx + 0x200], bv; mov eax, rfbm; xor edx, edx; xrstor [rbx]
std::vector<uint8_t> xrstor(uint32_t xstate_bv, uint32_t rfbm) {
  std::vector<uint8_t> b = {0x48, 0xc7, 0x83, 0x00, 0x02, 0x00, 0x00};
  put32(b, xstate_bv);
  b.push_back(0xb8);
  put32(b, rfbm);
  for (uint8_t x : {uint8_t{0x31}, uint8_t{0xd2}, uint8_t{0x0f}, uint8_t{0xae}, uint8_t{0x2b}}) b.push_back(x);
  return b;
}

}  // namespace

RegisterFile XsaveGenerator::registers() {
  RegisterFile r = legacy_.registers();
  r.ymm = 1;
  return r;
}

Sequence XsaveGenerator::sequence(int count) {
  Sequence seq;
  // The XRSTOR area: the x87 environment of FNINIT with random tags (a random image's reserved FCW bits, pending
  // exceptions and pointers in the other format are XRSTOR's x87 details, not XINUSE's), a valid MXCSR (every
  // exception masked, random rounding, DAZ and FTZ), XCOMP_BV and the reserved header bytes XRSTOR checks zero (the
  // rest of the header stays random), a random XSTATE_BV. The x87 registers and XMM/YMM values stay random.
  static constexpr uint32_t kMxcsrs[] = {0x1f80, 0x1f80, 0x5f80, 0x9fc0, 0x1f81, 0x3fa0};
  std::vector<uint8_t> prologue = {
      0xbb, 0x00, 0x00, 0x50, 0x00,                    // mov ebx, kDataAddr
      0x48, 0xc7, 0x03, 0x7f, 0x03, 0x00, 0x00,        // mov qword [rbx], 0x37f: FCW, FSW, FTW, FOP
      0x48, 0xc7, 0x43, 0x08, 0x00, 0x00, 0x00, 0x00,  // mov qword [rbx + 8], 0: FIP
      0x48, 0xc7, 0x43, 0x10, 0x00, 0x00, 0x00, 0x00,  // mov qword [rbx + 16], 0: FDP
      0xc6, 0x43, 0x04, uint8_t(rng_()),               // mov byte [rbx + 4], tags
      0xc7, 0x43, 0x18};                               // mov dword [rbx + 24], MXCSR
  put32(prologue, kMxcsrs[rng_() % std::size(kMxcsrs)]);
  for (uint8_t at : {0x08, 0x10}) {  // mov qword [rbx + 0x208 / 0x210], 0
    const uint8_t store[] = {0x48, 0xc7, 0x83, at, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00};
    prologue.insert(prologue.end(), std::begin(store), std::end(store));
  }
  const std::vector<uint8_t> start = xrstor(uint32_t(rng_() % 8), 7);
  prologue.insert(prologue.end(), start.begin(), start.end());
  append_instructions(seq, prologue, "xsave");
  for (int i = 0; i < count; ++i) {
    if (rng_() % 6 == 0) append_instructions(seq, xrstor(uint32_t(rng_() % 8), uint32_t(1 + rng_() % 7)), "xsave");
    else append_instructions(seq, events()[rng_() % events().size()], "xsave");
  }
  // mov ecx, 1; xgetbv; and eax, 7 (the host's XCR0 has more components); mov r8, rax
  append_instructions(seq, {0xb9, 0x01, 0x00, 0x00, 0x00, 0x0f, 0x01, 0xd0, 0x83, 0xe0, 0x07, 0x49, 0x89, 0xc0},
                      "xsave");
  // mov eax, rfbm; xor edx, edx; xsave/xsaveopt [rbx + 0x400], with REX.W or not
  std::vector<uint8_t> save = {0xb8};
  put32(save, rng_() % 3 == 0 ? uint32_t(1 + rng_() % 7) : 7u);
  save.push_back(0x31);
  save.push_back(0xd2);
  if (rng_() % 2) save.push_back(0x48);
  for (uint8_t x : {uint8_t{0x0f}, uint8_t{0xae}, uint8_t(rng_() % 2 ? 0xa3 : 0xb3), uint8_t{0x00}, uint8_t{0x04},
                    uint8_t{0x00}, uint8_t{0x00}})
    save.push_back(x);
  append_instructions(seq, save, "xsave");
  return seq;
}

}  // namespace deja::difftest
