// SSE/SSE2 dispatch of the software CPU: XMM loads/stores, FXSAVE/FXRSTOR, MXCSR; arithmetic goes to interp/sse.h.
#include <Zydis/Zydis.h>

#include <algorithm>
#include <array>
#include <cstring>

#include "interp/interp_backend.h"
#include "interp/simd_ops.h"
#include "interp/sse.h"

namespace deja {

using interp::DecodedInsn;
using interp::Operand;
using interp::OpKind;
using interp::sse::Xmm;

namespace {

constexpr uint8_t kUd = 6, kNm = 7, kGp = 13, kXm = 19;
constexpr size_t kXmmOffset = 160, kMxcsrOffset = 24, kMxcsrMaskOffset = 28;

struct FpEntry {
  ZydisMnemonic mnemonic;
  interp::sse::FpOp op;
  interp::sse::FpForm form;
};
using FO = interp::sse::FpOp;
using FF = interp::sse::FpForm;
constexpr FpEntry kFpOps[] = {
    {ZYDIS_MNEMONIC_ADDSD, FO::kAdd, FF::kSd}, {ZYDIS_MNEMONIC_ADDPD, FO::kAdd, FF::kPd},
    {ZYDIS_MNEMONIC_ADDSS, FO::kAdd, FF::kSs}, {ZYDIS_MNEMONIC_ADDPS, FO::kAdd, FF::kPs},
    {ZYDIS_MNEMONIC_SUBSD, FO::kSub, FF::kSd}, {ZYDIS_MNEMONIC_SUBPD, FO::kSub, FF::kPd},
    {ZYDIS_MNEMONIC_SUBSS, FO::kSub, FF::kSs}, {ZYDIS_MNEMONIC_SUBPS, FO::kSub, FF::kPs},
    {ZYDIS_MNEMONIC_MULSD, FO::kMul, FF::kSd}, {ZYDIS_MNEMONIC_MULPD, FO::kMul, FF::kPd},
    {ZYDIS_MNEMONIC_MULSS, FO::kMul, FF::kSs}, {ZYDIS_MNEMONIC_MULPS, FO::kMul, FF::kPs},
    {ZYDIS_MNEMONIC_DIVSD, FO::kDiv, FF::kSd}, {ZYDIS_MNEMONIC_DIVPD, FO::kDiv, FF::kPd},
    {ZYDIS_MNEMONIC_DIVSS, FO::kDiv, FF::kSs}, {ZYDIS_MNEMONIC_DIVPS, FO::kDiv, FF::kPs},
    {ZYDIS_MNEMONIC_MINSD, FO::kMin, FF::kSd}, {ZYDIS_MNEMONIC_MINPD, FO::kMin, FF::kPd},
    {ZYDIS_MNEMONIC_MINSS, FO::kMin, FF::kSs}, {ZYDIS_MNEMONIC_MINPS, FO::kMin, FF::kPs},
    {ZYDIS_MNEMONIC_MAXSD, FO::kMax, FF::kSd}, {ZYDIS_MNEMONIC_MAXPD, FO::kMax, FF::kPd},
    {ZYDIS_MNEMONIC_MAXSS, FO::kMax, FF::kSs}, {ZYDIS_MNEMONIC_MAXPS, FO::kMax, FF::kPs},
    {ZYDIS_MNEMONIC_SQRTSD, FO::kSqrt, FF::kSd}, {ZYDIS_MNEMONIC_SQRTPD, FO::kSqrt, FF::kPd},
    {ZYDIS_MNEMONIC_SQRTSS, FO::kSqrt, FF::kSs}, {ZYDIS_MNEMONIC_SQRTPS, FO::kSqrt, FF::kPs},
};

struct CvtEntry {
  ZydisMnemonic mnemonic;
  interp::sse::CvtOp op;
};
using CO = interp::sse::CvtOp;
constexpr CvtEntry kCvtOps[] = {
    {ZYDIS_MNEMONIC_CVTDQ2PD, CO::kCvtdq2pd}, {ZYDIS_MNEMONIC_CVTDQ2PS, CO::kCvtdq2ps},
    {ZYDIS_MNEMONIC_CVTPS2DQ, CO::kCvtps2dq}, {ZYDIS_MNEMONIC_CVTTPS2DQ, CO::kCvttps2dq},
    {ZYDIS_MNEMONIC_CVTPD2DQ, CO::kCvtpd2dq}, {ZYDIS_MNEMONIC_CVTTPD2DQ, CO::kCvttpd2dq},
    {ZYDIS_MNEMONIC_CVTPD2PS, CO::kCvtpd2ps}, {ZYDIS_MNEMONIC_CVTPS2PD, CO::kCvtps2pd},
    {ZYDIS_MNEMONIC_CVTSD2SS, CO::kCvtsd2ss}, {ZYDIS_MNEMONIC_CVTSS2SD, CO::kCvtss2sd},
};

}  // namespace

void InterpBackend::exec_sse(const DecodedInsn& insn) {
  if (exec_simd_extension(insn)) return;  // MMX registers, SSE3 and later
  const auto mnemonic = ZydisMnemonic(insn.mnemonic);
  auto sse_checks = [&] {
    if ((s_.cr0 & cr0::kEm) || !(s_.cr4 & cr4::kOsfxsr)) raise(kUd);
    if (s_.cr0 & cr0::kTs) raise(kNm);
  };
  auto xmm_get = [&](unsigned n) {
    Xmm x;
    std::memcpy(&x.lo, s_.fxsave.data() + kXmmOffset + 16 * n, 8);
    std::memcpy(&x.hi, s_.fxsave.data() + kXmmOffset + 16 * n + 8, 8);
    return x;
  };
  auto xmm_set = [&](unsigned n, Xmm x) {
    std::memcpy(s_.fxsave.data() + kXmmOffset + 16 * n, &x.lo, 8);
    std::memcpy(s_.fxsave.data() + kXmmOffset + 16 * n + 8, &x.hi, 8);
  };
  auto mxcsr = [&] {
    uint32_t value = 0;
    std::memcpy(&value, s_.fxsave.data() + kMxcsrOffset, 4);
    return value;
  };
  auto set_mxcsr = [&](uint32_t value) { std::memcpy(s_.fxsave.data() + kMxcsrOffset, &value, 4); };
  const bool unaligned_ok = mnemonic == ZYDIS_MNEMONIC_MOVUPS || mnemonic == ZYDIS_MNEMONIC_MOVUPD ||
                            mnemonic == ZYDIS_MNEMONIC_MOVDQU || mnemonic == ZYDIS_MNEMONIC_LDDQU;
  // Reads operand i as an XMM value; memory operands load op.size bytes (zero-extended).
  auto load = [&](int i) -> Xmm {
    const Operand& op = insn.op[i];
    if (op.kind == OpKind::kXmm) return xmm_get(op.reg);
    if (op.kind == OpKind::kGpr) return Xmm{s_.gpr[op.reg] & (op.size >= 8 ? ~0ull : (1ull << (op.size * 8)) - 1), 0};
    if (op.kind != OpKind::kMem) raise_ud(insn, true);
    uint64_t address = effective_address(op, insn);
    Xmm x;
    if (op.size >= 16) {
      if (!unaligned_ok && (address & 15)) raise(kGp, 0, true);
      x.lo = read_mem(op.seg, address, 8);
      x.hi = read_mem(op.seg, address + 8, 8);
    } else {
      x.lo = read_mem(op.seg, address, op.size);
    }
    return x;
  };
  auto store_mem = [&](int i, Xmm x) {
    const Operand& op = insn.op[i];
    uint64_t address = effective_address(op, insn);
    if (op.size >= 16) {
      if (!unaligned_ok && (address & 15)) raise(kGp, 0, true);
      // Probe both halves before writing either, so a fault leaves memory untouched.
      probe_write(op.seg, address, 16);
      write_mem(op.seg, address, 8, x.lo);
      write_mem(op.seg, address + 8, 8, x.hi);
    } else {
      write_mem(op.seg, address, op.size, x.lo);
    }
  };
  auto fp_result = [&](const interp::sse::FpResult& r, unsigned dst) {
    set_mxcsr(r.mxcsr);
    if (r.fault) raise((s_.cr4 & cr4::kOsxmmexcpt) ? kXm : kUd);
    xmm_set(dst, r.value);
  };

  switch (mnemonic) {
    case ZYDIS_MNEMONIC_FXSAVE:
    case ZYDIS_MNEMONIC_FXSAVE64:
    case ZYDIS_MNEMONIC_FXRSTOR:
    case ZYDIS_MNEMONIC_FXRSTOR64: {
      if (s_.cr0 & (cr0::kEm | cr0::kTs)) raise((s_.cr0 & cr0::kEm) ? kUd : kNm);
      const Operand& m = insn.op[0];
      uint64_t address = effective_address(m, insn);
      if (address & 15) raise(kGp, 0, true);
      if (mnemonic == ZYDIS_MNEMONIC_FXSAVE || mnemonic == ZYDIS_MNEMONIC_FXSAVE64) {
        uint32_t mask = interp::sse::mxcsr::kWritable;
        std::memcpy(s_.fxsave.data() + kMxcsrMaskOffset, &mask, 4);
        // Bytes 416-511 (reserved, then software-available) are left as they are, as processors and
        // QEMU leave them: a guest may keep data there, and stale stack bytes must match KVM's. The
        // reserved bytes 10-15 of each x87 register slot are written as zero, unless the recording CPU
        // left them (QEMU's TCG); one that keeps no x87 pointers wrote FIP/FDP as zero and left FOP.
        std::array<uint8_t, 416> out;
        std::array<bool, 416> skip{};
        std::memcpy(out.data(), s_.fxsave.data(), out.size());
        for (size_t slot = 32; slot < 160; slot += 16) {
          std::fill(out.begin() + long(slot) + 10, out.begin() + long(slot) + 16, uint8_t{0});
          if (quirks_.fxsave_skips_reserved_bytes) {
            std::fill(skip.begin() + long(slot) + 10, skip.begin() + long(slot) + 16, true);
          }
        }
        if (quirks_.fxsave_no_x87_pointers) {
          std::fill(out.begin() + 8, out.begin() + 24, uint8_t{0});
          skip[6] = skip[7] = true;
        }
        if (uint8_t* host = fast_host_range(m.seg, address, 512, true)) {
          for (size_t i = 0; i < out.size(); ++i) {
            if (!skip[i]) host[i] = out[i];
          }
          return;
        }
        probe_write(m.seg, address, 512);
        for (size_t offset = 0; offset < out.size(); offset += 8) {
          if (std::none_of(skip.begin() + long(offset), skip.begin() + long(offset) + 8, [](bool b) { return b; })) {
            uint64_t chunk = 0;
            std::memcpy(&chunk, out.data() + offset, 8);
            write_mem(m.seg, address + offset, 8, chunk);
            continue;
          }
          for (size_t i = offset; i < offset + 8; ++i) {
            if (!skip[i]) write_mem(m.seg, address + i, 1, out[i]);
          }
        }
      } else {
        std::array<uint8_t, 512> image{};
        if (const uint8_t* host = fast_host_range(m.seg, address, 512, false)) {
          std::memcpy(image.data(), host, 512);
        } else {
          for (size_t offset = 0; offset < 512; offset += 8) {
            uint64_t chunk = read_mem(m.seg, address + offset, 8);
            std::memcpy(image.data() + offset, &chunk, 8);
          }
        }
        uint32_t new_mxcsr = 0;
        std::memcpy(&new_mxcsr, image.data() + kMxcsrOffset, 4);
        if (new_mxcsr & ~interp::sse::mxcsr::kWritable) raise(kGp, 0, true);
        // Bytes 464-511 are software-available: the CPU does not load them.
        std::memcpy(s_.fxsave.data(), image.data(), 464);
      }
      return;
    }
    case ZYDIS_MNEMONIC_LDMXCSR: {
      sse_checks();
      uint32_t value = uint32_t(read_operand(insn, 0));
      if (value & ~interp::sse::mxcsr::kWritable) raise(kGp, 0, true);
      set_mxcsr(value);
      return;
    }
    case ZYDIS_MNEMONIC_STMXCSR:
      sse_checks();
      write_operand(insn, 0, mxcsr());
      return;
    default:
      break;
  }

  // Everything below is an SSE/SSE2 instruction on XMM registers.
  bool is_sse = false;
  for (int i = 0; i < insn.operand_count; ++i) is_sse |= insn.op[i].kind == OpKind::kXmm;
  is_sse |= mnemonic == ZYDIS_MNEMONIC_CVTSD2SI || mnemonic == ZYDIS_MNEMONIC_CVTTSD2SI ||
            mnemonic == ZYDIS_MNEMONIC_CVTSS2SI || mnemonic == ZYDIS_MNEMONIC_CVTTSS2SI;
  if (!is_sse) raise_ud(insn, true);
  sse_checks();
  const Operand& dst = insn.op[0];

  switch (mnemonic) {
    case ZYDIS_MNEMONIC_MOVAPS: case ZYDIS_MNEMONIC_MOVAPD: case ZYDIS_MNEMONIC_MOVDQA:
    case ZYDIS_MNEMONIC_MOVUPS: case ZYDIS_MNEMONIC_MOVUPD: case ZYDIS_MNEMONIC_MOVDQU: case ZYDIS_MNEMONIC_LDDQU:
    case ZYDIS_MNEMONIC_MOVNTDQ: case ZYDIS_MNEMONIC_MOVNTPS: case ZYDIS_MNEMONIC_MOVNTPD: {
      Xmm value = load(1);
      if (dst.kind == OpKind::kXmm) xmm_set(dst.reg, value);
      else store_mem(0, value);
      return;
    }
    case ZYDIS_MNEMONIC_MOVD:
    case ZYDIS_MNEMONIC_MOVQ: {
      const Operand& src = insn.op[1];
      if (dst.kind == OpKind::kXmm) {
        Xmm value = load(1);
        xmm_set(dst.reg, Xmm{src.kind == OpKind::kXmm ? value.lo : value.lo, 0});
      } else if (dst.kind == OpKind::kGpr) {
        reg_write(dst.reg, dst.size, xmm_get(src.reg).lo);
      } else {
        store_mem(0, xmm_get(src.reg));
      }
      return;
    }
    case ZYDIS_MNEMONIC_MOVSD:
    case ZYDIS_MNEMONIC_MOVSS: {
      const uint64_t low_mask = mnemonic == ZYDIS_MNEMONIC_MOVSD ? ~0ull : 0xffffffffull;
      const Operand& src = insn.op[1];
      if (dst.kind == OpKind::kXmm && src.kind == OpKind::kXmm) {
        Xmm d = xmm_get(dst.reg);
        d.lo = (d.lo & ~low_mask) | (xmm_get(src.reg).lo & low_mask);
        xmm_set(dst.reg, d);
      } else if (dst.kind == OpKind::kXmm) {
        xmm_set(dst.reg, Xmm{load(1).lo & low_mask, 0});  // a load clears the rest of the register
      } else {
        store_mem(0, xmm_get(src.reg));
      }
      return;
    }
    case ZYDIS_MNEMONIC_MOVLPS: case ZYDIS_MNEMONIC_MOVLPD: case ZYDIS_MNEMONIC_MOVHPS: case ZYDIS_MNEMONIC_MOVHPD: {
      const bool high = mnemonic == ZYDIS_MNEMONIC_MOVHPS || mnemonic == ZYDIS_MNEMONIC_MOVHPD;
      if (dst.kind == OpKind::kXmm) {
        Xmm d = xmm_get(dst.reg);
        uint64_t v = load(1).lo;
        (high ? d.hi : d.lo) = v;
        xmm_set(dst.reg, d);
      } else {
        Xmm s = xmm_get(insn.op[1].reg);
        store_mem(0, Xmm{high ? s.hi : s.lo, 0});
      }
      return;
    }
    case ZYDIS_MNEMONIC_MOVHLPS: {
      Xmm d = xmm_get(dst.reg);
      d.lo = xmm_get(insn.op[1].reg).hi;
      xmm_set(dst.reg, d);
      return;
    }
    case ZYDIS_MNEMONIC_MOVLHPS: {
      Xmm d = xmm_get(dst.reg);
      d.hi = xmm_get(insn.op[1].reg).lo;
      xmm_set(dst.reg, d);
      return;
    }
    case ZYDIS_MNEMONIC_MASKMOVDQU: {
      const Xmm value = xmm_get(dst.reg), mask = xmm_get(insn.op[1].reg);
      masked_store(insn, reinterpret_cast<const uint8_t*>(&value), reinterpret_cast<const uint8_t*>(&mask), 16);
      return;
    }
    case ZYDIS_MNEMONIC_PMOVMSKB: reg_write(dst.reg, dst.size, interp::sse::pmovmskb(xmm_get(insn.op[1].reg))); return;
    case ZYDIS_MNEMONIC_MOVMSKPS: reg_write(dst.reg, dst.size, interp::sse::movmskps(xmm_get(insn.op[1].reg))); return;
    case ZYDIS_MNEMONIC_MOVMSKPD: reg_write(dst.reg, dst.size, interp::sse::movmskpd(xmm_get(insn.op[1].reg))); return;
    case ZYDIS_MNEMONIC_PEXTRW: reg_write(dst.reg, dst.size, interp::sse::pextrw(xmm_get(insn.op[1].reg), uint8_t(insn.op[2].disp))); return;
    case ZYDIS_MNEMONIC_PINSRW: {
      uint16_t value = insn.op[1].kind == OpKind::kMem ? uint16_t(read_mem(insn.op[1].seg, effective_address(insn.op[1], insn), 2))
                                                      : uint16_t(s_.gpr[insn.op[1].reg]);
      xmm_set(dst.reg, interp::sse::pinsrw(xmm_get(dst.reg), value, uint8_t(insn.op[2].disp)));
      return;
    }
    case ZYDIS_MNEMONIC_PSHUFD: xmm_set(dst.reg, interp::sse::pshufd(load(1), uint8_t(insn.op[2].disp))); return;
    case ZYDIS_MNEMONIC_PSHUFLW: xmm_set(dst.reg, interp::sse::pshuflw(load(1), uint8_t(insn.op[2].disp))); return;
    case ZYDIS_MNEMONIC_PSHUFHW: xmm_set(dst.reg, interp::sse::pshufhw(load(1), uint8_t(insn.op[2].disp))); return;
    case ZYDIS_MNEMONIC_SHUFPS: xmm_set(dst.reg, interp::sse::shufps(xmm_get(dst.reg), load(1), uint8_t(insn.op[2].disp))); return;
    case ZYDIS_MNEMONIC_SHUFPD: xmm_set(dst.reg, interp::sse::shufpd(xmm_get(dst.reg), load(1), uint8_t(insn.op[2].disp))); return;
    case ZYDIS_MNEMONIC_PSLLDQ: xmm_set(dst.reg, interp::sse::pslldq(xmm_get(dst.reg), uint8_t(insn.op[1].disp))); return;
    case ZYDIS_MNEMONIC_PSRLDQ: xmm_set(dst.reg, interp::sse::psrldq(xmm_get(dst.reg), uint8_t(insn.op[1].disp))); return;
    case ZYDIS_MNEMONIC_COMISD: case ZYDIS_MNEMONIC_COMISS: case ZYDIS_MNEMONIC_UCOMISD: case ZYDIS_MNEMONIC_UCOMISS: {
      const bool dbl = mnemonic == ZYDIS_MNEMONIC_COMISD || mnemonic == ZYDIS_MNEMONIC_UCOMISD;
      const bool quiet = mnemonic == ZYDIS_MNEMONIC_UCOMISD || mnemonic == ZYDIS_MNEMONIC_UCOMISS;
      auto r = interp::sse::fp_comis(dbl ? FF::kSd : FF::kSs, quiet, xmm_get(dst.reg), load(1), s_.rflags, mxcsr());
      set_mxcsr(r.mxcsr);
      if (r.fault) raise((s_.cr4 & cr4::kOsxmmexcpt) ? kXm : kUd);
      s_.rflags = r.rflags | 2;
      return;
    }
    case ZYDIS_MNEMONIC_CMPSD: case ZYDIS_MNEMONIC_CMPPD: case ZYDIS_MNEMONIC_CMPSS: case ZYDIS_MNEMONIC_CMPPS: {
      FF form = mnemonic == ZYDIS_MNEMONIC_CMPSD ? FF::kSd : mnemonic == ZYDIS_MNEMONIC_CMPPD ? FF::kPd
              : mnemonic == ZYDIS_MNEMONIC_CMPSS ? FF::kSs : FF::kPs;
      fp_result(interp::sse::fp_cmp(form, xmm_get(dst.reg), load(1), uint8_t(insn.op[2].disp), mxcsr()), dst.reg);
      return;
    }
    case ZYDIS_MNEMONIC_CVTSI2SD: case ZYDIS_MNEMONIC_CVTSI2SS: {
      unsigned width = insn.op[1].size * 8;
      uint64_t src = read_operand(insn, 1);
      fp_result(interp::sse::cvtsi2f(mnemonic == ZYDIS_MNEMONIC_CVTSI2SD, xmm_get(dst.reg), src, width, mxcsr()), dst.reg);
      return;
    }
    case ZYDIS_MNEMONIC_CVTSD2SI: case ZYDIS_MNEMONIC_CVTTSD2SI: case ZYDIS_MNEMONIC_CVTSS2SI: case ZYDIS_MNEMONIC_CVTTSS2SI: {
      const bool dbl = mnemonic == ZYDIS_MNEMONIC_CVTSD2SI || mnemonic == ZYDIS_MNEMONIC_CVTTSD2SI;
      const bool truncate = mnemonic == ZYDIS_MNEMONIC_CVTTSD2SI || mnemonic == ZYDIS_MNEMONIC_CVTTSS2SI;
      auto r = interp::sse::cvtf2si(dbl ? FF::kSd : FF::kSs, truncate, load(1), dst.size * 8, mxcsr());
      set_mxcsr(r.mxcsr);
      if (r.fault) raise((s_.cr4 & cr4::kOsxmmexcpt) ? kXm : kUd);
      reg_write(dst.reg, dst.size, r.value);
      return;
    }
    default:
      break;
  }
  if (auto op = interp::int_op_of(insn.mnemonic)) {
    const bool shift_by_imm = insn.op[1].kind == OpKind::kImm;
    if (shift_by_imm) xmm_set(dst.reg, interp::sse::shift_imm(*op, xmm_get(dst.reg), uint8_t(insn.op[1].disp)));
    else xmm_set(dst.reg, interp::sse::int_binary(*op, xmm_get(dst.reg), load(1)));
    return;
  }
  for (const auto& entry : kFpOps) {
    if (entry.mnemonic != mnemonic) continue;
    fp_result(interp::sse::fp_arith(entry.op, entry.form, xmm_get(dst.reg), load(1), mxcsr()), dst.reg);
    return;
  }
  for (const auto& entry : kCvtOps) {
    if (entry.mnemonic != mnemonic) continue;
    fp_result(interp::sse::fp_convert(entry.op, xmm_get(dst.reg), load(1), mxcsr()), dst.reg);
    return;
  }
  raise_ud(insn, true);
}

}  // namespace deja
