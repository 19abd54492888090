// AVX/AVX2/FMA/F16C datapath of the software CPU: 256-bit values, the AVX2 permutations and variable shifts, and floating point run as the host's own VEX instruction under the guest's MXCSR.
#pragma once

#include <cstdint>

#include "interp/sse.h"

namespace deja::interp::avx {

using sse::Xmm;

// One YMM register: lane[0] is bits 0-127 (the XMM register), lane[1] bits 128-255.
struct Ymm {
  Xmm lane[2];
  bool operator==(const Ymm&) const = default;
  uint64_t q(unsigned i) const { return (i & 1) ? lane[i >> 1].hi : lane[i >> 1].lo; }
  void set_q(unsigned i, uint64_t v) { ((i & 1) ? lane[i >> 1].hi : lane[i >> 1].lo) = v; }
};

// The legacy mnemonic of a VEX one (VPSHUFB -> PSHUFB), whose datapath operation (interp/simd_ops.h) it shares;
// ZYDIS_MNEMONIC_INVALID (0) for the VEX-only ones.
uint16_t legacy_mnemonic(uint16_t vex);

// ---- Floating point on the host ----
// A VEX floating-point instruction (arithmetic, compares, conversions, rounding, dot products, FMA, F16C) runs as
// the very same host instruction, re-encoded with register operands only, inside one code stub that loads the
// guest's MXCSR rounding, DAZ and FTZ with every exception masked (as sse.cpp does for SSE): bit-exact by
// construction. Operands travel by the field that encodes them: ModRM.reg is YMM0, VEX.vvvv YMM1, ModRM.rm
// YMM2 (a memory source is loaded there first, its size zero-extended), the is4 byte YMM3.
struct HostInsn {
  uint8_t map = 1;      // VEX.mmmmm: 1 0F, 2 0F38, 3 0F3A
  uint8_t opcode = 0;
  uint8_t pp = 0;       // VEX.pp: 0 none, 1 66, 2 F3, 3 F2
  bool w = false;       // VEX.W (FMA's PD/SD forms)
  bool l = false;       // VEX.L
  bool vvvv = false;    // the instruction has a VEX.vvvv operand
  bool is4 = false;     // the instruction has an is4 register operand (its imm8[7:4])
  int16_t imm = -1;     // its imm8, or -1
};
struct HostOperands {
  Ymm reg, vvvv, rm, is4;  // in: the operands (reg: the destination's old value too); out: reg and rm as left
};
// Runs `insn` on `ops` under `guest_mxcsr`; returns the new guest MXCSR (raised flags ORed in) and whether an
// unmasked exception makes the instruction fault (then nothing but MXCSR may change: see sse::FpResult).
struct HostResult {
  uint32_t mxcsr = sse::mxcsr::kDefault;
  bool fault = false;
};
HostResult run_host(const HostInsn& insn, HostOperands& ops, uint32_t guest_mxcsr);
// Whether this host can run the VEX floating-point instructions (AVX, FMA, F16C enabled by its OS).
bool host_supports_avx();

// RCPPS/RSQRTPS and their scalar forms: approximations whose bits differ between processor vendors, so deja
// defines them in software (docs/interp-alu.md): the correctly rounded 1/x and 1/sqrt(x) in single precision
// (well within the architected relative error of 1.5 * 2^-12), denormal inputs as zeros, tiny results flushed
// to zero; MXCSR neither read nor written.
uint32_t rcp(uint32_t single);
uint32_t rsqrt(uint32_t single);

// ---- AVX2 permutations and shifts (portable C++) ----
Ymm permd(const Ymm& index, const Ymm& src);       // VPERMD/VPERMPS: dword i = src[index[i] & 7]
Ymm permq(const Ymm& src, uint8_t order);          // VPERMQ/VPERMPD: qword i = src[order >> 2i & 3]
Ymm perm2x128(const Ymm& a, const Ymm& b, uint8_t control);  // VPERM2F128/VPERM2I128
// VPSLLVD/Q, VPSRLVD/Q, VPSRAVD on one lane: each element shifted by the unsigned count in the same element of
// `counts` (a count of at least the width gives 0, or the sign bits for VPSRAVD).
enum class VarShift : uint8_t { kSllD, kSllQ, kSrlD, kSrlQ, kSraD };
Xmm shift_variable(VarShift op, Xmm a, Xmm counts);

}  // namespace deja::interp::avx
