// Register dumps for diagnostics.
#include "core/cpu_state.h"

#include <fmt/format.h>

namespace deja {

static std::string format_segment(const char* name, const SegmentReg& s) {
  return fmt::format("{:<4}{:04x} base={:016x} limit={:08x} type={:x} s={} dpl={} p={} db={} l={} g={}{}\n", name,
                     s.selector, s.base, s.limit, s.type, int(s.s), s.dpl, int(s.present), int(s.db), int(s.l),
                     int(s.g), s.unusable ? " unusable" : "");
}

std::string format_cpu_state(const CpuState& st) {
  static constexpr const char* kNames[kGprCount] = {"rax", "rcx", "rdx", "rbx", "rsp", "rbp", "rsi", "rdi",
                                                    "r8",  "r9",  "r10", "r11", "r12", "r13", "r14", "r15"};
  std::string out;
  for (int i = 0; i < kGprCount; ++i) {
    out += fmt::format("{:<4}={:016x}{}", kNames[i], st.gpr[i], i % 4 == 3 ? "\n" : "  ");
  }
  out += fmt::format("rip ={:016x}  rflags={:08x}{}{}\n", st.rip, st.rflags, st.interrupt_shadow ? " shadow" : "",
                     st.halted ? " halted" : "");
  out += format_segment("cs", st.cs) + format_segment("ss", st.ss) + format_segment("ds", st.ds) +
         format_segment("es", st.es) + format_segment("fs", st.fs) + format_segment("gs", st.gs) +
         format_segment("tr", st.tr) + format_segment("ldt", st.ldt);
  out += fmt::format("gdt base={:016x} limit={:04x}  idt base={:016x} limit={:04x}\n", st.gdt.base, st.gdt.limit,
                     st.idt.base, st.idt.limit);
  out += fmt::format("cr0={:08x} cr2={:016x} cr3={:016x} cr4={:08x} efer={:x}\n", st.cr0, st.cr2, st.cr3, st.cr4,
                     st.efer);
  return out;
}

CpuState cpu_state_after_init(uint32_t signature) {
  CpuState st;
  st.gpr[kRdx] = signature;
  st.rip = 0xfff0;
  st.rflags = 0x2;
  st.cr0 = cr0::kCd | cr0::kNw | cr0::kEt;
  // Real-mode segments: present, accessed read/write data (CS: read/execute code), 64 KiB limits.
  auto real = [](uint16_t selector, uint8_t type) {
    SegmentReg seg;
    seg.selector = selector;
    seg.base = uint64_t(selector) << 4;
    seg.limit = 0xffff;
    seg.type = type;
    seg.present = true;
    seg.s = true;
    return seg;
  };
  st.cs = real(0xf000, 0xb);
  st.cs.base = 0xffff0000;
  st.ds = st.es = st.fs = st.gs = st.ss = real(0, 0x3);
  st.ldt.limit = 0xffff;
  st.ldt.type = 0x2;
  st.ldt.present = true;
  st.tr.limit = 0xffff;
  st.tr.type = 0xb;  // busy 32-bit TSS, as KVM and the SDM's reset state have it
  st.tr.present = true;
  st.gdt.limit = st.idt.limit = 0xffff;
  // The power-up x87 control word 0x0040 and MXCSR 0x1F80 (INIT leaves them; an AP's are these).
  st.fxsave[0] = 0x40;
  st.fxsave[24] = 0x80;
  st.fxsave[25] = 0x1f;
  return st;
}

CpuState cpu_state_at_startup(uint8_t vector, uint32_t signature) {
  CpuState st = cpu_state_after_init(signature);
  st.cs.selector = uint16_t(vector) << 8;
  st.cs.base = uint64_t(vector) << 12;
  st.rip = 0;
  return st;
}

}  // namespace deja
