// The SSE3, SSSE3, SSE4.1 and SSE4.2 executor of the software CPU (legacy encodings) and the mnemonic tables of the SIMD datapaths.
#include <Zydis/Zydis.h>

#include "interp/interp_backend.h"
#include "interp/simd_ops.h"
#include "interp/sse4.h"

namespace deja {

using interp::DecodedInsn;
using interp::Operand;
using interp::OpKind;
using interp::sse::Xmm;

namespace interp {

std::optional<sse::IntOp> int_op_of(uint16_t mnemonic) {
  using IO = sse::IntOp;
  switch (ZydisMnemonic(mnemonic)) {
    case ZYDIS_MNEMONIC_PAND: return IO::kPand;
    case ZYDIS_MNEMONIC_ANDPS: return IO::kPand;
    case ZYDIS_MNEMONIC_ANDPD: return IO::kPand;
    case ZYDIS_MNEMONIC_PANDN: return IO::kPandn;
    case ZYDIS_MNEMONIC_ANDNPS: return IO::kPandn;
    case ZYDIS_MNEMONIC_ANDNPD: return IO::kPandn;
    case ZYDIS_MNEMONIC_POR: return IO::kPor;
    case ZYDIS_MNEMONIC_ORPS: return IO::kPor;
    case ZYDIS_MNEMONIC_ORPD: return IO::kPor;
    case ZYDIS_MNEMONIC_PXOR: return IO::kPxor;
    case ZYDIS_MNEMONIC_XORPS: return IO::kPxor;
    case ZYDIS_MNEMONIC_XORPD: return IO::kPxor;
    case ZYDIS_MNEMONIC_PADDB: return IO::kPaddb;
    case ZYDIS_MNEMONIC_PADDW: return IO::kPaddw;
    case ZYDIS_MNEMONIC_PADDD: return IO::kPaddd;
    case ZYDIS_MNEMONIC_PADDQ: return IO::kPaddq;
    case ZYDIS_MNEMONIC_PADDSB: return IO::kPaddsb;
    case ZYDIS_MNEMONIC_PADDSW: return IO::kPaddsw;
    case ZYDIS_MNEMONIC_PADDUSB: return IO::kPaddusb;
    case ZYDIS_MNEMONIC_PADDUSW: return IO::kPaddusw;
    case ZYDIS_MNEMONIC_PSUBB: return IO::kPsubb;
    case ZYDIS_MNEMONIC_PSUBW: return IO::kPsubw;
    case ZYDIS_MNEMONIC_PSUBD: return IO::kPsubd;
    case ZYDIS_MNEMONIC_PSUBQ: return IO::kPsubq;
    case ZYDIS_MNEMONIC_PSUBSB: return IO::kPsubsb;
    case ZYDIS_MNEMONIC_PSUBSW: return IO::kPsubsw;
    case ZYDIS_MNEMONIC_PSUBUSB: return IO::kPsubusb;
    case ZYDIS_MNEMONIC_PSUBUSW: return IO::kPsubusw;
    case ZYDIS_MNEMONIC_PCMPEQB: return IO::kPcmpeqb;
    case ZYDIS_MNEMONIC_PCMPEQW: return IO::kPcmpeqw;
    case ZYDIS_MNEMONIC_PCMPEQD: return IO::kPcmpeqd;
    case ZYDIS_MNEMONIC_PCMPGTB: return IO::kPcmpgtb;
    case ZYDIS_MNEMONIC_PCMPGTW: return IO::kPcmpgtw;
    case ZYDIS_MNEMONIC_PCMPGTD: return IO::kPcmpgtd;
    case ZYDIS_MNEMONIC_PMULLW: return IO::kPmullw;
    case ZYDIS_MNEMONIC_PMULHW: return IO::kPmulhw;
    case ZYDIS_MNEMONIC_PMULHUW: return IO::kPmulhuw;
    case ZYDIS_MNEMONIC_PMULUDQ: return IO::kPmuludq;
    case ZYDIS_MNEMONIC_PMADDWD: return IO::kPmaddwd;
    case ZYDIS_MNEMONIC_PMINUB: return IO::kPminub;
    case ZYDIS_MNEMONIC_PMAXUB: return IO::kPmaxub;
    case ZYDIS_MNEMONIC_PMINSW: return IO::kPminsw;
    case ZYDIS_MNEMONIC_PMAXSW: return IO::kPmaxsw;
    case ZYDIS_MNEMONIC_PAVGB: return IO::kPavgb;
    case ZYDIS_MNEMONIC_PAVGW: return IO::kPavgw;
    case ZYDIS_MNEMONIC_PSADBW: return IO::kPsadbw;
    case ZYDIS_MNEMONIC_PUNPCKLBW: return IO::kPunpcklbw;
    case ZYDIS_MNEMONIC_PUNPCKLWD: return IO::kPunpcklwd;
    case ZYDIS_MNEMONIC_PUNPCKLDQ: return IO::kPunpckldq;
    case ZYDIS_MNEMONIC_PUNPCKLQDQ: return IO::kPunpcklqdq;
    case ZYDIS_MNEMONIC_PUNPCKHBW: return IO::kPunpckhbw;
    case ZYDIS_MNEMONIC_PUNPCKHWD: return IO::kPunpckhwd;
    case ZYDIS_MNEMONIC_PUNPCKHDQ: return IO::kPunpckhdq;
    case ZYDIS_MNEMONIC_PUNPCKHQDQ: return IO::kPunpckhqdq;
    case ZYDIS_MNEMONIC_PACKSSWB: return IO::kPacksswb;
    case ZYDIS_MNEMONIC_PACKUSWB: return IO::kPackuswb;
    case ZYDIS_MNEMONIC_PACKSSDW: return IO::kPackssdw;
    case ZYDIS_MNEMONIC_PSLLW: return IO::kPsllw;
    case ZYDIS_MNEMONIC_PSLLD: return IO::kPslld;
    case ZYDIS_MNEMONIC_PSLLQ: return IO::kPsllq;
    case ZYDIS_MNEMONIC_PSRLW: return IO::kPsrlw;
    case ZYDIS_MNEMONIC_PSRLD: return IO::kPsrld;
    case ZYDIS_MNEMONIC_PSRLQ: return IO::kPsrlq;
    case ZYDIS_MNEMONIC_PSRAW: return IO::kPsraw;
    case ZYDIS_MNEMONIC_PSRAD: return IO::kPsrad;
    case ZYDIS_MNEMONIC_UNPCKLPS: return IO::kUnpcklps;
    case ZYDIS_MNEMONIC_UNPCKHPS: return IO::kUnpckhps;
    case ZYDIS_MNEMONIC_UNPCKLPD: return IO::kUnpcklpd;
    case ZYDIS_MNEMONIC_UNPCKHPD: return IO::kUnpckhpd;
    default: return std::nullopt;
  }
}

std::optional<sse::ExtOp> ext_op_of(uint16_t mnemonic) {
  using EO = sse::ExtOp;
  switch (ZydisMnemonic(mnemonic)) {
    case ZYDIS_MNEMONIC_PSHUFB: return EO::kPshufb;
    case ZYDIS_MNEMONIC_PHADDW: return EO::kPhaddw;
    case ZYDIS_MNEMONIC_PHADDD: return EO::kPhaddd;
    case ZYDIS_MNEMONIC_PHADDSW: return EO::kPhaddsw;
    case ZYDIS_MNEMONIC_PHSUBW: return EO::kPhsubw;
    case ZYDIS_MNEMONIC_PHSUBD: return EO::kPhsubd;
    case ZYDIS_MNEMONIC_PHSUBSW: return EO::kPhsubsw;
    case ZYDIS_MNEMONIC_PMADDUBSW: return EO::kPmaddubsw;
    case ZYDIS_MNEMONIC_PMULHRSW: return EO::kPmulhrsw;
    case ZYDIS_MNEMONIC_PSIGNB: return EO::kPsignb;
    case ZYDIS_MNEMONIC_PSIGNW: return EO::kPsignw;
    case ZYDIS_MNEMONIC_PSIGND: return EO::kPsignd;
    case ZYDIS_MNEMONIC_PABSB: return EO::kPabsb;
    case ZYDIS_MNEMONIC_PABSW: return EO::kPabsw;
    case ZYDIS_MNEMONIC_PABSD: return EO::kPabsd;
    case ZYDIS_MNEMONIC_PMULLD: return EO::kPmulld;
    case ZYDIS_MNEMONIC_PMULDQ: return EO::kPmuldq;
    case ZYDIS_MNEMONIC_PMINSB: return EO::kPminsb;
    case ZYDIS_MNEMONIC_PMINSD: return EO::kPminsd;
    case ZYDIS_MNEMONIC_PMINUW: return EO::kPminuw;
    case ZYDIS_MNEMONIC_PMINUD: return EO::kPminud;
    case ZYDIS_MNEMONIC_PMAXSB: return EO::kPmaxsb;
    case ZYDIS_MNEMONIC_PMAXSD: return EO::kPmaxsd;
    case ZYDIS_MNEMONIC_PMAXUW: return EO::kPmaxuw;
    case ZYDIS_MNEMONIC_PMAXUD: return EO::kPmaxud;
    case ZYDIS_MNEMONIC_PACKUSDW: return EO::kPackusdw;
    case ZYDIS_MNEMONIC_PCMPEQQ: return EO::kPcmpeqq;
    case ZYDIS_MNEMONIC_PHMINPOSUW: return EO::kPhminposuw;
    case ZYDIS_MNEMONIC_PMOVSXBW: return EO::kPmovsxbw;
    case ZYDIS_MNEMONIC_PMOVSXBD: return EO::kPmovsxbd;
    case ZYDIS_MNEMONIC_PMOVSXBQ: return EO::kPmovsxbq;
    case ZYDIS_MNEMONIC_PMOVSXWD: return EO::kPmovsxwd;
    case ZYDIS_MNEMONIC_PMOVSXWQ: return EO::kPmovsxwq;
    case ZYDIS_MNEMONIC_PMOVSXDQ: return EO::kPmovsxdq;
    case ZYDIS_MNEMONIC_PMOVZXBW: return EO::kPmovzxbw;
    case ZYDIS_MNEMONIC_PMOVZXBD: return EO::kPmovzxbd;
    case ZYDIS_MNEMONIC_PMOVZXBQ: return EO::kPmovzxbq;
    case ZYDIS_MNEMONIC_PMOVZXWD: return EO::kPmovzxwd;
    case ZYDIS_MNEMONIC_PMOVZXWQ: return EO::kPmovzxwq;
    case ZYDIS_MNEMONIC_PMOVZXDQ: return EO::kPmovzxdq;
    case ZYDIS_MNEMONIC_PCMPGTQ: return EO::kPcmpgtq;
    default: return std::nullopt;
  }
}

}  // namespace interp

namespace {

constexpr uint8_t kUd = 6, kNm = 7, kGp = 13, kXm = 19;

// The extension that defines an instruction's legacy form (kNone: an earlier one, or not a SIMD instruction).
enum class Extension : uint8_t { kNone, kSse3, kSsse3, kSse41, kSse42 };

Extension extension_of(const DecodedInsn& insn) {
  switch (ZydisMnemonic(insn.mnemonic)) {
    case ZYDIS_MNEMONIC_ADDSUBPS: case ZYDIS_MNEMONIC_ADDSUBPD: case ZYDIS_MNEMONIC_HADDPS: case ZYDIS_MNEMONIC_HADDPD:
    case ZYDIS_MNEMONIC_HSUBPS: case ZYDIS_MNEMONIC_HSUBPD: case ZYDIS_MNEMONIC_MOVSHDUP: case ZYDIS_MNEMONIC_MOVSLDUP:
    case ZYDIS_MNEMONIC_MOVDDUP:
      return Extension::kSse3;
    case ZYDIS_MNEMONIC_PSHUFB: case ZYDIS_MNEMONIC_PHADDW: case ZYDIS_MNEMONIC_PHADDD: case ZYDIS_MNEMONIC_PHADDSW:
    case ZYDIS_MNEMONIC_PHSUBW: case ZYDIS_MNEMONIC_PHSUBD: case ZYDIS_MNEMONIC_PHSUBSW: case ZYDIS_MNEMONIC_PMADDUBSW:
    case ZYDIS_MNEMONIC_PMULHRSW: case ZYDIS_MNEMONIC_PSIGNB: case ZYDIS_MNEMONIC_PSIGNW: case ZYDIS_MNEMONIC_PSIGND:
    case ZYDIS_MNEMONIC_PABSB: case ZYDIS_MNEMONIC_PABSW: case ZYDIS_MNEMONIC_PABSD: case ZYDIS_MNEMONIC_PALIGNR:
      return Extension::kSsse3;
    case ZYDIS_MNEMONIC_PMULLD: case ZYDIS_MNEMONIC_PMULDQ: case ZYDIS_MNEMONIC_PMINSB: case ZYDIS_MNEMONIC_PMINSD:
    case ZYDIS_MNEMONIC_PMINUW: case ZYDIS_MNEMONIC_PMINUD: case ZYDIS_MNEMONIC_PMAXSB: case ZYDIS_MNEMONIC_PMAXSD:
    case ZYDIS_MNEMONIC_PMAXUW: case ZYDIS_MNEMONIC_PMAXUD: case ZYDIS_MNEMONIC_PACKUSDW: case ZYDIS_MNEMONIC_PCMPEQQ:
    case ZYDIS_MNEMONIC_PHMINPOSUW: case ZYDIS_MNEMONIC_PMOVSXBW: case ZYDIS_MNEMONIC_PMOVSXBD:
    case ZYDIS_MNEMONIC_PMOVSXBQ: case ZYDIS_MNEMONIC_PMOVSXWD: case ZYDIS_MNEMONIC_PMOVSXWQ:
    case ZYDIS_MNEMONIC_PMOVSXDQ: case ZYDIS_MNEMONIC_PMOVZXBW: case ZYDIS_MNEMONIC_PMOVZXBD:
    case ZYDIS_MNEMONIC_PMOVZXBQ: case ZYDIS_MNEMONIC_PMOVZXWD: case ZYDIS_MNEMONIC_PMOVZXWQ:
    case ZYDIS_MNEMONIC_PMOVZXDQ: case ZYDIS_MNEMONIC_PBLENDVB: case ZYDIS_MNEMONIC_BLENDVPS:
    case ZYDIS_MNEMONIC_BLENDVPD: case ZYDIS_MNEMONIC_PBLENDW: case ZYDIS_MNEMONIC_BLENDPS: case ZYDIS_MNEMONIC_BLENDPD:
    case ZYDIS_MNEMONIC_PINSRB: case ZYDIS_MNEMONIC_PINSRD: case ZYDIS_MNEMONIC_PINSRQ: case ZYDIS_MNEMONIC_PEXTRB:
    case ZYDIS_MNEMONIC_PEXTRD: case ZYDIS_MNEMONIC_PEXTRQ: case ZYDIS_MNEMONIC_EXTRACTPS: case ZYDIS_MNEMONIC_INSERTPS:
    case ZYDIS_MNEMONIC_PTEST: case ZYDIS_MNEMONIC_ROUNDPS: case ZYDIS_MNEMONIC_ROUNDPD: case ZYDIS_MNEMONIC_ROUNDSS:
    case ZYDIS_MNEMONIC_ROUNDSD: case ZYDIS_MNEMONIC_DPPS: case ZYDIS_MNEMONIC_DPPD: case ZYDIS_MNEMONIC_MPSADBW:
    case ZYDIS_MNEMONIC_MOVNTDQA:
      return Extension::kSse41;
    case ZYDIS_MNEMONIC_PEXTRW:  // 66 0F 3A 15 (to memory too); 66 0F C5 is SSE2's
      return insn.opcode_map == ZYDIS_OPCODE_MAP_0F3A ? Extension::kSse41 : Extension::kNone;
    case ZYDIS_MNEMONIC_PCMPGTQ: case ZYDIS_MNEMONIC_PCMPESTRI: case ZYDIS_MNEMONIC_PCMPESTRM:
    case ZYDIS_MNEMONIC_PCMPISTRI: case ZYDIS_MNEMONIC_PCMPISTRM: case ZYDIS_MNEMONIC_CRC32:
      return Extension::kSse42;
    default:
      return Extension::kNone;
  }
}

bool is_mmx_instruction(const DecodedInsn& insn) {
  switch (ZydisMnemonic(insn.mnemonic)) {
    // No MMX register operand in some forms (EMMS; the conversions from m64).
    case ZYDIS_MNEMONIC_EMMS: case ZYDIS_MNEMONIC_CVTPI2PS: case ZYDIS_MNEMONIC_CVTPI2PD:
      return true;
    default:
      for (int i = 0; i < insn.operand_count; ++i) {
        if (insn.op[i].kind == OpKind::kMmx) return true;
      }
      return false;
  }
}

}  // namespace

bool interp::simd_extension_is_flagless(const DecodedInsn& insn) {
  switch (ZydisMnemonic(insn.mnemonic)) {
    case ZYDIS_MNEMONIC_PTEST: case ZYDIS_MNEMONIC_PCMPESTRI: case ZYDIS_MNEMONIC_PCMPESTRM:
    case ZYDIS_MNEMONIC_PCMPISTRI: case ZYDIS_MNEMONIC_PCMPISTRM:
      return false;
    default:
      return is_mmx_instruction(insn) || extension_of(insn) != Extension::kNone;
  }
}

InterpBackend::SimdFeatures InterpBackend::simd_features_of(const CpuModel& model) {
  SimdFeatures f;
  f.mmx = model.has(feature("MMX"));
  f.sse3 = model.has(feature("SSE3"));
  f.ssse3 = model.has(feature("SSSE3"));
  f.sse41 = model.has(feature("SSE4.1"));
  f.sse42 = model.has(feature("SSE4.2"));
  return f;
}

bool InterpBackend::exec_simd_extension(const DecodedInsn& insn) {
  // No CPU model advertises MONITOR/MWAIT (CPUID.01H:ECX[3]) or AMD's 3DNow! (0F 0F).
  if (insn.mnemonic == ZYDIS_MNEMONIC_MONITOR || insn.mnemonic == ZYDIS_MNEMONIC_MWAIT ||
      insn.opcode_map == ZYDIS_OPCODE_MAP_0F0F)
    raise_ud(insn, false);
  if (is_mmx_instruction(insn)) {
    exec_mmx(insn);
    return true;
  }
  if (extension_of(insn) == Extension::kNone) return false;
  exec_sse4(insn);
  return true;
}

void InterpBackend::exec_sse4(const DecodedInsn& insn) {
  namespace sse = interp::sse;
  const auto mnemonic = ZydisMnemonic(insn.mnemonic);
  bool provided = false;
  switch (extension_of(insn)) {
    case Extension::kSse3: provided = simd_.sse3; break;
    case Extension::kSsse3: provided = simd_.ssse3; break;
    case Extension::kSse41: provided = simd_.sse41; break;
    case Extension::kSse42: provided = simd_.sse42; break;
    case Extension::kNone: break;
  }
  if (!provided) raise_ud(insn, false);
  const Operand& dst = insn.op[0];
  if (mnemonic == ZYDIS_MNEMONIC_CRC32) {
    // A general-register instruction: no CR0/CR4 checks. The result is 32 bits, zero-extended.
    const uint32_t crc = sse::crc32c(uint32_t(s_.gpr[dst.reg]), read_operand(insn, 1), insn.op[1].size);
    reg_write(dst.reg, 4, crc);
    return;
  }
  if ((s_.cr0 & cr0::kEm) || !(s_.cr4 & cr4::kOsfxsr)) raise(kUd);
  if (s_.cr0 & cr0::kTs) raise(kNm);

  // The string compares take any alignment; every other 16-byte memory operand must be aligned.
  const bool unaligned_ok = mnemonic == ZYDIS_MNEMONIC_PCMPESTRI || mnemonic == ZYDIS_MNEMONIC_PCMPESTRM ||
                            mnemonic == ZYDIS_MNEMONIC_PCMPISTRI || mnemonic == ZYDIS_MNEMONIC_PCMPISTRM;
  // Operand i as an XMM value; a memory operand of fewer than 16 bytes is zero-extended.
  auto load = [&](int i) -> Xmm {
    const Operand& op = insn.op[i];
    if (op.kind == OpKind::kXmm) return xmm(op.reg);
    if (op.kind != OpKind::kMem) raise_ud(insn, true);
    const uint64_t address = effective_address(op, insn);
    if (op.size < 16) return Xmm{read_mem(op.seg, address, op.size), 0};
    if (!unaligned_ok && (address & 15)) raise(kGp, 0, true);
    Xmm x;
    x.lo = read_mem(op.seg, address, 8);
    x.hi = read_mem(op.seg, address + 8, 8);
    return x;
  };
  auto fp_result = [&](const sse::FpResult& r) {
    set_mxcsr(r.mxcsr);
    if (r.fault) raise((s_.cr4 & cr4::kOsxmmexcpt) ? kXm : kUd);
    set_xmm(dst.reg, r.value);
  };
  const uint8_t imm = insn.operand_count >= 3 && insn.op[2].kind == OpKind::kImm ? uint8_t(insn.op[2].disp) : 0;
  using FF = sse::FpForm;
  using HO = sse::HorizontalOp;

  if (auto op = interp::ext_op_of(insn.mnemonic)) {
    set_xmm(dst.reg, sse::ext_binary(*op, xmm(dst.reg), load(1)));
    return;
  }
  switch (mnemonic) {
    // ---- SSE3 ----
    case ZYDIS_MNEMONIC_ADDSUBPS: fp_result(sse::fp_horizontal(HO::kAddsub, FF::kPs, xmm(dst.reg), load(1), mxcsr())); return;
    case ZYDIS_MNEMONIC_ADDSUBPD: fp_result(sse::fp_horizontal(HO::kAddsub, FF::kPd, xmm(dst.reg), load(1), mxcsr())); return;
    case ZYDIS_MNEMONIC_HADDPS: fp_result(sse::fp_horizontal(HO::kHadd, FF::kPs, xmm(dst.reg), load(1), mxcsr())); return;
    case ZYDIS_MNEMONIC_HADDPD: fp_result(sse::fp_horizontal(HO::kHadd, FF::kPd, xmm(dst.reg), load(1), mxcsr())); return;
    case ZYDIS_MNEMONIC_HSUBPS: fp_result(sse::fp_horizontal(HO::kHsub, FF::kPs, xmm(dst.reg), load(1), mxcsr())); return;
    case ZYDIS_MNEMONIC_HSUBPD: fp_result(sse::fp_horizontal(HO::kHsub, FF::kPd, xmm(dst.reg), load(1), mxcsr())); return;
    case ZYDIS_MNEMONIC_MOVSLDUP: set_xmm(dst.reg, sse::movsldup(load(1))); return;
    case ZYDIS_MNEMONIC_MOVSHDUP: set_xmm(dst.reg, sse::movshdup(load(1))); return;
    case ZYDIS_MNEMONIC_MOVDDUP: set_xmm(dst.reg, sse::movddup(load(1))); return;
    // ---- SSSE3 ----
    case ZYDIS_MNEMONIC_PALIGNR: set_xmm(dst.reg, sse::palignr(xmm(dst.reg), load(1), imm)); return;
    // ---- SSE4.1 ----
    case ZYDIS_MNEMONIC_PBLENDVB: set_xmm(dst.reg, sse::blendv(1, xmm(dst.reg), load(1), xmm(0))); return;
    case ZYDIS_MNEMONIC_BLENDVPS: set_xmm(dst.reg, sse::blendv(4, xmm(dst.reg), load(1), xmm(0))); return;
    case ZYDIS_MNEMONIC_BLENDVPD: set_xmm(dst.reg, sse::blendv(8, xmm(dst.reg), load(1), xmm(0))); return;
    case ZYDIS_MNEMONIC_PBLENDW: set_xmm(dst.reg, sse::blend(2, xmm(dst.reg), load(1), imm)); return;
    case ZYDIS_MNEMONIC_BLENDPS: set_xmm(dst.reg, sse::blend(4, xmm(dst.reg), load(1), imm)); return;
    case ZYDIS_MNEMONIC_BLENDPD: set_xmm(dst.reg, sse::blend(8, xmm(dst.reg), load(1), imm)); return;
    case ZYDIS_MNEMONIC_PINSRB: case ZYDIS_MNEMONIC_PINSRD: case ZYDIS_MNEMONIC_PINSRQ: {
      const unsigned bytes = mnemonic == ZYDIS_MNEMONIC_PINSRB ? 1 : mnemonic == ZYDIS_MNEMONIC_PINSRD ? 4 : 8;
      set_xmm(dst.reg, sse::insert(xmm(dst.reg), read_operand(insn, 1), bytes, imm));
      return;
    }
    case ZYDIS_MNEMONIC_PEXTRB: case ZYDIS_MNEMONIC_PEXTRW: case ZYDIS_MNEMONIC_PEXTRD: case ZYDIS_MNEMONIC_PEXTRQ:
    case ZYDIS_MNEMONIC_EXTRACTPS: {
      const unsigned bytes = mnemonic == ZYDIS_MNEMONIC_PEXTRB ? 1 : mnemonic == ZYDIS_MNEMONIC_PEXTRW ? 2
                           : mnemonic == ZYDIS_MNEMONIC_PEXTRQ ? 8 : 4;
      const uint64_t value = sse::extract(xmm(insn.op[1].reg), bytes, imm);
      if (dst.kind == OpKind::kGpr) reg_write(dst.reg, dst.size, value);  // (zero-extended to 32 or 64 bits)
      else write_operand(insn, 0, value);
      return;
    }
    case ZYDIS_MNEMONIC_INSERTPS: {
      const Operand& src = insn.op[1];
      const uint32_t value = src.kind == OpKind::kXmm ? uint32_t(sse::extract(xmm(src.reg), 4, uint8_t(imm >> 6)))
                                                      : uint32_t(load(1).lo);
      set_xmm(dst.reg, sse::insertps(xmm(dst.reg), value, imm));
      return;
    }
    case ZYDIS_MNEMONIC_PTEST: s_.rflags = sse::ptest(xmm(dst.reg), load(1), s_.rflags) | 2; return;
    case ZYDIS_MNEMONIC_ROUNDPS: fp_result(sse::fp_round(FF::kPs, xmm(dst.reg), load(1), imm, mxcsr())); return;
    case ZYDIS_MNEMONIC_ROUNDPD: fp_result(sse::fp_round(FF::kPd, xmm(dst.reg), load(1), imm, mxcsr())); return;
    case ZYDIS_MNEMONIC_ROUNDSS: fp_result(sse::fp_round(FF::kSs, xmm(dst.reg), load(1), imm, mxcsr())); return;
    case ZYDIS_MNEMONIC_ROUNDSD: fp_result(sse::fp_round(FF::kSd, xmm(dst.reg), load(1), imm, mxcsr())); return;
    case ZYDIS_MNEMONIC_DPPS: fp_result(sse::fp_dot(FF::kPs, xmm(dst.reg), load(1), imm, mxcsr())); return;
    case ZYDIS_MNEMONIC_DPPD: fp_result(sse::fp_dot(FF::kPd, xmm(dst.reg), load(1), imm, mxcsr())); return;
    case ZYDIS_MNEMONIC_MPSADBW: set_xmm(dst.reg, sse::mpsadbw(xmm(dst.reg), load(1), imm)); return;
    case ZYDIS_MNEMONIC_MOVNTDQA: set_xmm(dst.reg, load(1)); return;
    // ---- SSE4.2 ----
    case ZYDIS_MNEMONIC_PCMPESTRI: case ZYDIS_MNEMONIC_PCMPESTRM: case ZYDIS_MNEMONIC_PCMPISTRI:
    case ZYDIS_MNEMONIC_PCMPISTRM: {
      const Xmm a = xmm(dst.reg), b = load(1);
      const bool explicit_lengths = mnemonic == ZYDIS_MNEMONIC_PCMPESTRI || mnemonic == ZYDIS_MNEMONIC_PCMPESTRM;
      const bool rex_w = insn.flags & interp::insn_flags::kRexW;
      const unsigned length_a = explicit_lengths ? sse::explicit_length(s_.gpr[kRax], rex_w, imm) : sse::implicit_length(a, imm);
      const unsigned length_b = explicit_lengths ? sse::explicit_length(s_.gpr[kRdx], rex_w, imm) : sse::implicit_length(b, imm);
      const sse::StringCompare r = sse::string_compare(a, length_a, b, length_b, imm, s_.rflags);
      if (mnemonic == ZYDIS_MNEMONIC_PCMPESTRI || mnemonic == ZYDIS_MNEMONIC_PCMPISTRI) {
        s_.gpr[kRcx] = sse::string_index(r, imm);
      } else {
        set_xmm(0, sse::string_mask(r, imm));
      }
      s_.rflags = r.rflags | 2;
      return;
    }
    default:
      raise_ud(insn, true);
  }
}

}  // namespace deja
