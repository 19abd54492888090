// SSE3/SSSE3/SSE4.1/SSE4.2 datapath: integer lanes and string compares in portable C++, floating point on the host's SSE unit under the guest's MXCSR.
#include "interp/sse4.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>

#include "interp/sse_host.h"
#include "interp/sse_lanes.h"

namespace deja::interp::sse {
namespace {

using detail::Lanes;
using detail::lanes;
using detail::map2;
using detail::saturate;
using detail::to_xmm;

// PHADD*/PHSUB*: pairs of a's elements in the low half, pairs of b's in the high half.
template <typename T, typename F>
Xmm horizontal(Xmm a, Xmm b, F f) {
  const Lanes<T> la = lanes<T>(a), lb = lanes<T>(b);
  Lanes<T> r;
  constexpr int half = Lanes<T>::kCount / 2;
  for (int i = 0; i < half; ++i) {
    r.v[i] = static_cast<T>(f(la.v[2 * i], la.v[2 * i + 1]));
    r.v[half + i] = static_cast<T>(f(lb.v[2 * i], lb.v[2 * i + 1]));
  }
  return to_xmm(r);
}

// Two's-complement negation that wraps: the most negative value negates to itself, as the hardware's does
// (negating it as a signed int is undefined behaviour).
template <typename S>
S wrapping_negate(S x) {
  return static_cast<S>(std::make_unsigned_t<S>(0) - static_cast<std::make_unsigned_t<S>>(x));
}

template <typename S>
Xmm sign(Xmm a, Xmm b) {
  return map2<S>(a, b, [](S x, S y) { return y < 0 ? wrapping_negate(x) : y == 0 ? S(0) : x; });
}

template <typename S>
Xmm absolute(Xmm b) {
  // The most negative value stays as it is (its absolute value is the unsigned reading of the same bits).
  return map2<S>(b, b, [](S x, S) { return x < 0 ? wrapping_negate(x) : x; });
}

template <typename Narrow, typename Wide>
Xmm extend(Xmm b) {
  const Lanes<Narrow> lb = lanes<Narrow>(b);
  Lanes<Wide> r;
  for (int i = 0; i < Lanes<Wide>::kCount; ++i) r.v[i] = static_cast<Wide>(lb.v[i]);
  return to_xmm(r);
}

template <typename T>
Xmm lane_min(Xmm a, Xmm b) {
  return map2<T>(a, b, [](T x, T y) { return std::min(x, y); });
}
template <typename T>
Xmm lane_max(Xmm a, Xmm b) {
  return map2<T>(a, b, [](T x, T y) { return std::max(x, y); });
}

}  // namespace

// ---- SSE3 ----

Xmm movsldup(Xmm src) {
  const uint64_t lo = src.lo & 0xffffffff, hi = src.hi & 0xffffffff;
  return {lo | (lo << 32), hi | (hi << 32)};
}

Xmm movshdup(Xmm src) {
  const uint64_t lo = src.lo >> 32, hi = src.hi >> 32;
  return {lo | (lo << 32), hi | (hi << 32)};
}

Xmm movddup(Xmm src) { return {src.lo, src.lo}; }

namespace {

using host::to_vec;
using host::Vec;

#define DEJA_SSE4_RR_FN(NAME, INSN)                                                                 \
  uint32_t NAME(Vec& a, Vec b, uint32_t run) {                                                     \
    uint32_t saved, after;                                                                         \
    DEJA_SSE_ASM(INSN " %[b], %[a]", : [a] "+x"(a), [saved] "=&m"(saved), [after] "=m"(after)      \
                 : [b] "x"(b), [run] "m"(run));                                                    \
    return after;                                                                                  \
  }
DEJA_SSE4_RR_FN(h_addsubps, "addsubps") DEJA_SSE4_RR_FN(h_addsubpd, "addsubpd")
DEJA_SSE4_RR_FN(h_haddps, "haddps") DEJA_SSE4_RR_FN(h_haddpd, "haddpd")
DEJA_SSE4_RR_FN(h_hsubps, "hsubps") DEJA_SSE4_RR_FN(h_hsubpd, "hsubpd")
#undef DEJA_SSE4_RR_FN

using HostFn = uint32_t (*)(Vec&, Vec, uint32_t);

// The host instructions with an immediate: one function per immediate the instruction distinguishes.
#define DEJA_SSE4_IMM_FN(NAME, INSN)                                                                \
  template <int kImm>                                                                              \
  uint32_t NAME(Vec& a, Vec b, uint32_t run) {                                                     \
    uint32_t saved, after;                                                                         \
    DEJA_SSE_ASM(INSN " %[i], %[b], %[a]", : [a] "+x"(a), [saved] "=&m"(saved), [after] "=m"(after) \
                 : [b] "x"(b), [run] "m"(run), [i] "i"(kImm));                                      \
    return after;                                                                                  \
  }
DEJA_SSE4_IMM_FN(h_roundps, "roundps") DEJA_SSE4_IMM_FN(h_roundpd, "roundpd")
DEJA_SSE4_IMM_FN(h_roundss, "roundss") DEJA_SSE4_IMM_FN(h_roundsd, "roundsd")
DEJA_SSE4_IMM_FN(h_dpps, "dpps") DEJA_SSE4_IMM_FN(h_dppd, "dppd")
#undef DEJA_SSE4_IMM_FN

template <template <int> class Fn, size_t... I>
constexpr std::array<HostFn, sizeof...(I)> table(std::index_sequence<I...>) {
  return {&Fn<int(I)>::call...};
}
#define DEJA_SSE4_TABLE(NAME, FN, N)                              \
  template <int kImm>                                             \
  struct NAME##_fn {                                              \
    static uint32_t call(Vec& a, Vec b, uint32_t run) { return FN<kImm>(a, b, run); } \
  };                                                              \
  constexpr auto NAME = table<NAME##_fn>(std::make_index_sequence<N>());
DEJA_SSE4_TABLE(kRoundps, h_roundps, 16)
DEJA_SSE4_TABLE(kRoundpd, h_roundpd, 16)
DEJA_SSE4_TABLE(kRoundss, h_roundss, 16)
DEJA_SSE4_TABLE(kRoundsd, h_roundsd, 16)
DEJA_SSE4_TABLE(kDpps, h_dpps, 256)
DEJA_SSE4_TABLE(kDppd, h_dppd, 64)
#undef DEJA_SSE4_TABLE

FpResult run_host(HostFn fn, Xmm a, Xmm b, uint32_t guest_mxcsr) {
  Vec value = to_vec(a);
  const uint32_t after = fn(value, to_vec(b), host::host_mxcsr(guest_mxcsr));
  return host::finish(a, value, guest_mxcsr, after);
}

}  // namespace

