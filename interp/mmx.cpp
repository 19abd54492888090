// MMX datapath: each 64-bit operation as its 128-bit SSE counterpart on operands placed so that the low quadword of the result is the MMX result.
#include "interp/mmx.h"

namespace deja::interp::mmx {

using sse::Xmm;

uint64_t int_binary(sse::IntOp op, uint64_t a, uint64_t b) {
  using IO = sse::IntOp;
  switch (op) {
    // The high halves interleave as the low halves of the operands' upper dwords do.
    case IO::kPunpckhbw: return sse::int_binary(IO::kPunpcklbw, Xmm{a >> 32, 0}, Xmm{b >> 32, 0}).lo;
    case IO::kPunpckhwd: return sse::int_binary(IO::kPunpcklwd, Xmm{a >> 32, 0}, Xmm{b >> 32, 0}).lo;
    case IO::kPunpckhdq: return sse::int_binary(IO::kPunpckldq, Xmm{a >> 32, 0}, Xmm{b >> 32, 0}).lo;
    // Packing a:b as one register puts a's narrowed elements in the low half and b's in the high half.
    case IO::kPacksswb: case IO::kPackuswb: case IO::kPackssdw: return sse::int_binary(op, Xmm{a, b}, Xmm{}).lo;
    default: return sse::int_binary(op, Xmm{a, 0}, Xmm{b, 0}).lo;
  }
}

uint64_t shift_imm(sse::IntOp op, uint64_t a, uint8_t count) { return sse::shift_imm(op, Xmm{a, 0}, count).lo; }

uint64_t ext_binary(sse::ExtOp op, uint64_t a, uint64_t b) {
  using EO = sse::ExtOp;
  switch (op) {
    // Indices count modulo 8: a twice makes bit 3 of an index select the same bytes.
    case EO::kPshufb: return sse::ext_binary(op, Xmm{a, a}, Xmm{b, 0}).lo;
    case EO::kPhaddw: case EO::kPhaddd: case EO::kPhaddsw: case EO::kPhsubw: case EO::kPhsubd: case EO::kPhsubsw:
      return sse::ext_binary(op, Xmm{a, b}, Xmm{}).lo;
    default: return sse::ext_binary(op, Xmm{a, 0}, Xmm{b, 0}).lo;
  }
}

uint64_t palignr(uint64_t a, uint64_t b, uint8_t bytes) {
  if (bytes >= 16) return 0;
  return sse::palignr(Xmm{}, Xmm{b, a}, bytes).lo;
}

uint64_t pshufw(uint64_t src, uint8_t order) {
  uint64_t r = 0;
  for (int i = 0; i < 4; ++i) r |= ((src >> (16 * ((order >> (2 * i)) & 3))) & 0xffff) << (16 * i);
  return r;
}

uint32_t pmovmskb(uint64_t src) { return sse::pmovmskb(Xmm{src, 0}); }

uint16_t pextrw(uint64_t src, uint8_t index) { return uint16_t(src >> (16 * (index & 3))); }

uint64_t pinsrw(uint64_t dst, uint16_t value, uint8_t index) {
  const unsigned shift = 16 * (index & 3);
  return (dst & ~(0xffffull << shift)) | (uint64_t{value} << shift);
}

}  // namespace deja::interp::mmx
