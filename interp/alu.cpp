// Integer ALU of the software CPU: results and RFLAGS per the Intel SDM; undefined flags get the values in docs/interp-alu.md.
#include "interp/alu.h"

namespace deja::interp {
namespace {

using u128 = unsigned __int128;
using i128 = __int128;

inline uint64_t msb(uint64_t value, unsigned width) { return (value >> (width - 1)) & 1; }

// SF, ZF and PF of a width-masked result: every instruction that defines them defines them this way.
inline uint64_t szp(uint64_t result, unsigned width) {
  uint64_t out = msb(result, width) ? kSf : 0;
  if (result == 0) out |= kZf;
  if (parity_even(static_cast<uint8_t>(result))) out |= kPf;
  return out;
}

inline uint64_t bit_if(bool condition, uint64_t flag) { return condition ? flag : 0; }

// Replaces the flags in `defined` and keeps the rest of RFLAGS.
inline uint64_t merge(uint64_t flags, uint64_t defined, uint64_t computed) { return (flags & ~defined) | computed; }

inline uint64_t shift_count_mask(unsigned width) { return width == 64 ? 63 : 31; }

}  // namespace

AluResult alu_binary(BinaryOp op, uint64_t a, uint64_t b, unsigned width, uint64_t flags) {
  const uint64_t mask = width_mask(width);
  a &= mask;
  b &= mask;
  uint64_t r = 0;
  switch (op) {
    case BinaryOp::kAdd:
    case BinaryOp::kAdc: {
      const uint64_t carry_in = (op == BinaryOp::kAdc && (flags & kCf)) ? 1 : 0;
      r = (a + b + carry_in) & mask;
      // The carry out of the top bit is the majority of a, b and the carry into it (= a^b^r there).
      const uint64_t carries = (a & b) | ((a | b) & ~r);
      const uint64_t computed = szp(r, width) | bit_if(msb(carries, width), kCf) |
                                bit_if(msb((a ^ r) & (b ^ r), width), kOf) | ((a ^ b ^ r) & kAf);
      return {r, merge(flags, kArithFlags, computed)};
    }
    case BinaryOp::kSub:
    case BinaryOp::kSbb:
    case BinaryOp::kCmp: {
      const uint64_t borrow_in = (op == BinaryOp::kSbb && (flags & kCf)) ? 1 : 0;
      r = (a - b - borrow_in) & mask;
      const uint64_t borrows = (~a & b) | ((~a | b) & r);
      const uint64_t computed = szp(r, width) | bit_if(msb(borrows, width), kCf) |
                                bit_if(msb((a ^ b) & (a ^ r), width), kOf) | ((a ^ b ^ r) & kAf);
      return {op == BinaryOp::kCmp ? a : r, merge(flags, kArithFlags, computed)};
    }
    case BinaryOp::kOr: r = a | b; break;
    case BinaryOp::kAnd:
    case BinaryOp::kTest: r = a & b; break;
    case BinaryOp::kXor: r = a ^ b; break;
  }
  // Logical ops: CF = OF = 0 (defined), AF undefined -> deja clears it.
  return {op == BinaryOp::kTest ? a : r, merge(flags, kArithFlags, szp(r, width))};
}

AluResult alu_inc(uint64_t a, unsigned width, uint64_t flags) {
  const uint64_t mask = width_mask(width);
  a &= mask;
  const uint64_t r = (a + 1) & mask;
  const uint64_t sign = uint64_t{1} << (width - 1);
  const uint64_t computed = szp(r, width) | bit_if(r == sign, kOf) | bit_if((r & 0xf) == 0, kAf);
  return {r, merge(flags, kArithFlags & ~kCf, computed)};
}

AluResult alu_dec(uint64_t a, unsigned width, uint64_t flags) {
  const uint64_t mask = width_mask(width);
  a &= mask;
  const uint64_t r = (a - 1) & mask;
  const uint64_t sign = uint64_t{1} << (width - 1);
  const uint64_t computed = szp(r, width) | bit_if(a == sign, kOf) | bit_if((a & 0xf) == 0, kAf);
  return {r, merge(flags, kArithFlags & ~kCf, computed)};
}

AluResult alu_neg(uint64_t a, unsigned width, uint64_t flags) {
  const uint64_t mask = width_mask(width);
  a &= mask;
  const uint64_t r = (0 - a) & mask;
  const uint64_t sign = uint64_t{1} << (width - 1);
  const uint64_t computed =
      szp(r, width) | bit_if(a != 0, kCf) | bit_if(a == sign, kOf) | bit_if((a & 0xf) != 0, kAf);
  return {r, merge(flags, kArithFlags, computed)};
}

AluResult alu_not(uint64_t a, unsigned width, uint64_t flags) { return {~a & width_mask(width), flags}; }

AluResult alu_shift(ShiftOp op, uint64_t a, uint64_t count, unsigned width, uint64_t flags) {
  const uint64_t mask = width_mask(width);
  a &= mask;
  const unsigned c = static_cast<unsigned>(count & shift_count_mask(width));
  if (c == 0) return {a, flags};
  uint64_t r = 0;
  bool cf = false;
  switch (op) {
    case ShiftOp::kRol:
    case ShiftOp::kRor: {
      // Rotates touch only CF and OF; the masked count is nonzero, so CF is updated even when the
      // rotation is a whole turn (SDM: "IF (COUNT & COUNTMASK) != 0 THEN CF <- LSB(DEST)").
      const unsigned turn = c % width;
      if (op == ShiftOp::kRol) {
        r = turn == 0 ? a : ((a << turn) | (a >> (width - turn))) & mask;
        cf = r & 1;
        const bool of = msb(r, width) ^ cf;
        return {r, merge(flags, kCf | kOf, bit_if(cf, kCf) | bit_if(of, kOf))};
      }
      r = turn == 0 ? a : ((a >> turn) | (a << (width - turn))) & mask;
      cf = msb(r, width);
      const bool of = msb(r, width) ^ msb(r, width - 1);
      return {r, merge(flags, kCf | kOf, bit_if(cf, kCf) | bit_if(of, kOf))};
    }
    case ShiftOp::kRcl:
    case ShiftOp::kRcr: {
      // A (width+1)-bit rotation through CF; 8/16-bit counts wrap modulo 9/17.
      const unsigned span = width + 1;
      const unsigned turn = width == 8 ? c % 9 : width == 16 ? c % 17 : c;
      const bool old_cf = flags & kCf;
      const u128 whole = static_cast<u128>(a) | (static_cast<u128>(old_cf) << width);
      const u128 span_mask = (static_cast<u128>(1) << span) - 1;
      u128 rotated = whole;
      if (turn != 0) {
        rotated = op == ShiftOp::kRcl ? ((whole << turn) | (whole >> (span - turn))) & span_mask
                                      : ((whole >> turn) | (whole << (span - turn))) & span_mask;
      }
      r = static_cast<uint64_t>(rotated) & mask;
      cf = static_cast<uint64_t>(rotated >> width) & 1;
      const bool of = op == ShiftOp::kRcl ? (msb(r, width) ^ cf) : (msb(r, width) ^ msb(r, width - 1));
      return {r, merge(flags, kCf | kOf, bit_if(cf, kCf) | bit_if(of, kOf))};
    }
    case ShiftOp::kShl:
    case ShiftOp::kSal: {
      if (c < width) {
        r = (a << c) & mask;
        cf = (a >> (width - c)) & 1;
      } else {  // only 8/16-bit: the bits all leave; CF is the last one out (0 once past bit 0).
        r = 0;
        cf = c == width ? (a & 1) : false;
      }
      const bool of = msb(r, width) ^ cf;
      return {r, merge(flags, kArithFlags, szp(r, width) | bit_if(cf, kCf) | bit_if(of, kOf))};
    }
    case ShiftOp::kShr: {
      if (c < width) {
        r = a >> c;
        cf = (a >> (c - 1)) & 1;
      } else {
        r = 0;
        cf = c == width ? msb(a, width) : false;
      }
      const bool of = msb(a, width);
      return {r, merge(flags, kArithFlags, szp(r, width) | bit_if(cf, kCf) | bit_if(of, kOf))};
    }
    case ShiftOp::kSar: {
      const int64_t signed_a = static_cast<int64_t>(sign_extend(a, width));
      const unsigned effective = c < width ? c : width - 1;
      r = static_cast<uint64_t>(signed_a >> effective) & mask;
      cf = c < width ? ((signed_a >> (c - 1)) & 1) : msb(a, width);
      return {r, merge(flags, kArithFlags, szp(r, width) | bit_if(cf, kCf))};
    }
  }
  return {a, flags};
}

AluResult alu_shld(uint64_t dst, uint64_t src, uint64_t count, unsigned width, uint64_t flags) {
  const uint64_t mask = width_mask(width);
  dst &= mask;
  src &= mask;
  const unsigned c = static_cast<unsigned>(count & shift_count_mask(width));
  if (c == 0) return {dst, flags};
  uint64_t r = 0;
  bool cf = false;
  if (width == 16) {
    // Counts 17..31 are undefined; deja shifts the 48-bit dst:src:dst (as Intel hardware and Bochs do).
    const uint64_t whole = (dst << 32) | (src << 16) | dst;
    r = ((whole << c) >> 32) & mask;
    cf = (whole >> (48 - c)) & 1;
  } else {
    r = ((dst << c) | (src >> (width - c))) & mask;
    cf = (dst >> (width - c)) & 1;
  }
  const bool of = msb(r, width) ^ cf;
  return {r, merge(flags, kArithFlags, szp(r, width) | bit_if(cf, kCf) | bit_if(of, kOf))};
}

AluResult alu_shrd(uint64_t dst, uint64_t src, uint64_t count, unsigned width, uint64_t flags) {
  const uint64_t mask = width_mask(width);
  dst &= mask;
  src &= mask;
  const unsigned c = static_cast<unsigned>(count & shift_count_mask(width));
  if (c == 0) return {dst, flags};
  uint64_t r = 0;
  bool cf = false;
  if (width == 16) {
    const uint64_t whole = (dst << 32) | (src << 16) | dst;
    r = (whole >> c) & mask;
    cf = (whole >> (c - 1)) & 1;
  } else {
    r = ((dst >> c) | (src << (width - c))) & mask;
    cf = (dst >> (c - 1)) & 1;
  }
  const bool of = msb(r, width) ^ msb(r, width - 1);
  return {r, merge(flags, kArithFlags, szp(r, width) | bit_if(cf, kCf) | bit_if(of, kOf))};
}

WideResult alu_mul(uint64_t a, uint64_t b, unsigned width, uint64_t flags) {
  const uint64_t mask = width_mask(width);
  const u128 product = static_cast<u128>(a & mask) * static_cast<u128>(b & mask);
  const uint64_t lo = static_cast<uint64_t>(product) & mask;
  const uint64_t hi = static_cast<uint64_t>(product >> width) & mask;
  const bool overflow = hi != 0;
  // SF/ZF/PF/AF are undefined: deja derives SF/ZF/PF from the low half and clears AF.
  const uint64_t computed = szp(lo, width) | bit_if(overflow, kCf | kOf);
  return {lo, hi, merge(flags, kArithFlags, computed)};
}

WideResult alu_imul_wide(uint64_t a, uint64_t b, unsigned width, uint64_t flags) {
  const uint64_t mask = width_mask(width);
  const i128 product = static_cast<i128>(static_cast<int64_t>(sign_extend(a & mask, width))) *
                       static_cast<i128>(static_cast<int64_t>(sign_extend(b & mask, width)));
  const uint64_t lo = static_cast<uint64_t>(product) & mask;
  const uint64_t hi = static_cast<uint64_t>(static_cast<u128>(product) >> width) & mask;
  const bool overflow = product != static_cast<i128>(static_cast<int64_t>(sign_extend(lo, width)));
  const uint64_t computed = szp(lo, width) | bit_if(overflow, kCf | kOf);
  return {lo, hi, merge(flags, kArithFlags, computed)};
}

AluResult alu_imul(uint64_t a, uint64_t b, unsigned width, uint64_t flags) {
  const WideResult wide = alu_imul_wide(a, b, width, flags);
  return {wide.lo, wide.flags};
}

DivResult alu_div(uint64_t hi, uint64_t lo, uint64_t divisor, unsigned width) {
  const uint64_t mask = width_mask(width);
  divisor &= mask;
  if (divisor == 0) return {0, 0, true};
  const u128 dividend = (static_cast<u128>(hi & mask) << width) | (lo & mask);
  const u128 quotient = dividend / divisor;
  if (quotient > mask) return {0, 0, true};
  return {static_cast<uint64_t>(quotient), static_cast<uint64_t>(dividend % divisor), false};
}

DivResult alu_idiv(uint64_t hi, uint64_t lo, uint64_t divisor, unsigned width) {
  const uint64_t mask = width_mask(width);
  const int64_t signed_divisor = static_cast<int64_t>(sign_extend(divisor & mask, width));
  if (signed_divisor == 0) return {0, 0, true};
  const u128 raw = (static_cast<u128>(hi & mask) << width) | (lo & mask);
  // Sign-extend the 2*width-bit dividend to 128 bits.
  const unsigned shift = 128 - 2 * width;
  const i128 dividend = static_cast<i128>(raw << shift) >> shift;
  const i128 min128 = static_cast<i128>(static_cast<u128>(1) << 127);
  if (signed_divisor == -1 && dividend == min128) return {0, 0, true};  // would overflow even i128
  const i128 quotient = dividend / signed_divisor;
  const i128 remainder = dividend % signed_divisor;
  const i128 lowest = -(static_cast<i128>(1) << (width - 1));
  const i128 highest = (static_cast<i128>(1) << (width - 1)) - 1;
  if (quotient < lowest || quotient > highest) return {0, 0, true};
  return {static_cast<uint64_t>(quotient) & mask, static_cast<uint64_t>(remainder) & mask, false};
}

AluResult alu_bit_scan(BitScanOp op, uint64_t src, uint64_t old_dst, unsigned width, uint64_t flags) {
  src &= width_mask(width);
  switch (op) {
    case BitScanOp::kBsf:
    case BitScanOp::kBsr: {
      // CF/OF/SF/AF/PF are undefined: deja clears them.
      if (src == 0) return {old_dst, merge(flags, kArithFlags, kZf)};
      const uint64_t index = op == BitScanOp::kBsf ? static_cast<uint64_t>(__builtin_ctzll(src))
                                                   : static_cast<uint64_t>(63 - __builtin_clzll(src));
      return {index, merge(flags, kArithFlags, 0)};
    }
    case BitScanOp::kTzcnt:
    case BitScanOp::kLzcnt: {
      uint64_t r = width;
      if (src != 0) {
        r = op == BitScanOp::kTzcnt ? static_cast<uint64_t>(__builtin_ctzll(src))
                                    : static_cast<uint64_t>(__builtin_clzll(src)) - (64 - width);
      }
      // OF/SF/AF/PF are undefined: deja clears them.
      return {r, merge(flags, kArithFlags, bit_if(src == 0, kCf) | bit_if(r == 0, kZf))};
    }
    case BitScanOp::kPopcnt:
      return {static_cast<uint64_t>(__builtin_popcountll(src)), merge(flags, kArithFlags, bit_if(src == 0, kZf))};
  }
  return {old_dst, flags};
}

AluResult alu_bit_test(BitTestOp op, uint64_t a, unsigned bit, unsigned width, uint64_t flags) {
  a &= width_mask(width);
  const uint64_t selected = uint64_t{1} << (bit & (width - 1));
  uint64_t r = a;
  switch (op) {
    case BitTestOp::kBt: break;
    case BitTestOp::kBts: r = a | selected; break;
    case BitTestOp::kBtr: r = a & ~selected; break;
    case BitTestOp::kBtc: r = a ^ selected; break;
  }
  // OF/SF/AF/PF are undefined and ZF is unaffected: deja leaves all of them as they were.
  return {r, merge(flags, kCf, bit_if(a & selected, kCf))};
}

}  // namespace deja::interp