FpResult fp_horizontal(HorizontalOp op, FpForm form, Xmm a, Xmm b, uint32_t guest_mxcsr) {
  static constexpr HostFn kTable[3][2] = {
      {h_addsubps, h_addsubpd}, {h_haddps, h_haddpd}, {h_hsubps, h_hsubpd}};
  return run_host(kTable[static_cast<int>(op)][form == FpForm::kPd || form == FpForm::kSd ? 1 : 0], a, b,
                  guest_mxcsr);
}

// ---- packed integer ----

Xmm ext_binary(ExtOp op, Xmm a, Xmm b) {
  switch (op) {
    case ExtOp::kPshufb: {
      const Lanes<uint8_t> la = lanes<uint8_t>(a), lb = lanes<uint8_t>(b);
      Lanes<uint8_t> r;
      for (int i = 0; i < 16; ++i) r.v[i] = (lb.v[i] & 0x80) ? 0 : la.v[lb.v[i] & 15];
      return to_xmm(r);
    }
    case ExtOp::kPhaddw: return horizontal<uint16_t>(a, b, [](uint16_t x, uint16_t y) { return x + y; });
    case ExtOp::kPhaddd: return horizontal<uint32_t>(a, b, [](uint32_t x, uint32_t y) { return x + y; });
    case ExtOp::kPhaddsw:
      return horizontal<int16_t>(a, b, [](int16_t x, int16_t y) { return saturate<int16_t>(int64_t{x} + y); });
    case ExtOp::kPhsubw: return horizontal<uint16_t>(a, b, [](uint16_t x, uint16_t y) { return x - y; });
    case ExtOp::kPhsubd: return horizontal<uint32_t>(a, b, [](uint32_t x, uint32_t y) { return x - y; });
    case ExtOp::kPhsubsw:
      return horizontal<int16_t>(a, b, [](int16_t x, int16_t y) { return saturate<int16_t>(int64_t{x} - y); });
    case ExtOp::kPmaddubsw: {
      // Unsigned bytes of a times signed bytes of b, adjacent products summed with signed saturation.
      const Lanes<uint8_t> la = lanes<uint8_t>(a);
      const Lanes<int8_t> lb = lanes<int8_t>(b);
      Lanes<int16_t> r;
      for (int i = 0; i < 8; ++i) {
        r.v[i] = saturate<int16_t>(int64_t{la.v[2 * i]} * lb.v[2 * i] + int64_t{la.v[2 * i + 1]} * lb.v[2 * i + 1]);
      }
      return to_xmm(r);
    }
    case ExtOp::kPmulhrsw:
      return map2<int16_t>(a, b, [](int16_t x, int16_t y) {
        return static_cast<int16_t>(static_cast<uint32_t>(((int32_t{x} * y >> 14) + 1) >> 1));
      });
    case ExtOp::kPsignb: return sign<int8_t>(a, b);
    case ExtOp::kPsignw: return sign<int16_t>(a, b);
    case ExtOp::kPsignd: return sign<int32_t>(a, b);
    case ExtOp::kPabsb: return absolute<int8_t>(b);
    case ExtOp::kPabsw: return absolute<int16_t>(b);
    case ExtOp::kPabsd: return absolute<int32_t>(b);
    case ExtOp::kPmulld:
      return map2<uint32_t>(a, b, [](uint32_t x, uint32_t y) { return static_cast<uint32_t>(uint64_t{x} * y); });
    case ExtOp::kPmuldq:
      return {static_cast<uint64_t>(int64_t{static_cast<int32_t>(a.lo)} * static_cast<int32_t>(b.lo)),
              static_cast<uint64_t>(int64_t{static_cast<int32_t>(a.hi)} * static_cast<int32_t>(b.hi))};
    case ExtOp::kPminsb: return lane_min<int8_t>(a, b);
    case ExtOp::kPminsd: return lane_min<int32_t>(a, b);
    case ExtOp::kPminuw: return lane_min<uint16_t>(a, b);
    case ExtOp::kPminud: return lane_min<uint32_t>(a, b);
    case ExtOp::kPmaxsb: return lane_max<int8_t>(a, b);
    case ExtOp::kPmaxsd: return lane_max<int32_t>(a, b);
    case ExtOp::kPmaxuw: return lane_max<uint16_t>(a, b);
    case ExtOp::kPmaxud: return lane_max<uint32_t>(a, b);
    case ExtOp::kPackusdw: {
      const Lanes<int32_t> la = lanes<int32_t>(a), lb = lanes<int32_t>(b);
      Lanes<uint16_t> r;
      for (int i = 0; i < 4; ++i) {
        r.v[i] = saturate<uint16_t>(la.v[i]);
        r.v[4 + i] = saturate<uint16_t>(lb.v[i]);
      }
      return to_xmm(r);
    }
    case ExtOp::kPcmpeqq: return {a.lo == b.lo ? ~0ull : 0, a.hi == b.hi ? ~0ull : 0};
    case ExtOp::kPcmpgtq:
      return {int64_t(a.lo) > int64_t(b.lo) ? ~0ull : 0, int64_t(a.hi) > int64_t(b.hi) ? ~0ull : 0};
    case ExtOp::kPhminposuw: {
      const Lanes<uint16_t> lb = lanes<uint16_t>(b);
      unsigned index = 0;
      for (unsigned i = 1; i < 8; ++i) {
        if (lb.v[i] < lb.v[index]) index = i;
      }
      return {uint64_t{lb.v[index]} | (uint64_t{index} << 16), 0};
    }
    case ExtOp::kPmovsxbw: return extend<int8_t, int16_t>(b);
    case ExtOp::kPmovsxbd: return extend<int8_t, int32_t>(b);
    case ExtOp::kPmovsxbq: return extend<int8_t, int64_t>(b);
    case ExtOp::kPmovsxwd: return extend<int16_t, int32_t>(b);
    case ExtOp::kPmovsxwq: return extend<int16_t, int64_t>(b);
    case ExtOp::kPmovsxdq: return extend<int32_t, int64_t>(b);
    case ExtOp::kPmovzxbw: return extend<uint8_t, uint16_t>(b);
    case ExtOp::kPmovzxbd: return extend<uint8_t, uint32_t>(b);
    case ExtOp::kPmovzxbq: return extend<uint8_t, uint64_t>(b);
    case ExtOp::kPmovzxwd: return extend<uint16_t, uint32_t>(b);
    case ExtOp::kPmovzxwq: return extend<uint16_t, uint64_t>(b);
    case ExtOp::kPmovzxdq: return extend<uint32_t, uint64_t>(b);
  }
  return a;
}

