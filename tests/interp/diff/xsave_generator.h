// Random sequences for the differential tester's XSAVE class: which events put x87, SSE and AVX state in or out of use (XINUSE), then XGETBV(1) and XSAVE or XSAVEOPT.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "tests/interp/diff/generator.h"

namespace deja::difftest {

// Each sequence starts from a known XINUSE on the host and in interp: XRSTOR of every component from an XSAVE
// area at kDataAddr whose XSTATE_BV is random (a cleared bit puts its component in its initial configuration).
// Then random events (VZEROUPPER, VZEROALL, writes and reads of XMM, YMM, MMX and x87 state, LDMXCSR, an XRSTOR
// with a partial XSTATE_BV and RFBM), then XGETBV with ECX = 1 into R8 and an XSAVE or XSAVEOPT (REX.W or not, a
// random RFBM) into a second area at kDataAddr + 0x400, whose bytes are compared: what is written and what is left.
class XsaveGenerator {
 public:
  explicit XsaveGenerator(uint64_t seed) : rng_(seed), legacy_(seed ^ 0x58534156, false, false) {}
  Sequence sequence(int events);
  RegisterFile registers();
  std::vector<uint8_t> data() { return legacy_.data(); }

 private:
  std::mt19937_64 rng_;
  Generator legacy_;
};

}  // namespace deja::difftest
