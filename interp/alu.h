// Integer ALU of the software CPU: pure functions computing results and exact RFLAGS, as the Intel SDM defines them.
#pragma once

#include <cstdint>

namespace deja::interp {

// The six arithmetic status flags, in their RFLAGS positions.
constexpr uint64_t kCf = 1u << 0, kPf = 1u << 2, kAf = 1u << 4, kZf = 1u << 6, kSf = 1u << 7, kOf = 1u << 11;
constexpr uint64_t kArithFlags = kCf | kPf | kAf | kZf | kSf | kOf;

// `width` is the operand size in bits: 8, 16, 32 or 64. Inputs are zero-extended to 64 bits and
// results are returned zero-extended (callers do the register-merge rules for 8/16-bit writes and
// the zero-extension of 32-bit writes). `flags` in and out is the whole RFLAGS: only the flags the
// instruction defines are replaced; flags the SDM calls undefined get deja's fixed, documented value
// (see docs/interp-alu.md, "Undefined flags"), never host-dependent garbage.
struct AluResult {
  uint64_t value = 0;
  uint64_t flags = 0;
};

enum class BinaryOp : uint8_t { kAdd, kOr, kAdc, kSbb, kAnd, kSub, kXor, kCmp, kTest };
// ADD/OR/ADC/SBB/AND/SUB/XOR; CMP and TEST return the flags and value = a unchanged.
AluResult alu_binary(BinaryOp op, uint64_t a, uint64_t b, unsigned width, uint64_t flags);
AluResult alu_inc(uint64_t a, unsigned width, uint64_t flags);  // CF preserved
AluResult alu_dec(uint64_t a, unsigned width, uint64_t flags);  // CF preserved
AluResult alu_neg(uint64_t a, unsigned width, uint64_t flags);
AluResult alu_not(uint64_t a, unsigned width, uint64_t flags);  // flags unchanged

enum class ShiftOp : uint8_t { kRol, kRor, kRcl, kRcr, kShl, kShr, kSal, kSar };
// `count` is the raw count operand; masked to 5 bits (6 for 64-bit) as the SDM says. A masked
// count of 0 leaves value and flags unchanged. Counts >= width (8/16-bit) follow the SDM.
AluResult alu_shift(ShiftOp op, uint64_t a, uint64_t count, unsigned width, uint64_t flags);
// SHLD/SHRD: dst shifted, filled from src. width 16, 32 or 64.
AluResult alu_shld(uint64_t dst, uint64_t src, uint64_t count, unsigned width, uint64_t flags);
AluResult alu_shrd(uint64_t dst, uint64_t src, uint64_t count, unsigned width, uint64_t flags);

// One-operand MUL/IMUL: the double-width product as (hi, lo), each zero-extended `width` bits.
struct WideResult {
  uint64_t lo = 0;
  uint64_t hi = 0;
  uint64_t flags = 0;
};
WideResult alu_mul(uint64_t a, uint64_t b, unsigned width, uint64_t flags);
WideResult alu_imul_wide(uint64_t a, uint64_t b, unsigned width, uint64_t flags);
// Two/three-operand IMUL: the truncated product; CF=OF=1 when it does not fit.
AluResult alu_imul(uint64_t a, uint64_t b, unsigned width, uint64_t flags);

// DIV/IDIV of (hi:lo) by divisor. `fault` = #DE (divide by zero or quotient overflow).
struct DivResult {
  uint64_t quotient = 0;
  uint64_t remainder = 0;
  bool fault = false;
};
DivResult alu_div(uint64_t hi, uint64_t lo, uint64_t divisor, unsigned width);
DivResult alu_idiv(uint64_t hi, uint64_t lo, uint64_t divisor, unsigned width);

enum class BitScanOp : uint8_t { kBsf, kBsr, kTzcnt, kLzcnt, kPopcnt };
// `old_dst` is returned unchanged for BSF/BSR of a zero source (as Intel and AMD hardware do).
AluResult alu_bit_scan(BitScanOp op, uint64_t src, uint64_t old_dst, unsigned width, uint64_t flags);

enum class BitTestOp : uint8_t { kBt, kBts, kBtr, kBtc };
// `bit` is already reduced to [0, width) by the caller (register form) or to the bit within the
// addressed operand (memory form). value = the operand after the set/reset/complement.
AluResult alu_bit_test(BitTestOp op, uint64_t a, unsigned bit, unsigned width, uint64_t flags);

// Flag helpers shared with the executor. Defined inline: they sit on the interpreter's hot path.
inline bool parity_even(uint8_t low_byte) { return (__builtin_popcount(low_byte) & 1) == 0; }
inline uint64_t width_mask(unsigned width) { return width >= 64 ? ~uint64_t{0} : (uint64_t{1} << width) - 1; }
inline uint64_t sign_extend(uint64_t value, unsigned from_width) {
  const unsigned shift = 64 - from_width;
  return from_width >= 64 ? value : static_cast<uint64_t>(static_cast<int64_t>(value << shift) >> shift);
}

// Condition codes (Jcc/SETcc/CMOVcc), encoded as the low nibble of the opcode (0 = O ... 15 = G).
inline bool condition_holds(unsigned cc, uint64_t flags) {
  const bool cf = flags & kCf, zf = flags & kZf, sf = flags & kSf, of = flags & kOf, pf = flags & kPf;
  bool holds = false;
  switch ((cc >> 1) & 7) {
    case 0: holds = of; break;               // O / NO
    case 1: holds = cf; break;               // B / AE
    case 2: holds = zf; break;               // E / NE
    case 3: holds = cf || zf; break;         // BE / A
    case 4: holds = sf; break;               // S / NS
    case 5: holds = pf; break;               // P / NP
    case 6: holds = sf != of; break;         // L / GE
    default: holds = zf || (sf != of); break;  // LE / G
  }
  return (cc & 1) ? !holds : holds;
}

}  // namespace deja::interp