unsigned pmov_source_bytes(ExtOp op) {
  switch (op) {
    case ExtOp::kPmovsxbq: case ExtOp::kPmovzxbq: return 2;
    case ExtOp::kPmovsxbd: case ExtOp::kPmovzxbd: case ExtOp::kPmovsxwq: case ExtOp::kPmovzxwq: return 4;
    default: return 8;
  }
}

Xmm palignr(Xmm a, Xmm b, uint8_t bytes) {
  if (bytes >= 32) return Xmm{};
  uint8_t whole[48] = {};
  std::memcpy(whole, &b.lo, 8);
  std::memcpy(whole + 8, &b.hi, 8);
  std::memcpy(whole + 16, &a.lo, 8);
  std::memcpy(whole + 24, &a.hi, 8);
  Xmm r;
  std::memcpy(&r.lo, whole + bytes, 8);
  std::memcpy(&r.hi, whole + bytes + 8, 8);
  return r;
}

Xmm blend(unsigned element_bytes, Xmm a, Xmm b, uint8_t imm) {
  uint8_t ra[16], rb[16];
  std::memcpy(ra, &a.lo, 8);
  std::memcpy(ra + 8, &a.hi, 8);
  std::memcpy(rb, &b.lo, 8);
  std::memcpy(rb + 8, &b.hi, 8);
  for (unsigned i = 0; i < 16 / element_bytes; ++i) {
    if ((imm >> i) & 1) std::memcpy(ra + i * element_bytes, rb + i * element_bytes, element_bytes);
  }
  Xmm r;
  std::memcpy(&r.lo, ra, 8);
  std::memcpy(&r.hi, ra + 8, 8);
  return r;
}

