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

}  // namespace deja
