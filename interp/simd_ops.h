// Which datapath operation (interp/sse.h, interp/sse4.h) a packed-integer mnemonic names, shared by the SSE, SSE4 and MMX executors.
#pragma once

#include <cstdint>
#include <optional>

#include "interp/sse.h"
#include "interp/sse4.h"

namespace deja::interp {

// The SSE2 packed-integer and bitwise operations (their MMX forms too): PADDB -> kPaddb, ANDPS -> kPand, ...
std::optional<sse::IntOp> int_op_of(uint16_t mnemonic);
// The SSSE3, SSE4.1 and SSE4.2 ones: PSHUFB -> kPshufb, PMOVZXBW -> kPmovzxbw, ...
std::optional<sse::ExtOp> ext_op_of(uint16_t mnemonic);

struct DecodedInsn;
// An instruction of the SIMD extensions after SSE2 (MMX, SSE3-SSE4.2) that neither reads nor writes RFLAGS:
// the fast path runs it without materializing the lazy flags (all but PTEST and PCMPxSTRx).
bool simd_extension_is_flagless(const DecodedInsn& insn);

}  // namespace deja::interp
