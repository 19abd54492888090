// SSE/SSE2 datapath: integer lanes in portable C++, floating point on the host's own SSE unit under the guest's MXCSR.
//
// deja runs on x86-64 hosts only, so executing the very same SSE instruction with the guest's
// rounding mode, DAZ and FTZ loaded is exact by construction (NaN propagation, default NaN,
// denormal handling, rounding). The host always runs with every exception masked (an unmasked
// one would be a host SIGFPE); whether the guest would fault is derived from the raised flags.
#include "interp/sse.h"
#include "interp/sse_host.h"
#include "interp/sse_lanes.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <limits>

namespace deja::interp::sse {
namespace {

using detail::Lanes;
using detail::lanes;
using detail::map2;
using detail::saturate;
using detail::to_xmm;

template <typename T>
Xmm add_saturating(Xmm a, Xmm b) {
  return map2<T>(a, b, [](T x, T y) { return saturate<T>(int64_t{x} + int64_t{y}); });
}
template <typename T>
Xmm sub_saturating(Xmm a, Xmm b) {
  return map2<T>(a, b, [](T x, T y) { return saturate<T>(int64_t{x} - int64_t{y}); });
}
template <typename T>
Xmm compare_eq(Xmm a, Xmm b) {
  return map2<T>(a, b, [](T x, T y) { return x == y ? T(~T{0}) : T{0}; });
}
template <typename S, typename U>
Xmm compare_gt(Xmm a, Xmm b) {
  return map2<S>(a, b, [](S x, S y) { return x > y ? S(-1) : S{0}; });
}

// Interleaves the low (`high` = false) or high halves of a and b, element by element.
template <typename T>
Xmm unpack(Xmm a, Xmm b, bool high) {
  const Lanes<T> la = lanes<T>(a), lb = lanes<T>(b);
  Lanes<T> r;
  constexpr int half = Lanes<T>::kCount / 2;
  const int base = high ? half : 0;
  for (int i = 0; i < half; ++i) {
    r.v[2 * i] = la.v[base + i];
    r.v[2 * i + 1] = lb.v[base + i];
  }
  return to_xmm(r);
}

// Narrows a's elements into the low half and b's into the high half, saturating to Narrow.
template <typename Wide, typename Narrow>
Xmm pack(Xmm a, Xmm b) {
  const Lanes<Wide> la = lanes<Wide>(a), lb = lanes<Wide>(b);
  Lanes<Narrow> r;
  constexpr int n = Lanes<Wide>::kCount;
  for (int i = 0; i < n; ++i) {
    r.v[i] = saturate<Narrow>(la.v[i]);
    r.v[n + i] = saturate<Narrow>(lb.v[i]);
  }
  return to_xmm(r);
}

template <typename T>
Xmm shift_left(Xmm a, uint64_t count) {
  if (count >= sizeof(T) * 8) return Xmm{};
  return map2<T>(a, a, [count](T x, T) { return static_cast<T>(x << count); });
}
template <typename T>
Xmm shift_right_logical(Xmm a, uint64_t count) {
  if (count >= sizeof(T) * 8) return Xmm{};
  return map2<T>(a, a, [count](T x, T) { return static_cast<T>(x >> count); });
}
template <typename S>
Xmm shift_right_arithmetic(Xmm a, uint64_t count) {
  const uint64_t effective = std::min<uint64_t>(count, sizeof(S) * 8 - 1);
  return map2<S>(a, a, [effective](S x, S) { return static_cast<S>(x >> effective); });
}

}  // namespace

Xmm int_binary(IntOp op, Xmm a, Xmm b) {
  switch (op) {
    case IntOp::kPand: return {a.lo & b.lo, a.hi & b.hi};
    case IntOp::kPandn: return {~a.lo & b.lo, ~a.hi & b.hi};
    case IntOp::kPor: return {a.lo | b.lo, a.hi | b.hi};
    case IntOp::kPxor: return {a.lo ^ b.lo, a.hi ^ b.hi};
    case IntOp::kPaddb: return map2<uint8_t>(a, b, [](uint8_t x, uint8_t y) { return x + y; });
    case IntOp::kPaddw: return map2<uint16_t>(a, b, [](uint16_t x, uint16_t y) { return x + y; });
    case IntOp::kPaddd: return map2<uint32_t>(a, b, [](uint32_t x, uint32_t y) { return x + y; });
    case IntOp::kPaddq: return {a.lo + b.lo, a.hi + b.hi};
    case IntOp::kPaddsb: return add_saturating<int8_t>(a, b);
    case IntOp::kPaddsw: return add_saturating<int16_t>(a, b);
    case IntOp::kPaddusb: return add_saturating<uint8_t>(a, b);
    case IntOp::kPaddusw: return add_saturating<uint16_t>(a, b);
    case IntOp::kPsubb: return map2<uint8_t>(a, b, [](uint8_t x, uint8_t y) { return x - y; });
    case IntOp::kPsubw: return map2<uint16_t>(a, b, [](uint16_t x, uint16_t y) { return x - y; });
    case IntOp::kPsubd: return map2<uint32_t>(a, b, [](uint32_t x, uint32_t y) { return x - y; });
    case IntOp::kPsubq: return {a.lo - b.lo, a.hi - b.hi};
    case IntOp::kPsubsb: return sub_saturating<int8_t>(a, b);
    case IntOp::kPsubsw: return sub_saturating<int16_t>(a, b);
    case IntOp::kPsubusb: return sub_saturating<uint8_t>(a, b);
    case IntOp::kPsubusw: return sub_saturating<uint16_t>(a, b);
    case IntOp::kPcmpeqb: return compare_eq<uint8_t>(a, b);
    case IntOp::kPcmpeqw: return compare_eq<uint16_t>(a, b);
    case IntOp::kPcmpeqd: return compare_eq<uint32_t>(a, b);
    case IntOp::kPcmpgtb: return compare_gt<int8_t, uint8_t>(a, b);
    case IntOp::kPcmpgtw: return compare_gt<int16_t, uint16_t>(a, b);
    case IntOp::kPcmpgtd: return compare_gt<int32_t, uint32_t>(a, b);
    case IntOp::kPmullw:
      return map2<int16_t>(a, b, [](int16_t x, int16_t y) { return static_cast<uint16_t>(int32_t{x} * y); });
    case IntOp::kPmulhw:
      return map2<int16_t>(a, b, [](int16_t x, int16_t y) { return static_cast<uint16_t>((int32_t{x} * y) >> 16); });
    case IntOp::kPmulhuw:
      return map2<uint16_t>(a, b, [](uint16_t x, uint16_t y) { return (uint32_t{x} * y) >> 16; });
    case IntOp::kPmuludq:
      return {(a.lo & 0xffffffff) * (b.lo & 0xffffffff), (a.hi & 0xffffffff) * (b.hi & 0xffffffff)};
    case IntOp::kPmaddwd: {
      const Lanes<int16_t> la = lanes<int16_t>(a), lb = lanes<int16_t>(b);
      Lanes<uint32_t> r;
      for (int i = 0; i < 4; ++i) {
        // 0x8000 * 0x8000 twice is the one sum that leaves int32: it wraps to 0x80000000 as on hardware.
        const int64_t sum = int64_t{la.v[2 * i]} * lb.v[2 * i] + int64_t{la.v[2 * i + 1]} * lb.v[2 * i + 1];
        r.v[i] = static_cast<uint32_t>(sum);
      }
      return to_xmm(r);
    }
    case IntOp::kPminub: return map2<uint8_t>(a, b, [](uint8_t x, uint8_t y) { return std::min(x, y); });
    case IntOp::kPmaxub: return map2<uint8_t>(a, b, [](uint8_t x, uint8_t y) { return std::max(x, y); });
    case IntOp::kPminsw: return map2<int16_t>(a, b, [](int16_t x, int16_t y) { return std::min(x, y); });
    case IntOp::kPmaxsw: return map2<int16_t>(a, b, [](int16_t x, int16_t y) { return std::max(x, y); });
    case IntOp::kPavgb:
      return map2<uint8_t>(a, b, [](uint8_t x, uint8_t y) { return (unsigned{x} + y + 1) >> 1; });
    case IntOp::kPavgw:
      return map2<uint16_t>(a, b, [](uint16_t x, uint16_t y) { return (unsigned{x} + y + 1) >> 1; });
    case IntOp::kPsadbw: {
      const Lanes<uint8_t> la = lanes<uint8_t>(a), lb = lanes<uint8_t>(b);
      uint64_t sums[2] = {0, 0};
      for (int i = 0; i < 16; ++i) sums[i / 8] += static_cast<uint64_t>(std::abs(int{la.v[i]} - int{lb.v[i]}));
      return {sums[0], sums[1]};
    }
    case IntOp::kPunpcklbw: return unpack<uint8_t>(a, b, false);
    case IntOp::kPunpcklwd: return unpack<uint16_t>(a, b, false);
    case IntOp::kPunpckldq:
    case IntOp::kUnpcklps: return unpack<uint32_t>(a, b, false);
    case IntOp::kPunpcklqdq:
    case IntOp::kUnpcklpd: return {a.lo, b.lo};
    case IntOp::kPunpckhbw: return unpack<uint8_t>(a, b, true);
    case IntOp::kPunpckhwd: return unpack<uint16_t>(a, b, true);
    case IntOp::kPunpckhdq:
    case IntOp::kUnpckhps: return unpack<uint32_t>(a, b, true);
    case IntOp::kPunpckhqdq:
    case IntOp::kUnpckhpd: return {a.hi, b.hi};
    case IntOp::kPacksswb: return pack<int16_t, int8_t>(a, b);
    case IntOp::kPackuswb: return pack<int16_t, uint8_t>(a, b);
    case IntOp::kPackssdw: return pack<int32_t, int16_t>(a, b);
    case IntOp::kPsllw: return shift_left<uint16_t>(a, b.lo);
    case IntOp::kPslld: return shift_left<uint32_t>(a, b.lo);
    case IntOp::kPsllq: return shift_left<uint64_t>(a, b.lo);
    case IntOp::kPsrlw: return shift_right_logical<uint16_t>(a, b.lo);
    case IntOp::kPsrld: return shift_right_logical<uint32_t>(a, b.lo);
    case IntOp::kPsrlq: return shift_right_logical<uint64_t>(a, b.lo);
    case IntOp::kPsraw: return shift_right_arithmetic<int16_t>(a, b.lo);
    case IntOp::kPsrad: return shift_right_arithmetic<int32_t>(a, b.lo);
  }
  return a;
}

Xmm shift_imm(IntOp op, Xmm a, uint8_t count) { return int_binary(op, a, Xmm{count, 0}); }

Xmm pslldq(Xmm a, uint8_t bytes) {
  if (bytes > 15) return Xmm{};
  const unsigned __int128 whole = (static_cast<unsigned __int128>(a.hi) << 64) | a.lo;
  const unsigned __int128 shifted = whole << (bytes * 8);
  return {static_cast<uint64_t>(shifted), static_cast<uint64_t>(shifted >> 64)};
}

Xmm psrldq(Xmm a, uint8_t bytes) {
  if (bytes > 15) return Xmm{};
  const unsigned __int128 whole = (static_cast<unsigned __int128>(a.hi) << 64) | a.lo;
  const unsigned __int128 shifted = whole >> (bytes * 8);
  return {static_cast<uint64_t>(shifted), static_cast<uint64_t>(shifted >> 64)};
}

Xmm pshufd(Xmm src, uint8_t order) {
  const Lanes<uint32_t> s = lanes<uint32_t>(src);
  Lanes<uint32_t> r;
  for (int i = 0; i < 4; ++i) r.v[i] = s.v[(order >> (2 * i)) & 3];
  return to_xmm(r);
}

Xmm pshuflw(Xmm src, uint8_t order) {
  const Lanes<uint16_t> s = lanes<uint16_t>(src);
  Lanes<uint16_t> r = s;
  for (int i = 0; i < 4; ++i) r.v[i] = s.v[(order >> (2 * i)) & 3];
  return to_xmm(r);
}

Xmm pshufhw(Xmm src, uint8_t order) {
  const Lanes<uint16_t> s = lanes<uint16_t>(src);
  Lanes<uint16_t> r = s;
  for (int i = 0; i < 4; ++i) r.v[4 + i] = s.v[4 + ((order >> (2 * i)) & 3)];
  return to_xmm(r);
}

Xmm shufps(Xmm a, Xmm b, uint8_t order) {
  const Lanes<uint32_t> la = lanes<uint32_t>(a), lb = lanes<uint32_t>(b);
  Lanes<uint32_t> r;
  r.v[0] = la.v[order & 3];
  r.v[1] = la.v[(order >> 2) & 3];
  r.v[2] = lb.v[(order >> 4) & 3];
  r.v[3] = lb.v[(order >> 6) & 3];
  return to_xmm(r);
}

Xmm shufpd(Xmm a, Xmm b, uint8_t order) { return {(order & 1) ? a.hi : a.lo, (order & 2) ? b.hi : b.lo}; }

uint32_t pmovmskb(Xmm src) {
  const Lanes<uint8_t> s = lanes<uint8_t>(src);
  uint32_t mask = 0;
  for (int i = 0; i < 16; ++i) mask |= uint32_t{static_cast<uint32_t>(s.v[i] >> 7)} << i;
  return mask;
}

uint32_t movmskps(Xmm src) {
  const Lanes<uint32_t> s = lanes<uint32_t>(src);
  uint32_t mask = 0;
  for (int i = 0; i < 4; ++i) mask |= (s.v[i] >> 31) << i;
  return mask;
}

uint32_t movmskpd(Xmm src) { return static_cast<uint32_t>((src.lo >> 63) | ((src.hi >> 63) << 1)); }

uint16_t pextrw(Xmm src, uint8_t index) { return lanes<uint16_t>(src).v[index & 7]; }

Xmm pinsrw(Xmm dst, uint16_t value, uint8_t index) {
  Lanes<uint16_t> d = lanes<uint16_t>(dst);
  d.v[index & 7] = value;
  return to_xmm(d);
}

// ---- Floating point on the host SSE unit ----
namespace {

using host::from_vec;
using host::host_mxcsr;
using host::Outcome;
using host::settle;
using host::to_vec;
using host::Vec;

#define DEJA_SSE_RR_FN(NAME, INSN)                                                                  \
  uint32_t NAME(Vec& a, Vec b, uint32_t run) {                                                     \
    uint32_t saved, after;                                                                         \
    DEJA_SSE_ASM(INSN " %[b], %[a]", : [a] "+x"(a), [saved] "=&m"(saved), [after] "=m"(after)      \
                 : [b] "x"(b), [run] "m"(run));                                                    \
    return after;                                                                                  \
  }

DEJA_SSE_RR_FN(h_addsd, "addsd") DEJA_SSE_RR_FN(h_addpd, "addpd") DEJA_SSE_RR_FN(h_addss, "addss") DEJA_SSE_RR_FN(h_addps, "addps")
DEJA_SSE_RR_FN(h_subsd, "subsd") DEJA_SSE_RR_FN(h_subpd, "subpd") DEJA_SSE_RR_FN(h_subss, "subss") DEJA_SSE_RR_FN(h_subps, "subps")
DEJA_SSE_RR_FN(h_mulsd, "mulsd") DEJA_SSE_RR_FN(h_mulpd, "mulpd") DEJA_SSE_RR_FN(h_mulss, "mulss") DEJA_SSE_RR_FN(h_mulps, "mulps")
DEJA_SSE_RR_FN(h_divsd, "divsd") DEJA_SSE_RR_FN(h_divpd, "divpd") DEJA_SSE_RR_FN(h_divss, "divss") DEJA_SSE_RR_FN(h_divps, "divps")
DEJA_SSE_RR_FN(h_minsd, "minsd") DEJA_SSE_RR_FN(h_minpd, "minpd") DEJA_SSE_RR_FN(h_minss, "minss") DEJA_SSE_RR_FN(h_minps, "minps")
DEJA_SSE_RR_FN(h_maxsd, "maxsd") DEJA_SSE_RR_FN(h_maxpd, "maxpd") DEJA_SSE_RR_FN(h_maxss, "maxss") DEJA_SSE_RR_FN(h_maxps, "maxps")
DEJA_SSE_RR_FN(h_sqrtsd, "sqrtsd") DEJA_SSE_RR_FN(h_sqrtpd, "sqrtpd") DEJA_SSE_RR_FN(h_sqrtss, "sqrtss") DEJA_SSE_RR_FN(h_sqrtps, "sqrtps")
DEJA_SSE_RR_FN(h_cvtdq2pd, "cvtdq2pd") DEJA_SSE_RR_FN(h_cvtdq2ps, "cvtdq2ps") DEJA_SSE_RR_FN(h_cvtps2dq, "cvtps2dq")
DEJA_SSE_RR_FN(h_cvttps2dq, "cvttps2dq") DEJA_SSE_RR_FN(h_cvtpd2dq, "cvtpd2dq") DEJA_SSE_RR_FN(h_cvttpd2dq, "cvttpd2dq")
DEJA_SSE_RR_FN(h_cvtpd2ps, "cvtpd2ps") DEJA_SSE_RR_FN(h_cvtps2pd, "cvtps2pd") DEJA_SSE_RR_FN(h_cvtsd2ss, "cvtsd2ss")
DEJA_SSE_RR_FN(h_cvtss2sd, "cvtss2sd")

using HostFn = uint32_t (*)(Vec&, Vec, uint32_t);

template <int kPredicate>
uint32_t h_cmp(FpForm form, Vec& a, Vec b, uint32_t run) {
  uint32_t saved, after;
  switch (form) {
    case FpForm::kSd:
      DEJA_SSE_ASM("cmpsd %[p], %[b], %[a]", : [a] "+x"(a), [saved] "=&m"(saved), [after] "=m"(after)
                   : [b] "x"(b), [run] "m"(run), [p] "i"(kPredicate));
      break;
    case FpForm::kPd:
      DEJA_SSE_ASM("cmppd %[p], %[b], %[a]", : [a] "+x"(a), [saved] "=&m"(saved), [after] "=m"(after)
                   : [b] "x"(b), [run] "m"(run), [p] "i"(kPredicate));
      break;
    case FpForm::kSs:
      DEJA_SSE_ASM("cmpss %[p], %[b], %[a]", : [a] "+x"(a), [saved] "=&m"(saved), [after] "=m"(after)
                   : [b] "x"(b), [run] "m"(run), [p] "i"(kPredicate));
      break;
    case FpForm::kPs:
      DEJA_SSE_ASM("cmpps %[p], %[b], %[a]", : [a] "+x"(a), [saved] "=&m"(saved), [after] "=m"(after)
                   : [b] "x"(b), [run] "m"(run), [p] "i"(kPredicate));
      break;
  }
  return after;
}

}  // namespace

FpResult fp_arith(FpOp op, FpForm form, Xmm a, Xmm b, uint32_t guest_mxcsr) {
  static constexpr HostFn kTable[7][4] = {
      {h_addsd, h_addpd, h_addss, h_addps}, {h_subsd, h_subpd, h_subss, h_subps},
      {h_mulsd, h_mulpd, h_mulss, h_mulps}, {h_divsd, h_divpd, h_divss, h_divps},
      {h_minsd, h_minpd, h_minss, h_minps}, {h_maxsd, h_maxpd, h_maxss, h_maxps},
      {h_sqrtsd, h_sqrtpd, h_sqrtss, h_sqrtps},
  };
  Vec value = to_vec(a);
  const uint32_t after = kTable[static_cast<int>(op)][static_cast<int>(form)](value, to_vec(b), host_mxcsr(guest_mxcsr));
  const Outcome outcome = settle(guest_mxcsr, after);
  return {outcome.fault ? a : from_vec(value), outcome.mxcsr, outcome.fault};
}

FpResult fp_cmp(FpForm form, Xmm a, Xmm b, uint8_t predicate, uint32_t guest_mxcsr) {
  using CmpFn = uint32_t (*)(FpForm, Vec&, Vec, uint32_t);
  static constexpr CmpFn kTable[8] = {h_cmp<0>, h_cmp<1>, h_cmp<2>, h_cmp<3>, h_cmp<4>, h_cmp<5>, h_cmp<6>, h_cmp<7>};
  Vec value = to_vec(a);
  const uint32_t after = kTable[predicate & 7](form, value, to_vec(b), host_mxcsr(guest_mxcsr));
  const Outcome outcome = settle(guest_mxcsr, after);
  return {outcome.fault ? a : from_vec(value), outcome.mxcsr, outcome.fault};
}

CompareResult fp_comis(FpForm form, bool quiet, Xmm a, Xmm b, uint64_t rflags, uint32_t guest_mxcsr) {
  const Vec va = to_vec(a), vb = to_vec(b);
  const uint32_t run = host_mxcsr(guest_mxcsr);
  uint32_t saved, after;
  uint8_t zf, pf, cf;
#define DEJA_COMIS(INSN)                                                                                   \
  DEJA_SSE_ASM(INSN " %[b], %[a]\n\tsetz %[zf]\n\tsetp %[pf]\n\tsetc %[cf]",                              \
               : [saved] "=&m"(saved), [after] "=m"(after), [zf] "=&r"(zf), [pf] "=&r"(pf), [cf] "=&r"(cf) \
               : [a] "x"(va), [b] "x"(vb), [run] "m"(run)                                                 \
               : "cc")
  const bool single = form == FpForm::kSs || form == FpForm::kPs;
  if (single) {
    if (quiet) DEJA_COMIS("ucomiss"); else DEJA_COMIS("comiss");
  } else {
    if (quiet) DEJA_COMIS("ucomisd"); else DEJA_COMIS("comisd");
  }
#undef DEJA_COMIS
  const Outcome outcome = settle(guest_mxcsr, after);
  constexpr uint64_t kCf = 1u << 0, kPf = 1u << 2, kAf = 1u << 4, kZf = 1u << 6, kSf = 1u << 7, kOf = 1u << 11;
  uint64_t flags = rflags & ~(kCf | kPf | kAf | kZf | kSf | kOf);
  if (zf) flags |= kZf;
  if (pf) flags |= kPf;
  if (cf) flags |= kCf;
  return {outcome.fault ? rflags : flags, outcome.mxcsr, outcome.fault};
}

FpResult fp_convert(CvtOp op, Xmm dst, Xmm src, uint32_t guest_mxcsr) {
  static constexpr HostFn kTable[] = {h_cvtdq2pd, h_cvtdq2ps, h_cvtps2dq, h_cvttps2dq, h_cvtpd2dq,
                                      h_cvttpd2dq, h_cvtpd2ps, h_cvtps2pd, h_cvtsd2ss,  h_cvtss2sd};
  Vec value = to_vec(dst);
  const uint32_t after = kTable[static_cast<int>(op)](value, to_vec(src), host_mxcsr(guest_mxcsr));
  const Outcome outcome = settle(guest_mxcsr, after);
  return {outcome.fault ? dst : from_vec(value), outcome.mxcsr, outcome.fault};
}

FpResult cvtsi2f(bool to_double, Xmm dst, uint64_t src, unsigned width, uint32_t guest_mxcsr) {
  Vec value = to_vec(dst);
  const uint32_t run = host_mxcsr(guest_mxcsr);
  uint32_t saved, after;
  const uint32_t src32 = static_cast<uint32_t>(src);
  if (width == 64) {
    if (to_double) {
      DEJA_SSE_ASM("cvtsi2sdq %[s], %[a]", : [a] "+x"(value), [saved] "=&m"(saved), [after] "=m"(after) : [s] "r"(src), [run] "m"(run));
    } else {
      DEJA_SSE_ASM("cvtsi2ssq %[s], %[a]", : [a] "+x"(value), [saved] "=&m"(saved), [after] "=m"(after) : [s] "r"(src), [run] "m"(run));
    }
  } else if (to_double) {
    DEJA_SSE_ASM("cvtsi2sdl %[s], %[a]", : [a] "+x"(value), [saved] "=&m"(saved), [after] "=m"(after) : [s] "r"(src32), [run] "m"(run));
  } else {
    DEJA_SSE_ASM("cvtsi2ssl %[s], %[a]", : [a] "+x"(value), [saved] "=&m"(saved), [after] "=m"(after) : [s] "r"(src32), [run] "m"(run));
  }
  const Outcome outcome = settle(guest_mxcsr, after);
  return {outcome.fault ? dst : from_vec(value), outcome.mxcsr, outcome.fault};
}

IntResult cvtf2si(FpForm form, bool truncate, Xmm src, unsigned width, uint32_t guest_mxcsr) {
  const Vec value = to_vec(src);
  const uint32_t run = host_mxcsr(guest_mxcsr);
  uint32_t saved, after;
  uint64_t out64 = 0;
  uint32_t out32 = 0;
  const bool single = form == FpForm::kSs || form == FpForm::kPs;
#define DEJA_CVT(INSN, OUT) \
  DEJA_SSE_ASM(INSN " %[s], %[o]", : [o] "=r"(OUT), [saved] "=&m"(saved), [after] "=m"(after) : [s] "x"(value), [run] "m"(run))
  if (width == 64) {
    if (single) {
      if (truncate) DEJA_CVT("cvttss2si", out64); else DEJA_CVT("cvtss2si", out64);
    } else {
      if (truncate) DEJA_CVT("cvttsd2si", out64); else DEJA_CVT("cvtsd2si", out64);
    }
  } else {
    if (single) {
      if (truncate) DEJA_CVT("cvttss2si", out32); else DEJA_CVT("cvtss2si", out32);
    } else {
      if (truncate) DEJA_CVT("cvttsd2si", out32); else DEJA_CVT("cvtsd2si", out32);
    }
    out64 = out32;
  }
#undef DEJA_CVT
  const Outcome outcome = settle(guest_mxcsr, after);
  return {outcome.fault ? 0 : out64, outcome.mxcsr, outcome.fault};
}

}  // namespace deja::interp::sse
