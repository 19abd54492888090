// Lazy arithmetic flags of the fast path: the last flag-setting operation and its operands, turned into RFLAGS bits only when read.
#pragma once

#include <cstdint>

#include "interp/alu.h"

namespace deja::interp {

// The operation that set the flags last. Its width is folded in: cc = kind * 4 + log2(width in bytes).
// Every kind reproduces exactly what interp/alu.cpp computes (undefined flags included).
enum CcKind : uint32_t {
  kCcNone = 0,  // RFLAGS holds the flags
  kCcAdd,       // ADD, XADD: dst = a + b                        (src1 = a, src2 = b)
  kCcAdc,       // ADC: dst = a + b + CF                         (src1 = a, src2 = b)
  kCcSub,       // SUB, CMP, NEG (a = 0), CMPS, SCAS, CMPXCHG    (src1 = a, src2 = b)
  kCcSbb,       // SBB: dst = a - b - CF                         (src1 = a, src2 = b)
  kCcLogic,     // AND, OR, XOR, TEST: CF = OF = AF = 0
  kCcInc,       // INC: src2 = the CF it keeps
  kCcDec,       // DEC: src2 = the CF it keeps
  kCcSzp,       // SF, ZF, PF from dst; CF, OF, AF as given in src2 (shifts, MUL/IMUL)
};

constexpr uint32_t cc_code(CcKind kind, unsigned width_bytes) {
  return uint32_t(kind) * 4 + (width_bytes == 1 ? 0 : width_bytes == 2 ? 1 : width_bytes == 4 ? 2 : 3);
}

struct LazyFlags {
  uint32_t cc = kCcNone;
  uint64_t dst = 0;   // the result, masked to the width
  uint64_t src1 = 0;  // operands, masked to the width
  uint64_t src2 = 0;
};

inline unsigned cc_width_bits(uint32_t cc) { return 8u << (cc & 3); }

inline uint64_t cc_szp(uint64_t r, unsigned width) {
  uint64_t out = ((r >> (width - 1)) & 1) ? kSf : 0;
  if (r == 0) out |= kZf;
  if (parity_even(static_cast<uint8_t>(r))) out |= kPf;
  return out;
}

// The six arithmetic flags the lazy state stands for (cc != kCcNone).
inline uint64_t cc_compute(const LazyFlags& f) {
  const unsigned w = cc_width_bits(f.cc);
  const uint64_t a = f.src1, b = f.src2, r = f.dst;
  auto msb = [w](uint64_t v) { return (v >> (w - 1)) & 1; };
  switch (f.cc >> 2) {
    case kCcAdd:
    case kCcAdc: {
      const uint64_t carries = (a & b) | ((a | b) & ~r);
      return cc_szp(r, w) | (msb(carries) ? kCf : 0) | (msb((a ^ r) & (b ^ r)) ? kOf : 0) | ((a ^ b ^ r) & kAf);
    }
    case kCcSub:
    case kCcSbb: {
      const uint64_t borrows = (~a & b) | ((~a | b) & r);
      return cc_szp(r, w) | (msb(borrows) ? kCf : 0) | (msb((a ^ b) & (a ^ r)) ? kOf : 0) | ((a ^ b ^ r) & kAf);
    }
    case kCcLogic: return cc_szp(r, w);
    case kCcInc: {
      const uint64_t sign = uint64_t{1} << (w - 1);
      return cc_szp(r, w) | (r == sign ? kOf : 0) | ((r & 0xf) == 0 ? kAf : 0) | (b & kCf);
    }
    case kCcDec: {
      const uint64_t sign = uint64_t{1} << (w - 1);
      return cc_szp(r, w) | (r == sign - 1 ? kOf : 0) | ((r & 0xf) == 0xf ? kAf : 0) | (b & kCf);
    }
    default: return cc_szp(r, w) | (b & (kCf | kOf | kAf));
  }
}

// CF alone (INC/DEC keep it, ADC/SBB/RCL/RCR read it).
[[gnu::always_inline]] inline bool cc_carry(const LazyFlags& f, uint64_t rflags) {
  switch (f.cc >> 2) {
    case kCcNone: return rflags & kCf;
    case kCcSub: return f.src1 < f.src2;
    case kCcLogic: return false;
    case kCcInc:
    case kCcDec:
    case kCcSzp: return f.src2 & kCf;
    default: return cc_compute(f) & kCf;
  }
}

// Condition `cc` (the low nibble of Jcc/SETcc/CMOVcc), from the lazy state where that is cheap.
[[gnu::always_inline]] inline bool cc_condition(const LazyFlags& f, unsigned cc, uint64_t rflags) {
  const unsigned kind = f.cc >> 2;
  if (kind == kCcNone) return condition_holds(cc, rflags);
  const unsigned w = cc_width_bits(f.cc);
  const uint64_t r = f.dst;
  bool holds;
  if (kind == kCcSub) {
    const uint64_t a = f.src1, b = f.src2;
    const int64_t sa = static_cast<int64_t>(sign_extend(a, w)), sb = static_cast<int64_t>(sign_extend(b, w));
    switch ((cc >> 1) & 7) {
      case 0: holds = (((a ^ b) & (a ^ r)) >> (w - 1)) & 1; break;
      case 1: holds = a < b; break;
      case 2: holds = r == 0; break;
      case 3: holds = a <= b; break;
      case 4: holds = (r >> (w - 1)) & 1; break;
      case 5: holds = parity_even(static_cast<uint8_t>(r)); break;
      case 6: holds = sa < sb; break;
      default: holds = sa <= sb; break;
    }
  } else if (kind == kCcLogic) {
    const bool sf = (r >> (w - 1)) & 1;
    switch ((cc >> 1) & 7) {
      case 0: case 1: holds = false; break;
      case 2: case 3: holds = r == 0; break;
      case 4: case 6: holds = sf; break;
      case 5: holds = parity_even(static_cast<uint8_t>(r)); break;
      default: holds = r == 0 || sf; break;
    }
  } else {
    return condition_holds(cc, (rflags & ~kArithFlags) | cc_compute(f));
  }
  return (cc & 1) ? !holds : holds;
}

}  // namespace deja::interp
