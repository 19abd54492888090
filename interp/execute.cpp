// The integer executor: operand access and one handler per mnemonic, for 16/32/64-bit code.
#include <Zydis/Zydis.h>

#include <cstring>

#include "interp/alu.h"
#include "interp/interp_backend.h"

namespace deja {

using interp::DecodedInsn;
using interp::Operand;
using interp::OpKind;
namespace flags_ns = interp;

namespace {

constexpr uint8_t kDe = 0, kDb = 1, kBp = 3, kOf = 4, kUd = 6, kGp = 13;
constexpr uint64_t kStatus = interp::kArithFlags;

uint64_t mask_for(unsigned bytes) { return bytes >= 8 ? ~0ull : ((1ull << (bytes * 8)) - 1); }

bool cpuid_bit(const CpuModel& model, uint32_t leaf, int reg, int bit) {
  CpuidResult r = model.cpuid(leaf, 0);
  uint32_t regs[4] = {r.eax, r.ebx, r.ecx, r.edx};
  return (regs[reg] >> bit) & 1;
}

}  // namespace


uint64_t InterpBackend::effective_address(const Operand& op, const DecodedInsn& insn) const {
  uint64_t address = uint64_t(op.disp);
  if (op.base == interp::kRipBase) address += insn_rip_ + insn.length;
  else if (op.base != interp::kNoReg) address += s_.gpr[op.base];
  if (op.index != interp::kNoReg) address += s_.gpr[op.index] * op.scale;
  if (insn.addrsize == 32) address &= 0xffffffffu;
  else if (insn.addrsize == 16) address &= 0xffff;
  return address;
}

uint64_t InterpBackend::read_operand_slow(const DecodedInsn& insn, int i) {
  const Operand& op = insn.op[i];
  switch (op.kind) {
    case OpKind::kGpr: return s_.gpr[op.reg] & mask_for(op.size);
    case OpKind::kGprHigh8: return (s_.gpr[op.reg] >> 8) & 0xff;
    case OpKind::kImm: return uint64_t(op.disp);
    case OpKind::kMem: return read_mem(op.seg, effective_address(op, insn), op.size > 8 ? 8 : op.size);
    case OpKind::kSeg: return seg(op.reg).selector;
    default: raise_ud(insn, true);
  }
}

void InterpBackend::write_operand_slow(const DecodedInsn& insn, int i, uint64_t value) {
  const Operand& op = insn.op[i];
  switch (op.kind) {
    case OpKind::kGpr: reg_write(op.reg, op.size, value); return;
    case OpKind::kGprHigh8: s_.gpr[op.reg] = (s_.gpr[op.reg] & ~0xff00ull) | ((value & 0xff) << 8); return;
    case OpKind::kMem: write_mem(op.seg, effective_address(op, insn), op.size > 8 ? 8 : op.size, value); return;
    default: raise_ud(insn, true);
  }
}

void InterpBackend::count_unimplemented(uint16_t mnemonic) { ++unimplemented_[interp::mnemonic_name(mnemonic)]; }

void InterpBackend::raise_ud(const DecodedInsn& insn, bool unimplemented) {
  if (unimplemented) count_unimplemented(insn.mnemonic);
  throw GuestException{kUd, 0, false};
}

void InterpBackend::execute(const DecodedInsn& insn) {
  using interp::alu_binary;
  using interp::BinaryOp;
  using interp::ShiftOp;
  if (!insn.valid) raise_ud(insn, false);
  const unsigned w = insn.op[0].size * 8;  // width of the first operand, for ALU instructions
  auto binary = [&](BinaryOp op) {
    uint64_t a = read_operand(insn, 0);
    uint64_t b = read_operand(insn, 1);
    interp::AluResult r = alu_binary(op, a, b, w, s_.rflags);
    if (op != BinaryOp::kCmp && op != BinaryOp::kTest) write_operand(insn, 0, r.value);
    s_.rflags = r.flags;
  };
  auto shift = [&](ShiftOp op) {
    uint64_t count = (insn.operand_count >= 2 && insn.op[1].kind != OpKind::kNone) ? read_operand(insn, 1) : 1;
    uint64_t a = read_operand(insn, 0);
    interp::AluResult r = interp::alu_shift(op, a, count & 0xff, w, s_.rflags);
    write_operand(insn, 0, r.value);
    s_.rflags = r.flags;
  };
  auto jump_target = [&](int i) {
    uint64_t target = next_rip_ + uint64_t(insn.op[i].disp);
    if (insn.opsize == 16) target &= 0xffff;
    else if (insn.opsize == 32) target &= 0xffffffffu;
    return target;
  };
  auto set_rip = [&](uint64_t target) {
    if (mode64()) canonical_check(target, false);
    else if (insn.opsize == 16) target &= 0xffff;
    else target &= 0xffffffffu;
    next_rip_ = target;
  };
  auto stack_bytes = [&]() -> unsigned { return insn.opsize / 8; };

  switch (ZydisMnemonic(insn.mnemonic)) {
    // ---- data movement ----
    case ZYDIS_MNEMONIC_MOV: {
      const Operand& dst = insn.op[0];
      const Operand& src = insn.op[1];
      if (dst.kind == OpKind::kCr || src.kind == OpKind::kCr) {
        if (cpl() != 0) raise(kGp, 0, true);
        unsigned cr = dst.kind == OpKind::kCr ? dst.reg : src.reg;
        if (cr == 1 || (cr > 4 && cr != 8)) raise_ud(insn, false);
        if (dst.kind == OpKind::kCr) set_cr(cr, s_.gpr[src.reg] & (mode64() ? ~0ull : 0xffffffffull));
        else reg_write(dst.reg, mode64() ? 8 : 4, get_cr(cr));
        return;
      }
      if (dst.kind == OpKind::kDr || src.kind == OpKind::kDr) {
        if (cpl() != 0) raise(kGp, 0, true);
        // Debug registers are accepted and read as their reset values (no hardware breakpoints).
        if (src.kind == OpKind::kDr) reg_write(dst.reg, mode64() ? 8 : 4, src.reg == 6 ? 0xffff0ff0 : src.reg == 7 ? 0x400 : 0);
        return;
      }
      if (dst.kind == OpKind::kSeg) {
        if (dst.reg == 1) raise_ud(insn, false);
        load_segment(dst.reg, uint16_t(read_operand(insn, 1)));
        if (dst.reg == 2) shadow_next_ = true;
        return;
      }
      if (src.kind == OpKind::kSeg) {
        uint64_t selector = seg(src.reg).selector;
        if (dst.kind == OpKind::kMem) write_mem(dst.seg, effective_address(dst, insn), 2, selector);
        else reg_write(dst.reg, dst.size, selector);
        return;
      }
      write_operand(insn, 0, read_operand(insn, 1));
      return;
    }
    case ZYDIS_MNEMONIC_MOVZX:
    case ZYDIS_MNEMONIC_MOVNTI:  // the non-temporal hint has no architectural effect
      write_operand(insn, 0, read_operand(insn, 1));
      return;
    case ZYDIS_MNEMONIC_MOVSX:
    case ZYDIS_MNEMONIC_MOVSXD:
      write_operand(insn, 0, interp::sign_extend(read_operand(insn, 1), insn.op[1].size * 8));
      return;
    case ZYDIS_MNEMONIC_LEA: write_operand(insn, 0, effective_address(insn.op[1], insn)); return;
    case ZYDIS_MNEMONIC_XCHG: {
      uint64_t a = read_operand(insn, 0), b = read_operand(insn, 1);
      write_operand(insn, 0, b);
      write_operand(insn, 1, a);
      return;
    }
    case ZYDIS_MNEMONIC_BSWAP: {
      uint64_t v = read_operand(insn, 0);
      write_operand(insn, 0, w == 64 ? __builtin_bswap64(v) : w == 32 ? __builtin_bswap32(uint32_t(v)) : 0);
      return;
    }
    case ZYDIS_MNEMONIC_MOVBE: {
      uint64_t v = read_operand(insn, 1);
      unsigned bytes = insn.op[0].size;
      uint64_t swapped = bytes == 8 ? __builtin_bswap64(v) : bytes == 4 ? __builtin_bswap32(uint32_t(v)) : __builtin_bswap16(uint16_t(v));
      write_operand(insn, 0, swapped);
      return;
    }
    case ZYDIS_MNEMONIC_CMOVB: case ZYDIS_MNEMONIC_CMOVBE: case ZYDIS_MNEMONIC_CMOVL: case ZYDIS_MNEMONIC_CMOVLE:
    case ZYDIS_MNEMONIC_CMOVNB: case ZYDIS_MNEMONIC_CMOVNBE: case ZYDIS_MNEMONIC_CMOVNL: case ZYDIS_MNEMONIC_CMOVNLE:
    case ZYDIS_MNEMONIC_CMOVNO: case ZYDIS_MNEMONIC_CMOVNP: case ZYDIS_MNEMONIC_CMOVNS: case ZYDIS_MNEMONIC_CMOVNZ:
    case ZYDIS_MNEMONIC_CMOVO: case ZYDIS_MNEMONIC_CMOVP: case ZYDIS_MNEMONIC_CMOVS: case ZYDIS_MNEMONIC_CMOVZ: {
      uint64_t src = read_operand(insn, 1);
      // A 32-bit CMOV writes (zero-extends) its destination even when the condition is false.
      write_operand(insn, 0, interp::condition_holds(insn.opcode & 0xf, s_.rflags) ? src : read_operand(insn, 0));
      return;
    }
    case ZYDIS_MNEMONIC_SETB: case ZYDIS_MNEMONIC_SETBE: case ZYDIS_MNEMONIC_SETL: case ZYDIS_MNEMONIC_SETLE:
    case ZYDIS_MNEMONIC_SETNB: case ZYDIS_MNEMONIC_SETNBE: case ZYDIS_MNEMONIC_SETNL: case ZYDIS_MNEMONIC_SETNLE:
    case ZYDIS_MNEMONIC_SETNO: case ZYDIS_MNEMONIC_SETNP: case ZYDIS_MNEMONIC_SETNS: case ZYDIS_MNEMONIC_SETNZ:
    case ZYDIS_MNEMONIC_SETO: case ZYDIS_MNEMONIC_SETP: case ZYDIS_MNEMONIC_SETS: case ZYDIS_MNEMONIC_SETZ:
      write_operand(insn, 0, interp::condition_holds(insn.opcode & 0xf, s_.rflags) ? 1 : 0);
      return;
    case ZYDIS_MNEMONIC_CBW: reg_write(kRax, 2, interp::sign_extend(s_.gpr[kRax] & 0xff, 8)); return;
    case ZYDIS_MNEMONIC_CWDE: reg_write(kRax, 4, interp::sign_extend(s_.gpr[kRax] & 0xffff, 16)); return;
    case ZYDIS_MNEMONIC_CDQE: reg_write(kRax, 8, interp::sign_extend(s_.gpr[kRax] & 0xffffffffu, 32)); return;
    case ZYDIS_MNEMONIC_CWD: reg_write(kRdx, 2, (s_.gpr[kRax] & 0x8000) ? 0xffff : 0); return;
    case ZYDIS_MNEMONIC_CDQ: reg_write(kRdx, 4, (s_.gpr[kRax] & 0x80000000u) ? 0xffffffffu : 0); return;
    case ZYDIS_MNEMONIC_CQO: reg_write(kRdx, 8, (s_.gpr[kRax] >> 63) ? ~0ull : 0); return;
    case ZYDIS_MNEMONIC_LAHF:
      if (mode64() && !cpuid_bit(model_, 0x80000001, 2, 0)) raise_ud(insn, false);
      s_.gpr[kRax] = (s_.gpr[kRax] & ~0xff00ull) | (((s_.rflags & 0xd5) | 2) << 8);
      return;
    case ZYDIS_MNEMONIC_SAHF:
      if (mode64() && !cpuid_bit(model_, 0x80000001, 2, 0)) raise_ud(insn, false);
      s_.rflags = (s_.rflags & ~0xd5ull) | ((s_.gpr[kRax] >> 8) & 0xd5) | 2;
      return;
    case ZYDIS_MNEMONIC_XLAT: {
      uint64_t offset = s_.gpr[kRbx] + (s_.gpr[kRax] & 0xff);
      if (insn.addrsize == 32) offset &= 0xffffffffu;
      if (insn.addrsize == 16) offset &= 0xffff;
      reg_write(kRax, 1, read_mem(insn.seg_override != 0xff ? insn.seg_override : 3, offset, 1));
      return;
    }

    // ---- stack ----
    case ZYDIS_MNEMONIC_PUSH: {
      uint64_t value = read_operand(insn, 0);
      unsigned bytes = stack_bytes();
      if (insn.op[0].kind == OpKind::kSeg) value &= 0xffff;
      push(value, bytes);
      return;
    }
    case ZYDIS_MNEMONIC_POP: {
      unsigned bytes = stack_bytes();
      if (insn.op[0].kind == OpKind::kSeg) {
        uint64_t saved_rsp = s_.gpr[kRsp];
        uint16_t selector = uint16_t(pop(bytes));
        try {
          load_segment(insn.op[0].reg, selector);
        } catch (...) {
          s_.gpr[kRsp] = saved_rsp;
          throw;
        }
        if (insn.op[0].reg == 2) shadow_next_ = true;
        return;
      }
      uint64_t saved_rsp = s_.gpr[kRsp];
      uint64_t value = pop(bytes);
      try {
        write_operand(insn, 0, value);
      } catch (...) {
        s_.gpr[kRsp] = saved_rsp;
        throw;
      }
      return;
    }
    case ZYDIS_MNEMONIC_PUSHF: case ZYDIS_MNEMONIC_PUSHFD: case ZYDIS_MNEMONIC_PUSHFQ:
      push(s_.rflags & ~(rflags::kVm | rflags::kRf), stack_bytes());
      return;
    case ZYDIS_MNEMONIC_POPF: case ZYDIS_MNEMONIC_POPFD: case ZYDIS_MNEMONIC_POPFQ: {
      unsigned bytes = stack_bytes();
      uint64_t value = pop(bytes);
      uint64_t mask = kStatus | rflags::kTf | rflags::kDf | rflags::kNt | rflags::kAc | rflags::kId;
      const unsigned iopl = (s_.rflags >> 12) & 3;
      if (cpl() == 0) mask |= rflags::kIopl;
      if (cpl() <= iopl) mask |= rflags::kIf;
      if (bytes == 2) mask &= 0xffff;
      write_rflags(value, mask);
      return;
    }
    case ZYDIS_MNEMONIC_ENTER: {
      unsigned bytes = stack_bytes();
      uint64_t alloc = uint64_t(insn.op[0].disp) & 0xffff;
      unsigned level = unsigned(insn.op[1].disp) & 31;
      push(s_.gpr[kRbp], bytes);
      uint64_t frame = s_.gpr[kRsp];
      if (level > 0) {
        uint64_t rbp = s_.gpr[kRbp];
        for (unsigned i = 1; i < level; ++i) {
          rbp -= bytes;
          push(read_mem(2, rbp, bytes), bytes);
        }
        push(frame, bytes);
      }
      reg_write(kRbp, stack_addr_size() == 8 ? 8 : bytes, frame);
      uint64_t rsp = s_.gpr[kRsp] - alloc;
      probe_write(2, rsp, 1);  // the new stack top must be writable
      reg_write(kRsp, stack_addr_size(), rsp);
      return;
    }
    case ZYDIS_MNEMONIC_LEAVE: {
      unsigned bytes = stack_bytes();
      uint64_t saved_rsp = s_.gpr[kRsp];
      reg_write(kRsp, stack_addr_size(), s_.gpr[kRbp]);
      try {
        reg_write(kRbp, bytes, pop(bytes));
      } catch (...) {
        s_.gpr[kRsp] = saved_rsp;
        throw;
      }
      return;
    }

    // ---- arithmetic and logic ----
    case ZYDIS_MNEMONIC_ADD: binary(BinaryOp::kAdd); return;
    case ZYDIS_MNEMONIC_OR: binary(BinaryOp::kOr); return;
    case ZYDIS_MNEMONIC_ADC: binary(BinaryOp::kAdc); return;
    case ZYDIS_MNEMONIC_SBB: binary(BinaryOp::kSbb); return;
    case ZYDIS_MNEMONIC_AND: binary(BinaryOp::kAnd); return;
    case ZYDIS_MNEMONIC_SUB: binary(BinaryOp::kSub); return;
    case ZYDIS_MNEMONIC_XOR: binary(BinaryOp::kXor); return;
    case ZYDIS_MNEMONIC_CMP: binary(BinaryOp::kCmp); return;
    case ZYDIS_MNEMONIC_TEST: binary(BinaryOp::kTest); return;
    case ZYDIS_MNEMONIC_INC: {
      auto r = interp::alu_inc(read_operand(insn, 0), w, s_.rflags);
      write_operand(insn, 0, r.value);
      s_.rflags = r.flags;
      return;
    }
    case ZYDIS_MNEMONIC_DEC: {
      auto r = interp::alu_dec(read_operand(insn, 0), w, s_.rflags);
      write_operand(insn, 0, r.value);
      s_.rflags = r.flags;
      return;
    }
    case ZYDIS_MNEMONIC_NEG: {
      auto r = interp::alu_neg(read_operand(insn, 0), w, s_.rflags);
      write_operand(insn, 0, r.value);
      s_.rflags = r.flags;
      return;
    }
    case ZYDIS_MNEMONIC_NOT: write_operand(insn, 0, ~read_operand(insn, 0)); return;
    case ZYDIS_MNEMONIC_ROL: shift(ShiftOp::kRol); return;
    case ZYDIS_MNEMONIC_ROR: shift(ShiftOp::kRor); return;
    case ZYDIS_MNEMONIC_RCL: shift(ShiftOp::kRcl); return;
    case ZYDIS_MNEMONIC_RCR: shift(ShiftOp::kRcr); return;
    case ZYDIS_MNEMONIC_SHL: shift(ShiftOp::kShl); return;
    case ZYDIS_MNEMONIC_SHR: shift(ShiftOp::kShr); return;
    case ZYDIS_MNEMONIC_SAR: shift(ShiftOp::kSar); return;
    case ZYDIS_MNEMONIC_SHLD:
    case ZYDIS_MNEMONIC_SHRD: {
      uint64_t dst = read_operand(insn, 0), src = read_operand(insn, 1), count = read_operand(insn, 2) & 0xff;
      auto r = insn.mnemonic == ZYDIS_MNEMONIC_SHLD ? interp::alu_shld(dst, src, count, w, s_.rflags)
                                                     : interp::alu_shrd(dst, src, count, w, s_.rflags);
      write_operand(insn, 0, r.value);
      s_.rflags = r.flags;
      return;
    }
    case ZYDIS_MNEMONIC_BT: case ZYDIS_MNEMONIC_BTS: case ZYDIS_MNEMONIC_BTR: case ZYDIS_MNEMONIC_BTC: {
      interp::BitTestOp op = insn.mnemonic == ZYDIS_MNEMONIC_BT    ? interp::BitTestOp::kBt
                             : insn.mnemonic == ZYDIS_MNEMONIC_BTS ? interp::BitTestOp::kBts
                             : insn.mnemonic == ZYDIS_MNEMONIC_BTR ? interp::BitTestOp::kBtr
                                                                   : interp::BitTestOp::kBtc;
      uint64_t offset = read_operand(insn, 1);
      const Operand& dst = insn.op[0];
      if (dst.kind == OpKind::kMem && insn.op[1].kind != OpKind::kImm) {
        // A register bit offset addresses memory beyond the operand (SDM BT: signed offset).
        int64_t signed_offset = int64_t(interp::sign_extend(offset, w));
        uint64_t address = effective_address(dst, insn) + uint64_t((signed_offset >> (w == 64 ? 6 : w == 32 ? 5 : 4)) * int64_t(w / 8));
        if (insn.addrsize == 32) address &= 0xffffffffu;
        unsigned bit = unsigned(signed_offset & (w - 1));
        uint64_t value = read_mem(dst.seg, address, w / 8);
        auto r = interp::alu_bit_test(op, value, bit, w, s_.rflags);
        if (op != interp::BitTestOp::kBt) write_mem(dst.seg, address, w / 8, r.value);
        s_.rflags = r.flags;
        return;
      }
      auto r = interp::alu_bit_test(op, read_operand(insn, 0), unsigned(offset & (w - 1)), w, s_.rflags);
      if (op != interp::BitTestOp::kBt) write_operand(insn, 0, r.value);
      s_.rflags = r.flags;
      return;
    }
    case ZYDIS_MNEMONIC_BSF: case ZYDIS_MNEMONIC_BSR: case ZYDIS_MNEMONIC_TZCNT: case ZYDIS_MNEMONIC_LZCNT:
    case ZYDIS_MNEMONIC_POPCNT: {
      interp::BitScanOp op = interp::BitScanOp::kBsf;
      switch (insn.mnemonic) {
        case ZYDIS_MNEMONIC_BSR: op = interp::BitScanOp::kBsr; break;
        // Without BMI1 in the model, F3 0F BC is BSF (the prefix is ignored), as on such CPUs.
        case ZYDIS_MNEMONIC_TZCNT: op = cpuid_bit(model_, 7, 1, 3) ? interp::BitScanOp::kTzcnt : interp::BitScanOp::kBsf; break;
        case ZYDIS_MNEMONIC_LZCNT: op = cpuid_bit(model_, 0x80000001, 2, 5) ? interp::BitScanOp::kLzcnt : interp::BitScanOp::kBsr; break;
        case ZYDIS_MNEMONIC_POPCNT:
          if (!cpuid_bit(model_, 1, 2, 23)) raise_ud(insn, false);
          op = interp::BitScanOp::kPopcnt;
          break;
        default: break;
      }
      uint64_t src = read_operand(insn, 1);
      auto r = interp::alu_bit_scan(op, src, read_operand(insn, 0), w, s_.rflags);
      bool keep = (op == interp::BitScanOp::kBsf || op == interp::BitScanOp::kBsr) && (src & mask_for(w / 8)) == 0;
      if (!keep) write_operand(insn, 0, r.value);
      s_.rflags = r.flags;
      return;
    }
    case ZYDIS_MNEMONIC_MUL:
    case ZYDIS_MNEMONIC_IMUL: {
      if (insn.mnemonic == ZYDIS_MNEMONIC_IMUL && insn.operand_count >= 2 && insn.op[1].kind != OpKind::kNone) {
        uint64_t a = insn.operand_count >= 3 ? read_operand(insn, 1) : read_operand(insn, 0);
        uint64_t b = insn.operand_count >= 3 ? read_operand(insn, 2) : read_operand(insn, 1);
        auto r = interp::alu_imul(a, b, w, s_.rflags);
        write_operand(insn, 0, r.value);
        s_.rflags = r.flags;
        return;
      }
      uint64_t src = read_operand(insn, 0);
      uint64_t acc = reg_read(kRax, w / 8);
      auto r = insn.mnemonic == ZYDIS_MNEMONIC_MUL ? interp::alu_mul(acc, src, w, s_.rflags)
                                                    : interp::alu_imul_wide(acc, src, w, s_.rflags);
      if (w == 8) {
        reg_write(kRax, 2, (r.hi << 8) | r.lo);
      } else {
        reg_write(kRax, w / 8, r.lo);
        reg_write(kRdx, w / 8, r.hi);
      }
      s_.rflags = r.flags;
      return;
    }
    case ZYDIS_MNEMONIC_DIV:
    case ZYDIS_MNEMONIC_IDIV: {
      uint64_t divisor = read_operand(insn, 0);
      uint64_t hi = w == 8 ? (s_.gpr[kRax] >> 8) & 0xff : reg_read(kRdx, w / 8);
      uint64_t lo = reg_read(kRax, w == 8 ? 1 : w / 8);
      auto r = insn.mnemonic == ZYDIS_MNEMONIC_DIV ? interp::alu_div(hi, lo, divisor, w)
                                                    : interp::alu_idiv(hi, lo, divisor, w);
      if (r.fault) raise(kDe);
      if (w == 8) {
        reg_write(kRax, 2, ((r.remainder & 0xff) << 8) | (r.quotient & 0xff));
      } else {
        reg_write(kRax, w / 8, r.quotient);
        reg_write(kRdx, w / 8, r.remainder);
      }
      return;
    }
    case ZYDIS_MNEMONIC_XADD: {
      uint64_t dst = read_operand(insn, 0), src = read_operand(insn, 1);
      auto r = alu_binary(BinaryOp::kAdd, dst, src, w, s_.rflags);
      // Source first: with the same register in both operands the sum is what remains.
      write_operand(insn, 1, dst);
      write_operand(insn, 0, r.value);
      s_.rflags = r.flags;
      return;
    }
    case ZYDIS_MNEMONIC_CMPXCHG: {
      uint64_t dst = read_operand(insn, 0);
      uint64_t acc = reg_read(kRax, w / 8);
      auto r = alu_binary(BinaryOp::kCmp, acc, dst, w, s_.rflags);
      if (r.flags & interp::kZf) {
        write_operand(insn, 0, read_operand(insn, 1));
      } else {
        // The destination is written back unchanged (the locked cycle always writes), then RAX loaded.
        if (insn.op[0].kind == OpKind::kMem) write_operand(insn, 0, dst);
        reg_write(kRax, w / 8, dst);
      }
      s_.rflags = r.flags;
      return;
    }
    case ZYDIS_MNEMONIC_CMPXCHG8B:
    case ZYDIS_MNEMONIC_CMPXCHG16B: {
      const Operand& m = insn.op[0];
      if (m.kind != OpKind::kMem) raise_ud(insn, false);
      uint64_t address = effective_address(m, insn);
      if (insn.mnemonic == ZYDIS_MNEMONIC_CMPXCHG8B) {
        uint64_t old = read_mem(m.seg, address, 8);
        uint64_t expected = (reg_read(kRdx, 4) << 32) | reg_read(kRax, 4);
        if (old == expected) {
          write_mem(m.seg, address, 8, (reg_read(kRcx, 4) << 32) | reg_read(kRbx, 4));
          s_.rflags |= interp::kZf;
        } else {
          write_mem(m.seg, address, 8, old);
          reg_write(kRax, 4, old);
          reg_write(kRdx, 4, old >> 32);
          s_.rflags &= ~interp::kZf;
        }
        return;
      }
      if (address & 15) raise(kGp, 0, true);
      uint64_t lo = read_mem(m.seg, address, 8), hi = read_mem(m.seg, address + 8, 8);
      if (lo == s_.gpr[kRax] && hi == s_.gpr[kRdx]) {
        write_mem(m.seg, address, 8, s_.gpr[kRbx]);
        write_mem(m.seg, address + 8, 8, s_.gpr[kRcx]);
        s_.rflags |= interp::kZf;
      } else {
        write_mem(m.seg, address, 8, lo);
        write_mem(m.seg, address + 8, 8, hi);
        s_.gpr[kRax] = lo;
        s_.gpr[kRdx] = hi;
        s_.rflags &= ~interp::kZf;
      }
      return;
    }

    // ---- flags ----
    case ZYDIS_MNEMONIC_CLC: s_.rflags &= ~rflags::kCf; return;
    case ZYDIS_MNEMONIC_STC: s_.rflags |= rflags::kCf; return;
    case ZYDIS_MNEMONIC_CMC: s_.rflags ^= rflags::kCf; return;
    case ZYDIS_MNEMONIC_CLD: s_.rflags &= ~rflags::kDf; return;
    case ZYDIS_MNEMONIC_STD: s_.rflags |= rflags::kDf; return;
    case ZYDIS_MNEMONIC_CLI:
    case ZYDIS_MNEMONIC_STI: {
      if ((s_.cr0 & cr0::kPe) && cpl() > ((s_.rflags >> 12) & 3)) raise(kGp, 0, true);
      if (insn.mnemonic == ZYDIS_MNEMONIC_CLI) {
        s_.rflags &= ~rflags::kIf;
      } else {
        if (!(s_.rflags & rflags::kIf)) shadow_next_ = true;
        s_.rflags |= rflags::kIf;
      }
      return;
    }

    // ---- control transfer ----
    case ZYDIS_MNEMONIC_JO: case ZYDIS_MNEMONIC_JNO: case ZYDIS_MNEMONIC_JB: case ZYDIS_MNEMONIC_JNB:
    case ZYDIS_MNEMONIC_JZ: case ZYDIS_MNEMONIC_JNZ: case ZYDIS_MNEMONIC_JBE: case ZYDIS_MNEMONIC_JNBE:
    case ZYDIS_MNEMONIC_JS: case ZYDIS_MNEMONIC_JNS: case ZYDIS_MNEMONIC_JP: case ZYDIS_MNEMONIC_JNP:
    case ZYDIS_MNEMONIC_JL: case ZYDIS_MNEMONIC_JNL: case ZYDIS_MNEMONIC_JLE: case ZYDIS_MNEMONIC_JNLE: {
      if (interp::condition_holds(insn.opcode & 0xf, s_.rflags)) set_rip(jump_target(0));
      ++branches_;
      return;
    }
    case ZYDIS_MNEMONIC_JCXZ: case ZYDIS_MNEMONIC_JECXZ: case ZYDIS_MNEMONIC_JRCXZ: {
      if (reg_read(kRcx, insn.addrsize / 8) == 0) set_rip(jump_target(0));
      ++branches_;
      return;
    }
    case ZYDIS_MNEMONIC_LOOP: case ZYDIS_MNEMONIC_LOOPE: case ZYDIS_MNEMONIC_LOOPNE: {
      unsigned bytes = insn.addrsize / 8;
      uint64_t count = (reg_read(kRcx, bytes) - 1) & mask_for(bytes);
      bool taken = count != 0;
      if (insn.mnemonic == ZYDIS_MNEMONIC_LOOPE) taken = taken && (s_.rflags & rflags::kZf);
      if (insn.mnemonic == ZYDIS_MNEMONIC_LOOPNE) taken = taken && !(s_.rflags & rflags::kZf);
      uint64_t target = jump_target(0);
      if (taken) set_rip(target);
      reg_write(kRcx, bytes, count);
      ++branches_;
      return;
    }
    case ZYDIS_MNEMONIC_JMP: {
      const Operand& op = insn.op[0];
      if (op.kind == OpKind::kImm) {
        set_rip(jump_target(0));
      } else if (op.kind == OpKind::kPtr) {
        load_code_segment_far(op.ptr_sel, uint64_t(op.disp), false, insn.opsize);
      } else if (op.kind == OpKind::kMem && op.size == insn.opsize / 8 + 2) {
        uint64_t address = effective_address(op, insn);
        uint64_t offset = read_mem(op.seg, address, insn.opsize / 8);
        uint16_t selector = uint16_t(read_mem(op.seg, address + insn.opsize / 8, 2));
        load_code_segment_far(selector, offset, false, insn.opsize);
      } else {
        set_rip(read_operand(insn, 0));
      }
      return;
    }
    case ZYDIS_MNEMONIC_CALL: {
      const Operand& op = insn.op[0];
      if (op.kind == OpKind::kPtr) {
        load_code_segment_far(op.ptr_sel, uint64_t(op.disp), true, insn.opsize);
        return;
      }
      if (op.kind == OpKind::kMem && op.size == insn.opsize / 8 + 2) {
        uint64_t address = effective_address(op, insn);
        uint64_t offset = read_mem(op.seg, address, insn.opsize / 8);
        uint16_t selector = uint16_t(read_mem(op.seg, address + insn.opsize / 8, 2));
        load_code_segment_far(selector, offset, true, insn.opsize);
        return;
      }
      uint64_t target = op.kind == OpKind::kImm ? jump_target(0) : read_operand(insn, 0);
      if (mode64()) canonical_check(target, false);
      push(next_rip_, stack_bytes());
      set_rip(target);
      return;
    }
    case ZYDIS_MNEMONIC_RET: {
      uint16_t extra = insn.operand_count >= 1 && insn.op[0].kind == OpKind::kImm ? uint16_t(insn.op[0].disp) : 0;
      if (insn.opcode == 0xca || insn.opcode == 0xcb) {
        far_return(insn.opsize, extra);
        return;
      }
      uint64_t saved_rsp = s_.gpr[kRsp];
      uint64_t target = pop(stack_bytes());
      try {
        set_rip(target);
      } catch (...) {
        s_.gpr[kRsp] = saved_rsp;
        throw;
      }
      reg_write(kRsp, stack_addr_size(), s_.gpr[kRsp] + extra);
      return;
    }
    case ZYDIS_MNEMONIC_IRET: case ZYDIS_MNEMONIC_IRETD: case ZYDIS_MNEMONIC_IRETQ:
      iret(insn.opsize);
      return;
    case ZYDIS_MNEMONIC_INT: software_interrupt_ = int(insn.op[0].disp & 0xff); return;
    case ZYDIS_MNEMONIC_INT3: software_interrupt_ = kBp; return;
    case ZYDIS_MNEMONIC_INT1: icebp_ = true; software_interrupt_ = kDb; return;
    case ZYDIS_MNEMONIC_INTO:
      if (mode64()) raise_ud(insn, false);
      if (s_.rflags & rflags::kOf) software_interrupt_ = kOf;
      return;
    case ZYDIS_MNEMONIC_UD0: case ZYDIS_MNEMONIC_UD1: case ZYDIS_MNEMONIC_UD2: raise_ud(insn, false);

    case ZYDIS_MNEMONIC_PAUSE:
      pause_executed_ = pause_exits_;
      return;
    // ---- no-ops ----
    case ZYDIS_MNEMONIC_NOP: case ZYDIS_MNEMONIC_LFENCE: case ZYDIS_MNEMONIC_MFENCE:
    case ZYDIS_MNEMONIC_SFENCE: case ZYDIS_MNEMONIC_PREFETCHT0: case ZYDIS_MNEMONIC_PREFETCHT1:
    case ZYDIS_MNEMONIC_PREFETCHT2: case ZYDIS_MNEMONIC_PREFETCHNTA: case ZYDIS_MNEMONIC_PREFETCHW:
    case ZYDIS_MNEMONIC_ENDBR32: case ZYDIS_MNEMONIC_ENDBR64:
      return;
    case ZYDIS_MNEMONIC_CLFLUSH:
      if (!cpuid_bit(model_, 1, 3, 19)) raise_ud(insn, false);
      return;

    // ---- strings ----
    case ZYDIS_MNEMONIC_MOVSB: case ZYDIS_MNEMONIC_MOVSW: case ZYDIS_MNEMONIC_MOVSQ:
    case ZYDIS_MNEMONIC_STOSB: case ZYDIS_MNEMONIC_STOSW: case ZYDIS_MNEMONIC_STOSD: case ZYDIS_MNEMONIC_STOSQ:
    case ZYDIS_MNEMONIC_LODSB: case ZYDIS_MNEMONIC_LODSW: case ZYDIS_MNEMONIC_LODSD: case ZYDIS_MNEMONIC_LODSQ:
    case ZYDIS_MNEMONIC_CMPSB: case ZYDIS_MNEMONIC_CMPSW: case ZYDIS_MNEMONIC_CMPSQ:
    case ZYDIS_MNEMONIC_SCASB: case ZYDIS_MNEMONIC_SCASW: case ZYDIS_MNEMONIC_SCASD: case ZYDIS_MNEMONIC_SCASQ:
    case ZYDIS_MNEMONIC_INSB: case ZYDIS_MNEMONIC_INSW: case ZYDIS_MNEMONIC_INSD:
    case ZYDIS_MNEMONIC_OUTSB: case ZYDIS_MNEMONIC_OUTSW: case ZYDIS_MNEMONIC_OUTSD:
      exec_string(insn);
      return;
    case ZYDIS_MNEMONIC_MOVSD:
    case ZYDIS_MNEMONIC_CMPSD:
      if (insn.opcode_map == ZYDIS_OPCODE_MAP_DEFAULT) {
        exec_string(insn);
      } else {
        exec_sse(insn);
        s_.xinuse |= insn.xinuse;
      }
      return;

    default:
      exec_system(insn);
      return;
  }
}

void InterpBackend::exec_string(const DecodedInsn& insn) {
  const unsigned asize = insn.addrsize / 8;
  const uint64_t amask = mask_for(asize);
  const bool rep = insn.flags & (interp::insn_flags::kRep | interp::insn_flags::kRepne);
  if (rep && (s_.gpr[kRcx] & amask) == 0) return;
  unsigned n = 1;
  enum { kMovs, kStos, kLods, kCmps, kScas, kIns, kOuts } kind = kMovs;
  switch (ZydisMnemonic(insn.mnemonic)) {
    case ZYDIS_MNEMONIC_MOVSB: n = 1; kind = kMovs; break;
    case ZYDIS_MNEMONIC_MOVSW: n = 2; kind = kMovs; break;
    case ZYDIS_MNEMONIC_MOVSD: n = 4; kind = kMovs; break;
    case ZYDIS_MNEMONIC_MOVSQ: n = 8; kind = kMovs; break;
    case ZYDIS_MNEMONIC_STOSB: n = 1; kind = kStos; break;
    case ZYDIS_MNEMONIC_STOSW: n = 2; kind = kStos; break;
    case ZYDIS_MNEMONIC_STOSD: n = 4; kind = kStos; break;
    case ZYDIS_MNEMONIC_STOSQ: n = 8; kind = kStos; break;
    case ZYDIS_MNEMONIC_LODSB: n = 1; kind = kLods; break;
    case ZYDIS_MNEMONIC_LODSW: n = 2; kind = kLods; break;
    case ZYDIS_MNEMONIC_LODSD: n = 4; kind = kLods; break;
    case ZYDIS_MNEMONIC_LODSQ: n = 8; kind = kLods; break;
    case ZYDIS_MNEMONIC_CMPSB: n = 1; kind = kCmps; break;
    case ZYDIS_MNEMONIC_CMPSW: n = 2; kind = kCmps; break;
    case ZYDIS_MNEMONIC_CMPSD: n = 4; kind = kCmps; break;
    case ZYDIS_MNEMONIC_CMPSQ: n = 8; kind = kCmps; break;
    case ZYDIS_MNEMONIC_SCASB: n = 1; kind = kScas; break;
    case ZYDIS_MNEMONIC_SCASW: n = 2; kind = kScas; break;
    case ZYDIS_MNEMONIC_SCASD: n = 4; kind = kScas; break;
    case ZYDIS_MNEMONIC_SCASQ: n = 8; kind = kScas; break;
    case ZYDIS_MNEMONIC_INSB: n = 1; kind = kIns; break;
    case ZYDIS_MNEMONIC_INSW: n = 2; kind = kIns; break;
    case ZYDIS_MNEMONIC_INSD: n = 4; kind = kIns; break;
    case ZYDIS_MNEMONIC_OUTSB: n = 1; kind = kOuts; break;
    case ZYDIS_MNEMONIC_OUTSW: n = 2; kind = kOuts; break;
    default: n = 4; kind = kOuts; break;
  }
  const int src_seg = insn.seg_override != 0xff ? insn.seg_override : 3;
  const uint64_t rsi = s_.gpr[kRsi] & amask, rdi = s_.gpr[kRdi] & amask;
  const uint64_t step = (s_.rflags & rflags::kDf) ? uint64_t(-int64_t(n)) : n;
  bool advance_si = false, advance_di = false;
  switch (kind) {
    case kMovs: write_mem(0, rdi, n, read_mem(src_seg, rsi, n)); advance_si = advance_di = true; break;
    case kStos: write_mem(0, rdi, n, s_.gpr[kRax]); advance_di = true; break;
    case kLods: reg_write(kRax, n, read_mem(src_seg, rsi, n)); advance_si = true; break;
    case kCmps: {
      uint64_t a = read_mem(src_seg, rsi, n), b = read_mem(0, rdi, n);
      s_.rflags = interp::alu_binary(interp::BinaryOp::kCmp, a, b, n * 8, s_.rflags).flags;
      advance_si = advance_di = true;
      break;
    }
    case kScas: {
      uint64_t b = read_mem(0, rdi, n);
      s_.rflags = interp::alu_binary(interp::BinaryOp::kCmp, s_.gpr[kRax], b, n * 8, s_.rflags).flags;
      advance_di = true;
      break;
    }
    case kIns: {
      // Probe the destination first so a page fault cannot swallow a device read.
      probe_write(0, rdi, n);
      write_mem(0, rdi, n, port_in(uint16_t(s_.gpr[kRdx]), n));
      advance_di = true;
      break;
    }
    case kOuts: port_out(uint16_t(s_.gpr[kRdx]), n, read_mem(src_seg, rsi, n)); advance_si = true; break;
  }
  if (advance_si) reg_write(kRsi, asize, rsi + step);
  if (advance_di) reg_write(kRdi, asize, rdi + step);
  if (!rep) return;
  uint64_t count = ((s_.gpr[kRcx] & amask) - 1) & amask;
  reg_write(kRcx, asize, count);
  bool done = count == 0;
  if (kind == kCmps || kind == kScas) {
    bool zf = s_.rflags & rflags::kZf;
    if ((insn.flags & interp::insn_flags::kRepne) ? zf : !zf) done = true;
  }
  if (!done) {
    next_rip_ = insn_rip_;  // stay on the instruction: the next iteration is a separate step
    rep_continues_ = true;
  }
}

}  // namespace deja
