// SSE3, SSSE3, SSE4.1 and SSE4.2 datapath of the software CPU: pure functions over 128-bit values (and MXCSR), bit-exact with the hardware.
//
// Every function takes its sources and returns the result, so that an executor of the legacy forms (the
// destination is the first source) and one of the VEX forms (separate sources, each 128-bit lane of a
// YMM register in turn) call the same code. Integer operations are portable C++; floating point runs the
// same instruction on the host under the guest's MXCSR, as interp/sse.h does (docs/interp-alu.md).
#pragma once

#include <cstdint>

#include "interp/sse.h"

namespace deja::interp::sse {

// ---- SSE3 ----

// ADDSUBPS/PD (subtract in even elements, add in odd ones), HADDPS/PD, HSUBPS/PD; `form` kPs or kPd.
enum class HorizontalOp : uint8_t { kAddsub, kHadd, kHsub };
FpResult fp_horizontal(HorizontalOp op, FpForm form, Xmm a, Xmm b, uint32_t mxcsr);

Xmm movsldup(Xmm src);  // dwords 0, 0, 2, 2
Xmm movshdup(Xmm src);  // dwords 1, 1, 3, 3
Xmm movddup(Xmm src);   // the low quadword twice

// ---- Packed integer operations of SSSE3, SSE4.1 and SSE4.2: result = op(a, b), `a` the first source
// (the legacy forms' destination). The unary ones (PABS*, PHMINPOSUW, PMOVSX*/PMOVZX*) read `b` only;
// PMOVSX/PMOVZX take their narrow elements from the low bytes of `b`. ----
enum class ExtOp : uint8_t {
  // SSSE3
  kPshufb, kPhaddw, kPhaddd, kPhaddsw, kPhsubw, kPhsubd, kPhsubsw, kPmaddubsw, kPmulhrsw,
  kPsignb, kPsignw, kPsignd, kPabsb, kPabsw, kPabsd,
  // SSE4.1
  kPmulld, kPmuldq, kPminsb, kPminsd, kPminuw, kPminud, kPmaxsb, kPmaxsd, kPmaxuw, kPmaxud,
  kPackusdw, kPcmpeqq, kPhminposuw,
  kPmovsxbw, kPmovsxbd, kPmovsxbq, kPmovsxwd, kPmovsxwq, kPmovsxdq,
  kPmovzxbw, kPmovzxbd, kPmovzxbq, kPmovzxwd, kPmovzxwq, kPmovzxdq,
  // SSE4.2
  kPcmpgtq,
};
Xmm ext_binary(ExtOp op, Xmm a, Xmm b);
// The bytes a PMOVSX/PMOVZX reads from memory (8, 4 or 2).
unsigned pmov_source_bytes(ExtOp op);

// PALIGNR: the 32 bytes a:b (a high) shifted right by `bytes`, the low 16 (0 from 32 on).
Xmm palignr(Xmm a, Xmm b, uint8_t bytes);

// PBLENDW (words, imm8 bits 0-7), BLENDPS (dwords, bits 0-3), BLENDPD (quadwords, bits 0-1): element i
// from `b` where bit i of imm8 is set.
Xmm blend(unsigned element_bytes, Xmm a, Xmm b, uint8_t imm);
// PBLENDVB (bytes), BLENDVPS (dwords), BLENDVPD (quadwords): element i from `b` where the sign bit of
// element i of `mask` is set (XMM0 for the legacy forms).
Xmm blendv(unsigned element_bytes, Xmm a, Xmm b, Xmm mask);

// INSERTPS: dword imm8[5:4] of `a` replaced by `value` (the caller picks it: dword imm8[7:6] of the
// register source, or the m32), then the dwords of imm8[3:0] cleared.
Xmm insertps(Xmm a, uint32_t value, uint8_t imm);
// PEXTRB/PEXTRW/PEXTRD/PEXTRQ and EXTRACTPS: element `index` (modulo the count) of `bytes` bytes, zero-extended.
uint64_t extract(Xmm src, unsigned bytes, uint8_t index);
// PINSRB/PINSRW/PINSRD/PINSRQ: element `index` (modulo the count) of `bytes` bytes replaced by `value`.
Xmm insert(Xmm dst, uint64_t value, unsigned bytes, uint8_t index);

// MPSADBW: eight sums of absolute differences of 4 bytes, at a's offset imm8[2]*4 + i, b's imm8[1:0]*4.
Xmm mpsadbw(Xmm a, Xmm b, uint8_t imm);

// PTEST: RFLAGS with ZF = (a AND b) == 0, CF = (NOT a AND b) == 0, OF, SF, AF and PF cleared.
uint64_t ptest(Xmm a, Xmm b, uint64_t rflags);

// ROUNDPS/PD/SS/SD with imm8 (bits 0-1 a rounding mode, bit 2: MXCSR.RC instead, bit 3: no precision
// exception). The scalar forms round b's element 0 into a, keeping the rest of a.
FpResult fp_round(FpForm form, Xmm a, Xmm b, uint8_t imm, uint32_t mxcsr);
// DPPS/DPPD (`form` kPs or kPd): the products selected by imm8[7:4] summed, stored where imm8[3:0] says.
FpResult fp_dot(FpForm form, Xmm a, Xmm b, uint8_t imm, uint32_t mxcsr);

// ---- SSE4.2 ----

// PCMPESTRI/PCMPESTRM/PCMPISTRI/PCMPISTRM (SDM vol. 2, 4.1): `a` is the first operand (xmm1), `b` the
// second (xmm2/m128), `length_a`/`length_b` their valid elements (explicit_length / implicit_length).
// Elements: 16 bytes, or 8 words with imm8[0]; signed with imm8[1].
unsigned explicit_length(uint64_t value, bool rex_w, uint8_t imm);  // |EAX| or |EDX|, saturated
unsigned implicit_length(Xmm x, uint8_t imm);                       // up to the first null element
struct StringCompare {
  uint32_t result = 0;  // IntRes2: one bit per element
  uint64_t rflags = 0;  // CF = result != 0, ZF = b shorter than the register, SF = a shorter, OF = bit 0
};
StringCompare string_compare(Xmm a, unsigned length_a, Xmm b, unsigned length_b, uint8_t imm, uint64_t rflags);
// PCMPxSTRI's index for ECX: the least (imm8[6] = 0) or most significant set bit, else the element count.
uint32_t string_index(const StringCompare& r, uint8_t imm);
// PCMPxSTRM's XMM0: the bits zero-extended (imm8[6] = 0) or expanded to element masks.
Xmm string_mask(const StringCompare& r, uint8_t imm);

// CRC32 (Castagnoli polynomial, bit-reflected as the instruction computes it) of the low `bytes` bytes of
// `data` (1, 2, 4 or 8), little-endian, continuing from `crc`.
uint32_t crc32c(uint32_t crc, uint64_t data, unsigned bytes);

}  // namespace deja::interp::sse
