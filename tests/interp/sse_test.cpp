// Tests of interp/sse: integer ops against the host's SSE2 instructions, FP against compiled C++ and the SDM's special cases (NaN, DAZ/FTZ, faults).
#include <gtest/gtest.h>

#include <bit>
#include <cfenv>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>

#include "interp/sse.h"

namespace deja::interp::sse {
namespace {

using Vec = long long __attribute__((vector_size(16)));

Vec to_vec(Xmm x) { return Vec{static_cast<long long>(x.lo), static_cast<long long>(x.hi)}; }
Xmm from_vec(Vec v) { return {static_cast<uint64_t>(v[0]), static_cast<uint64_t>(v[1])}; }

// Every IntOp with the host instruction that defines it.
#define DEJA_INT_OPS(X)                                                                                          \
  X(kPand, "pand") X(kPandn, "pandn") X(kPor, "por") X(kPxor, "pxor") X(kPaddb, "paddb") X(kPaddw, "paddw")       \
  X(kPaddd, "paddd") X(kPaddq, "paddq") X(kPaddsb, "paddsb") X(kPaddsw, "paddsw") X(kPaddusb, "paddusb")          \
  X(kPaddusw, "paddusw") X(kPsubb, "psubb") X(kPsubw, "psubw") X(kPsubd, "psubd") X(kPsubq, "psubq")              \
  X(kPsubsb, "psubsb") X(kPsubsw, "psubsw") X(kPsubusb, "psubusb") X(kPsubusw, "psubusw") X(kPcmpeqb, "pcmpeqb")  \
  X(kPcmpeqw, "pcmpeqw") X(kPcmpeqd, "pcmpeqd") X(kPcmpgtb, "pcmpgtb") X(kPcmpgtw, "pcmpgtw")                     \
  X(kPcmpgtd, "pcmpgtd") X(kPmullw, "pmullw") X(kPmulhw, "pmulhw") X(kPmulhuw, "pmulhuw") X(kPmuludq, "pmuludq")  \
  X(kPmaddwd, "pmaddwd") X(kPminub, "pminub") X(kPmaxub, "pmaxub") X(kPminsw, "pminsw") X(kPmaxsw, "pmaxsw")      \
  X(kPavgb, "pavgb") X(kPavgw, "pavgw") X(kPsadbw, "psadbw") X(kPunpcklbw, "punpcklbw")                           \
  X(kPunpcklwd, "punpcklwd") X(kPunpckldq, "punpckldq") X(kPunpcklqdq, "punpcklqdq") X(kPunpckhbw, "punpckhbw")   \
  X(kPunpckhwd, "punpckhwd") X(kPunpckhdq, "punpckhdq") X(kPunpckhqdq, "punpckhqdq") X(kPacksswb, "packsswb")     \
  X(kPackuswb, "packuswb") X(kPackssdw, "packssdw") X(kPsllw, "psllw") X(kPslld, "pslld") X(kPsllq, "psllq")      \
  X(kPsrlw, "psrlw") X(kPsrld, "psrld") X(kPsrlq, "psrlq") X(kPsraw, "psraw") X(kPsrad, "psrad")                  \
  X(kUnpcklps, "unpcklps") X(kUnpckhps, "unpckhps") X(kUnpcklpd, "unpcklpd") X(kUnpckhpd, "unpckhpd")

Xmm host_int(IntOp op, Xmm a, Xmm b) {
  Vec va = to_vec(a);
  const Vec vb = to_vec(b);
  switch (op) {
#define DEJA_CASE(OP, INSN)                                    \
  case IntOp::OP:                                              \
    asm(INSN " %[b], %[a]" : [a] "+x"(va) : [b] "x"(vb));      \
    break;
    DEJA_INT_OPS(DEJA_CASE)
#undef DEJA_CASE
  }
  return from_vec(va);
}

const char* int_op_name(IntOp op) {
  switch (op) {
#define DEJA_NAME(OP, INSN) \
  case IntOp::OP: return INSN;
    DEJA_INT_OPS(DEJA_NAME)
#undef DEJA_NAME
  }
  return "?";
}

constexpr IntOp kAllIntOps[] = {
#define DEJA_LIST(OP, INSN) IntOp::OP,
    DEJA_INT_OPS(DEJA_LIST)
#undef DEJA_LIST
};

class Random {
 public:
  explicit Random(uint64_t seed) : rng_(seed) {}
  uint64_t word() {
    // Lanes full of the saturation and sign boundaries, mixed with plain random data.
    static constexpr uint64_t kEdges[] = {0, ~0ull, 0x8000800080008000ull, 0x7fff7fff7fff7fffull,
                                          0x8080808080808080ull, 0x7f7f7f7f7f7f7f7full, 0x0001000100010001ull,
                                          0x8000000080000000ull, 0x7fffffff7fffffffull, 0x00ff00ff00ff00ffull};
    const uint64_t pick = rng_() % 16;
    return pick < std::size(kEdges) ? kEdges[pick] ^ (rng_() % 4 == 0 ? rng_() & 0x0101010101010101ull : 0) : rng_();
  }
  Xmm xmm() { return {word(), word()}; }
  uint64_t raw() { return rng_(); }