Xmm blendv(unsigned element_bytes, Xmm a, Xmm b, Xmm mask) {
  const Lanes<uint8_t> m = lanes<uint8_t>(mask);
  uint8_t imm_bits[16] = {};
  const unsigned count = 16 / element_bytes;
  uint32_t select = 0;
  for (unsigned i = 0; i < count; ++i) {
    imm_bits[i] = m.v[i * element_bytes + element_bytes - 1] >> 7;
    select |= uint32_t{imm_bits[i]} << i;
  }
  if (element_bytes > 1) return blend(element_bytes, a, b, uint8_t(select));
  const Lanes<uint8_t> la = lanes<uint8_t>(a), lb = lanes<uint8_t>(b);
  Lanes<uint8_t> r;
  for (unsigned i = 0; i < 16; ++i) r.v[i] = imm_bits[i] ? lb.v[i] : la.v[i];
  return to_xmm(r);
}

Xmm insertps(Xmm a, uint32_t value, uint8_t imm) {
  Lanes<uint32_t> r = lanes<uint32_t>(a);
  r.v[(imm >> 4) & 3] = value;
  for (int i = 0; i < 4; ++i) {
    if ((imm >> i) & 1) r.v[i] = 0;
  }
  return to_xmm(r);
}

uint64_t extract(Xmm src, unsigned bytes, uint8_t index) {
  const unsigned i = index & (16 / bytes - 1);
  uint8_t all[16];
  std::memcpy(all, &src.lo, 8);
  std::memcpy(all + 8, &src.hi, 8);
  uint64_t value = 0;
  std::memcpy(&value, all + i * bytes, bytes);
  return value;
}

