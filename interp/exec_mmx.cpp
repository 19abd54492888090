// The MMX executor of the software CPU: MM0-7 on the x87 registers' mantissas, the x87-to-MMX transition, every instruction with an MMX register and the conversions between MMX and SSE.
#include <Zydis/Zydis.h>

#include <array>

#include "interp/interp_backend.h"
#include "interp/mmx.h"
#include "interp/simd_ops.h"

namespace deja {

using interp::DecodedInsn;
using interp::Operand;
using interp::OpKind;
using interp::sse::Xmm;

namespace {

constexpr uint8_t kUd = 6, kNm = 7, kMf = 16, kGp = 13, kXm = 19;
constexpr size_t kFswOffset = 2, kFtwOffset = 4, kStOffset = 32;
constexpr uint16_t kFswSummary = 0x80, kFswTopMask = 0x3800;

}  // namespace

uint64_t InterpBackend::mm(unsigned n) const {
  uint16_t fsw;
  std::memcpy(&fsw, s_.fxsave.data() + kFswOffset, 2);
  const unsigned slot = (n - ((fsw & kFswTopMask) >> 11)) & 7;  // FXSAVE stores ST(i) = physical (TOP + i) in slot i
  uint64_t value;
  std::memcpy(&value, s_.fxsave.data() + kStOffset + 16 * slot, 8);
  return value;
}

void InterpBackend::mmx_transition() {
  uint16_t fsw;
  std::memcpy(&fsw, s_.fxsave.data() + kFswOffset, 2);
  const unsigned top = (fsw & kFswTopMask) >> 11;
  if (top != 0) {
    // TOP = 0: the slots rotate so that slot i holds physical register i.
    std::array<uint8_t, 128> old;
    std::memcpy(old.data(), s_.fxsave.data() + kStOffset, 128);
    for (unsigned i = 0; i < 8; ++i) std::memcpy(s_.fxsave.data() + kStOffset + 16 * i, &old[16 * ((i - top) & 7)], 16);
    fsw = uint16_t(fsw & ~kFswTopMask);
    std::memcpy(s_.fxsave.data() + kFswOffset, &fsw, 2);
  }
  s_.fxsave[kFtwOffset] = 0xff;
}

void InterpBackend::set_mm(unsigned n, uint64_t value) {
  uint8_t* slot = s_.fxsave.data() + kStOffset + 16 * n;
  std::memcpy(slot, &value, 8);
  slot[8] = slot[9] = 0xff;       // the exponent field (and sign) all ones: the value reads as a NaN to the x87
  std::memset(slot + 10, 0, 6);   // (the reserved bytes read as zero, as FXSAVE writes them)
}

void InterpBackend::masked_store(const DecodedInsn& insn, const uint8_t* data, const uint8_t* mask, unsigned n) {
  // DS:[RDI] (a segment prefix applies), the bytes whose mask byte has its sign bit set. Only those are stored,
  // after the whole range is checked for a write; an all-zero mask accesses no memory (a documented choice: the
  // SDM leaves faults on a zero mask to the implementation).
  const uint64_t address_mask = insn.addrsize == 64 ? ~0ull : insn.addrsize == 32 ? 0xffffffffull : 0xffffull;
  const uint64_t address = s_.gpr[kRdi] & address_mask;
  const int seg = insn.seg_override != 0xff ? insn.seg_override : 3;
  bool any = false;
  for (unsigned i = 0; i < n; ++i) any |= (mask[i] & 0x80) != 0;
  if (!any) return;
  probe_write(seg, address, n);
  for (unsigned i = 0; i < n; ++i) {
    if (mask[i] & 0x80) write_mem(seg, (address + i) & address_mask, 1, data[i]);
  }
}

void InterpBackend::exec_mmx(const DecodedInsn& insn) {
  namespace sse = interp::sse;
  namespace mmx = interp::mmx;
  const auto mnemonic = ZydisMnemonic(insn.mnemonic);
  bool has_mmx_register = false, has_xmm_register = false;
  for (int i = 0; i < insn.operand_count; ++i) {
    has_mmx_register |= insn.op[i].kind == OpKind::kMmx;
    has_xmm_register |= insn.op[i].kind == OpKind::kXmm;
  }
  // SSE's and SSE2's additions on MMX registers are in every model with MMX; the SSSE3 forms need SSSE3 too.
  const bool ssse3 = interp::ext_op_of(insn.mnemonic).has_value() || mnemonic == ZYDIS_MNEMONIC_PALIGNR;
  if (!simd_.mmx || (ssse3 && !simd_.ssse3)) raise_ud(insn, false);
  if ((s_.cr0 & cr0::kEm) || (has_xmm_register && !(s_.cr4 & cr4::kOsfxsr))) raise(kUd);
  if (s_.cr0 & cr0::kTs) raise(kNm);
  // An instruction on MMX registers first reports a pending x87 exception (as #MF with CR0.NE, as the x87's
  // waiting instructions do); CVTPI2PS/CVTPI2PD from memory do not touch the x87 state at all.
  uint16_t fsw;
  std::memcpy(&fsw, s_.fxsave.data() + kFswOffset, 2);
  if ((has_mmx_register || mnemonic == ZYDIS_MNEMONIC_EMMS) && (fsw & kFswSummary) && (s_.cr0 & cr0::kNe)) raise(kMf);

  const Operand& dst = insn.op[0];
  const Operand& src = insn.op[1];
  // Operand i as 64 bits: an MMX register, a general register or memory (op.size bytes, zero-extended).
  auto load = [&](int i) -> uint64_t {
    const Operand& op = insn.op[i];
    if (op.kind == OpKind::kMmx) return mm(op.reg);
    if (op.kind == OpKind::kXmm) return xmm(op.reg).lo;
    return read_operand(insn, i);
  };
  // The result into MMX register `n`: the transition first (after every access that can fault).
  auto write_mm = [&](unsigned n, uint64_t value) {
    mmx_transition();
    set_mm(n, value);
  };
  const uint8_t imm = insn.operand_count >= 3 && insn.op[2].kind == OpKind::kImm ? uint8_t(insn.op[2].disp) : 0;
  auto convert = [&](sse::CvtOp op, Xmm from) {
    const sse::FpResult r = sse::fp_convert(op, Xmm{}, from, mxcsr());
    set_mxcsr(r.mxcsr);
    if (r.fault) raise((s_.cr4 & cr4::kOsxmmexcpt) ? kXm : kUd);
    return r.value;
  };

  switch (mnemonic) {
    case ZYDIS_MNEMONIC_EMMS:  // TOP = 0 as after any MMX instruction, then every register empty (SDM vol. 1, table 9-3)
      mmx_transition();
      s_.fxsave[kFtwOffset] = 0;
      return;
    case ZYDIS_MNEMONIC_MOVD:
    case ZYDIS_MNEMONIC_MOVQ:
    case ZYDIS_MNEMONIC_MOVNTQ:
      if (dst.kind == OpKind::kMmx) {
        write_mm(dst.reg, load(1));
      } else {
        write_operand(insn, 0, mm(src.reg));  // (a 32-bit general register is zero-extended)
        mmx_transition();
      }
      return;
    case ZYDIS_MNEMONIC_MOVQ2DQ:
      set_xmm(dst.reg, Xmm{mm(src.reg), 0});
      mmx_transition();
      return;
    case ZYDIS_MNEMONIC_MOVDQ2Q: write_mm(dst.reg, xmm(src.reg).lo); return;
    case ZYDIS_MNEMONIC_PSHUFW: write_mm(dst.reg, mmx::pshufw(load(1), imm)); return;
    case ZYDIS_MNEMONIC_PINSRW: write_mm(dst.reg, mmx::pinsrw(mm(dst.reg), uint16_t(load(1)), imm)); return;
    case ZYDIS_MNEMONIC_PEXTRW:
      reg_write(dst.reg, dst.size, mmx::pextrw(mm(src.reg), imm));
      mmx_transition();
      return;
    case ZYDIS_MNEMONIC_PMOVMSKB:
      reg_write(dst.reg, dst.size, mmx::pmovmskb(mm(src.reg)));
      mmx_transition();
      return;
    case ZYDIS_MNEMONIC_MASKMOVQ: {
      const uint64_t value = mm(dst.reg), mask = mm(src.reg);
      masked_store(insn, reinterpret_cast<const uint8_t*>(&value), reinterpret_cast<const uint8_t*>(&mask), 8);
      mmx_transition();
      return;
    }
    // ---- conversions with SSE ----
    case ZYDIS_MNEMONIC_CVTPI2PS: {  // two dwords to the low two singles; the high half of the XMM stays
      const Xmm result = convert(sse::CvtOp::kCvtdq2ps, Xmm{load(1), 0});
      set_xmm(dst.reg, Xmm{result.lo, xmm(dst.reg).hi});
      if (has_mmx_register) mmx_transition();
      return;
    }
    case ZYDIS_MNEMONIC_CVTPI2PD: {
      const Xmm result = convert(sse::CvtOp::kCvtdq2pd, Xmm{load(1), 0});
      set_xmm(dst.reg, result);
      if (has_mmx_register) mmx_transition();
      return;
    }
    case ZYDIS_MNEMONIC_CVTPS2PI:
    case ZYDIS_MNEMONIC_CVTTPS2PI: {
      const auto op = mnemonic == ZYDIS_MNEMONIC_CVTPS2PI ? sse::CvtOp::kCvtps2dq : sse::CvtOp::kCvttps2dq;
      write_mm(dst.reg, convert(op, Xmm{load(1), 0}).lo);
      return;
    }
    case ZYDIS_MNEMONIC_CVTPD2PI:
    case ZYDIS_MNEMONIC_CVTTPD2PI: {
      Xmm from;
      if (src.kind == OpKind::kXmm) {
        from = xmm(src.reg);
      } else {
        const uint64_t address = effective_address(src, insn);
        if (address & 15) raise(kGp, 0, true);
        from.lo = read_mem(src.seg, address, 8);
        from.hi = read_mem(src.seg, address + 8, 8);
      }
      const auto op = mnemonic == ZYDIS_MNEMONIC_CVTPD2PI ? sse::CvtOp::kCvtpd2dq : sse::CvtOp::kCvttpd2dq;
      write_mm(dst.reg, convert(op, from).lo);
      return;
    }
    case ZYDIS_MNEMONIC_PALIGNR: write_mm(dst.reg, mmx::palignr(mm(dst.reg), load(1), imm)); return;
    default:
      break;
  }
  if (dst.kind != OpKind::kMmx) raise_ud(insn, true);
  if (auto op = interp::int_op_of(insn.mnemonic)) {
    if (src.kind == OpKind::kImm) write_mm(dst.reg, mmx::shift_imm(*op, mm(dst.reg), uint8_t(src.disp)));
    else write_mm(dst.reg, mmx::int_binary(*op, mm(dst.reg), load(1)));
    return;
  }
  if (auto op = interp::ext_op_of(insn.mnemonic)) {
    write_mm(dst.reg, mmx::ext_binary(*op, mm(dst.reg), load(1)));
    return;
  }
  raise_ud(insn, true);
}

}  // namespace deja
