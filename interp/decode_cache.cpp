// Zydis-to-DecodedInsn translation and the per-page decode cache.
#include <Zydis/Zydis.h>

#include "interp/decoded_insn.h"

#include <algorithm>

namespace deja::interp {
namespace {

struct Decoders {
  ZydisDecoder by_mode[3];
  Decoders() {
    ZydisDecoderInit(&by_mode[kMode16], ZYDIS_MACHINE_MODE_LEGACY_16, ZYDIS_STACK_WIDTH_16);
    ZydisDecoderInit(&by_mode[kMode32], ZYDIS_MACHINE_MODE_LEGACY_32, ZYDIS_STACK_WIDTH_32);
    ZydisDecoderInit(&by_mode[kMode64], ZYDIS_MACHINE_MODE_LONG_64, ZYDIS_STACK_WIDTH_64);
  }
};

uint8_t segment_number(ZydisRegister reg) {
  if (reg >= ZYDIS_REGISTER_ES && reg <= ZYDIS_REGISTER_GS) return uint8_t(reg - ZYDIS_REGISTER_ES);
  return 3;
}

// Maps a GPR of any width to (number, is-high-byte).
bool gpr_number(ZydisRegister reg, uint8_t& number, bool& high) {
  high = false;
  if (reg >= ZYDIS_REGISTER_AL && reg <= ZYDIS_REGISTER_BL) { number = uint8_t(reg - ZYDIS_REGISTER_AL); return true; }
  if (reg >= ZYDIS_REGISTER_AH && reg <= ZYDIS_REGISTER_BH) {
    number = uint8_t(reg - ZYDIS_REGISTER_AH);
    high = true;
    return true;
  }
  if (reg >= ZYDIS_REGISTER_SPL && reg <= ZYDIS_REGISTER_R15B) { number = uint8_t(reg - ZYDIS_REGISTER_SPL + 4); return true; }
  if (reg >= ZYDIS_REGISTER_AX && reg <= ZYDIS_REGISTER_R15W) { number = uint8_t(reg - ZYDIS_REGISTER_AX); return true; }
  if (reg >= ZYDIS_REGISTER_EAX && reg <= ZYDIS_REGISTER_R15D) { number = uint8_t(reg - ZYDIS_REGISTER_EAX); return true; }
  if (reg >= ZYDIS_REGISTER_RAX && reg <= ZYDIS_REGISTER_R15) { number = uint8_t(reg - ZYDIS_REGISTER_RAX); return true; }
  return false;
}

void convert_register(ZydisRegister reg, Operand& op) {
  uint8_t number = 0;
  bool high = false;
  if (gpr_number(reg, number, high)) {
    op.kind = high ? OpKind::kGprHigh8 : OpKind::kGpr;
    op.reg = number;
  } else if (reg >= ZYDIS_REGISTER_ES && reg <= ZYDIS_REGISTER_GS) {
    op.kind = OpKind::kSeg;
    op.reg = uint8_t(reg - ZYDIS_REGISTER_ES);
  } else if (reg >= ZYDIS_REGISTER_CR0 && reg <= ZYDIS_REGISTER_CR15) {
    op.kind = OpKind::kCr;
    op.reg = uint8_t(reg - ZYDIS_REGISTER_CR0);
  } else if (reg >= ZYDIS_REGISTER_DR0 && reg <= ZYDIS_REGISTER_DR15) {
    op.kind = OpKind::kDr;
    op.reg = uint8_t(reg - ZYDIS_REGISTER_DR0);
  } else if (reg >= ZYDIS_REGISTER_XMM0 && reg <= ZYDIS_REGISTER_XMM15) {
    op.kind = OpKind::kXmm;
    op.reg = uint8_t(reg - ZYDIS_REGISTER_XMM0);
  } else if (reg >= ZYDIS_REGISTER_YMM0 && reg <= ZYDIS_REGISTER_YMM15) {
    op.kind = OpKind::kXmm;  // (op.size 32: the whole YMM register)
    op.reg = uint8_t(reg - ZYDIS_REGISTER_YMM0);
  } else if (reg >= ZYDIS_REGISTER_MM0 && reg <= ZYDIS_REGISTER_MM7) {
    op.kind = OpKind::kMmx;
    op.reg = uint8_t(reg - ZYDIS_REGISTER_MM0);
  } else {
    op.kind = OpKind::kOther;  // x87, ...: the executor treats these as unimplemented
    op.reg = kNoReg;
  }
}

uint8_t vector_number(ZydisRegister reg) {
  if (reg >= ZYDIS_REGISTER_XMM0 && reg <= ZYDIS_REGISTER_XMM15) return uint8_t(reg - ZYDIS_REGISTER_XMM0);
  if (reg >= ZYDIS_REGISTER_YMM0 && reg <= ZYDIS_REGISTER_YMM15) return uint8_t(reg - ZYDIS_REGISTER_YMM0);
  return kNoReg;
}

uint8_t base_number(ZydisRegister reg) {
  if (reg == ZYDIS_REGISTER_NONE) return kNoReg;
  if (reg == ZYDIS_REGISTER_RIP || reg == ZYDIS_REGISTER_EIP) return kRipBase;
  uint8_t number = 0;
  bool high = false;
  return gpr_number(reg, number, high) ? number : kNoReg;
}

OpEnc operand_encoding(ZydisOperandEncoding encoding) {
  switch (encoding) {
    case ZYDIS_OPERAND_ENCODING_MODRM_REG: return OpEnc::kModrmReg;
    case ZYDIS_OPERAND_ENCODING_MODRM_RM: return OpEnc::kModrmRm;
    case ZYDIS_OPERAND_ENCODING_NDSNDD: return OpEnc::kVvvv;
    case ZYDIS_OPERAND_ENCODING_IS4: return OpEnc::kIs4;
    case ZYDIS_OPERAND_ENCODING_UIMM8: case ZYDIS_OPERAND_ENCODING_SIMM8: return OpEnc::kImm;
    default: return OpEnc::kOther;
  }
}

// The feature a VEX instruction needs among those deja's CPU models may have; kNone for the others.
VexIsa vex_isa(const ZydisDecodedInstruction& zi) {
  switch (zi.meta.isa_ext) {
    case ZYDIS_ISA_EXT_AVX:
      return zi.mnemonic == ZYDIS_MNEMONIC_VPCLMULQDQ ? VexIsa::kPclmul : VexIsa::kAvx;
    case ZYDIS_ISA_EXT_AVX2: case ZYDIS_ISA_EXT_AVX2GATHER: return VexIsa::kAvx2;
    case ZYDIS_ISA_EXT_FMA: return VexIsa::kFma;
    case ZYDIS_ISA_EXT_F16C: return VexIsa::kF16c;
    case ZYDIS_ISA_EXT_BMI1: return VexIsa::kBmi1;
    case ZYDIS_ISA_EXT_BMI2: return VexIsa::kBmi2;
    case ZYDIS_ISA_EXT_AVXAES: return VexIsa::kAes;
    default: return VexIsa::kNone;
  }
}

// The XINUSE bits an instruction sets when it completes, by the rules measured on Intel hosts (XGETBV with ECX = 1
// after each kind of instruction from the initial configuration; docs/cpu-models.md, "XINUSE"): every x87
// instruction but FNSTCW and FNSTSW, and every MMX one (EMMS too), set x87 (0); a write of an XMM or YMM register
// (PCMPISTRM's and PCMPESTRM's of XMM0 included), LDMXCSR and FXRSTOR set SSE (1); a VEX.256 instruction that
// writes a vector register sets AVX (2) too. Reads and stores set nothing. VZEROUPPER, VZEROALL and XRSTOR clear
// bits: their executors do that.
uint8_t xinuse_set_by(const ZydisDecodedInstruction& zi, const ZydisDecodedOperand* zops, uint8_t count) {
  constexpr uint8_t kX87 = 1, kSse = 2, kAvx = 4;
  switch (zi.mnemonic) {
    case ZYDIS_MNEMONIC_FNSTCW: case ZYDIS_MNEMONIC_FNSTSW: case ZYDIS_MNEMONIC_VZEROUPPER: case ZYDIS_MNEMONIC_VZEROALL:
      return 0;
    case ZYDIS_MNEMONIC_EMMS: return kX87;
    case ZYDIS_MNEMONIC_FXRSTOR: case ZYDIS_MNEMONIC_FXRSTOR64: return kX87 | kSse;
    case ZYDIS_MNEMONIC_LDMXCSR: case ZYDIS_MNEMONIC_VLDMXCSR: case ZYDIS_MNEMONIC_PCMPISTRM:
    case ZYDIS_MNEMONIC_PCMPESTRM: case ZYDIS_MNEMONIC_VPCMPISTRM: case ZYDIS_MNEMONIC_VPCMPESTRM:
      return kSse;
    default: break;
  }
  uint8_t sets = 0;
  if (zi.opcode_map == ZYDIS_OPCODE_MAP_DEFAULT && ((zi.opcode & 0xf8) == 0xd8 || zi.opcode == 0x9b)) sets |= kX87;
  for (uint8_t i = 0; i < count; ++i) {
    if (zops[i].type != ZYDIS_OPERAND_TYPE_REGISTER) continue;
    const ZydisRegister reg = zops[i].reg.value;
    if (reg >= ZYDIS_REGISTER_MM0 && reg <= ZYDIS_REGISTER_MM7) sets |= kX87;
    const bool vector = (reg >= ZYDIS_REGISTER_XMM0 && reg <= ZYDIS_REGISTER_XMM15) ||
                        (reg >= ZYDIS_REGISTER_YMM0 && reg <= ZYDIS_REGISTER_YMM15);
    if (vector && (zops[i].actions & ZYDIS_OPERAND_ACTION_MASK_WRITE))
      sets |= (zi.encoding == ZYDIS_INSTRUCTION_ENCODING_VEX && zi.raw.vex.L) ? kSse | kAvx : kSse;
  }
  return sets;
}

}  // namespace

bool decode_bytes(const uint8_t* bytes, size_t len, uint8_t mode, DecodedInsn& out) {
  static const Decoders decoders;
  ZydisDecodedInstruction zi;
  ZydisDecodedOperand zops[ZYDIS_MAX_OPERAND_COUNT];
  out = DecodedInsn{};
  out.mode = mode;
  // The instruction, then its visible operands only (the implicit ones, decoded by DecodeFull, are never
  // read here).
  ZydisDecoderContext context;
  const ZydisDecoder& decoder = decoders.by_mode[mode];
  ZyanStatus status = ZydisDecoderDecodeInstruction(&decoder, &context, bytes, len, &zi);
  if (ZYAN_SUCCESS(status))
    status = ZydisDecoderDecodeOperands(&decoder, &context, &zi, zops, std::min<ZyanU8>(zi.operand_count_visible, 4));
  if (!ZYAN_SUCCESS(status)) {
    if (status == ZYDIS_STATUS_NO_MORE_DATA && len < ZYDIS_MAX_INSTRUCTION_LENGTH) return false;
    out.valid = false;
    out.length = 1;
    return true;
  }
  // No CPU model has AVX-512, XOP or 3DNow!: their encodings are #UD (as on a CPU without them).
  if (zi.encoding != ZYDIS_INSTRUCTION_ENCODING_LEGACY && zi.encoding != ZYDIS_INSTRUCTION_ENCODING_VEX) {
    out.valid = false;
    out.length = 1;
    return true;
  }
  out.valid = true;
  out.mnemonic = uint16_t(zi.mnemonic);
  out.length = zi.length;
  out.opsize = zi.operand_width;
  out.addrsize = zi.address_width;
  out.opcode = zi.opcode;
  out.opcode_map = uint8_t(zi.opcode_map);
  if (zi.attributes & ZYDIS_ATTRIB_HAS_MODRM)
    out.modrm = uint8_t((zi.raw.modrm.mod << 6) | ((zi.raw.modrm.reg & 7) << 3) | (zi.raw.modrm.rm & 7));
  if (zi.attributes & ZYDIS_ATTRIB_HAS_REP) out.flags |= insn_flags::kRep;
  if (zi.attributes & ZYDIS_ATTRIB_HAS_REPE) out.flags |= insn_flags::kRep;
  if (zi.attributes & ZYDIS_ATTRIB_HAS_REPNE) out.flags |= insn_flags::kRepne;
  if (zi.attributes & ZYDIS_ATTRIB_HAS_LOCK) out.flags |= insn_flags::kLock;
  if (zi.attributes & ZYDIS_ATTRIB_HAS_OPERANDSIZE) out.flags |= insn_flags::kOpsizePrefix;
  // (For a VEX instruction Zydis fills raw.rex from the VEX prefix, W inverted: VEX.W is raw.vex.W.)
  if (zi.raw.rex.W && zi.encoding == ZYDIS_INSTRUCTION_ENCODING_LEGACY) out.flags |= insn_flags::kRexW;
  if (zi.encoding == ZYDIS_INSTRUCTION_ENCODING_VEX) {
    out.isa = vex_isa(zi);
    if (out.isa == VexIsa::kNone) {  // (AVX-VNNI, VAES, GFNI, AMX, FMA4, AVX-512 mask instructions, ...)
      out = DecodedInsn{};
      out.mode = mode;
      out.length = 1;
      return true;
    }
    out.flags |= insn_flags::kVex;
    if (zi.raw.vex.W) out.flags |= insn_flags::kRexW;
    if (zi.raw.vex.L) out.flags |= insn_flags::kVexL;
    out.vex_pp = zi.raw.vex.pp;
  }
  static constexpr std::pair<ZydisInstructionAttributes, uint8_t> kOverrides[] = {
      {ZYDIS_ATTRIB_HAS_SEGMENT_ES, 0}, {ZYDIS_ATTRIB_HAS_SEGMENT_CS, 1}, {ZYDIS_ATTRIB_HAS_SEGMENT_SS, 2},
      {ZYDIS_ATTRIB_HAS_SEGMENT_DS, 3}, {ZYDIS_ATTRIB_HAS_SEGMENT_FS, 4}, {ZYDIS_ATTRIB_HAS_SEGMENT_GS, 5}};
  for (auto [attribute, number] : kOverrides) {
    if (zi.attributes & attribute) {
      out.seg_override = number;
      out.flags |= insn_flags::kSegOverride;
    }
  }
  out.operand_count = zi.operand_count_visible > 4 ? 4 : zi.operand_count_visible;
  out.xinuse = xinuse_set_by(zi, zops, out.operand_count);
  for (int i = 0; i < out.operand_count; ++i) {
    const ZydisDecodedOperand& z = zops[i];
    Operand& op = out.op[i];
    op.size = uint8_t(z.size / 8);
    op.enc = operand_encoding(z.encoding);
    switch (z.type) {
      case ZYDIS_OPERAND_TYPE_REGISTER:
        convert_register(z.reg.value, op);
        break;
      case ZYDIS_OPERAND_TYPE_MEMORY:
        op.kind = OpKind::kMem;
        op.base = base_number(z.mem.base);
        op.index = base_number(z.mem.index);
        op.scale = z.mem.scale;
        op.seg = segment_number(z.mem.segment);
        op.disp = z.mem.disp.has_displacement ? z.mem.disp.value : 0;
        if (z.mem.type == ZYDIS_MEMOP_TYPE_AGEN) op.seg = 3;  // LEA: no segment applies
        if (z.mem.index != ZYDIS_REGISTER_NONE && op.index == kNoReg) {
          op.index = vector_number(z.mem.index);  // VSIB (gathers)
          if (op.index == kNoReg) op.kind = OpKind::kOther;
          else out.flags |= insn_flags::kVsib;
        }
        break;
      case ZYDIS_OPERAND_TYPE_IMMEDIATE:
        op.kind = OpKind::kImm;
        op.disp = z.imm.is_signed ? z.imm.value.s : int64_t(z.imm.value.u);
        break;
      case ZYDIS_OPERAND_TYPE_POINTER:
        op.kind = OpKind::kPtr;
        op.disp = z.ptr.offset;
        op.ptr_sel = z.ptr.segment;
        break;
      default:
        op.kind = OpKind::kOther;
        break;
    }
  }
  return true;
}

const char* mnemonic_name(uint16_t mnemonic) { return ZydisMnemonicGetString(ZydisMnemonic(mnemonic)); }

DecodedInsn* DecodeCache::insert(uint64_t gpa, const DecodedInsn& insn) {
  uint64_t pfn = gpa >> 12;
  Page* page = pfn == last_pfn_ ? last_page_ : lookup_page(pfn);
  if (!page && bytes_ + sizeof(Page) + 4096 * sizeof(uint16_t) > capacity_) {
    clear();
    ++flushes_;
  }
  if (!page) {
    auto fresh = std::make_unique<Page>();
    page = fresh.get();
    bytes_ += page->bytes();
    pages_.emplace(pfn, std::move(fresh));
    last_pfn_ = pfn;
    last_page_ = page;
    if (pfn < has_code_.size()) has_code_[pfn] = 1;
  }
  uint16_t& slot = page->slot[gpa & 0xfff];
  if (slot != 0) {
    page->insns[slot - 1] = insn;
    return &page->insns[slot - 1];
  }
  const uint64_t before = page->insns.capacity();
  page->insns.push_back(insn);
  bytes_ += (page->insns.capacity() - before) * sizeof(DecodedInsn);
  slot = uint16_t(page->insns.size());
  DecodedInsn* entry = &page->insns.back();
  if (bytes_ > capacity_) {
    // Full: everything else goes (retired, so pointers held by the caller stay valid until the
    // next step); this page stays, so the entry returned is still cached.
    std::unique_ptr<Page> keep = std::move(pages_[pfn]);
    pages_.erase(pfn);
    clear();
    ++flushes_;
    bytes_ = keep->bytes();
    pages_.emplace(pfn, std::move(keep));
    last_pfn_ = pfn;
    last_page_ = page;
    if (pfn < has_code_.size()) has_code_[pfn] = 1;
  }
  return entry;
}

void DecodeCache::invalidate_range(uint64_t gpa, unsigned size) {
  const uint64_t pfn = gpa >> 12;
  Page* page = pfn == last_pfn_ ? last_page_ : lookup_page(pfn);
  if (!page) return;
  // Re-decoded entries are appended, so a page that keeps being rewritten is dropped whole.
  if (page->insns.size() > 8192) {
    invalidate(pfn);
    return;
  }
  const uint64_t offset = gpa & 0xfff;
  const uint64_t first = offset >= 14 ? offset - 14 : 0;
  const uint64_t end = std::min<uint64_t>(offset + size, 4096);
  bool dropped = false;
  for (uint64_t i = first; i < end; ++i) {
    dropped |= page->slot[i] != 0;
    page->slot[i] = 0;
  }
  if (dropped) ++invalidations_;
}

void DecodeCache::invalidate(uint64_t pfn) {
  auto it = pages_.find(pfn);
  if (pfn < has_code_.size()) has_code_[pfn] = 0;
  if (it == pages_.end()) return;
  bytes_ -= std::min(bytes_, it->second->bytes());
  graveyard_.push_back(std::move(it->second));
  pages_.erase(it);
  if (last_pfn_ == pfn) {
    last_pfn_ = ~0ull;
    last_page_ = nullptr;
  }
  ++invalidations_;
  ++generation_;
}

void DecodeCache::clear() {
  for (auto& [pfn, page] : pages_) {
    if (pfn < has_code_.size()) has_code_[pfn] = 0;
    graveyard_.push_back(std::move(page));
  }
  pages_.clear();
  bytes_ = 0;
  ++generation_;
  last_pfn_ = ~0ull;
  last_page_ = nullptr;
}

}  // namespace deja::interp