Xmm insert(Xmm dst, uint64_t value, unsigned bytes, uint8_t index) {
  const unsigned i = index & (16 / bytes - 1);
  uint8_t all[16];
  std::memcpy(all, &dst.lo, 8);
  std::memcpy(all + 8, &dst.hi, 8);
  std::memcpy(all + i * bytes, &value, bytes);
  Xmm r;
  std::memcpy(&r.lo, all, 8);
  std::memcpy(&r.hi, all + 8, 8);
  return r;
}

Xmm mpsadbw(Xmm a, Xmm b, uint8_t imm) {
  const Lanes<uint8_t> la = lanes<uint8_t>(a), lb = lanes<uint8_t>(b);
  const unsigned a_offset = (imm & 4) ? 4 : 0, b_offset = (imm & 3) * 4;
  Lanes<uint16_t> r;
  for (unsigned i = 0; i < 8; ++i) {
    unsigned sum = 0;
    for (unsigned k = 0; k < 4; ++k) sum += unsigned(std::abs(int{la.v[a_offset + i + k]} - int{lb.v[b_offset + k]}));
    r.v[i] = static_cast<uint16_t>(sum);
  }
  return to_xmm(r);
}

uint64_t ptest(Xmm a, Xmm b, uint64_t rflags) {
  constexpr uint64_t kCf = 1, kPf = 4, kAf = 0x10, kZf = 0x40, kSf = 0x80, kOf = 0x800;
  uint64_t flags = rflags & ~(kCf | kPf | kAf | kZf | kSf | kOf);
  if (((a.lo & b.lo) | (a.hi & b.hi)) == 0) flags |= kZf;
  if (((~a.lo & b.lo) | (~a.hi & b.hi)) == 0) flags |= kCf;
  return flags;
}

FpResult fp_round(FpForm form, Xmm a, Xmm b, uint8_t imm, uint32_t guest_mxcsr) {
  const unsigned i = imm & 15;
  switch (form) {
    case FpForm::kPs: return run_host(kRoundps[i], a, b, guest_mxcsr);
    case FpForm::kPd: return run_host(kRoundpd[i], a, b, guest_mxcsr);
    case FpForm::kSs: return run_host(kRoundss[i], a, b, guest_mxcsr);
    case FpForm::kSd: return run_host(kRoundsd[i], a, b, guest_mxcsr);
  }
  return {a, guest_mxcsr, false};
}

FpResult fp_dot(FpForm form, Xmm a, Xmm b, uint8_t imm, uint32_t guest_mxcsr) {
  if (form == FpForm::kPd || form == FpForm::kSd) return run_host(kDppd[imm & 0x3f], a, b, guest_mxcsr);
  return run_host(kDpps[imm], a, b, guest_mxcsr);
}

// ---- SSE4.2 ----

unsigned explicit_length(uint64_t value, bool rex_w, uint8_t imm) {
  const int64_t signed_value = rex_w ? static_cast<int64_t>(value) : int64_t{static_cast<int32_t>(value)};
  const uint64_t limit = (imm & 1) ? 8 : 16;
  // |INT64_MIN| does not fit: compare before negating.
  if (signed_value > int64_t(limit) || signed_value < -int64_t(limit)) return unsigned(limit);
  return unsigned(signed_value < 0 ? -signed_value : signed_value);
}

unsigned implicit_length(Xmm x, uint8_t imm) {
  const unsigned count = (imm & 1) ? 8 : 16;
  for (unsigned i = 0; i < count; ++i) {
    if (extract(x, (imm & 1) ? 2 : 1, uint8_t(i)) == 0) return i;
  }
  return count;
}

