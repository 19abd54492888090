// The vCPU's architectural state (CpuState) as a tagged, versioned byte blob for checkpoints.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/cpu_state.h"
#include "core/error.h"

namespace deja {

// Every field of CpuState: GPRs, RIP, RFLAGS, segments with their hidden parts, descriptor tables,
// control registers, EFER, XCR0, the MSRs both backends hold, the FXSAVE image (x87/SSE, MXCSR),
// the YMM upper halves and the interrupt shadow / halt state.
std::vector<uint8_t> encode_cpu_state(const CpuState& state);
Result<CpuState> decode_cpu_state(std::span<const uint8_t> blob);

}  // namespace deja
