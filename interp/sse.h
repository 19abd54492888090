// SSE/SSE2 datapath of the software CPU: pure functions over 128-bit registers and MXCSR, bit-exact with SSE hardware.
#pragma once

#include <cstdint>

namespace deja::interp::sse {

// One XMM register, little-endian: `lo` holds bytes 0-7 (element 0 of every lane size).
struct Xmm {
  uint64_t lo = 0;
  uint64_t hi = 0;
  bool operator==(const Xmm&) const = default;
};

// MXCSR fields (SDM vol. 1, 10.2.3).
namespace mxcsr {
constexpr uint32_t kIe = 1u << 0, kDe = 1u << 1, kZe = 1u << 2, kOe = 1u << 3, kUe = 1u << 4, kPe = 1u << 5;
constexpr uint32_t kDaz = 1u << 6;
constexpr uint32_t kIm = 1u << 7, kDm = 1u << 8, kZm = 1u << 9, kOm = 1u << 10, kUm = 1u << 11, kPm = 1u << 12;
constexpr uint32_t kRcShift = 13, kRcMask = 3u << 13;
constexpr uint32_t kFtz = 1u << 15;
constexpr uint32_t kFlags = 0x3f, kMasks = 0x3f << 7;
constexpr uint32_t kDefault = 0x1f80;   // power-up / FNINIT value: all masked, round to nearest
constexpr uint32_t kWritable = 0xffff;  // MXCSR_MASK of deja's CPU model: LDMXCSR with other bits set is #GP
}  // namespace mxcsr

// ---- Integer and bitwise operations (no MXCSR involvement, never fault) ----

// Two-operand packed integer ops: result = op(a, b) where `a` is the destination/first source.
// The PSLL/PSRL/PSRA entries shift `a` by the unsigned 64-bit count in b.lo (b.hi ignored), as the
// xmm-count forms do; counts >= the lane width give 0 (or all sign bits for PSRA).
enum class IntOp : uint8_t {
  kPand, kPandn, kPor, kPxor,  // also ANDPS/ANDPD, ANDNPS/ANDNPD, ORPS/ORPD, XORPS/XORPD
  kPaddb, kPaddw, kPaddd, kPaddq, kPaddsb, kPaddsw, kPaddusb, kPaddusw,
  kPsubb, kPsubw, kPsubd, kPsubq, kPsubsb, kPsubsw, kPsubusb, kPsubusw,
  kPcmpeqb, kPcmpeqw, kPcmpeqd, kPcmpgtb, kPcmpgtw, kPcmpgtd,
  kPmullw, kPmulhw, kPmulhuw, kPmuludq, kPmaddwd,
  kPminub, kPmaxub, kPminsw, kPmaxsw, kPavgb, kPavgw, kPsadbw,
  kPunpcklbw, kPunpcklwd, kPunpckldq, kPunpcklqdq, kPunpckhbw, kPunpckhwd, kPunpckhdq, kPunpckhqdq,
  kPacksswb, kPackuswb, kPackssdw,
  kPsllw, kPslld, kPsllq, kPsrlw, kPsrld, kPsrlq, kPsraw, kPsrad,
  kUnpcklps, kUnpckhps, kUnpcklpd, kUnpckhpd,
};
Xmm int_binary(IntOp op, Xmm a, Xmm b);

// PSLLW/D/Q, PSRLW/D/Q, PSRAW/D by an immediate (pass the matching kPsll*/kPsrl*/kPsra* op).
Xmm shift_imm(IntOp op, Xmm a, uint8_t count);
Xmm pslldq(Xmm a, uint8_t bytes);  // bytes > 15 clear the register
Xmm psrldq(Xmm a, uint8_t bytes);

Xmm pshufd(Xmm src, uint8_t order);
Xmm pshuflw(Xmm src, uint8_t order);
Xmm pshufhw(Xmm src, uint8_t order);
Xmm shufps(Xmm a, Xmm b, uint8_t order);
Xmm shufpd(Xmm a, Xmm b, uint8_t order);

uint32_t pmovmskb(Xmm src);
uint32_t movmskps(Xmm src);
uint32_t movmskpd(Xmm src);
uint16_t pextrw(Xmm src, uint8_t index);  // index taken modulo 8
Xmm pinsrw(Xmm dst, uint16_t value, uint8_t index);

// ---- Floating point ----
// Every FP function takes the guest MXCSR and returns the new one (exception flags are sticky:
// bits already set stay set). When `fault` is true an unmasked SIMD FP exception occurred: the
// executor must NOT write `value` (the destination keeps its old contents), must store `mxcsr`,
// and raise #XM when CR4.OSXMMEXCPT is set, #UD otherwise (SDM vol. 3, 6.15 "#XM").
struct FpResult {
  Xmm value;
  uint32_t mxcsr = mxcsr::kDefault;
  bool fault = false;
};

// Element layout: scalar double (SD), packed double (PD), scalar single (SS), packed single (PS).
// Scalar forms compute element 0 and keep the rest of `a` (the destination).
enum class FpForm : uint8_t { kSd, kPd, kSs, kPs };

enum class FpOp : uint8_t { kAdd, kSub, kMul, kDiv, kMin, kMax, kSqrt };
// a = destination/first source, b = second source (SQRT reads only b, and a for scalar upper bits).
FpResult fp_arith(FpOp op, FpForm form, Xmm a, Xmm b, uint32_t mxcsr);

// CMPccSD/PD/SS/PS with the SSE predicates 0-7 (EQ, LT, LE, UNORD, NEQ, NLT, NLE, ORD);
// `predicate` is taken modulo 8 (the imm8's upper bits are ignored by SSE encodings).
FpResult fp_cmp(FpForm form, Xmm a, Xmm b, uint8_t predicate, uint32_t mxcsr);

// COMISD/COMISS (signal on QNaN, `quiet` = false) and UCOMISD/UCOMISS (`quiet` = true); `form` is
// kSd or kSs. Returns the whole RFLAGS with ZF/PF/CF set per the comparison and OF/SF/AF cleared.
struct CompareResult {
  uint64_t rflags = 0;
  uint32_t mxcsr = mxcsr::kDefault;
  bool fault = false;  // as FpResult: on fault RFLAGS must not be written
};
CompareResult fp_comis(FpForm form, bool quiet, Xmm a, Xmm b, uint64_t rflags, uint32_t mxcsr);

// Register-to-register conversions: `dst` is the old destination (scalar forms keep its upper
// part), `src` the source operand.
enum class CvtOp : uint8_t {
  kCvtdq2pd, kCvtdq2ps, kCvtps2dq, kCvttps2dq, kCvtpd2dq, kCvttpd2dq, kCvtpd2ps, kCvtps2pd, kCvtsd2ss, kCvtss2sd,
};
FpResult fp_convert(CvtOp op, Xmm dst, Xmm src, uint32_t mxcsr);

// CVTSI2SD/CVTSI2SS: `src` is a signed integer of `width` 32 or 64 bits; `to_double` selects SD.
FpResult cvtsi2f(bool to_double, Xmm dst, uint64_t src, unsigned width, uint32_t mxcsr);

// CVT(T)SD2SI / CVT(T)SS2SI into a `width` 32- or 64-bit integer; `form` is kSd or kSs. NaN and
// out-of-range inputs give the integer indefinite value (0x80000000 / 0x8000000000000000) with IE.
struct IntResult {
  uint64_t value = 0;  // zero-extended `width` bits
  uint32_t mxcsr = mxcsr::kDefault;
  bool fault = false;
};
IntResult cvtf2si(FpForm form, bool truncate, Xmm src, unsigned width, uint32_t mxcsr);

}  // namespace deja::interp::sse