StringCompare string_compare(Xmm a, unsigned length_a, Xmm b, unsigned length_b, uint8_t imm, uint64_t rflags) {
  const bool words = imm & 1, is_signed = imm & 2;
  const unsigned n = words ? 8 : 16;
  auto element = [&](Xmm x, unsigned i) -> int32_t {
    const uint64_t raw = extract(x, words ? 2 : 1, uint8_t(i));
    if (!is_signed) return int32_t(raw);
    return words ? int32_t(int16_t(raw)) : int32_t(int8_t(raw));
  };
  int32_t ea[16], eb[16];
  for (unsigned i = 0; i < n; ++i) {
    ea[i] = element(a, i);
    eb[i] = element(b, i);
  }
  uint32_t result = 0;  // IntRes1
  switch ((imm >> 2) & 3) {
    case 0:  // equal any: b's element j is one of a's valid elements
      for (unsigned j = 0; j < length_b; ++j) {
        for (unsigned i = 0; i < length_a; ++i) {
          if (ea[i] == eb[j]) result |= 1u << j;
        }
      }
      break;
    case 1:  // ranges: b's element j lies in one of a's valid pairs [a[i], a[i+1]]
      for (unsigned j = 0; j < length_b; ++j) {
        for (unsigned i = 0; i + 1 < length_a; i += 2) {
          if (ea[i] <= eb[j] && eb[j] <= ea[i + 1]) result |= 1u << j;
        }
      }
      break;
    case 2:  // equal each: both valid and equal, or both invalid
      for (unsigned i = 0; i < n; ++i) {
        const bool va = i < length_a, vb = i < length_b;
        if (va && vb ? ea[i] == eb[i] : !va && !vb) result |= 1u << i;
      }
      break;
    default:  // equal ordered: a (the needle, up to its length) occurs in b at j; past b's end only a's end matches
      for (unsigned j = 0; j < n; ++j) {
        bool match = true;
        for (unsigned k = 0; j + k < n && match; ++k) {
          if (k >= length_a) break;
          match = j + k < length_b && ea[k] == eb[j + k];
        }
        if (match) result |= 1u << j;
      }
      break;
  }
  const uint32_t all = (1u << n) - 1;
  switch ((imm >> 4) & 3) {
    case 1: result ^= all; break;                         // negative
    case 3: result ^= (1u << length_b) - 1; break;        // masked negative: b's valid elements only
    default: break;
  }
  constexpr uint64_t kCf = 1, kPf = 4, kAf = 0x10, kZf = 0x40, kSf = 0x80, kOf = 0x800;
  uint64_t flags = rflags & ~(kCf | kPf | kAf | kZf | kSf | kOf);
  if (result) flags |= kCf;
  if (length_b < n) flags |= kZf;
  if (length_a < n) flags |= kSf;
  if (result & 1) flags |= kOf;
  return {result, flags};
}

uint32_t string_index(const StringCompare& r, uint8_t imm) {
  if (r.result == 0) return (imm & 1) ? 8 : 16;
  return (imm & 0x40) ? 31 - uint32_t(std::countl_zero(r.result)) : uint32_t(std::countr_zero(r.result));
}

Xmm string_mask(const StringCompare& r, uint8_t imm) {
  if (!(imm & 0x40)) return {r.result, 0};
  const unsigned bytes = (imm & 1) ? 2 : 1;
  Xmm mask;
  for (unsigned i = 0; i < 16 / bytes; ++i) {
    if ((r.result >> i) & 1) mask = insert(mask, ~0ull, bytes, uint8_t(i));
  }
  return mask;
}

uint32_t crc32c(uint32_t crc, uint64_t data, unsigned bytes) {
  static const std::array<uint32_t, 256> kTable = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c >> 1) ^ ((c & 1) ? 0x82f63b78u : 0);
      t[i] = c;
    }
    return t;
  }();
  for (unsigned i = 0; i < bytes; ++i) crc = (crc >> 8) ^ kTable[(crc ^ (data >> (8 * i))) & 0xff];
  return crc;
}

}  // namespace deja::interp::sse
