// System instructions of the software CPU: CPUID, MSRs, TSC/RNG and I/O exits, HLT, descriptor tables, SYSCALL/SYSRET.
#include <Zydis/Zydis.h>

#include <cstring>

#include "interp/alu.h"
#include "interp/interp_backend.h"

namespace deja {

using interp::DecodedInsn;
using interp::OpKind;

namespace {
constexpr uint8_t kGp = 13;

bool cpuid_has(const CpuModel& model, uint32_t leaf, int reg, int bit) {
  CpuidResult r = model.cpuid(leaf, 0);
  uint32_t regs[4] = {r.eax, r.ebx, r.ecx, r.edx};
  return (regs[reg] >> bit) & 1;
}
}  // namespace

void InterpBackend::exec_system(const DecodedInsn& insn) {
  auto require_cpl0 = [&] {
    if ((s_.cr0 & cr0::kPe) && cpl() != 0) raise(kGp, 0, true);
  };
  switch (ZydisMnemonic(insn.mnemonic)) {
    case ZYDIS_MNEMONIC_CPUID: {
      CpuidResult r = cpuid(uint32_t(s_.gpr[kRax]), uint32_t(s_.gpr[kRcx]));
      s_.gpr[kRax] = r.eax;
      s_.gpr[kRbx] = r.ebx;
      s_.gpr[kRcx] = r.ecx;
      s_.gpr[kRdx] = r.edx;
      return;
    }
    case ZYDIS_MNEMONIC_RDMSR: {
      uint64_t value = msr_read(uint32_t(s_.gpr[kRcx]));
      s_.gpr[kRax] = value & 0xffffffffu;
      s_.gpr[kRdx] = value >> 32;
      return;
    }
    case ZYDIS_MNEMONIC_WRMSR:
      msr_write(uint32_t(s_.gpr[kRcx]), (s_.gpr[kRdx] << 32) | (s_.gpr[kRax] & 0xffffffffu));
      return;
    case ZYDIS_MNEMONIC_RDTSC:
    case ZYDIS_MNEMONIC_RDTSCP: {
      const bool rdtscp = insn.mnemonic == ZYDIS_MNEMONIC_RDTSCP;
      if (rdtscp && !cpuid_has(model_, 0x80000001, 3, 27)) raise_ud(insn, false);
      if ((s_.cr4 & 4 /* TSD */) && cpl() != 0 && (s_.cr0 & cr0::kPe)) raise(kGp, 0, true);
      uint64_t value = 0;
      if (inline_tsc_) {
        value = inline_tsc_();
      } else if (!take_response(ExitKind::kRdtsc, 0, value)) {
        exit_ = VcpuExit{};
        exit_.kind = ExitKind::kRdtsc;
        exit_.is_rdtscp = rdtscp;
        defer_exit();
        return;
      }
      s_.gpr[kRax] = value & 0xffffffffu;
      s_.gpr[kRdx] = value >> 32;
      if (rdtscp) s_.gpr[kRcx] = s_.msrs.tsc_aux & 0xffffffffu;
      return;
    }
    case ZYDIS_MNEMONIC_RDRAND:
    case ZYDIS_MNEMONIC_RDSEED: {
      const bool seed = insn.mnemonic == ZYDIS_MNEMONIC_RDSEED;
      if (seed ? !cpuid_has(model_, 7, 1, 18) : !cpuid_has(model_, 1, 2, 30)) raise_ud(insn, false);
      uint64_t value = 0;
      bool ok = true;
      if (!take_response(ExitKind::kRdrand, 0, value, nullptr, &ok)) {
        exit_ = VcpuExit{};
        exit_.kind = ExitKind::kRdrand;
        exit_.is_rdseed = seed;
        exit_.size = insn.op[0].size;
        request_exit();
      }
      write_operand(insn, 0, ok ? value : 0);
      s_.rflags &= ~interp::kArithFlags;
      if (ok) s_.rflags |= interp::kCf;
      return;
    }
    case ZYDIS_MNEMONIC_IN: {
      uint16_t port = uint16_t(insn.op[1].kind == OpKind::kImm ? insn.op[1].disp & 0xff : s_.gpr[kRdx] & 0xffff);
      unsigned size = insn.op[0].size;
      uint64_t value = 0;
      if (!try_port_in(port, size, value)) {
        defer_exit();
        return;
      }
      reg_write(kRax, size, value);
      return;
    }
    case ZYDIS_MNEMONIC_OUT: {
      uint16_t port = uint16_t(insn.op[0].kind == OpKind::kImm ? insn.op[0].disp & 0xff : s_.gpr[kRdx] & 0xffff);
      unsigned size = insn.op[1].size;
      if (!try_port_out(port, size, reg_read(kRax, size))) defer_exit();
      return;
    }
    case ZYDIS_MNEMONIC_HLT:
      require_cpl0();
      hlt_executed_ = true;
      return;
    case ZYDIS_MNEMONIC_LGDT:
    case ZYDIS_MNEMONIC_LIDT: {
      require_cpl0();
      const auto& m = insn.op[0];
      if (m.kind != OpKind::kMem) raise_ud(insn, false);
      uint64_t address = effective_address(m, insn);
      uint16_t limit = uint16_t(read_mem(m.seg, address, 2));
      uint64_t base = read_mem(m.seg, address + 2, mode64() ? 8 : 4);
      if (!mode64() && insn.opsize == 16) base &= 0xffffff;
      if (mode64()) canonical_check(base, false);
      TableReg& table = insn.mnemonic == ZYDIS_MNEMONIC_LGDT ? s_.gdt : s_.idt;
      table.base = base;
      table.limit = limit;
      return;
    }
    case ZYDIS_MNEMONIC_SGDT:
    case ZYDIS_MNEMONIC_SIDT: {
      const auto& m = insn.op[0];
      if (m.kind != OpKind::kMem) raise_ud(insn, false);
      const TableReg& table = insn.mnemonic == ZYDIS_MNEMONIC_SGDT ? s_.gdt : s_.idt;
      uint64_t address = effective_address(m, insn);
      write_mem(m.seg, address, 2, table.limit);
      write_mem(m.seg, address + 2, mode64() ? 8 : 4, table.base);
      return;
    }
    case ZYDIS_MNEMONIC_LTR:
    case ZYDIS_MNEMONIC_LLDT: {
      require_cpl0();
      if (!(s_.cr0 & cr0::kPe)) raise_ud(insn, false);
      const bool is_tr = insn.mnemonic == ZYDIS_MNEMONIC_LTR;
      uint16_t selector = uint16_t(read_operand(insn, 0));
      if ((selector & 0xfffc) == 0) {
        if (is_tr) raise(kGp, 0, true);
        s_.ldt = SegmentReg{};
        s_.ldt.selector = selector;
        s_.ldt.unusable = true;
        return;
      }
      if (selector & 4) raise(kGp, selector & 0xfffc, true);
      uint64_t address = descriptor_address(selector, kGp);
      uint64_t lo = read_sys(address, 8);
      unsigned type = (lo >> 40) & 0xf;
      bool system = !((lo >> 44) & 1);
      bool ok = system && (is_tr ? (type == 9 || type == 1) : type == 2);
      if (!ok) raise(kGp, selector & 0xfffc, true);
      if (!((lo >> 47) & 1)) raise(11, selector & 0xfffc, true);
      SegmentReg seg_reg;
      seg_reg.selector = selector;
      seg_reg.limit = uint32_t((lo & 0xffff) | ((lo >> 32) & 0xf0000));
      seg_reg.base = ((lo >> 16) & 0xffffff) | (((lo >> 56) & 0xff) << 24);
      if (long_mode()) seg_reg.base |= (read_sys(address + 8, 8) & 0xffffffffu) << 32;
      seg_reg.g = (lo >> 55) & 1;
      if (seg_reg.g) seg_reg.limit = (seg_reg.limit << 12) | 0xfff;
      seg_reg.present = true;
      seg_reg.dpl = uint8_t((lo >> 45) & 3);
      seg_reg.type = uint8_t(type);
      if (is_tr) {
        seg_reg.type = uint8_t(type | 2);  // busy
        write_sys(address + 5, 1, (lo >> 40 & 0xff) | 2);
        s_.tr = seg_reg;
      } else {
        s_.ldt = seg_reg;
      }
      return;
    }
    case ZYDIS_MNEMONIC_STR:
    case ZYDIS_MNEMONIC_SLDT: {
      uint16_t selector = insn.mnemonic == ZYDIS_MNEMONIC_STR ? s_.tr.selector : s_.ldt.selector;
      if (insn.op[0].kind == OpKind::kMem) write_mem(insn.op[0].seg, effective_address(insn.op[0], insn), 2, selector);
      else reg_write(insn.op[0].reg, insn.op[0].size, selector);
      return;
    }
    case ZYDIS_MNEMONIC_SMSW: {
      if (insn.op[0].kind == OpKind::kMem) write_mem(insn.op[0].seg, effective_address(insn.op[0], insn), 2, s_.cr0 & 0xffff);
      else reg_write(insn.op[0].reg, insn.op[0].size, s_.cr0);
      return;
    }
    case ZYDIS_MNEMONIC_LMSW: {
      require_cpl0();
      uint64_t value = read_operand(insn, 0) & 0xf;
      // LMSW can set PE but never clear it.
      set_cr(0, (s_.cr0 & ~0xeull) | (value & 0xe) | ((s_.cr0 | value) & 1));
      return;
    }
    case ZYDIS_MNEMONIC_CLTS:
      require_cpl0();
      s_.cr0 &= ~cr0::kTs;
      return;
    case ZYDIS_MNEMONIC_INVLPG: {
      require_cpl0();
      const auto& m = insn.op[0];
      uint64_t linear = effective_address(m, insn) + (mode64() && m.seg < 4 ? 0 : segment_base(m.seg));
      if (!mode64()) linear &= 0xffffffffu;
      if (TlbEntry& entry = tlb_entry(linear); entry.tag == (linear >> 12)) {
        entry = TlbEntry{};
        entry.listed = true;  // (still in tlb_live_)
      }
      invalidate_fetch();
      return;
    }
    case ZYDIS_MNEMONIC_VERR:
    case ZYDIS_MNEMONIC_VERW: {
      // ZF says whether the selector names a segment readable (writable) at this CPL and RPL; nothing faults
      // on the descriptor. Linux's MDS mitigation runs VERW on a data selector at every return to user space.
      if (!(s_.cr0 & cr0::kPe) || (s_.rflags & rflags::kVm)) raise_ud(insn, false);
      const uint16_t selector = uint16_t(read_operand(insn, 0));
      const bool write = insn.mnemonic == ZYDIS_MNEMONIC_VERW;
      bool ok = false;
      const bool local = selector & 4;
      const uint32_t limit = local ? s_.ldt.limit : s_.gdt.limit;
      if ((selector & 0xfffc) != 0 && !(local && s_.ldt.unusable) && (selector & 0xfff8) + 7u <= limit) {
        const uint64_t lo = read_sys((local ? s_.ldt.base : s_.gdt.base) + (selector & 0xfff8), 8);
        const bool code_or_data = (lo >> 44) & 1;
        const unsigned type = (lo >> 40) & 0xf, dpl = (lo >> 45) & 3;
        const bool code = type & 8, conforming = code && (type & 4);
        const bool privileged_enough = conforming || (cpl() <= dpl && (selector & 3u) <= dpl);
        const bool allowed = write ? !code && (type & 2) : !code || (type & 2);
        ok = code_or_data && privileged_enough && allowed;
      }
      s_.rflags = ok ? s_.rflags | rflags::kZf : s_.rflags & ~rflags::kZf;
      return;
    }
    case ZYDIS_MNEMONIC_WBINVD:
    case ZYDIS_MNEMONIC_INVD:
      require_cpl0();
      return;
    case ZYDIS_MNEMONIC_SWAPGS: {
      if (!mode64()) raise_ud(insn, false);
      require_cpl0();
      std::swap(s_.gs.base, s_.msrs.kernel_gs_base);
      return;
    }
    case ZYDIS_MNEMONIC_SYSCALL: {
      // In compatibility mode AMD's CPUs enter the 64-bit kernel at CSTAR (Linux's 32-bit programs take this
      // path on AMD: X86_FEATURE_SYSCALL32); Intel's, and deja's own vendor, #UD. Legacy mode: #UD.
      const bool compat = long_mode() && !mode64();
      if (!(mode64() || (compat && model_.is_amd())) || !(s_.efer & efer::kSce)) raise_ud(insn, false);
      s_.gpr[kRcx] = next_rip_;
      s_.gpr[kR11] = s_.rflags & ~rflags::kRf;
      s_.rflags = (s_.rflags & ~(s_.msrs.sfmask | rflags::kRf)) | 2;
      uint16_t selector = uint16_t((s_.msrs.star >> 32) & 0xfffc);
      SegmentReg cs;
      cs.selector = selector;
      cs.limit = 0xffffffff;
      cs.type = 0xb;
      cs.s = true;
      cs.present = true;
      cs.l = true;
      cs.g = true;
      s_.cs = cs;
      SegmentReg ss;
      ss.selector = uint16_t(selector + 8);
      ss.limit = 0xffffffff;
      ss.type = 0x3;
      ss.s = true;
      ss.present = true;
      ss.db = true;
      ss.g = true;
      s_.ss = ss;
      next_rip_ = compat ? s_.msrs.cstar : s_.msrs.lstar;
      return;
    }
    case ZYDIS_MNEMONIC_SYSRET: {
      if (!long_mode() || !(s_.efer & efer::kSce)) raise_ud(insn, false);
      if (!mode64() || cpl() != 0) raise(kGp, 0, true);
      const bool to64 = insn.flags & interp::insn_flags::kRexW;
      uint64_t target = to64 ? s_.gpr[kRcx] : (s_.gpr[kRcx] & 0xffffffffu);
      if (to64) canonical_check(target, false);
      uint16_t base = uint16_t((s_.msrs.star >> 48) & 0xffff);
      SegmentReg cs;
      cs.selector = uint16_t((to64 ? base + 16 : base) | 3);
      cs.limit = 0xffffffff;
      cs.type = 0xb;
      cs.s = true;
      cs.dpl = 3;
      cs.present = true;
      cs.l = to64;
      cs.db = !to64;
      cs.g = true;
      SegmentReg ss;
      ss.selector = uint16_t((base + 8) | 3);
      ss.limit = 0xffffffff;
      ss.type = 0x3;
      ss.s = true;
      ss.dpl = 3;
      ss.present = true;
      ss.db = true;
      ss.g = true;
      s_.rflags = (s_.gpr[kR11] & 0x3c7fd7) | 2;
      s_.cs = cs;
      s_.ss = ss;
      next_rip_ = target;
      return;
    }
    case ZYDIS_MNEMONIC_FXSAVE: case ZYDIS_MNEMONIC_FXSAVE64: case ZYDIS_MNEMONIC_FXRSTOR:
    case ZYDIS_MNEMONIC_FXRSTOR64: case ZYDIS_MNEMONIC_LDMXCSR: case ZYDIS_MNEMONIC_STMXCSR:
      exec_sse(insn);
      s_.xinuse |= insn.xinuse;
      return;
    case ZYDIS_MNEMONIC_XSAVE: case ZYDIS_MNEMONIC_XSAVE64: case ZYDIS_MNEMONIC_XSAVEOPT:
    case ZYDIS_MNEMONIC_XSAVEOPT64: case ZYDIS_MNEMONIC_XSAVEC: case ZYDIS_MNEMONIC_XSAVEC64:
    case ZYDIS_MNEMONIC_XSAVES: case ZYDIS_MNEMONIC_XSAVES64: case ZYDIS_MNEMONIC_XRSTOR:
    case ZYDIS_MNEMONIC_XRSTOR64: case ZYDIS_MNEMONIC_XRSTORS: case ZYDIS_MNEMONIC_XRSTORS64:
    case ZYDIS_MNEMONIC_XGETBV: case ZYDIS_MNEMONIC_XSETBV:
      exec_xsave(insn);
      return;
    default:
      // (Each of these sets the XINUSE bits of what it wrote once it has completed: a fault sets none.)
      if (insn.flags & interp::insn_flags::kVex) {
        exec_avx(insn);
      } else if (insn.opcode_map == ZYDIS_OPCODE_MAP_DEFAULT &&
                 ((insn.opcode & 0xf8) == 0xd8 || insn.opcode == 0x9b)) {
        exec_x87(insn);  // the x87 escape opcodes D8-DF and FWAIT (interp/x87.cpp)
      } else {
        exec_sse(insn);
      }
      s_.xinuse |= insn.xinuse;
      return;
  }
}

}  // namespace deja
