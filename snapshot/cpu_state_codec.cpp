// CpuState encoding: tag "CPU0", fields in declaration order, little-endian (version 2 added the YMM upper halves, version 3 XINUSE).
#include "snapshot/cpu_state_codec.h"

#include <algorithm>

#include "devices/state_codec.h"

namespace deja {
namespace {

// Version 1: up to the FXSAVE image. Version 2 adds the YMM upper halves after it; a version-1 state has them zero
// (no CPU model of that time had AVX), so old checkpoints still load. Version 3 adds XINUSE after them; an older
// state has x87 and SSE in use, and AVX where an upper half is not zero (what the KVM backend loads for it).
constexpr uint8_t kVersion = 3;

void put_segment(StateWriter& w, const SegmentReg& s) {
  w.u64(s.base);
  w.u32(s.limit);
  w.u16(s.selector);
  w.u8(s.type);
  w.u8(s.dpl);
  uint8_t flags = uint8_t(s.present) | uint8_t(s.s) << 1 | uint8_t(s.db) << 2 | uint8_t(s.l) << 3 |
                  uint8_t(s.g) << 4 | uint8_t(s.avl) << 5 | uint8_t(s.unusable) << 6;
  w.u8(flags);
}

SegmentReg get_segment(StateReader& r) {
  SegmentReg s;
  s.base = r.u64();
  s.limit = r.u32();
  s.selector = r.u16();
  s.type = r.u8();
  s.dpl = r.u8();
  uint8_t flags = r.u8();
  if (s.type > 15 || s.dpl > 3 || flags > 0x7f) r.invalid("segment register field out of range");
  s.present = flags & 1;
  s.s = flags & 2;
  s.db = flags & 4;
  s.l = flags & 8;
  s.g = flags & 16;
  s.avl = flags & 32;
  s.unusable = flags & 64;
  return s;
}

}  // namespace

std::vector<uint8_t> encode_cpu_state(const CpuState& st) {
  StateWriter w("CPU0", kVersion);
  for (uint64_t g : st.gpr) w.u64(g);
  w.u64(st.rip);
  w.u64(st.rflags);
  for (const SegmentReg* s : {&st.cs, &st.ds, &st.es, &st.fs, &st.gs, &st.ss, &st.tr, &st.ldt}) put_segment(w, *s);
  for (const TableReg* t : {&st.gdt, &st.idt}) {
    w.u64(t->base);
    w.u16(t->limit);
  }
  for (uint64_t v : {st.cr0, st.cr2, st.cr3, st.cr4, st.cr8, st.efer, st.xcr0}) w.u64(v);
  const MsrState& m = st.msrs;
  for (uint64_t v : {m.star, m.lstar, m.cstar, m.sfmask, m.kernel_gs_base, m.sysenter_cs, m.sysenter_esp,
                     m.sysenter_eip, m.pat, m.tsc_aux})
    w.u64(v);
  w.bytes(st.fxsave);
  w.bytes(st.ymmh);
  w.u64(st.xinuse);
  w.boolean(st.interrupt_shadow);
  w.boolean(st.halted);
  return w.take();
}

Result<CpuState> decode_cpu_state(std::span<const uint8_t> blob) {
  StateReader r(blob, "CPU0", 1, kVersion);
  CpuState st;
  for (uint64_t& g : st.gpr) g = r.u64();
  st.rip = r.u64();
  st.rflags = r.u64();
  for (SegmentReg* s : {&st.cs, &st.ds, &st.es, &st.fs, &st.gs, &st.ss, &st.tr, &st.ldt}) *s = get_segment(r);
  for (TableReg* t : {&st.gdt, &st.idt}) {
    t->base = r.u64();
    t->limit = r.u16();
  }
  for (uint64_t* v : {&st.cr0, &st.cr2, &st.cr3, &st.cr4, &st.cr8, &st.efer, &st.xcr0}) *v = r.u64();
  MsrState& m = st.msrs;
  for (uint64_t* v : {&m.star, &m.lstar, &m.cstar, &m.sfmask, &m.kernel_gs_base, &m.sysenter_cs, &m.sysenter_esp,
                      &m.sysenter_eip, &m.pat, &m.tsc_aux})
    *v = r.u64();
  r.bytes(st.fxsave);
  if (r.version() >= 2) r.bytes(st.ymmh);
  if (r.version() >= 3) {
    st.xinuse = r.u64();
    if (st.xinuse & ~(xcr0::kX87 | xcr0::kSse | xcr0::kAvx)) r.invalid("XINUSE names a state component deja lacks");
  } else {
    const bool avx_in_use = std::any_of(st.ymmh.begin(), st.ymmh.end(), [](uint8_t b) { return b != 0; });
    st.xinuse = xcr0::kX87 | xcr0::kSse | (avx_in_use ? xcr0::kAvx : 0);
  }
  st.interrupt_shadow = r.boolean();
  st.halted = r.boolean();
  if (auto done = r.finish(); !done) return std::unexpected(done.error());
  return st;
}

}  // namespace deja
