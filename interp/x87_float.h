// The x87's 80-bit floating-point datapath in software: pure functions, bit-exact with x87 hardware and independent of the host CPU.
#pragma once

#include <array>
#include <cstdint>

namespace deja::interp::x87 {

// One register in double extended-precision format (SDM vol. 1, 4.2.2): an explicit integer bit at
// significand bit 63, a 15-bit exponent biased by 16383, and the sign above it.
struct Float80 {
  uint64_t sig = 0;
  uint16_t sign_exp = 0;
  constexpr bool sign() const { return sign_exp >> 15; }
  constexpr uint16_t exponent() const { return sign_exp & 0x7fff; }
  constexpr bool operator==(const Float80&) const = default;
};

constexpr Float80 kPositiveZero{0, 0};
constexpr Float80 kOne{0x8000000000000000ull, 0x3fff};
// The "real indefinite" QNaN every masked invalid operation without a NaN operand returns.
constexpr Float80 kIndefinite{0xc000000000000000ull, 0xffff};

// The exception flags, in their FSW (and, as masks, FCW) bit positions.
namespace flag {
constexpr uint8_t kInvalid = 1, kDenormal = 2, kZeroDivide = 4, kOverflow = 8, kUnderflow = 16, kPrecision = 32;
constexpr uint8_t kAll = 0x3f;
}  // namespace flag

// What of the control word the datapath honours: rounding control, precision control (only the
// instructions the SDM names apply it: FADD/FSUB/FMUL/FDIV with their variants, and FSQRT) and the
// exception masks (an unmasked overflow or underflow into a register stores a bias-adjusted result).
struct Control {
  uint16_t fcw = 0x37f;
  unsigned rounding() const { return (fcw >> 10) & 3; }  // 0 nearest, 1 down, 2 up, 3 toward zero
  // Significand bits of precision control: 24 (PC=00), 53 (PC=10), 64 (PC=11 and the reserved PC=01).
  unsigned precision() const;
  uint8_t masks() const { return fcw & flag::kAll; }
};

// A register-destined result: the value, the exception flags raised, and whether rounding increased
// the magnitude (C1 after an inexact result).
struct Result {
  Float80 value;
  uint8_t flags = 0;
  bool rounded_up = false;
};

// The operand classes that decide x87 special cases; pseudo-denormals are kDenormal, unnormals,
// pseudo-infinities and pseudo-NaNs kUnsupported.
enum class Class : uint8_t { kUnsupported, kQuietNaN, kSignalingNaN, kInfinity, kZero, kDenormal, kNormal };
Class classify(Float80 value);
inline bool is_nan(Class c) { return c == Class::kQuietNaN || c == Class::kSignalingNaN; }

// ---- arithmetic (precision control applies) ----
Result add(Float80 a, Float80 b, Control control);
Result subtract(Float80 a, Float80 b, Control control);  // a - b
Result multiply(Float80 a, Float80 b, Control control);
Result divide(Float80 a, Float80 b, Control control);    // a / b
Result square_root(Float80 a, Control control);

// ---- other operations (always 64-bit precision) ----
Result round_to_integer(Float80 a, Control control);          // FRNDINT
Result scale(Float80 a, Float80 b, Control control);          // FSCALE: a * 2^trunc(b)
struct Extracted {                                            // FXTRACT
  Float80 exponent;     // the unbiased exponent as a value (ST(1) after FXTRACT)
  Float80 significand;  // the value with exponent 0 (ST(0))
  uint8_t flags = 0;
};
Extracted extract(Float80 a);
struct PartialRemainder {                                     // FPREM / FPREM1
  Result result;
  unsigned quotient_low = 0;  // Q2 Q1 Q0, the low three bits of the quotient's magnitude
  bool incomplete = false;    // C2: the exponent difference was 64 or more; run the instruction again
  bool special = false;       // a NaN or an invalid operand decided the result: no quotient, C0 and C3 stay
};
PartialRemainder partial_remainder(Float80 a, Float80 b, bool round_to_nearest, Control control);

// ---- comparison ----
enum class Relation : uint8_t { kLess, kEqual, kGreater, kUnordered };
struct Comparison {
  Relation relation = Relation::kUnordered;
  uint8_t flags = 0;
};
// `quiet` (FUCOM*): only signaling NaNs and unsupported encodings are invalid; otherwise any NaN is.
Comparison compare(Float80 a, Float80 b, bool quiet);

// ---- conversions ----
// Exact; a denormal raises #D. FLD quiets a signaling NaN with #IA; an arithmetic memory operand keeps it
// signaling (`keep_signaling`), so that the operation applies the two-operand NaN rules.
Result from_float32(uint32_t bits, bool keep_signaling = false);
Result from_float64(uint64_t bits, bool keep_signaling = false);
Float80 from_integer(int64_t value);  // exact
// A memory-destined result: `stored` false means an unmasked exception suppresses the store (the stack
// is then not popped either).
struct Stored {
  uint64_t bits = 0;
  uint8_t flags = 0;
  bool rounded_up = false;
  bool stored = true;
};
Stored to_float32(Float80 a, Control control);
Stored to_float64(Float80 a, Control control);
// To a signed integer of `bits` bits (16, 32 or 64), rounded per RC or, with `truncate` (FISTTP), toward
// zero; out of range, NaN and infinity give the integer indefinite (the most negative value) with #IA.
Stored to_integer(Float80 a, unsigned bits, bool truncate, Control control);
// Packed BCD: 18 digits in bytes 0-8, the sign in bit 7 of byte 9.
Float80 from_bcd(const std::array<uint8_t, 10>& bcd);
struct StoredBcd {
  std::array<uint8_t, 10> bcd{};
  uint8_t flags = 0;
  bool rounded_up = false;
  bool stored = true;
};
StoredBcd to_bcd(Float80 a, Control control);

// The constants of FLDPI, FLDL2T, FLDL2E, FLDLG2, FLDLN2: held with 66 bits and rounded per RC, with no
// precision exception (SDM vol. 1, 8.3.8).
enum class Constant : uint8_t { kPi, kLog2Of10, kLog2OfE, kLog10Of2, kLnOf2 };
Float80 constant(Constant which, Control control);

// ---- transcendentals: computed in software, never by the host's FSIN & co., which differ between Intel
// and AMD. Arguments are reduced like Intel's x87 (a 66-bit pi), then evaluated in 113-bit binary128. ----
// FSIN/FCOS/FSINCOS/FPTAN take |x| < 2^63; `out_of_range` (C2) otherwise, and the operand stays.
struct Trig {
  Result first;   // sin, cos or tan
  Result second;  // cos for sincos
  bool out_of_range = false;
};
Trig sine(Float80 x, Control control);
Trig cosine(Float80 x, Control control);
Trig sine_cosine(Float80 x, Control control);  // first = sin, second = cos (FSINCOS)
Trig tangent(Float80 x, Control control);
Result arctangent(Float80 y, Float80 x, Control control);  // FPATAN: atan2(ST(1), ST(0))
Result exp2_minus_1(Float80 x, Control control);           // F2XM1
Result y_log2_x(Float80 y, Float80 x, Control control);     // FYL2X
Result y_log2_x_plus_1(Float80 y, Float80 x, Control control);  // FYL2XP1

}  // namespace deja::interp::x87
