// System architecture of the software CPU: segments and descriptors, control registers, MSRs, I/O, event delivery.
#include <fmt/format.h>

#include "interp/alu.h"
#include "interp/interp_backend.h"

namespace deja {
namespace {

constexpr uint8_t kDe = 0, kUd = 6, kDf = 8, kTs = 10, kNp = 11, kSs = 12, kGp = 13, kPf = 14;

SegmentReg parse_descriptor(uint64_t lo, uint16_t selector) {
  SegmentReg seg;
  seg.selector = selector;
  seg.limit = uint32_t((lo & 0xffff) | ((lo >> 32) & 0xf0000));
  seg.base = ((lo >> 16) & 0xffffff) | (((lo >> 56) & 0xff) << 24);
  seg.type = uint8_t((lo >> 40) & 0xf);
  seg.s = (lo >> 44) & 1;
  seg.dpl = uint8_t((lo >> 45) & 3);
  seg.present = (lo >> 47) & 1;
  seg.avl = (lo >> 52) & 1;
  seg.l = (lo >> 53) & 1;
  seg.db = (lo >> 54) & 1;
  seg.g = (lo >> 55) & 1;
  if (seg.g) seg.limit = (seg.limit << 12) | 0xfff;
  return seg;
}

bool is_code(const SegmentReg& seg) { return seg.s && (seg.type & 8); }
bool is_conforming(const SegmentReg& seg) { return is_code(seg) && (seg.type & 4); }

bool contributory(int vector) { return vector == kDe || (vector >= kTs && vector <= kGp); }

}  // namespace

SegmentReg& InterpBackend::seg(int index) {
  switch (index) {
    case 0: return s_.es;
    case 1: return s_.cs;
    case 2: return s_.ss;
    case 3: return s_.ds;
    case 4: return s_.fs;
    default: return s_.gs;
  }
}

uint64_t InterpBackend::descriptor_address(uint16_t selector, uint8_t vector_on_fault) {
  const bool local = selector & 4;
  uint64_t base = local ? s_.ldt.base : s_.gdt.base;
  uint32_t limit = local ? s_.ldt.limit : s_.gdt.limit;
  if (local && s_.ldt.unusable) raise(vector_on_fault, selector & 0xfffc, true);
  uint32_t offset = selector & 0xfff8;
  if (offset + 7 > limit) raise(vector_on_fault, selector & 0xfffc, true);
  return base + offset;
}

SegmentReg InterpBackend::read_descriptor(uint16_t selector, uint8_t vector_on_fault) {
  uint64_t address = descriptor_address(selector, vector_on_fault);
  return parse_descriptor(read_sys(address, 8), selector);
}

void InterpBackend::load_segment(int index, uint16_t selector, bool by_transfer) {
  if (!(s_.cr0 & cr0::kPe)) {
    // Real mode: the selector is a paragraph number.
    SegmentReg& target = seg(index);
    target.selector = selector;
    target.base = uint64_t(selector) << 4;
    return;
  }
  const uint16_t rpl = selector & 3;
  if ((selector & 0xfffc) == 0) {
    if (index == 2 && !(mode64() && cpl() != 3 && rpl == cpl())) raise(kGp, 0, true);
    SegmentReg null_seg;
    null_seg.selector = selector;
    null_seg.unusable = true;
    null_seg.dpl = index == 2 ? uint8_t(cpl()) : 0;
    if (index == 2) null_seg.db = true;
    seg(index) = null_seg;
    return;
  }
  SegmentReg desc = read_descriptor(selector, kGp);
  const uint32_t error = selector & 0xfffc;
  if (index == 2) {
    bool writable_data = desc.s && !(desc.type & 8) && (desc.type & 2);
    if (rpl != cpl() || !writable_data || desc.dpl != cpl()) raise(kGp, error, true);
    if (!desc.present) raise(kSs, error, true);
  } else {
    bool readable = desc.s && (!(desc.type & 8) || (desc.type & 2));
    if (!readable) raise(kGp, error, true);
    if (!is_conforming(desc) && (rpl > desc.dpl || cpl() > desc.dpl)) raise(kGp, error, true);
    if (!desc.present) raise(kNp, error, true);
  }
  mark_accessed(selector, desc, by_transfer);
  seg(index) = desc;
}

// Every load of a code or data descriptor into a segment register sets its accessed bit in the
// table (SDM vol. 3A 3.4.5.1), CS included: far JMP/CALL/RET, IRET and event delivery too.
// QEMU's TCG, the CPU under the nested KVM harness, skips it for all but MOV/POP Sreg and LxS: a trace
// recorded there names kCpuQuirkAccessedBitOnlyBySegmentLoads, and its replay here does the same.
void InterpBackend::mark_accessed(uint16_t selector, SegmentReg& desc, bool by_transfer) {
  if (!desc.s || (desc.type & 1)) return;
  if (by_transfer && quirks_.accessed_only_by_segment_loads) return;
  desc.type |= 1;
  uint64_t address = descriptor_address(selector, kGp);
  write_sys(address + 5, 1, uint64_t(desc.type) | (uint64_t(desc.s) << 4) | (uint64_t(desc.dpl) << 5) |
                                (uint64_t(desc.present) << 7));
}

// Far JMP/CALL to a code segment (call gates are not implemented: #GP).
void InterpBackend::load_code_segment_far(uint16_t selector, uint64_t target, bool is_call, unsigned opsize) {
  if (!(s_.cr0 & cr0::kPe)) {
    if (is_call) {
      push(s_.cs.selector, opsize / 8);
      push(next_rip_, opsize / 8);
    }
    s_.cs.selector = selector;
    s_.cs.base = uint64_t(selector) << 4;
    next_rip_ = target;
    return;
  }
  if ((selector & 0xfffc) == 0) raise(kGp, 0, true);
  SegmentReg desc = read_descriptor(selector, kGp);
  const uint32_t error = selector & 0xfffc;
  if (!is_code(desc)) raise(kGp, error, true);
  if (is_conforming(desc) ? desc.dpl > cpl() : ((selector & 3) > cpl() || desc.dpl != cpl())) raise(kGp, error, true);
  if (!desc.present) raise(kNp, error, true);
  if (long_mode() && desc.l && desc.db) raise(kGp, error, true);
  if (is_call) {
    push(s_.cs.selector, opsize / 8);
    push(next_rip_, opsize / 8);
  }
  mark_accessed(selector, desc, true);
  desc.selector = uint16_t((selector & ~3) | cpl());
  desc.dpl = uint8_t(cpl());
  s_.cs = desc;
  next_rip_ = (long_mode() && desc.l) ? target : (target & 0xffffffffu);
}

void InterpBackend::far_return(unsigned opsize, uint16_t pop_extra) {
  unsigned bytes = opsize / 8;
  uint64_t rip = pop(bytes);
  uint16_t selector = uint16_t(pop(bytes));
  if (!(s_.cr0 & cr0::kPe)) {
    s_.cs.selector = selector;
    s_.cs.base = uint64_t(selector) << 4;
    s_.gpr[kRsp] += pop_extra;
    next_rip_ = rip & 0xffff;
    return;
  }
  const unsigned new_cpl = selector & 3;
  if ((selector & 0xfffc) == 0) raise(kGp, 0, true);
  if (new_cpl < cpl()) raise(kGp, selector & 0xfffc, true);
  SegmentReg desc = read_descriptor(selector, kGp);
  if (!is_code(desc)) raise(kGp, selector & 0xfffc, true);
  if (!desc.present) raise(kNp, selector & 0xfffc, true);
  s_.gpr[kRsp] += pop_extra;
  mark_accessed(selector, desc, true);
  if (new_cpl > cpl()) {
    uint64_t rsp = pop(bytes);
    uint16_t ss_sel = uint16_t(pop(bytes));
    desc.dpl = uint8_t(new_cpl);
    s_.cs = desc;
    load_segment(2, ss_sel, true);
    s_.gpr[kRsp] = rsp + pop_extra;
  } else {
    desc.dpl = uint8_t(new_cpl);
    s_.cs = desc;
  }
  next_rip_ = (long_mode() && desc.l) ? rip : (rip & 0xffffffffu);
}

void InterpBackend::iret(unsigned opsize) {
  const unsigned bytes = opsize / 8;
  nmi_blocked_ = false;  // IRET ends an NMI handler's blocking, even one that faults (SDM 6.7.1)
  if (!(s_.cr0 & cr0::kPe)) {
    uint64_t rip = pop(bytes);
    uint16_t cs_sel = uint16_t(pop(bytes));
    uint64_t flags = pop(bytes);
    s_.cs.selector = cs_sel;
    s_.cs.base = uint64_t(cs_sel) << 4;
    write_rflags(flags, bytes == 2 ? 0xffff : 0x257fd5);
    next_rip_ = rip;
    return;
  }
  if (s_.rflags & rflags::kNt) {
    if (long_mode()) raise(kGp, 0, true);
    triple_fault("IRET with NT=1 (task switch) is not implemented");
    return;
  }
  uint64_t rip = pop(bytes);
  uint16_t cs_sel = uint16_t(pop(bytes));
  uint64_t flags = pop(bytes);
  const unsigned new_cpl = cs_sel & 3;
  bool pop_stack = mode64() || new_cpl > cpl();
  uint64_t new_rsp = 0;
  uint16_t ss_sel = 0;
  if (pop_stack) {
    new_rsp = pop(bytes);
    ss_sel = uint16_t(pop(bytes));
  }
  if ((cs_sel & 0xfffc) == 0) raise(kGp, 0, true);
  if (new_cpl < cpl()) raise(kGp, cs_sel & 0xfffc, true);
  SegmentReg cs_desc = read_descriptor(cs_sel, kGp);
  if (!is_code(cs_desc)) raise(kGp, cs_sel & 0xfffc, true);
  if (!is_conforming(cs_desc) && cs_desc.dpl != new_cpl) raise(kGp, cs_sel & 0xfffc, true);
  if (!cs_desc.present) raise(kNp, cs_sel & 0xfffc, true);
  if (long_mode() && !cs_desc.l && rip > 0xffffffffu) raise(kGp, 0, true);

  // Flags: IOPL only at CPL 0, IF only when CPL <= IOPL (checked at the old CPL).
  uint64_t mask = rflags::kCf | rflags::kPf | rflags::kAf | rflags::kZf | rflags::kSf | rflags::kTf | rflags::kDf |
                  rflags::kOf | rflags::kNt | rflags::kRf | rflags::kAc | rflags::kId;
  if (bytes == 2) mask &= 0xffff;
  const unsigned iopl = (s_.rflags >> 12) & 3;
  if (cpl() == 0) mask |= rflags::kIopl | (bytes > 2 ? (rflags::kVif | rflags::kVip) : 0);
  if (cpl() <= iopl) mask |= rflags::kIf;
  const unsigned old_cpl = cpl();
  mark_accessed(cs_sel, cs_desc, true);
  cs_desc.dpl = uint8_t(new_cpl);
  s_.cs = cs_desc;
  if (pop_stack) {
    if ((ss_sel & 0xfffc) == 0 && long_mode() && new_cpl != 3 && cs_desc.l) {
      SegmentReg null_ss;
      null_ss.selector = ss_sel;
      null_ss.unusable = true;
      null_ss.dpl = uint8_t(new_cpl);
      null_ss.db = true;
      s_.ss = null_ss;
    } else {
      load_segment(2, ss_sel, true);
    }
    s_.gpr[kRsp] = new_rsp;
    if (!mode64()) s_.gpr[kRsp] &= 0xffffffffu;
  }
  s_.rflags = (s_.rflags & ~mask) | (flags & mask) | 2;
  // Data segments that the new, less privileged level may not use become null (SDM IRET).
  if (new_cpl > old_cpl) {
    for (int index : {0, 3, 4, 5}) {
      SegmentReg& data = seg(index);
      if (!data.unusable && !is_conforming(data) && data.dpl < new_cpl) {
        data = SegmentReg{};
        data.unusable = true;
      }
    }
  }
  next_rip_ = cs_desc.l && long_mode() ? rip : (rip & 0xffffffffu);
}

void InterpBackend::write_rflags(uint64_t value, uint64_t mask) {
  s_.rflags = (s_.rflags & ~mask) | (value & mask) | 2;
}

uint64_t InterpBackend::get_cr(int cr) const {
  switch (cr) {
    case 0: return s_.cr0;
    case 2: return s_.cr2;
    case 3: return s_.cr3;
    case 4: return s_.cr4;
    default: return s_.cr8;
  }
}

void InterpBackend::update_mode() {}

void InterpBackend::set_cr(int cr, uint64_t value) {
  switch (cr) {
    case 0: {
      if (value >> 32) raise(kGp, 0, true);
      value |= cr0::kEt;
      if ((value & cr0::kPg) && !(value & cr0::kPe)) raise(kGp, 0, true);
      if ((value & cr0::kNw) && !(value & cr0::kCd)) raise(kGp, 0, true);
      bool enabling_paging = (value & cr0::kPg) && !(s_.cr0 & cr0::kPg);
      bool disabling_paging = !(value & cr0::kPg) && (s_.cr0 & cr0::kPg);
      if (enabling_paging && (s_.efer & efer::kLme)) {
        if (!(s_.cr4 & cr4::kPae)) raise(kGp, 0, true);
        s_.efer |= efer::kLma;
      }
      if (disabling_paging && long_mode()) {
        if (mode64()) raise(kGp, 0, true);
        s_.efer &= ~efer::kLma;
      }
      if ((value ^ s_.cr0) & (cr0::kPg | cr0::kWp | cr0::kPe)) flush_tlb(true);
      s_.cr0 = value;
      return;
    }
    case 2: s_.cr2 = value; return;
    case 3:
      if (long_mode() && (value >> 52)) raise(kGp, 0, true);
      s_.cr3 = value;
      flush_tlb(false);
      return;
    case 4: {
      // The model offers VME..OSXMMEXCPT (bits 0-10), and OSXSAVE with XSAVE; FSGSBASE, SMEP, ... are absent
      // from CPUID.
      if (value & ~(0x7ffull | (model_has(1, 2, 26) ? cr4::kOsxsave : 0))) raise(kGp, 0, true);
      if (long_mode() && !(value & cr4::kPae)) raise(kGp, 0, true);
      if ((value ^ s_.cr4) & (cr4::kPae | cr4::kPge | cr4::kPse)) flush_tlb(true);
      s_.cr4 = value;
      return;
    }
    case 8:
      if (value >> 4) raise(kGp, 0, true);
      s_.cr8 = value;
      return;
    default: raise(kUd);
  }
}

void InterpBackend::set_efer(uint64_t value) {
  const uint64_t writable = efer::kSce | efer::kLme | efer::kNxe;
  if (value & ~(writable | efer::kLma)) raise(kGp, 0, true);
  if (((value ^ s_.efer) & efer::kLme) && (s_.cr0 & cr0::kPg)) raise(kGp, 0, true);
  if ((value ^ s_.efer) & efer::kNxe) flush_tlb(true);
  s_.efer = (value & writable) | (s_.efer & efer::kLma);
}

uint64_t InterpBackend::msr_read(uint32_t index) {
  if (cpl() != 0) raise(kGp, 0, true);
  if (CpuModel::cpu_owns_msr(index)) {
    switch (index) {
      case msr::kEfer: return s_.efer;
      case msr::kStar: return s_.msrs.star;
      case msr::kLstar: return s_.msrs.lstar;
      case msr::kCstar: return s_.msrs.cstar;
      case msr::kSfmask: return s_.msrs.sfmask;
      case msr::kFsBase: return s_.fs.base;
      case msr::kGsBase: return s_.gs.base;
      case msr::kKernelGsBase: return s_.msrs.kernel_gs_base;
      case msr::kSysenterCs: return s_.msrs.sysenter_cs;
      case msr::kSysenterEsp: return s_.msrs.sysenter_esp;
      case msr::kSysenterEip: return s_.msrs.sysenter_eip;
      case msr::kPat: return s_.msrs.pat;
      default: break;
    }
  }
  uint64_t value = 0;
  bool fault = false;
  if (take_response(ExitKind::kMsrRead, index, value, &fault)) {
    if (fault) raise(kGp, 0, true);
    return value;
  }
  exit_ = VcpuExit{};
  exit_.kind = ExitKind::kMsrRead;
  exit_.msr = index;
  request_exit();
}

void InterpBackend::msr_write(uint32_t index, uint64_t value) {
  if (cpl() != 0) raise(kGp, 0, true);
  auto canonical = [&](uint64_t address) {
    if (!is_canonical(address)) raise(kGp, 0, true);
    return address;
  };
  if (CpuModel::cpu_owns_msr(index)) {
    switch (index) {
      case msr::kEfer: set_efer(value); return;
      case msr::kStar: s_.msrs.star = value; return;
      case msr::kLstar: s_.msrs.lstar = canonical(value); return;
      case msr::kCstar: s_.msrs.cstar = canonical(value); return;
      case msr::kSfmask: s_.msrs.sfmask = value & 0xffffffffu; return;
      case msr::kFsBase: s_.fs.base = canonical(value); return;
      case msr::kGsBase: s_.gs.base = canonical(value); return;
      case msr::kKernelGsBase: s_.msrs.kernel_gs_base = canonical(value); return;
      case msr::kSysenterCs: s_.msrs.sysenter_cs = value & 0xffff; return;
      case msr::kSysenterEsp: s_.msrs.sysenter_esp = canonical(value); return;
      case msr::kSysenterEip: s_.msrs.sysenter_eip = canonical(value); return;
      case msr::kPat:
        for (int i = 0; i < 8; ++i) {
          uint8_t type = uint8_t(value >> (8 * i));
          if (type > 7 || type == 2 || type == 3) raise(kGp, 0, true);
        }
        s_.msrs.pat = value;
        return;
      default: break;
    }
  }
  uint64_t ignored = 0;
  bool fault = false;
  if (take_response(ExitKind::kMsrWrite, index, ignored, &fault)) {
    if (fault) raise(kGp, 0, true);
    return;
  }
  exit_ = VcpuExit{};
  exit_.kind = ExitKind::kMsrWrite;
  exit_.msr = index;
  exit_.value = value;
  request_exit();
}

void InterpBackend::check_io_permission() {
  // The TSS I/O bitmap is not consulted: CPL > IOPL is #GP(0) (documented in docs/interp.md).
  if ((s_.cr0 & cr0::kPe) && cpl() > ((s_.rflags >> 12) & 3)) raise(kGp, 0, true);
}

bool InterpBackend::try_port_in(uint16_t port, unsigned size, uint64_t& value) {
  check_io_permission();
  value = 0;
  if (take_response(ExitKind::kIoIn, port, value)) {
    value &= interp::width_mask(size * 8);
    return true;
  }
  exit_ = VcpuExit{};
  exit_.kind = ExitKind::kIoIn;
  exit_.port = port;
  exit_.size = uint8_t(size);
  return false;
}

uint64_t InterpBackend::port_in(uint16_t port, unsigned size) {
  uint64_t value = 0;
  if (!try_port_in(port, size, value)) request_exit();
  return value;
}

bool InterpBackend::try_port_out(uint16_t port, unsigned size, uint64_t value) {
  check_io_permission();
  uint64_t ignored = 0;
  if (take_response(ExitKind::kIoOut, port, ignored)) return true;
  exit_ = VcpuExit{};
  exit_.kind = ExitKind::kIoOut;
  exit_.port = port;
  exit_.size = uint8_t(size);
  exit_.value = value & interp::width_mask(size * 8);
  return false;
}

void InterpBackend::port_out(uint16_t port, unsigned size, uint64_t value) {
  if (!try_port_out(port, size, value)) request_exit();
}

bool InterpBackend::take_response(ExitKind kind, uint64_t key, uint64_t& value, bool* fault, bool* ok) {
  if (response_cursor_ >= responses_.size()) return false;
  const Response& response = responses_[response_cursor_];
  if (response.kind != kind || response.key != key) {
    // The re-executed instruction took another path (the VMM changed memory it depends on, e.g.
    // a page table, between the exit and this run()): the stale answers no longer apply.
    responses_.resize(response_cursor_);
    return false;
  }
  ++response_cursor_;
  value = response.value;
  if (fault) *fault = response.fault;
  if (ok) *ok = response.ok;
  return true;
}

void InterpBackend::request_exit(std::optional<uint64_t> rip) {
  exit_.rip = rip.value_or(insn_rip_);
  throw ExitRequest{};
}

void InterpBackend::raise(uint8_t vector, uint32_t error_code, bool has_error_code) const {
  throw GuestException{vector, error_code, has_error_code};
}

void InterpBackend::triple_fault(const std::string& why) {
  shutdown_ = true;
  shutdown_detail_ = why;
}

// Delivers one event; a fault during delivery becomes #DF or a triple fault per SDM Table 6-5.
void InterpBackend::deliver_event(uint8_t vector, bool has_error_code, uint32_t error_code, bool software,
                                  uint64_t return_rip) {
  if (store_buffer_) drain_store_buffer();  // interrupts and exceptions order memory (SDM vol. 3 8.2.5)
  const int outer = delivering_;
  delivering_ = vector;
  try {
    deliver(vector, has_error_code, error_code, software, return_rip);
    s_.halted = false;
    delivering_ = outer;
  } catch (const ExitRequest&) {
    // The IDT, GDT, TSS or handler stack is outside RAM: no device can sensibly answer that.
    delivering_ = outer;
    triple_fault(fmt::format("delivering vector {} touched guest-physical {:#x} outside RAM", vector, exit_.address));
  } catch (const GuestException& nested) {
    delivering_ = outer;
    if (vector == kDf) {
      triple_fault(fmt::format("triple fault: vector {} (error {:#x}) while delivering #DF at rip {:#x}",
                               nested.vector, nested.error_code, insn_rip_));
      return;
    }
    bool double_fault = (contributory(vector) && contributory(nested.vector)) ||
                        (vector == kPf && (contributory(nested.vector) || nested.vector == kPf));
    if (double_fault) {
      deliver_event(kDf, true, 0, false, return_rip);
    } else {
      deliver_event(nested.vector, nested.has_error_code, nested.error_code, false, return_rip);
    }
  }
}

void InterpBackend::deliver(uint8_t vector, bool has_error_code, uint32_t error_code, bool software,
                            uint64_t return_rip) {
  if (shutdown_) return;
  if (!(s_.cr0 & cr0::kPe)) {
    // Real-mode IVT.
    uint64_t entry = read_sys(uint64_t(vector) * 4, 4);
    push(s_.rflags & 0xffff, 2);
    push(s_.cs.selector, 2);
    push(return_rip & 0xffff, 2);
    s_.rflags &= ~(rflags::kIf | rflags::kTf | rflags::kAc);
    s_.cs.selector = uint16_t(entry >> 16);
    s_.cs.base = (entry >> 16) << 4;
    s_.rip = entry & 0xffff;
    return;
  }
  if (long_mode()) deliver_long(vector, has_error_code, error_code, software, return_rip);
  else deliver_protected(vector, has_error_code, error_code, software, return_rip);
}

void InterpBackend::deliver_long(uint8_t vector, bool has_error_code, uint32_t error_code, bool software,
                                 uint64_t return_rip) {
  const uint32_t ext = software ? 0 : 1;
  const uint32_t idt_error = uint32_t(vector) * 8 + 2 + ext;
  if (uint32_t(vector) * 16 + 15 > s_.idt.limit) raise(kGp, idt_error, true);
  uint64_t lo = read_sys(s_.idt.base + uint64_t(vector) * 16, 8);
  uint64_t hi = read_sys(s_.idt.base + uint64_t(vector) * 16 + 8, 8);
  const unsigned type = (lo >> 40) & 0xf, gate_dpl = (lo >> 45) & 3;
  if (type != 0xe && type != 0xf) raise(kGp, idt_error, true);
  if (software && gate_dpl < cpl()) raise(kGp, uint32_t(vector) * 8 + 2, true);
  if (!((lo >> 47) & 1)) raise(kNp, idt_error, true);
  const uint64_t target = (lo & 0xffff) | (((lo >> 48) & 0xffff) << 16) | ((hi & 0xffffffffu) << 32);
  const uint16_t cs_sel = uint16_t(lo >> 16);
  const unsigned ist = (lo >> 32) & 7;
  if ((cs_sel & 0xfffc) == 0) raise(kGp, ext, true);
  SegmentReg cs_desc = read_descriptor(cs_sel, kGp);
  if (!is_code(cs_desc) || !cs_desc.l || cs_desc.db || cs_desc.dpl > cpl()) raise(kGp, (cs_sel & 0xfffc) + ext, true);
  if (!cs_desc.present) raise(kNp, (cs_sel & 0xfffc) + ext, true);
  const unsigned new_cpl = is_conforming(cs_desc) ? cpl() : cs_desc.dpl;
  uint64_t rsp = s_.gpr[kRsp];
  if (ist != 0) {
    rsp = read_sys(s_.tr.base + 36 + (ist - 1) * 8, 8);
  } else if (new_cpl < cpl()) {
    rsp = read_sys(s_.tr.base + 4 + new_cpl * 8, 8);
  }
  if (!mode64() && ist == 0 && new_cpl == cpl()) rsp &= 0xffffffffu;
  canonical_check(rsp, true);
  rsp &= ~0xfull;
  uint64_t frame[6];
  int n = 0;
  if (has_error_code) frame[n++] = error_code;
  frame[n++] = return_rip;
  frame[n++] = s_.cs.selector;
  frame[n++] = s_.rflags;
  frame[n++] = s_.gpr[kRsp];
  frame[n++] = s_.ss.selector;
  // Written from the top down, all before any register changes so a fault here leaves the state intact.
  for (int i = n - 1, slot = 1; i >= 0; --i, ++slot) write_sys(rsp - uint64_t(slot) * 8, 8, frame[i]);
  rsp -= uint64_t(n) * 8;
  if (new_cpl != cpl()) {
    SegmentReg null_ss;
    null_ss.selector = uint16_t(new_cpl);
    null_ss.unusable = true;
    null_ss.dpl = uint8_t(new_cpl);
    null_ss.db = true;
    s_.ss = null_ss;
  }
  mark_accessed(cs_sel, cs_desc, true);
  cs_desc.selector = uint16_t((cs_sel & ~3) | new_cpl);
  cs_desc.dpl = uint8_t(new_cpl);
  s_.cs = cs_desc;
  s_.gpr[kRsp] = rsp;
  s_.rflags &= ~(rflags::kTf | rflags::kNt | rflags::kRf | rflags::kVm);
  if (type == 0xe) s_.rflags &= ~rflags::kIf;
  s_.rip = target;
}

void InterpBackend::deliver_protected(uint8_t vector, bool has_error_code, uint32_t error_code, bool software,
                                      uint64_t return_rip) {
  const uint32_t ext = software ? 0 : 1;
  const uint32_t idt_error = uint32_t(vector) * 8 + 2 + ext;
  if (uint32_t(vector) * 8 + 7 > s_.idt.limit) raise(kGp, idt_error, true);
  uint64_t lo = read_sys(s_.idt.base + uint64_t(vector) * 8, 8);
  const unsigned type = (lo >> 40) & 0xf, gate_dpl = (lo >> 45) & 3;
  if (type == 0x5) {
    triple_fault(fmt::format("task gate for vector {} is not implemented", vector));
    return;
  }
  if (type != 0xe && type != 0xf) raise(kGp, idt_error, true);
  if (software && gate_dpl < cpl()) raise(kGp, uint32_t(vector) * 8 + 2, true);
  if (!((lo >> 47) & 1)) raise(kNp, idt_error, true);
  const uint32_t target = uint32_t((lo & 0xffff) | (((lo >> 48) & 0xffff) << 16));
  const uint16_t cs_sel = uint16_t(lo >> 16);
  if ((cs_sel & 0xfffc) == 0) raise(kGp, ext, true);
  SegmentReg cs_desc = read_descriptor(cs_sel, kGp);
  if (!is_code(cs_desc) || cs_desc.dpl > cpl()) raise(kGp, (cs_sel & 0xfffc) + ext, true);
  if (!cs_desc.present) raise(kNp, (cs_sel & 0xfffc) + ext, true);
  const unsigned new_cpl = is_conforming(cs_desc) ? cpl() : cs_desc.dpl;
  const uint64_t old_ss = s_.ss.selector, old_esp = s_.gpr[kRsp] & 0xffffffffu;
  if (new_cpl < cpl()) {
    uint32_t esp = uint32_t(read_sys(s_.tr.base + 4 + new_cpl * 8, 4));
    uint16_t ss_sel = uint16_t(read_sys(s_.tr.base + 8 + new_cpl * 8, 2));
    const unsigned saved_dpl = s_.cs.dpl;
    s_.cs.dpl = uint8_t(new_cpl);  // the SS load checks against the new CPL
    try {
      load_segment(2, ss_sel, true);
    } catch (...) {
      s_.cs.dpl = uint8_t(saved_dpl);
      throw;
    }
    s_.gpr[kRsp] = esp;
    push(old_ss, 4);
    push(old_esp, 4);
  }
  push(s_.rflags & 0xffffffffu, 4);
  push(s_.cs.selector, 4);
  push(return_rip & 0xffffffffu, 4);
  if (has_error_code) push(error_code, 4);
  mark_accessed(cs_sel, cs_desc, true);
  cs_desc.selector = uint16_t((cs_sel & ~3) | new_cpl);
  cs_desc.dpl = uint8_t(new_cpl);
  s_.cs = cs_desc;
  s_.rflags &= ~(rflags::kTf | rflags::kNt | rflags::kRf | rflags::kVm);
  if (type == 0xe || type == 0x6) s_.rflags &= ~rflags::kIf;
  s_.rip = target;
}

}  // namespace deja
