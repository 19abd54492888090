// The x87's 80-bit floating-point datapath in software: integer arithmetic for the IEEE operations, binary128 for the transcendentals.
#include "interp/x87_float.h"

#include <bit>
#include <cmath>
#include <cstring>
#include <utility>

namespace deja::interp::x87 {
namespace {

using u128 = unsigned __int128;
using f128 = __float128;  // binary128 in software (libgcc): the same result on every host

constexpr int32_t kBias = 16383;
constexpr int32_t kBiasAdjust = 24576;  // an unmasked overflow/underflow into a register wraps the exponent by this
constexpr uint64_t kIntegerBit = 1ull << 63;
constexpr uint64_t kQuietBit = 1ull << 62;

// A destination format: significand bits and the unbiased exponents of its normal range.
struct Format {
  unsigned precision;
  int32_t min_exp;
  int32_t max_exp;
};
constexpr Format kExtended{64, -16382, 16383};
constexpr Format kDouble{53, -1022, 1023};
constexpr Format kSingle{24, -126, 127};

// A finite nonzero value: sig * 2^(exp - 63), sig normalized (bit 63 set) even for denormals.
struct Unpacked {
  bool sign;
  int32_t exp;
  uint64_t sig;
};

Unpacked unpack(Float80 a) {
  Unpacked u{a.sign(), a.exponent() == 0 ? 1 - kBias : int32_t(a.exponent()) - kBias, a.sig};
  const int shift = std::countl_zero(u.sig);
  u.sig <<= shift;
  u.exp -= shift;
  return u;
}

int leading_zeros(u128 m) {
  const uint64_t hi = uint64_t(m >> 64);
  return hi ? std::countl_zero(hi) : 64 + std::countl_zero(uint64_t(m));
}

// Shifts right, ORing every bit shifted out into bit 0 (so rounding still sees them).
u128 shift_right_jam(u128 m, int32_t n) {
  if (n <= 0) return m;
  if (n >= 128) return m != 0;
  return (m >> n) | u128((m << (128 - n)) != 0);
}

Float80 zero(bool sign) { return {0, uint16_t(sign ? 0x8000 : 0)}; }
Float80 infinity(bool sign) { return {kIntegerBit, uint16_t(sign ? 0xffff : 0x7fff)}; }
Float80 with_sign(Float80 a, bool sign) { return {a.sig, uint16_t((a.sign_exp & 0x7fff) | (sign ? 0x8000 : 0))}; }
Float80 quiet(Float80 a) { return {a.sig | kQuietBit, a.sign_exp}; }

bool round_increment(u128 rem, u128 half, bool lsb, bool sign, unsigned rc) {
  if (rem == 0) return false;
  switch (rc) {
    case 0: return rem > half || (rem == half && lsb);
    case 1: return sign;   // toward -infinity
    case 2: return !sign;  // toward +infinity
    default: return false;
  }
}

// A rounded result before it is packed into its format.
struct Rounded {
  bool sign = false;
  bool infinity = false;
  bool denormal = false;  // below the normal range (exponent field 0)
  int32_t exp = 0;        // unbiased exponent of significand bit precision-1 (bias-adjusted if so)
  u128 sig = 0;           // `precision` bits, right-aligned
  uint8_t flags = 0;
  bool rounded_up = false;
  bool stored = true;
};

// Rounds sign * m * 2^(exp - 127), m normalized (bit 127 set), to `precision` bits within `f`'s exponent
// range, as SDM vol. 1, 4.9.1.4-4.9.1.6 and 8.5.4-8.5.6 say: tininess after rounding; a masked underflow
// is flagged only when the denormal result is inexact; unmasked overflow/underflow bias-adjusts a register
// result and suppresses a memory store.
Rounded round_to(bool sign, int32_t exp, u128 m, const Format& f, unsigned precision, unsigned rc, uint8_t masks,
                 bool register_destination) {
  Rounded r;
  r.sign = sign;
  const int drop = 128 - int(precision);
  const u128 low_mask = (u128(1) << drop) - 1, half = u128(1) << (drop - 1);
  u128 rem = m & low_mask, kept = m >> drop;
  bool inexact = rem != 0;
  bool increment = round_increment(rem, half, kept & 1, sign, rc);
  u128 rounded = kept + increment;
  int32_t e = exp;
  if (rounded >> precision) {
    rounded >>= 1;
    ++e;
  }
  if (e > f.max_exp) {
    if (!(masks & flag::kOverflow)) {
      if (!register_destination) {
        r.flags = flag::kOverflow;
        r.stored = false;
        return r;
      }
      r.exp = e - kBiasAdjust;
      r.sig = rounded;
      r.flags = uint8_t(flag::kOverflow | (inexact ? flag::kPrecision : 0));
      r.rounded_up = increment;
      return r;
    }
    r.flags = flag::kOverflow | flag::kPrecision;
    if (rc == 0 || (rc == 1 && sign) || (rc == 2 && !sign)) {
      r.infinity = true;
      r.rounded_up = true;
    } else {
      r.exp = f.max_exp;
      r.sig = (u128(1) << precision) - 1;
    }
    return r;
  }
  if (e < f.min_exp) {
    if (!(masks & flag::kUnderflow)) {
      if (!register_destination) {
        r.flags = flag::kUnderflow;
        r.stored = false;
        return r;
      }
      r.exp = e + kBiasAdjust;
      r.sig = rounded;
      r.flags = uint8_t(flag::kUnderflow | (inexact ? flag::kPrecision : 0));
      r.rounded_up = increment;
      return r;
    }
    // Denormalize: round again at the same significand position with the exponent pinned at the minimum.
    const u128 shifted = shift_right_jam(m, f.min_exp - exp);
    rem = shifted & low_mask;
    kept = shifted >> drop;
    inexact = rem != 0;
    increment = round_increment(rem, half, kept & 1, sign, rc);
    rounded = kept + increment;
    r.exp = f.min_exp;
    r.sig = rounded;
    r.denormal = !(rounded >> (precision - 1));
    r.flags = inexact ? flag::kUnderflow | flag::kPrecision : 0;
    r.rounded_up = increment;
    return r;
  }
  r.exp = e;
  r.sig = rounded;
  r.flags = inexact ? flag::kPrecision : 0;
  r.rounded_up = increment;
  return r;
}

Float80 pack_extended(const Rounded& r, unsigned precision) {
  if (r.infinity) return infinity(r.sign);
  const uint64_t sig = uint64_t(r.sig << (64 - precision));
  const uint16_t biased = r.denormal ? 0 : uint16_t((r.exp + kBias) & 0x7fff);
  return {sig, uint16_t(biased | (r.sign ? 0x8000 : 0))};
}

uint64_t pack_binary(const Rounded& r, const Format& f, unsigned exp_bits) {
  const unsigned fraction_bits = f.precision - 1;
  const uint64_t sign = uint64_t(r.sign) << (fraction_bits + exp_bits);
  const uint64_t exp_all_ones = (1ull << exp_bits) - 1;
  if (r.infinity) return sign | (exp_all_ones << fraction_bits);
  const uint64_t fraction = uint64_t(r.sig) & ((1ull << fraction_bits) - 1);
  const uint64_t biased = r.denormal ? 0 : uint64_t(r.exp - f.min_exp + 1);
  return sign | (biased << fraction_bits) | fraction;
}

// Rounds a finite nonzero sign * m * 2^(exp - 127) (m any nonzero value) into a register.
Result finish(bool sign, int32_t exp, u128 m, Control control, unsigned precision, uint8_t flags) {
  const int shift = leading_zeros(m);
  m <<= shift;
  exp -= shift;
  const Rounded r = round_to(sign, exp, m, kExtended, precision, control.rounding(), control.masks(), true);
  return {pack_extended(r, precision), uint8_t(flags | r.flags), r.rounded_up};
}

Result finish(const Unpacked& u, Control control, unsigned precision, uint8_t flags) {
  return finish(u.sign, u.exp, u128(u.sig) << 64, control, precision, flags);
}

// x87 NaN propagation (SDM vol. 1, table 4-7): a QNaN beats an SNaN; two of a kind give the one with
// the larger significand (ties: the positive one); the result is always quiet. #IA if any is signaling.
Float80 propagate_nan(Float80 a, Class ca, Float80 b, Class cb, uint8_t& flags) {
  const bool a_signaling = ca == Class::kSignalingNaN, b_signaling = cb == Class::kSignalingNaN;
  if (a_signaling || b_signaling) flags |= flag::kInvalid;
  if (!is_nan(cb)) return quiet(a);
  if (!is_nan(ca)) return quiet(b);
  if (a_signaling != b_signaling) return quiet(a_signaling ? b : a);
  if (a.sig != b.sig) return quiet(a.sig > b.sig ? a : b);
  return quiet(a.sign_exp <= b.sign_exp ? a : b);
}

// Unsupported encodings and NaNs decide a two-operand result before anything else.
bool nan_or_unsupported(Float80 a, Class ca, Float80 b, Class cb, Result& out) {
  if (ca == Class::kUnsupported || cb == Class::kUnsupported) {
    out = {kIndefinite, flag::kInvalid, false};
    return true;
  }
  if (is_nan(ca) || is_nan(cb)) {
    out = {};
    out.value = propagate_nan(a, ca, b, cb, out.flags);
    return true;
  }
  return false;
}

bool nan_or_unsupported(Float80 a, Class ca, Result& out) { return nan_or_unsupported(a, ca, a, ca, out); }

uint8_t denormal_flag(Class c) { return c == Class::kDenormal ? flag::kDenormal : 0; }

Result add_signed(Float80 a, Float80 b, bool b_sign, Control control) {
  const Class ca = classify(a), cb = classify(b);
  Result out;
  if (nan_or_unsupported(a, ca, b, cb, out)) return out;
  const uint8_t flags = denormal_flag(ca) | denormal_flag(cb);
  if (ca == Class::kInfinity || cb == Class::kInfinity) {
    if (ca == Class::kInfinity && cb == Class::kInfinity && a.sign() != b_sign) return {kIndefinite, flag::kInvalid};
    return {ca == Class::kInfinity ? a : infinity(b_sign), flags};
  }
  const unsigned precision = control.precision();
  if (ca == Class::kZero && cb == Class::kZero) {
    return {zero(a.sign() == b_sign ? a.sign() : control.rounding() == 1), flags};
  }
  if (cb == Class::kZero) return finish(unpack(a), control, precision, flags);
  Unpacked ub = unpack(b);
  ub.sign = b_sign;
  if (ca == Class::kZero) return finish(ub, control, precision, flags);
  Unpacked ua = unpack(a);
  if (ua.exp < ub.exp || (ua.exp == ub.exp && ua.sig < ub.sig)) std::swap(ua, ub);  // |a| >= |b|
  const u128 big = u128(ua.sig) << 63;
  const u128 small = shift_right_jam(u128(ub.sig) << 63, ua.exp - ub.exp);
  if (ua.sign == ub.sign) return finish(ua.sign, ua.exp + 1, big + small, control, precision, flags);
  const u128 difference = big - small;
  if (difference == 0) return {zero(control.rounding() == 1), flags};
  return finish(ua.sign, ua.exp + 1, difference, control, precision, flags);
}

// Integer square root of a 128-bit value: floor(sqrt(n)) and the remainder n - root^2.
std::pair<u128, u128> integer_sqrt(u128 n) {
  u128 root = 0, bit = u128(1) << 126;
  while (bit > n) bit >>= 2;
  while (bit != 0) {
    if (n >= root + bit) {
      n -= root + bit;
      root = (root >> 1) + bit;
    } else {
      root >>= 1;
    }
    bit >>= 2;
  }
  return {root, n};
}

// Rounds |u| to an integer per `rc` (u.exp <= 63): the magnitude, whether bits were dropped, and whether
// rounding went up.
struct IntegerRounding {
  u128 magnitude = 0;
  bool inexact = false;
  bool increment = false;
};
IntegerRounding round_integer(const Unpacked& u, unsigned rc) {
  IntegerRounding r;
  if (u.exp >= 63) {
    r.magnitude = u128(u.sig) << (u.exp - 63);
    return r;
  }
  u128 kept = 0, rem = 0, half = 0;
  if (u.exp >= 0) {
    const int frac_bits = 63 - u.exp;
    kept = u.sig >> frac_bits;
    rem = u.sig & ((1ull << frac_bits) - 1);
    half = u128(1) << (frac_bits - 1);
  } else if (u.exp == -1) {
    rem = u.sig;
    half = u128(1) << 63;
  } else {
    rem = 1;  // below one half
    half = u128(1) << 64;
  }
  r.inexact = rem != 0;
  r.increment = round_increment(rem, half, kept & 1, u.sign, rc);
  r.magnitude = kept + r.increment;
  return r;
}

Float80 from_magnitude(bool sign, u128 magnitude) {
  if (magnitude == 0) return zero(sign);
  const int shift = leading_zeros(magnitude);
  const u128 m = magnitude << shift;
  return {uint64_t(m >> 64), uint16_t((127 - shift + kBias) | (sign ? 0x8000 : 0))};
}

// ---- binary128 helpers for the transcendentals ----

f128 f128_from_bits(uint64_t hi, uint64_t lo) {
  const u128 bits = (u128(hi) << 64) | lo;
  f128 v;
  std::memcpy(&v, &bits, sizeof(v));
  return v;
}

u128 f128_bits(f128 v) {
  u128 bits;
  std::memcpy(&bits, &v, sizeof(bits));
  return bits;
}

// 2^k for k in binary128's normal range.
f128 power_of_two(int32_t k) { return f128_from_bits(uint64_t(k + kBias) << 48, 0); }

// Exact: every finite Float80 is a binary128 value (the same exponent range, 64 of 113 bits).
f128 to_f128(Float80 a) {
  if (a.sig == 0) return a.sign() ? -f128(0) : f128(0);
  const Unpacked u = unpack(a);
  f128 v = f128(u.sig);  // exact: 64 bits
  // Scale in two steps so that neither leaves the normal range.
  const int32_t k = u.exp - 63;
  v *= power_of_two(k / 2);
  v *= power_of_two(k - k / 2);
  return u.sign ? -v : v;
}

// Rounds a binary128 value (finite) into a register. `inexact_tail` tells what the binary128 value leaves out
// when it is exactly a 64-bit value: 0 = it is exact, +1 = the true value is slightly larger in magnitude, -1
// slightly smaller (transcendentals are inexact for all but a few arguments).
Result finish_f128(f128 v, Control control, uint8_t flags, int inexact_tail) {
  const u128 bits = f128_bits(v);
  const bool sign = bits >> 127;
  const int32_t biased = int32_t((bits >> 112) & 0x7fff);
  const u128 fraction = bits & ((u128(1) << 112) - 1);
  if (biased == 0x7fff) return {infinity(sign), flags};
  const u128 mantissa = biased ? fraction | (u128(1) << 112) : fraction;
  if (mantissa == 0) return {zero(sign), flags};
  // value = mantissa * 2^(e - 112), e the unbiased exponent of bit 112.
  const int32_t e = (biased ? biased : 1) - kBias;
  u128 m = mantissa << 15;  // bit 127 is worth 2^e
  if (inexact_tail > 0) m |= 1;
  if (inexact_tail < 0) m -= 1;
  return finish(sign, e, m, control, 64, flags);
}

f128 f128_sqrt(f128 v) {
  f128 root = f128(std::sqrt(double(v)));
  for (int i = 0; i < 3; ++i) root = (root + v / root) / 2;
  return root;
}

struct F128Constants {
  f128 pi = f128_from_bits(0x4000921fb54442d1ull, 0x8469898cc51701b8ull);
  f128 half_pi = f128_from_bits(0x3fff921fb54442d1ull, 0x8469898cc51701b8ull);
  f128 ln2 = f128_from_bits(0x3ffe62e42fefa39eull, 0xf35793c7673007e6ull);
};
const F128Constants kF128;

// sin and cos of |r| <= pi/4 by their Taylor series (terms fall below 2^-120 of the first long before the end).
f128 sin_series(f128 r) {
  const f128 r2 = r * r;
  f128 term = r, sum = r;
  for (int k = 1; k < 24; ++k) {
    term *= -r2 / f128((2 * k) * (2 * k + 1));
    sum += term;
  }
  return sum;
}
f128 cos_series(f128 r) {
  const f128 r2 = r * r;
  f128 term = 1, sum = 1;
  for (int k = 1; k < 24; ++k) {
    term *= -r2 / f128((2 * k - 1) * (2 * k));
    sum += term;
  }
  return sum;
}
// atanh(s) = s + s^3/3 + s^5/5 + ..., |s| <= 0.18.
f128 atanh_series(f128 s) {
  const f128 s2 = s * s;
  f128 power = s, sum = s;
  for (int k = 1; k < 40; ++k) {
    power *= s2;
    sum += power / f128(2 * k + 1);
  }
  return sum;
}
// atan(t) for 0 <= t <= 1: four halvings (tan(x/2) = t / (1 + sqrt(1 + t^2))) bring t under 0.05.
f128 atan_unit(f128 t) {
  for (int i = 0; i < 4; ++i) t = t / (1 + f128_sqrt(1 + t * t));
  const f128 t2 = t * t;
  f128 power = t, sum = t;
  for (int k = 1; k < 30; ++k) {
    power *= -t2;
    sum += power / f128(2 * k + 1);
  }
  return sum * 16;
}
// e^t - 1 for |t| <= 0.7.
f128 expm1_series(f128 t) {
  f128 term = t, sum = t;
  for (int k = 2; k < 40; ++k) {
    term *= t / f128(k);
    sum += term;
  }
  return sum;
}
// ln(x) for finite x > 0 given as m * 2^e with 1 <= m < 2 (the exact decomposition of a Float80).
f128 ln_of(f128 m, int32_t e) {
  if (m > f128_sqrt(2)) {
    m /= 2;
    ++e;
  }
  return 2 * atanh_series((m - 1) / (m + 1)) + f128(e) * kF128.ln2;
}

// Intel reduces trigonometric arguments with a 66-bit pi (why its FSIN near multiples of pi differs from
// the true sine); so does this, exactly: x = k * pi66/2 + r, |r| <= pi66/4, and returns k mod 4.
constexpr u128 kPi66 = (u128(0x3) << 64) | 0x243f6a8885a308d3ull;  // pi66 = kPi66 * 2^-64

unsigned reduce(const Unpacked& u, f128& reduced) {
  // |x| < 2^63, so x in units of 2^-65 (pi66/2 = kPi66 units) fits 128 bits when u.exp >= -2.
  if (u.exp < -2) {
    reduced = to_f128(Float80{u.sig, uint16_t(u.exp + kBias)});
    return 0;
  }
  const u128 units = u128(u.sig) << (u.exp + 2);
  u128 quotient = units / kPi66, rem = units % kPi66;
  bool negative = false;
  if (rem * 2 > kPi66 || (rem * 2 == kPi66 && (quotient & 1))) {
    ++quotient;
    rem = kPi66 - rem;
    negative = true;
  }
  reduced = f128(rem) * power_of_two(-65);
  if (negative) reduced = -reduced;
  return unsigned(quotient & 3);
}

}  // namespace

unsigned Control::precision() const {
  switch ((fcw >> 8) & 3) {
    case 0: return 24;
    case 2: return 53;
    default: return 64;
  }
}

Class classify(Float80 value) {
  const uint16_t e = value.exponent();
  const bool integer_bit = value.sig & kIntegerBit;
  if (e == 0) return value.sig == 0 ? Class::kZero : Class::kDenormal;
  if (e == 0x7fff) {
    if (!integer_bit) return Class::kUnsupported;
    if ((value.sig << 1) == 0) return Class::kInfinity;
    return (value.sig & kQuietBit) ? Class::kQuietNaN : Class::kSignalingNaN;
  }
  return integer_bit ? Class::kNormal : Class::kUnsupported;
}

Result add(Float80 a, Float80 b, Control control) { return add_signed(a, b, b.sign(), control); }
Result subtract(Float80 a, Float80 b, Control control) { return add_signed(a, b, !b.sign(), control); }

Result multiply(Float80 a, Float80 b, Control control) {
  const Class ca = classify(a), cb = classify(b);
  Result out;
  if (nan_or_unsupported(a, ca, b, cb, out)) return out;
  const bool sign = a.sign() != b.sign();
  const bool a_inf = ca == Class::kInfinity, b_inf = cb == Class::kInfinity;
  const bool a_zero = ca == Class::kZero, b_zero = cb == Class::kZero;
  if ((a_inf && b_zero) || (a_zero && b_inf)) return {kIndefinite, flag::kInvalid};
  const uint8_t flags = denormal_flag(ca) | denormal_flag(cb);
  if (a_inf || b_inf) return {infinity(sign), flags};
  if (a_zero || b_zero) return {zero(sign), flags};
  const Unpacked ua = unpack(a), ub = unpack(b);
  return finish(sign, ua.exp + ub.exp + 1, u128(ua.sig) * ub.sig, control, control.precision(), flags);
}

Result divide(Float80 a, Float80 b, Control control) {
  const Class ca = classify(a), cb = classify(b);
  Result out;
  if (nan_or_unsupported(a, ca, b, cb, out)) return out;
  const bool sign = a.sign() != b.sign();
  const bool a_inf = ca == Class::kInfinity, b_inf = cb == Class::kInfinity;
  const bool a_zero = ca == Class::kZero, b_zero = cb == Class::kZero;
  if ((a_inf && b_inf) || (a_zero && b_zero)) return {kIndefinite, flag::kInvalid};
  const uint8_t flags = denormal_flag(ca) | denormal_flag(cb);
  if (a_inf) return {infinity(sign), flags};
  if (b_inf) return {zero(sign), flags};
  if (b_zero) return {infinity(sign), flag::kZeroDivide};  // #Z outranks #D
  if (a_zero) return {zero(sign), flags};
  const Unpacked ua = unpack(a), ub = unpack(b);
  const u128 first = (u128(ua.sig) << 64) / ub.sig, first_rem = (u128(ua.sig) << 64) % ub.sig;
  const u128 second = (first_rem << 64) / ub.sig, second_rem = (first_rem << 64) % ub.sig;
  const u128 sticky = second_rem != 0;
  if (first >> 64) {
    const u128 m = (first << 63) | (second >> 1) | (second & 1) | sticky;
    return finish(sign, ua.exp - ub.exp, m, control, control.precision(), flags);
  }
  return finish(sign, ua.exp - ub.exp - 1, (first << 64) | second | sticky, control, control.precision(), flags);
}

Result square_root(Float80 a, Control control) {
  const Class ca = classify(a);
  Result out;
  if (nan_or_unsupported(a, ca, out)) return out;
  if (ca == Class::kZero) return {a};
  if (a.sign()) return {kIndefinite, flag::kInvalid};
  if (ca == Class::kInfinity) return {a};
  const Unpacked u = unpack(a);
  const bool even = (u.exp & 1) == 0;
  const int shift = even ? 63 : 64;
  const auto [root, rem] = integer_sqrt(u128(u.sig) << shift);
  // The fraction beyond the root: above one half exactly when rem > root (it is never exactly one half).
  const uint64_t beyond = rem == 0 ? 0 : rem > root ? 0x8000000000000001ull : 1;
  const int32_t exp = (u.exp - 63 - shift) / 2 + 63;
  return finish(false, exp, (root << 64) | beyond, control, control.precision(), denormal_flag(ca));
}

Result round_to_integer(Float80 a, Control control) {
  const Class ca = classify(a);
  Result out;
  if (nan_or_unsupported(a, ca, out)) return out;
  if (ca == Class::kZero || ca == Class::kInfinity) return {a};
  const Unpacked u = unpack(a);
  if (u.exp >= 63) return {a};
  const IntegerRounding r = round_integer(u, control.rounding());
  return {from_magnitude(u.sign, r.magnitude), uint8_t(denormal_flag(ca) | (r.inexact ? flag::kPrecision : 0)),
          r.increment};
}

Result scale(Float80 a, Float80 b, Control control) {
  const Class ca = classify(a), cb = classify(b);
  Result out;
  if (nan_or_unsupported(a, ca, b, cb, out)) return out;
  const uint8_t flags = denormal_flag(ca) | denormal_flag(cb);
  if (cb == Class::kInfinity) {
    if (ca == Class::kInfinity && b.sign()) return {kIndefinite, flag::kInvalid};
    if (ca == Class::kZero && !b.sign()) return {kIndefinite, flag::kInvalid};
    if (ca == Class::kInfinity || ca == Class::kZero) return {a, flags};
    return {b.sign() ? zero(a.sign()) : infinity(a.sign()), flags};
  }
  if (ca == Class::kInfinity || ca == Class::kZero) return {a, flags};
  int32_t n = 0;
  if (cb != Class::kZero) {
    const Unpacked ub = unpack(b);
    // Beyond 2^17 every result has overflowed or underflowed alike.
    if (ub.exp >= 17) n = 1 << 17;
    else if (ub.exp >= 0) n = int32_t(ub.sig >> (63 - ub.exp));
    if (ub.sign) n = -n;
  }
  Unpacked ua = unpack(a);
  ua.exp += n;
  return finish(ua, control, 64, flags);
}

Extracted extract(Float80 a) {
  const Class ca = classify(a);
  Extracted e;
  if (ca == Class::kUnsupported) return {kIndefinite, kIndefinite, flag::kInvalid};
  if (is_nan(ca)) {
    const Float80 q = quiet(a);
    return {q, q, uint8_t(ca == Class::kSignalingNaN ? flag::kInvalid : 0)};
  }
  if (ca == Class::kZero) return {infinity(true), a, flag::kZeroDivide};
  if (ca == Class::kInfinity) return {infinity(false), a, 0};
  const Unpacked u = unpack(a);
  e.exponent = from_integer(u.exp);
  e.significand = {u.sig, uint16_t(kBias | (u.sign ? 0x8000 : 0))};
  e.flags = denormal_flag(ca);
  return e;
}

PartialRemainder partial_remainder(Float80 a, Float80 b, bool round_to_nearest, Control control) {
  const Class ca = classify(a), cb = classify(b);
  PartialRemainder out;
  out.special = true;
  if (nan_or_unsupported(a, ca, b, cb, out.result)) return out;
  if (ca == Class::kInfinity || cb == Class::kZero) {
    out.result = {kIndefinite, flag::kInvalid};
    return out;
  }
  // From here on the quotient is defined (zero for a zero dividend or an infinite divisor).
  out.special = false;
  const uint8_t flags = denormal_flag(ca) | denormal_flag(cb);
  out.result = {a, flags};
  if (ca == Class::kZero) return out;
  const Unpacked ua = unpack(a);
  // The dividend as the result: rounded, so a pseudo-denormal comes back in its canonical encoding.
  out.result = finish(ua, control, 64, flags);
  if (cb == Class::kInfinity) return out;
  const Unpacked ub = unpack(b);
  const int32_t difference = ua.exp - ub.exp;
  if (difference < 0 && !(round_to_nearest && difference == -1)) return out;
  // Beyond 63 the x87 reduces the exponent by 32..63 per step: (D mod 32) + 32, as Intel's does.
  out.incomplete = difference >= 64;
  const int shift = out.incomplete ? 32 + difference % 32 : difference > 0 ? difference : 0;
  const u128 dividend = u128(ua.sig) << shift;
  const u128 divisor = u128(ub.sig) << (difference < 0 ? 1 : 0);
  u128 quotient = dividend / divisor, rem = dividend % divisor;
  bool sign = ua.sign;
  if (round_to_nearest && !out.incomplete && (rem * 2 > divisor || (rem * 2 == divisor && (quotient & 1)))) {
    ++quotient;
    rem = divisor - rem;
    sign = !sign;
  }
  out.quotient_low = out.incomplete ? 0 : unsigned(quotient & 7);
  if (rem == 0) {
    out.result = {zero(ua.sign), flags};
    return out;
  }
  // rem is in units of 2^(ua.exp - 63 - shift).
  out.result = finish(sign, ua.exp - 63 - shift + 127, rem, control, 64, flags);
  return out;
}

Comparison compare(Float80 a, Float80 b, bool quiet) {
  const Class ca = classify(a), cb = classify(b);
  if (ca == Class::kUnsupported || cb == Class::kUnsupported) return {Relation::kUnordered, flag::kInvalid};
  if (is_nan(ca) || is_nan(cb)) {
    const bool signaling = ca == Class::kSignalingNaN || cb == Class::kSignalingNaN;
    return {Relation::kUnordered, uint8_t(!quiet || signaling ? flag::kInvalid : 0)};
  }
  const uint8_t flags = denormal_flag(ca) | denormal_flag(cb);
  const bool a_zero = ca == Class::kZero, b_zero = cb == Class::kZero;
  if (a_zero && b_zero) return {Relation::kEqual, flags};
  // Magnitudes as (exponent, significand), zero below and infinity above every finite value.
  auto magnitude = [](Float80 v, Class c) -> std::pair<int32_t, uint64_t> {
    if (c == Class::kZero) return {INT32_MIN, 0};
    if (c == Class::kInfinity) return {INT32_MAX, 0};
    const Unpacked u = unpack(v);
    return {u.exp, u.sig};
  };
  const bool a_negative = a.sign() && !a_zero, b_negative = b.sign() && !b_zero;
  if (a_negative != b_negative) return {a_negative ? Relation::kLess : Relation::kGreater, flags};
  const auto ma = magnitude(a, ca), mb = magnitude(b, cb);
  if (ma == mb) return {Relation::kEqual, flags};
  const bool a_larger = ma > mb;
  return {a_larger != a_negative ? Relation::kGreater : Relation::kLess, flags};
}

Result from_float32(uint32_t bits, bool keep_signaling) {
  const bool sign = bits >> 31;
  const uint32_t e = (bits >> 23) & 0xff, f = bits & 0x7fffff;
  const uint16_t sign_bit = sign ? 0x8000 : 0;
  if (e == 0xff) {
    if (f == 0) return {infinity(sign)};
    const Float80 nan{kIntegerBit | (uint64_t(f) << 40), uint16_t(0x7fff | sign_bit)};
    return (f & 0x400000) || keep_signaling ? Result{nan} : Result{quiet(nan), flag::kInvalid};
  }
  if (e == 0) {
    if (f == 0) return {zero(sign)};
    const int top = 63 - std::countl_zero(uint64_t(f));
    return {{uint64_t(f) << (63 - top), uint16_t((top - 149 + kBias) | sign_bit)}, flag::kDenormal};
  }
  return {{kIntegerBit | (uint64_t(f) << 40), uint16_t((int32_t(e) - 127 + kBias) | sign_bit)}};
}

Result from_float64(uint64_t bits, bool keep_signaling) {
  const bool sign = bits >> 63;
  const uint64_t e = (bits >> 52) & 0x7ff, f = bits & ((1ull << 52) - 1);
  const uint16_t sign_bit = sign ? 0x8000 : 0;
  if (e == 0x7ff) {
    if (f == 0) return {infinity(sign)};
    const Float80 nan{kIntegerBit | (f << 11), uint16_t(0x7fff | sign_bit)};
    return (f & (1ull << 51)) || keep_signaling ? Result{nan} : Result{quiet(nan), flag::kInvalid};
  }
  if (e == 0) {
    if (f == 0) return {zero(sign)};
    const int top = 63 - std::countl_zero(f);
    return {{f << (63 - top), uint16_t((top - 1074 + kBias) | sign_bit)}, flag::kDenormal};
  }
  return {{kIntegerBit | (f << 11), uint16_t((int32_t(e) - 1023 + kBias) | sign_bit)}};
}

Float80 from_integer(int64_t value) {
  const bool sign = value < 0;
  return from_magnitude(sign, sign ? 0 - uint64_t(value) : uint64_t(value));
}

namespace {

Stored to_binary(Float80 a, Control control, const Format& f, unsigned exp_bits, uint64_t indefinite) {
  const Class ca = classify(a);
  const unsigned fraction_bits = f.precision - 1;
  const uint64_t sign = uint64_t(a.sign()) << (fraction_bits + exp_bits);
  const uint64_t exp_all_ones = ((1ull << exp_bits) - 1) << fraction_bits;
  switch (ca) {
    case Class::kUnsupported: return {indefinite, flag::kInvalid};
    case Class::kQuietNaN:
    case Class::kSignalingNaN: {
      const uint64_t fraction = ((a.sig << 1) >> (64 - fraction_bits)) | (1ull << (fraction_bits - 1));
      return {sign | exp_all_ones | fraction, uint8_t(ca == Class::kSignalingNaN ? flag::kInvalid : 0)};
    }
    case Class::kInfinity: return {sign | exp_all_ones};
    case Class::kZero: return {sign};
    default: break;
  }
  const Unpacked u = unpack(a);
  const Rounded r =
      round_to(u.sign, u.exp, u128(u.sig) << 64, f, f.precision, control.rounding(), control.masks(), false);
  Stored s{pack_binary(r, f, exp_bits), r.flags, r.rounded_up, r.stored};
  if (!s.stored) s.bits = 0;
  return s;
}

}  // namespace

Stored to_float32(Float80 a, Control control) { return to_binary(a, control, kSingle, 8, 0xffc00000u); }
Stored to_float64(Float80 a, Control control) { return to_binary(a, control, kDouble, 11, 0xfff8000000000000ull); }

Stored to_integer(Float80 a, unsigned bits, bool truncate, Control control) {
  const Class ca = classify(a);
  const uint64_t indefinite = 1ull << (bits - 1);
  const uint64_t mask = bits == 64 ? ~0ull : (1ull << bits) - 1;
  if (ca == Class::kUnsupported || ca == Class::kInfinity || is_nan(ca)) return {indefinite, flag::kInvalid};
  if (ca == Class::kZero) return {0};
  const Unpacked u = unpack(a);
  if (u.exp >= 64) return {indefinite, flag::kInvalid};
  const IntegerRounding r = round_integer(u, truncate ? 3 : control.rounding());
  const u128 limit = u.sign ? u128(1) << (bits - 1) : (u128(1) << (bits - 1)) - 1;
  if (r.magnitude > limit) return {indefinite, flag::kInvalid};
  const uint64_t magnitude = uint64_t(r.magnitude);
  return {(u.sign ? 0 - magnitude : magnitude) & mask, uint8_t(r.inexact ? flag::kPrecision : 0), r.increment};
}

Float80 from_bcd(const std::array<uint8_t, 10>& bcd) {
  uint64_t value = 0;
  for (int i = 8; i >= 0; --i) value = value * 100 + (bcd[i] >> 4) * 10 + (bcd[i] & 0xf);
  return from_magnitude(bcd[9] & 0x80, value);
}

StoredBcd to_bcd(Float80 a, Control control) {
  StoredBcd out;
  const Class ca = classify(a);
  auto indefinite = [&] {
    out.bcd = {0, 0, 0, 0, 0, 0, 0, 0xc0, 0xff, 0xff};
    out.flags = flag::kInvalid;
    return out;
  };
  if (ca == Class::kUnsupported || ca == Class::kInfinity || is_nan(ca)) return indefinite();
  uint64_t magnitude = 0;
  if (ca != Class::kZero) {
    const Unpacked u = unpack(a);
    if (u.exp >= 64) return indefinite();
    const IntegerRounding r = round_integer(u, control.rounding());
    if (r.magnitude > 999999999999999999ull) return indefinite();
    magnitude = uint64_t(r.magnitude);
    out.flags = r.inexact ? flag::kPrecision : 0;
    out.rounded_up = r.increment;
  }
  for (int i = 0; i < 9; ++i) {
    const unsigned low = unsigned(magnitude % 10), high = unsigned(magnitude / 10 % 10);
    out.bcd[i] = uint8_t(low | (high << 4));
    magnitude /= 100;
  }
  out.bcd[9] = a.sign() ? 0x80 : 0;
  return out;
}

Float80 constant(Constant which, Control control) {
  struct Entry {
    uint64_t truncated;  // the first 64 significand bits
    uint16_t exponent;
    bool nearest_rounds_up;
  };
  static constexpr Entry kEntries[] = {
      {0xc90fdaa22168c234ull, 0x4000, true},   // pi
      {0xd49a784bcd1b8afeull, 0x4000, false},  // log2(10)
      {0xb8aa3b295c17f0bbull, 0x3fff, true},   // log2(e)
      {0x9a209a84fbcff798ull, 0x3ffd, true},   // log10(2)
      {0xb17217f7d1cf79abull, 0x3ffe, true},   // ln(2)
  };
  const Entry& e = kEntries[unsigned(which)];
  const unsigned rc = control.rounding();
  const bool up = rc == 2 || (rc == 0 && e.nearest_rounds_up);
  return {e.truncated + (up ? 1 : 0), e.exponent};
}

// ---- transcendentals ----

namespace {

// The common front of FSIN/FCOS/FSINCOS/FPTAN: special operands, the range check, and the reduction.
enum class TrigKind : uint8_t { kSin, kCos, kSinCos, kTan };

Trig trigonometric(Float80 x, Control control, TrigKind kind) {
  Trig out;
  const Class c = classify(x);
  auto both = [&](Result r) {
    out.first = out.second = r;
    return out;
  };
  if (c == Class::kUnsupported || c == Class::kInfinity) return both({kIndefinite, flag::kInvalid});
  if (is_nan(c)) return both({quiet(x), uint8_t(c == Class::kSignalingNaN ? flag::kInvalid : 0)});
  const Result one{kOne};
  if (c == Class::kZero) {
    out.first = kind == TrigKind::kCos ? one : Result{x};
    out.second = one;
    return out;
  }
  const Unpacked u = unpack(x);
  if (u.exp >= 63) {
    out.out_of_range = true;
    return out;
  }
  const uint8_t flags = denormal_flag(c) | flag::kPrecision;
  // Tiny arguments: sin x and tan x round as x minus (plus) a sliver, cos x as one minus a sliver; binary128
  // cannot hold the sliver, so it is modelled as a bit below the last.
  if (u.exp < -40) {
    const u128 m = u128(u.sig) << 64;
    const Result sliver_less = finish(u.sign, u.exp, m - 1, control, 64, flags);
    const Result sliver_more = finish(u.sign, u.exp, m | 1, control, 64, flags);
    const Result cos_value = finish(false, 0, (u128(1) << 127) - 1, control, 64, flag::kPrecision | denormal_flag(c));
    switch (kind) {
      case TrigKind::kSin: out.first = sliver_less; break;
      case TrigKind::kCos: out.first = cos_value; break;
      case TrigKind::kSinCos: out.first = sliver_less; out.second = cos_value; break;
      case TrigKind::kTan: out.first = sliver_more; break;
    }
    return out;
  }
  f128 r = 0;
  const unsigned quadrant = reduce(Unpacked{false, u.exp, u.sig}, r);
  const f128 s = sin_series(r), co = cos_series(r);
  // sin and cos of |x| through the quadrant; the sign of x flips the sine (and the tangent).
  f128 sin_x = 0, cos_x = 0;
  switch (quadrant) {
    case 0: sin_x = s; cos_x = co; break;
    case 1: sin_x = co; cos_x = -s; break;
    case 2: sin_x = -s; cos_x = -co; break;
    default: sin_x = -co; cos_x = s; break;
  }
  if (u.sign) sin_x = -sin_x;
  switch (kind) {
    case TrigKind::kSin: out.first = finish_f128(sin_x, control, flags, 1); break;
    case TrigKind::kCos: out.first = finish_f128(cos_x, control, flags, 1); break;
    case TrigKind::kSinCos:
      out.first = finish_f128(sin_x, control, flags, 1);
      out.second = finish_f128(cos_x, control, flags, 1);
      break;
    case TrigKind::kTan: out.first = finish_f128(sin_x / cos_x, control, flags, 1); break;
  }
  return out;
}

// y * log2(arg) for FYL2X (arg = x) and FYL2XP1 (arg = 1 + x, given as x with `plus_one`).
Result y_log2(Float80 y, Float80 x, bool plus_one, Control control) {
  const Class cy = classify(y), cx = classify(x);
  Result out;
  if (nan_or_unsupported(y, cy, x, cx, out)) return out;
  const uint8_t flags = denormal_flag(cx) | denormal_flag(cy);
  const bool y_zero = cy == Class::kZero, y_inf = cy == Class::kInfinity;
  // The logarithm's class: negative (invalid), -infinity (arg 0), zero (arg 1), finite, +infinity.
  const f128 fx = cx == Class::kInfinity ? f128(0) : to_f128(x);
  enum { kNegative, kMinusInfinity, kLogZero, kFinite, kPlusInfinity } log_class;
  bool log_negative = false;  // sign of a zero or finite logarithm
  if (cx == Class::kInfinity) {
    log_class = x.sign() ? kNegative : kPlusInfinity;
  } else if (plus_one) {
    if (fx < -1) log_class = kNegative;
    else if (fx == -1) log_class = kMinusInfinity;
    else log_class = cx == Class::kZero ? kLogZero : kFinite;
    log_negative = x.sign();
  } else {
    if (cx == Class::kZero) log_class = kMinusInfinity;
    else if (x.sign()) log_class = kNegative;
    else if (fx == 1) log_class = kLogZero;
    else log_class = kFinite;
    log_negative = fx < 1;
  }
  switch (log_class) {
    case kNegative: return {kIndefinite, flag::kInvalid};
    case kMinusInfinity:
      if (y_zero) return {kIndefinite, flag::kInvalid};
      return {infinity(!y.sign()), uint8_t(flags | (y_inf ? 0 : flag::kZeroDivide))};
    case kPlusInfinity:
      if (y_zero) return {kIndefinite, flag::kInvalid};
      return {infinity(y.sign()), flags};
    case kLogZero:
      if (y_inf) return {kIndefinite, flag::kInvalid};
      return {zero(y.sign() != log_negative), flags};
    case kFinite: break;
  }
  if (y_inf) return {infinity(y.sign() != log_negative), flags};
  if (y_zero) return {zero(y.sign() != log_negative), flags};
  f128 log2_value = 0;
  bool exact = false;
  if (plus_one) {
    log2_value = 2 * atanh_series(fx / (2 + fx)) / kF128.ln2;
  } else {
    const Unpacked u = unpack(x);
    const f128 m = to_f128(Float80{u.sig, kBias});
    exact = u.sig == kIntegerBit;  // a power of two: the logarithm is its exponent
    log2_value = exact ? f128(u.exp) : ln_of(m, u.exp) / kF128.ln2;
  }
  return finish_f128(to_f128(y) * log2_value, control, uint8_t(flags | (exact ? 0 : flag::kPrecision)), exact ? 0 : 1);
}

}  // namespace

Trig sine(Float80 x, Control control) { return trigonometric(x, control, TrigKind::kSin); }
Trig cosine(Float80 x, Control control) { return trigonometric(x, control, TrigKind::kCos); }
Trig sine_cosine(Float80 x, Control control) { return trigonometric(x, control, TrigKind::kSinCos); }
Trig tangent(Float80 x, Control control) { return trigonometric(x, control, TrigKind::kTan); }

Result arctangent(Float80 y, Float80 x, Control control) {
  const Class cy = classify(y), cx = classify(x);
  Result out;
  if (nan_or_unsupported(y, cy, x, cx, out)) return out;
  const uint8_t flags = denormal_flag(cx) | denormal_flag(cy);
  const bool y_inf = cy == Class::kInfinity, x_inf = cx == Class::kInfinity;
  const bool y_zero = cy == Class::kZero, x_zero = cx == Class::kZero;
  // The SDM's FPATAN table: exact multiples of pi/4 for the special operands, signed by y.
  auto pi_times = [&](f128 factor) {
    return finish_f128(kF128.pi * factor * (y.sign() ? -1 : 1), control, uint8_t(flags | flag::kPrecision), 1);
  };
  if (y_zero) {
    if (x.sign()) return pi_times(1);  // -0, -F, -inf: +-pi
    return {zero(y.sign()), flags};   // +0, +F, +inf: +-0
  }
  if (y_inf) {
    if (x_inf) return pi_times(x.sign() ? f128(0.75) : f128(0.25));
    return pi_times(f128(0.5));
  }
  if (x_zero) return pi_times(f128(0.5));
  if (x_inf) return x.sign() ? pi_times(1) : Result{zero(y.sign()), flags};
  const f128 ay = to_f128(with_sign(y, false)), ax = to_f128(with_sign(x, false));
  f128 angle = ay <= ax ? atan_unit(ay / ax) : kF128.half_pi - atan_unit(ax / ay);
  if (x.sign()) angle = kF128.pi - angle;
  // Tiny y/x: atan(t) is t less a sliver.
  const int tail = !x.sign() && ay <= ax ? -1 : 1;
  return finish_f128(y.sign() ? -angle : angle, control, uint8_t(flags | flag::kPrecision), tail);
}

Result exp2_minus_1(Float80 x, Control control) {
  const Class c = classify(x);
  Result out;
  if (nan_or_unsupported(x, c, out)) return out;
  if (c == Class::kZero) return {x};
  if (c == Class::kInfinity) return {x.sign() ? with_sign(kOne, true) : x};
  const uint8_t flags = denormal_flag(c);
  const f128 v = to_f128(x);
  if (v == 1) return {kOne, flags};
  if (v == -1) return {{kIntegerBit, 0xbffe}, flags};
  // Outside [-1, 1] the SDM leaves the result undefined; this computes 2^x - 1 there too (beyond +-16400 it
  // has overflowed or reached -1 anyway).
  const f128 clamped = v > 16400 ? f128(16400) : v < -16400 ? f128(-16400) : v;
  const int32_t whole = int32_t(static_cast<int64_t>(clamped));  // toward zero
  f128 result = expm1_series((clamped - whole) * kF128.ln2);
  if (whole != 0) result = (result + 1) * power_of_two(whole / 2) * power_of_two(whole - whole / 2) - 1;
  return finish_f128(result, control, uint8_t(flags | flag::kPrecision), 1);
}

Result y_log2_x(Float80 y, Float80 x, Control control) { return y_log2(y, x, false, control); }
Result y_log2_x_plus_1(Float80 y, Float80 x, Control control) { return y_log2(y, x, true, control); }

}  // namespace deja::interp::x87
