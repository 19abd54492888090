// BMI1 and BMI2 of the software CPU: the VEX-encoded general-register instructions (ANDN, BEXTR, BLSI, BLSMSK, BLSR, BZHI, MULX, PDEP, PEXT, RORX, SARX, SHLX, SHRX).
//
// They need neither AVX state nor CR4.OSXSAVE, and never raise #NM. The flags the SDM leaves undefined are 0
// (docs/interp-alu.md); MULX, PDEP, PEXT, RORX and the shifts leave RFLAGS alone.
#include <Zydis/Zydis.h>

#include "interp/interp_backend.h"
#include "interp/lazy_flags.h"

namespace deja {

using interp::DecodedInsn;

namespace {

uint64_t width_mask(unsigned bits) { return bits == 64 ? ~0ull : (1ull << bits) - 1; }

uint64_t deposit(uint64_t src, uint64_t mask) {  // PDEP
  uint64_t out = 0;
  for (uint64_t bit = 1; mask; bit <<= 1) {
    const uint64_t lowest = mask & -mask;
    if (src & bit) out |= lowest;
    mask ^= lowest;
  }
  return out;
}

uint64_t extract(uint64_t src, uint64_t mask) {  // PEXT
  uint64_t out = 0;
  for (uint64_t bit = 1; mask; bit <<= 1) {
    const uint64_t lowest = mask & -mask;
    if (src & lowest) out |= bit;
    mask ^= lowest;
  }
  return out;
}

}  // namespace

void InterpBackend::exec_bmi(const DecodedInsn& insn) {
  if (!(s_.cr0 & cr0::kPe) || (s_.rflags & rflags::kVm) || !vex_features_[size_t(insn.isa)]) raise_ud(insn, false);
  const unsigned w = insn.op[0].size * 8;
  const uint64_t mask = width_mask(w);
  const uint64_t sign = 1ull << (w - 1);
  // Sets ZF and SF from `result` (unless `zf_from_result` is false: ZF cleared), CF as given, OF, AF, PF clear.
  auto set_flags = [&](uint64_t result, bool cf, bool zf_from_result = true, bool sf = true) {
    uint64_t f = s_.rflags & ~interp::kArithFlags;
    if (zf_from_result && (result & mask) == 0) f |= interp::kZf;
    if (sf && (result & sign)) f |= interp::kSf;
    if (cf) f |= interp::kCf;
    s_.rflags = f;
  };
  switch (ZydisMnemonic(insn.mnemonic)) {
    case ZYDIS_MNEMONIC_ANDN: {
      const uint64_t r = ~read_operand(insn, 1) & read_operand(insn, 2) & mask;
      write_operand(insn, 0, r);
      set_flags(r, false);
      return;
    }
    case ZYDIS_MNEMONIC_BEXTR: {
      const uint64_t src = read_operand(insn, 1), control = read_operand(insn, 2);
      const unsigned start = unsigned(control & 0xff), length = unsigned((control >> 8) & 0xff);
      uint64_t r = start >= w ? 0 : src >> start;
      if (length < 64) r &= width_mask(length);
      write_operand(insn, 0, r);
      set_flags(r, false, true, false);
      return;
    }
    case ZYDIS_MNEMONIC_BLSI: case ZYDIS_MNEMONIC_BLSMSK: case ZYDIS_MNEMONIC_BLSR: {
      const uint64_t src = read_operand(insn, 1);
      uint64_t r;
      if (insn.mnemonic == ZYDIS_MNEMONIC_BLSI) r = (0 - src) & src & mask;
      else if (insn.mnemonic == ZYDIS_MNEMONIC_BLSMSK) r = ((src - 1) ^ src) & mask;
      else r = (src - 1) & src & mask;
      write_operand(insn, 0, r);
      if (insn.mnemonic == ZYDIS_MNEMONIC_BLSI) set_flags(r, src != 0);
      else if (insn.mnemonic == ZYDIS_MNEMONIC_BLSMSK) set_flags(r, src == 0, false);
      else set_flags(r, src == 0);
      return;
    }
    case ZYDIS_MNEMONIC_BZHI: {
      const uint64_t src = read_operand(insn, 1);
      const unsigned n = unsigned(read_operand(insn, 2) & 0xff);
      const uint64_t r = n < w ? src & width_mask(n) : src;
      write_operand(insn, 0, r);
      set_flags(r, n > w - 1);
      return;
    }
    case ZYDIS_MNEMONIC_MULX: {
      // EDX/RDX times the source; the low half to the second operand, then the high half to the first (which
      // wins when they are the same register).
      const uint64_t a = reg_read(kRdx, w / 8), b = read_operand(insn, 2);
      const unsigned __int128 product = (unsigned __int128)a * b;
      const uint64_t lo = w == 64 ? uint64_t(product) : uint64_t(product) & mask;
      const uint64_t hi = w == 64 ? uint64_t(product >> 64) : uint64_t(product) >> 32;
      write_operand(insn, 1, lo);
      write_operand(insn, 0, hi);
      return;
    }
    case ZYDIS_MNEMONIC_PDEP:
      write_operand(insn, 0, deposit(read_operand(insn, 1), read_operand(insn, 2)) & mask);
      return;
    case ZYDIS_MNEMONIC_PEXT:
      write_operand(insn, 0, extract(read_operand(insn, 1), read_operand(insn, 2)) & mask);
      return;
    case ZYDIS_MNEMONIC_RORX: {
      const uint64_t src = read_operand(insn, 1);
      const unsigned n = unsigned(insn.op[2].disp) & (w - 1);
      write_operand(insn, 0, n == 0 ? src : ((src >> n) | (src << (w - n))) & mask);
      return;
    }
    case ZYDIS_MNEMONIC_SARX: case ZYDIS_MNEMONIC_SHLX: case ZYDIS_MNEMONIC_SHRX: {
      const uint64_t src = read_operand(insn, 1);
      const unsigned n = unsigned(read_operand(insn, 2)) & (w - 1);
      uint64_t r;
      if (insn.mnemonic == ZYDIS_MNEMONIC_SHLX) r = (src << n) & mask;
      else if (insn.mnemonic == ZYDIS_MNEMONIC_SHRX) r = src >> n;
      else r = uint64_t(int64_t(src << (64 - w)) >> (64 - w + n)) & mask;
      write_operand(insn, 0, r);
      return;
    }
    default:
      raise_ud(insn, true);
  }
}

}  // namespace deja