 private:
  std::mt19937_64 rng_;
};

::testing::AssertionResult same_xmm(Xmm deja, Xmm host) {
  if (deja == host) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << std::hex << "deja " << deja.hi << ":" << deja.lo << " host " << host.hi << ":"
                                       << host.lo;
}

TEST(SseHost, IntegerBinaryOps) {
  Random random(11);
  for (IntOp op : kAllIntOps) {
    for (int i = 0; i < 3000; ++i) {
      const Xmm a = random.xmm();
      Xmm b = random.xmm();
      // Shift counts: mostly in range, sometimes just past the lane width or huge.
      const bool shift = op >= IntOp::kPsllw && op <= IntOp::kPsrad;
      if (shift) b = {i % 3 == 0 ? random.raw() : random.raw() % 70, random.raw()};
      EXPECT_TRUE(same_xmm(int_binary(op, a, b), host_int(op, a, b)))
          << int_op_name(op) << std::hex << " a=" << a.hi << ":" << a.lo << " b=" << b.hi << ":" << b.lo;
    }
  }
}

template <int kCount>
void check_shift_imm(Xmm a) {
  Vec v[8];
  for (Vec& x : v) x = to_vec(a);
  asm("psllw %[c], %[v0]\n\tpslld %[c], %[v1]\n\tpsllq %[c], %[v2]\n\tpsrlw %[c], %[v3]\n\t"
      "psrld %[c], %[v4]\n\tpsrlq %[c], %[v5]\n\tpsraw %[c], %[v6]\n\tpsrad %[c], %[v7]"
      : [v0] "+x"(v[0]), [v1] "+x"(v[1]), [v2] "+x"(v[2]), [v3] "+x"(v[3]), [v4] "+x"(v[4]), [v5] "+x"(v[5]),
        [v6] "+x"(v[6]), [v7] "+x"(v[7])
      : [c] "i"(kCount));
  const IntOp ops[] = {IntOp::kPsllw, IntOp::kPslld, IntOp::kPsllq, IntOp::kPsrlw,
                       IntOp::kPsrld, IntOp::kPsrlq, IntOp::kPsraw, IntOp::kPsrad};
  for (int i = 0; i < 8; ++i) EXPECT_TRUE(same_xmm(shift_imm(ops[i], a, kCount), from_vec(v[i]))) << int_op_name(ops[i]) << " imm " << kCount;
  Vec l = to_vec(a), r = to_vec(a);
  asm("pslldq %[c], %[l]\n\tpsrldq %[c], %[r]" : [l] "+x"(l), [r] "+x"(r) : [c] "i"(kCount));
  EXPECT_TRUE(same_xmm(pslldq(a, kCount), from_vec(l))) << "pslldq " << kCount;
  EXPECT_TRUE(same_xmm(psrldq(a, kCount), from_vec(r))) << "psrldq " << kCount;
}

template <int... kCounts>
void check_shift_imms(Xmm a, std::integer_sequence<int, kCounts...>) {
  (check_shift_imm<kCounts>(a), ...);
}

TEST(SseHost, ShiftsByImmediate) {
  Random random(12);
  for (int i = 0; i < 50; ++i) {
    check_shift_imms(random.xmm(), std::make_integer_sequence<int, 70>{});
    check_shift_imm<255>(random.xmm());
    check_shift_imm<128>(random.xmm());
  }
}

template <int kOrder>
void check_shuffles(Xmm a, Xmm b) {
  Vec d = to_vec(a), lw = to_vec(a), hw = to_vec(a), ps = to_vec(a), pd = to_vec(a);
  const Vec vb = to_vec(b);
  asm("pshufd %[o], %[b], %[d]\n\tpshuflw %[o], %[b], %[lw]\n\tpshufhw %[o], %[b], %[hw]\n\t"
      "shufps %[o], %[b], %[ps]\n\tshufpd %[o], %[b], %[pd]"
      : [d] "+x"(d), [lw] "+x"(lw), [hw] "+x"(hw), [ps] "+x"(ps), [pd] "+x"(pd)
      : [b] "x"(vb), [o] "i"(kOrder));
  EXPECT_TRUE(same_xmm(pshufd(b, kOrder), from_vec(d))) << "pshufd " << kOrder;
  EXPECT_TRUE(same_xmm(pshuflw(b, kOrder), from_vec(lw))) << "pshuflw " << kOrder;
  EXPECT_TRUE(same_xmm(pshufhw(b, kOrder), from_vec(hw))) << "pshufhw " << kOrder;
  EXPECT_TRUE(same_xmm(shufps(a, b, kOrder), from_vec(ps))) << "shufps " << kOrder;
  EXPECT_TRUE(same_xmm(shufpd(a, b, kOrder), from_vec(pd))) << "shufpd " << kOrder;
  uint32_t word;
  Vec inserted = to_vec(a);
  const uint32_t value = static_cast<uint32_t>(b.lo);
  asm("pextrw %[o], %[b], %[w]\n\tpinsrw %[o], %[v], %[i]" : [w] "=&r"(word), [i] "+x"(inserted) : [b] "x"(vb), [v] "r"(value), [o] "i"(kOrder));
  EXPECT_EQ(pextrw(b, kOrder), word) << "pextrw " << kOrder;
  EXPECT_TRUE(same_xmm(pinsrw(a, static_cast<uint16_t>(value), kOrder), from_vec(inserted))) << "pinsrw " << kOrder;
}

template <int... kOrders>
void check_all_shuffles(Xmm a, Xmm b, std::integer_sequence<int, kOrders...>) {
  (check_shuffles<kOrders>(a, b), ...);
}

TEST(SseHost, ShufflesAndWordInsertExtract) {
  Random random(13);
  for (int i = 0; i < 20; ++i) check_all_shuffles(random.xmm(), random.xmm(), std::make_integer_sequence<int, 256>{});
}

TEST(SseHost, MoveMasks) {
  Random random(14);
  for (int i = 0; i < 5000; ++i) {
    const Xmm a = random.xmm();
    const Vec v = to_vec(a);
    uint32_t b, s, d;
    asm("pmovmskb %[v], %[b]\n\tmovmskps %[v], %[s]\n\tmovmskpd %[v], %[d]" : [b] "=&r"(b), [s] "=&r"(s), [d] "=&r"(d) : [v] "x"(v));
    EXPECT_EQ(pmovmskb(a), b);
    EXPECT_EQ(movmskps(a), s);
    EXPECT_EQ(movmskpd(a), d);
  }
}

// ---- Floating point ----

constexpr double kInfinity = std::numeric_limits<double>::infinity();
uint64_t bits(double d) { return std::bit_cast<uint64_t>(d); }
double dbl(uint64_t u) { return std::bit_cast<double>(u); }
uint32_t bits(float f) { return std::bit_cast<uint32_t>(f); }

double random_double(Random& random) {
  static constexpr uint64_t kSpecial[] = {0, 0x8000000000000000ull, 0x7ff0000000000000ull, 0xfff0000000000000ull,
                                          0x7ff8000000000000ull, 0x7ff4000000000000ull, 0x0000000000000001ull,
                                          0x000fffffffffffffull, 0x3ff0000000000000ull, 0x7fefffffffffffffull};
  const uint64_t pick = random.raw() % 24;
  if (pick < std::size(kSpecial)) return dbl(kSpecial[pick]);
  if (pick < 16) return dbl(random.raw());
  return static_cast<double>(static_cast<int64_t>(random.raw() % 2000001) - 1000000) / 7.0;
}

// The compiler emits scalar SSE2 for double arithmetic on x86-64 under the default MXCSR, so
// compiled C++ is an independent reference for round-to-nearest results and NaN propagation.
TEST(SseFp, ScalarDoubleMatchesCompiledArithmetic) {
  Random random(21);
  for (int i = 0; i < 20000; ++i) {
    const volatile double x = random_double(random), y = random_double(random);
    const Xmm a{bits(x), 0x1122334455667788ull}, b{bits(y), 0x99};
    struct Case {
      FpOp op;
      double expected;
    };
    const Case cases[] = {{FpOp::kAdd, x + y}, {FpOp::kSub, x - y}, {FpOp::kMul, x * y}, {FpOp::kDiv, x / y},
                          {FpOp::kMin, x < y ? x : y}, {FpOp::kMax, x > y ? x : y}, {FpOp::kSqrt, __builtin_sqrt(y)}};
    // With two NaN operands the result's payload depends on operand order, which C leaves to the
    // compiler (GCC swaps commutative operands at some optimisation levels); the SDM's rule for that
    // case is checked directly in NanPropagationAndDefaultNan.
    const bool both_nan = x != x && y != y;
    for (const Case& c : cases) {
      const FpResult r = fp_arith(c.op, FpForm::kSd, a, b, mxcsr::kDefault);
      ASSERT_FALSE(r.fault);
      if (both_nan && c.op != FpOp::kSqrt && c.op != FpOp::kMin && c.op != FpOp::kMax) continue;
      EXPECT_EQ(r.value.lo, bits(c.expected)) << "op " << int(c.op) << std::hex << " x=" << bits(x) << " y=" << bits(y);
      EXPECT_EQ(r.value.hi, a.hi) << "scalar op must keep the destination's upper half";
    }
  }
}

TEST(SseFp, PackedSingleMatchesCompiledArithmetic) {
  Random random(22);
  for (int i = 0; i < 5000; ++i) {
    float x[4], y[4];
    for (int k = 0; k < 4; ++k) {
      x[k] = static_cast<float>(random_double(random));
      y[k] = static_cast<float>(random_double(random));
    }
    Xmm a, b;
    std::memcpy(&a.lo, x, 8);
    std::memcpy(&a.hi, x + 2, 8);
    std::memcpy(&b.lo, y, 8);
    std::memcpy(&b.hi, y + 2, 8);
    const FpResult sum = fp_arith(FpOp::kAdd, FpForm::kPs, a, b, mxcsr::kDefault);
    const FpResult product = fp_arith(FpOp::kMul, FpForm::kPs, a, b, mxcsr::kDefault);
    float s[4], p[4];
    std::memcpy(s, &sum.value.lo, 8);
    std::memcpy(s + 2, &sum.value.hi, 8);
    std::memcpy(p, &product.value.lo, 8);
    std::memcpy(p + 2, &product.value.hi, 8);
    for (int k = 0; k < 4; ++k) {
      const volatile float xs = x[k], ys = y[k];
      EXPECT_EQ(bits(s[k]), bits(static_cast<float>(xs + ys)));
      EXPECT_EQ(bits(p[k]), bits(static_cast<float>(xs * ys)));
    }
  }
}

uint32_t with_rounding(uint32_t rc) { return mxcsr::kDefault | (rc << mxcsr::kRcShift); }

TEST(SseFp, RoundingModesFollowMxcsr) {
  const Xmm one{bits(1.0), 0}, three{bits(3.0), 0};
  const uint64_t down = fp_arith(FpOp::kDiv, FpForm::kSd, one, three, with_rounding(1)).value.lo;
  const uint64_t up = fp_arith(FpOp::kDiv, FpForm::kSd, one, three, with_rounding(2)).value.lo;
  const uint64_t toward_zero = fp_arith(FpOp::kDiv, FpForm::kSd, one, three, with_rounding(3)).value.lo;
  EXPECT_EQ(up, down + 1);
  EXPECT_EQ(toward_zero, down);
  const FpResult nearest = fp_arith(FpOp::kDiv, FpForm::kSd, one, three, mxcsr::kDefault);
  EXPECT_EQ(nearest.value.lo, bits(1.0 / 3.0));
  EXPECT_EQ(nearest.mxcsr, mxcsr::kDefault | mxcsr::kPe);
  // Conversions: 2.5 and -2.5 under each rounding mode, and truncation ignoring it.
  const Xmm pos{bits(2.5), 0}, neg{bits(-2.5), 0};
  const int64_t expect_pos[4] = {2, 2, 3, 2}, expect_neg[4] = {-2, -3, -2, -2};
  for (uint32_t rc = 0; rc < 4; ++rc) {
    EXPECT_EQ(static_cast<int64_t>(cvtf2si(FpForm::kSd, false, pos, 64, with_rounding(rc)).value), expect_pos[rc]) << rc;
    EXPECT_EQ(static_cast<int64_t>(cvtf2si(FpForm::kSd, false, neg, 64, with_rounding(rc)).value), expect_neg[rc]) << rc;
    EXPECT_EQ(static_cast<int32_t>(cvtf2si(FpForm::kSd, true, neg, 32, with_rounding(rc)).value), -2) << rc;
  }
}

TEST(SseFp, NanPropagationAndDefaultNan) {
  const uint64_t qnan1 = 0x7ff8000000000001ull, qnan2 = 0x7ff8000000000002ull, snan = 0x7ff0000000000003ull;
  EXPECT_EQ(fp_arith(FpOp::kAdd, FpForm::kSd, {qnan1, 0}, {qnan2, 0}, mxcsr::kDefault).value.lo, qnan1);
  const FpResult quieted = fp_arith(FpOp::kAdd, FpForm::kSd, {bits(1.0), 0}, {snan, 0}, mxcsr::kDefault);
  EXPECT_EQ(quieted.value.lo, snan | 0x0008000000000000ull);
  EXPECT_EQ(quieted.mxcsr & mxcsr::kFlags, mxcsr::kIe);
  // Two NaNs: the first source wins, quieted if it is signalling (SDM vol. 1, table 4-7), for every operation.
  const uint64_t snan_first = 0x7ff4000000000000ull, qnan_first = 0x7ff8000000000000ull;
  for (FpOp op : {FpOp::kAdd, FpOp::kSub, FpOp::kMul, FpOp::kDiv}) {
    EXPECT_EQ(fp_arith(op, FpForm::kSd, {snan_first, 0}, {qnan_first, 0}, mxcsr::kDefault).value.lo,
              0x7ffc000000000000ull);
    EXPECT_EQ(fp_arith(op, FpForm::kSd, {qnan_first, 0}, {snan_first, 0}, mxcsr::kDefault).value.lo, qnan_first);
  }
  const FpResult indefinite =
      fp_arith(FpOp::kSub, FpForm::kSd, {bits(kInfinity), 0}, {bits(kInfinity), 0}, mxcsr::kDefault);
  EXPECT_EQ(indefinite.value.lo, 0xfff8000000000000ull);
  // MINSD/MAXSD return the second operand when either is NaN.
  EXPECT_EQ(fp_arith(FpOp::kMin, FpForm::kSd, {qnan1, 0}, {bits(2.0), 0}, mxcsr::kDefault).value.lo, bits(2.0));
  EXPECT_EQ(fp_arith(FpOp::kMax, FpForm::kSd, {bits(2.0), 0}, {qnan1, 0}, mxcsr::kDefault).value.lo, qnan1);
}

TEST(SseFp, DenormalsAreZeroAndFlushToZero) {
  const uint64_t denormal = 0x0000000000000010ull;
  const FpResult plain = fp_arith(FpOp::kAdd, FpForm::kSd, {denormal, 0}, {0, 0}, mxcsr::kDefault);
  EXPECT_EQ(plain.value.lo, denormal);
  EXPECT_TRUE(plain.mxcsr & mxcsr::kDe);
  const FpResult daz = fp_arith(FpOp::kAdd, FpForm::kSd, {denormal, 0}, {0, 0}, mxcsr::kDefault | mxcsr::kDaz);
  EXPECT_EQ(daz.value.lo, 0u);
  EXPECT_FALSE(daz.mxcsr & mxcsr::kDe);
  const Xmm tiny{bits(std::numeric_limits<double>::min()), 0}, half{bits(0.3), 0};
  const FpResult ftz = fp_arith(FpOp::kMul, FpForm::kSd, tiny, half, mxcsr::kDefault | mxcsr::kFtz);
  EXPECT_EQ(ftz.value.lo, 0u);
  EXPECT_EQ(ftz.mxcsr & mxcsr::kFlags, mxcsr::kUe | mxcsr::kPe);
  const FpResult gradual = fp_arith(FpOp::kMul, FpForm::kSd, tiny, half, mxcsr::kDefault);
  EXPECT_NE(gradual.value.lo, 0u);
}

TEST(SseFp, UnmaskedExceptionsFaultAndKeepDestination) {
  const Xmm one{bits(1.0), 7}, zero{0, 9};
  const uint32_t zero_divide_unmasked = mxcsr::kDefault & ~mxcsr::kZm;
  const FpResult division = fp_arith(FpOp::kDiv, FpForm::kSd, one, zero, zero_divide_unmasked);
  EXPECT_TRUE(division.fault);
  EXPECT_EQ(division.value, one);
  EXPECT_EQ(division.mxcsr, zero_divide_unmasked | mxcsr::kZe);
  // Masked, the same division gives +inf and only sets the sticky flag.
  const FpResult masked = fp_arith(FpOp::kDiv, FpForm::kSd, one, zero, mxcsr::kDefault | mxcsr::kPe);
  EXPECT_FALSE(masked.fault);
  EXPECT_EQ(masked.value.lo, bits(kInfinity));
  EXPECT_EQ(masked.mxcsr, mxcsr::kDefault | mxcsr::kPe | mxcsr::kZe);
  // A post-computation exception (precision) unmasked.
  const FpResult inexact =
      fp_arith(FpOp::kDiv, FpForm::kSd, one, {bits(3.0), 0}, mxcsr::kDefault & ~mxcsr::kPm);
  EXPECT_TRUE(inexact.fault);
  EXPECT_TRUE(inexact.mxcsr & mxcsr::kPe);
  // An invalid operation stops before the post-computation flags are looked at.
  const FpResult invalid = fp_arith(FpOp::kSqrt, FpForm::kSd, one, {bits(-1.0), 0}, mxcsr::kDefault & ~mxcsr::kIm);
  EXPECT_TRUE(invalid.fault);
  EXPECT_EQ(invalid.mxcsr & mxcsr::kFlags, mxcsr::kIe);
  const CompareResult comis = fp_comis(FpForm::kSd, false, {0x7ff8000000000000ull, 0}, one, 0x2, mxcsr::kDefault & ~mxcsr::kIm);
  EXPECT_TRUE(comis.fault);
  EXPECT_FALSE(fp_comis(FpForm::kSd, true, {0x7ff8000000000000ull, 0}, one, 0x2, mxcsr::kDefault & ~mxcsr::kIm).fault);
}

TEST(SseFp, ComparisonsSetFlagsLikeTheSdm) {
  constexpr uint64_t kCf = 1, kPf = 4, kAf = 16, kZf = 64, kSf = 128, kOf = 2048;
  const uint64_t noise = 0x2 | kAf | kSf | kOf | (1u << 9);
  const Xmm one{bits(1.0), 0}, two{bits(2.0), 0}, nan{0x7ff8000000000000ull, 0};
  EXPECT_EQ(fp_comis(FpForm::kSd, false, one, two, noise, mxcsr::kDefault).rflags, 0x2 | (1u << 9) | kCf);
  EXPECT_EQ(fp_comis(FpForm::kSd, false, two, one, noise, mxcsr::kDefault).rflags, 0x2 | (1u << 9));
  EXPECT_EQ(fp_comis(FpForm::kSd, true, one, one, noise, mxcsr::kDefault).rflags, 0x2 | (1u << 9) | kZf);
  const CompareResult unordered = fp_comis(FpForm::kSd, true, one, nan, noise, mxcsr::kDefault);
  EXPECT_EQ(unordered.rflags, 0x2 | (1u << 9) | kZf | kPf | kCf);
  EXPECT_EQ(unordered.mxcsr, mxcsr::kDefault);  // UCOMISD is quiet on QNaN
  EXPECT_EQ(fp_comis(FpForm::kSd, false, one, nan, noise, mxcsr::kDefault).mxcsr, mxcsr::kDefault | mxcsr::kIe);
  const Xmm fone{bits(1.0f), 0}, fnan{0x7fc00000, 0};
  EXPECT_EQ(fp_comis(FpForm::kSs, true, fone, fnan, 0x2, mxcsr::kDefault).rflags, 0x2 | kZf | kPf | kCf);
  // CMPccSD: each predicate on an ordered pair and an unordered pair.
  const bool less_expected[8] = {false, true, true, false, true, false, false, true};
  const bool nan_expected[8] = {false, false, false, true, true, true, true, false};
  for (uint8_t p = 0; p < 8; ++p) {
    EXPECT_EQ(fp_cmp(FpForm::kSd, one, two, p, mxcsr::kDefault).value.lo, less_expected[p] ? ~0ull : 0) << int(p);
    EXPECT_EQ(fp_cmp(FpForm::kSd, one, nan, p, mxcsr::kDefault).value.lo, nan_expected[p] ? ~0ull : 0) << int(p);
  }
  const FpResult packed = fp_cmp(FpForm::kPs, {0x3f800000'40000000ull, 0}, {0x40000000'40000000ull, 0}, 0, mxcsr::kDefault);
  EXPECT_EQ(packed.value.lo, 0x00000000'ffffffffull);
}

TEST(SseFp, IntegerConversions) {
  EXPECT_EQ(cvtsi2f(true, {0, 5}, static_cast<uint64_t>(-3), 64, mxcsr::kDefault).value, (Xmm{bits(-3.0), 5}));
  EXPECT_EQ(cvtsi2f(true, {0, 5}, 0xfffffffdull, 32, mxcsr::kDefault).value.lo, bits(-3.0));
  const FpResult rounded = cvtsi2f(false, {0, 0}, (1ull << 62) + 1, 64, mxcsr::kDefault);
  EXPECT_EQ(rounded.value.lo, bits(0x1p62f));
  EXPECT_TRUE(rounded.mxcsr & mxcsr::kPe);
  const IntResult nan32 = cvtf2si(FpForm::kSd, true, {0x7ff8000000000000ull, 0}, 32, mxcsr::kDefault);
  EXPECT_EQ(nan32.value, 0x80000000u);
  EXPECT_TRUE(nan32.mxcsr & mxcsr::kIe);
  EXPECT_EQ(cvtf2si(FpForm::kSs, true, {bits(1e20f), 0}, 64, mxcsr::kDefault).value, 0x8000000000000000ull);
  EXPECT_EQ(cvtf2si(FpForm::kSs, false, {bits(-7.5f), 0}, 32, mxcsr::kDefault).value, 0xfffffff8u);
  EXPECT_TRUE(cvtf2si(FpForm::kSd, true, {bits(3e9), 0}, 32, mxcsr::kDefault & ~mxcsr::kIm).fault);
}

TEST(SseFp, RegisterConversions) {
  const Xmm ints{0xfffffffe00000003ull, 0x7fffffff80000000ull};
  const FpResult to_pd = fp_convert(CvtOp::kCvtdq2pd, {1, 2}, ints, mxcsr::kDefault);
  EXPECT_EQ(to_pd.value, (Xmm{bits(3.0), bits(-2.0)}));
  const FpResult to_ps = fp_convert(CvtOp::kCvtdq2ps, {}, ints, mxcsr::kDefault);
  EXPECT_EQ(static_cast<uint32_t>(to_ps.value.lo), bits(3.0f));
  EXPECT_EQ(static_cast<uint32_t>(to_ps.value.hi >> 32), bits(2147483648.0f));  // 0x7fffffff rounds up
  const Xmm doubles{bits(1.5), bits(-1e300)};
  const FpResult pd2dq = fp_convert(CvtOp::kCvtpd2dq, {~0ull, ~0ull}, doubles, mxcsr::kDefault);
  EXPECT_EQ(pd2dq.value, (Xmm{0x8000000000000002ull, 0}));  // upper half zeroed, indefinite for overflow
  EXPECT_TRUE(pd2dq.mxcsr & mxcsr::kIe);
  EXPECT_EQ(fp_convert(CvtOp::kCvttpd2dq, {}, doubles, mxcsr::kDefault).value.lo, 0x8000000000000001ull);
  const FpResult pd2ps = fp_convert(CvtOp::kCvtpd2ps, {~0ull, ~0ull}, doubles, mxcsr::kDefault);
  EXPECT_EQ(pd2ps.value, (Xmm{(uint64_t{bits(-INFINITY)} << 32) | bits(1.5f), 0}));
  EXPECT_TRUE(pd2ps.mxcsr & mxcsr::kOe);
  const FpResult ps2pd = fp_convert(CvtOp::kCvtps2pd, {}, {(uint64_t{bits(-0.25f)} << 32) | bits(8.0f), 0}, mxcsr::kDefault);
  EXPECT_EQ(ps2pd.value, (Xmm{bits(8.0), bits(-0.25)}));
  const FpResult sd2ss = fp_convert(CvtOp::kCvtsd2ss, {0xaaaaaaaabbbbbbbbull, 3}, doubles, mxcsr::kDefault);
  EXPECT_EQ(sd2ss.value, (Xmm{0xaaaaaaaa00000000ull | bits(1.5f), 3}));
  EXPECT_EQ(fp_convert(CvtOp::kCvtss2sd, {0, 4}, {bits(0.5f), 0}, mxcsr::kDefault).value, (Xmm{bits(0.5), 4}));
  const FpResult ps2dq = fp_convert(CvtOp::kCvtps2dq, {}, {(uint64_t{bits(-2.5f)} << 32) | bits(2.5f), 0}, mxcsr::kDefault);
  EXPECT_EQ(ps2dq.value.lo, 0xfffffffe00000002ull);
  EXPECT_EQ(fp_convert(CvtOp::kCvttps2dq, {}, {(uint64_t{bits(-2.5f)} << 32) | bits(2.7f), 0}, mxcsr::kDefault).value.lo,
            0xfffffffe00000002ull);
}

TEST(SseFp, StickyFlagsAreKept) {
  const uint32_t before = mxcsr::kDefault | mxcsr::kUe;
  const FpResult r = fp_arith(FpOp::kAdd, FpForm::kPd, {bits(1.0), bits(2.0)}, {bits(1.0), bits(2.0)}, before);
  EXPECT_EQ(r.mxcsr, before);
  EXPECT_EQ(r.value, (Xmm{bits(2.0), bits(4.0)}));
}

}  // namespace
}  // namespace deja::interp::sse
