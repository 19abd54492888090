// Element views of a 128-bit register for the SIMD datapaths (interp/sse.cpp, interp/sse4.cpp): lanes, lane-wise maps, saturation.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>

#include "interp/sse.h"

namespace deja::interp::sse::detail {

template <typename T>
struct Lanes {
  static constexpr int kCount = 16 / sizeof(T);
  T v[kCount];
};

template <typename T>
Lanes<T> lanes(Xmm x) {
  Lanes<T> out;
  const uint64_t halves[2] = {x.lo, x.hi};
  std::memcpy(out.v, halves, 16);
  return out;
}

template <typename T>
Xmm to_xmm(const Lanes<T>& l) {
  uint64_t halves[2];
  std::memcpy(halves, l.v, 16);
  return {halves[0], halves[1]};
}

template <typename T, typename F>
Xmm map2(Xmm a, Xmm b, F f) {
  const Lanes<T> la = lanes<T>(a), lb = lanes<T>(b);
  Lanes<T> r;
  for (int i = 0; i < Lanes<T>::kCount; ++i) r.v[i] = static_cast<T>(f(la.v[i], lb.v[i]));
  return to_xmm(r);
}

template <typename T>
T saturate(int64_t value) {
  return static_cast<T>(std::clamp<int64_t>(value, std::numeric_limits<T>::min(), std::numeric_limits<T>::max()));
}

}  // namespace deja::interp::sse::detail
