// Running one SSE instruction on the host under the guest's MXCSR (shared by interp/sse.cpp and interp/sse4.cpp).
#pragma once

#include <cstdint>

#include "interp/sse.h"

namespace deja::interp::sse::host {

using Vec = long long __attribute__((vector_size(16)));

inline Vec to_vec(Xmm x) { return Vec{static_cast<long long>(x.lo), static_cast<long long>(x.hi)}; }
inline Xmm from_vec(Vec v) { return {static_cast<uint64_t>(v[0]), static_cast<uint64_t>(v[1])}; }

// The MXCSR the host runs with: the guest's rounding, DAZ and FTZ, no flags, every exception masked.
inline uint32_t host_mxcsr(uint32_t guest) {
  return (guest & (mxcsr::kRcMask | mxcsr::kDaz | mxcsr::kFtz)) | mxcsr::kMasks;
}

struct Outcome {
  uint32_t mxcsr;
  bool fault;
};

// Folds the flags the host raised into the guest MXCSR and decides whether the guest faults.
// Invalid, denormal and divide-by-zero are detected before the result is computed: if one of
// them is unmasked the instruction stops there and the post-computation flags are not raised.
inline Outcome settle(uint32_t guest, uint32_t host_after) {
  const uint32_t raised = host_after & mxcsr::kFlags;
  const uint32_t masked = (guest & mxcsr::kMasks) >> 7;
  const uint32_t pre = raised & (mxcsr::kIe | mxcsr::kDe | mxcsr::kZe);
  if (pre & ~masked) return {guest | pre, true};
  const bool fault = (raised & ~masked) != 0;
  return {guest | raised, fault};
}

// The FpResult of an operation the host ran on `value` (a copy of `before`), its MXCSR after.
inline FpResult finish(Xmm before, Vec value, uint32_t guest_mxcsr, uint32_t host_after) {
  const Outcome outcome = settle(guest_mxcsr, host_after);
  return {outcome.fault ? before : from_vec(value), outcome.mxcsr, outcome.fault};
}

}  // namespace deja::interp::sse::host

// Saves the host MXCSR, loads %[run], runs INSN_LINE, stores the MXCSR it left in %[after] and restores the
// host's; the operands follow as in an asm statement (they must name [saved], [after] and [run]).
#define DEJA_SSE_ASM(INSN_LINE, ...)                                                                 \
  asm volatile("stmxcsr %[saved]\n\tldmxcsr %[run]\n\t" INSN_LINE "\n\tstmxcsr %[after]\n\tldmxcsr %[saved]" \
               __VA_ARGS__)
