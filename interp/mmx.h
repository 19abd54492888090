// MMX datapath of the software CPU: the 64-bit forms of the packed-integer operations, as pure functions (built on interp/sse.h and interp/sse4.h).
#pragma once

#include <cstdint>

#include "interp/sse.h"
#include "interp/sse4.h"

namespace deja::interp::mmx {

// The MMX form of an SSE2 packed-integer operation (PADD*, PSUB*, PCMP*, PMUL*, PMADDWD, PACK*, PUNPCK*,
// the shifts by a register count, the logic, and SSE's PAVG*, PMIN/PMAX*, PSADBW, PMULHUW, PADDQ/PSUBQ,
// PMULUDQ): a is the destination, b the source.
uint64_t int_binary(sse::IntOp op, uint64_t a, uint64_t b);
// PSLLW/D/Q, PSRLW/D/Q, PSRAW/D by an immediate.
uint64_t shift_imm(sse::IntOp op, uint64_t a, uint8_t count);
// The MMX form of an SSSE3 operation (PSHUFB, PHADD*/PHSUB*, PMADDUBSW, PMULHRSW, PSIGN*, PABS*).
uint64_t ext_binary(sse::ExtOp op, uint64_t a, uint64_t b);
// PALIGNR mm: the 16 bytes a:b shifted right by `bytes`, the low 8 (0 from 16 on).
uint64_t palignr(uint64_t a, uint64_t b, uint8_t bytes);
uint64_t pshufw(uint64_t src, uint8_t order);
uint32_t pmovmskb(uint64_t src);
uint16_t pextrw(uint64_t src, uint8_t index);  // index modulo 4
uint64_t pinsrw(uint64_t dst, uint16_t value, uint8_t index);

}  // namespace deja::interp::mmx
