// The x87 FPU of the software CPU: register stack and tags in the FXSAVE image, control and status words, #NM/#MF and every instruction form; arithmetic is interp/x87_float.h.
#include <array>
#include <cstring>

#include "interp/interp_backend.h"
#include "interp/x87_float.h"

namespace deja {

using interp::DecodedInsn;
using interp::Operand;
using interp::OpKind;
namespace fp = interp::x87;

namespace {

constexpr uint8_t kNm = 7, kMf = 16;

// Where CpuState::fxsave holds the x87 state: the FXSAVE64 layout, which is also how KVM transfers it.
constexpr size_t kFcwOffset = 0, kFswOffset = 2, kFtwOffset = 4, kFopOffset = 6, kFipOffset = 8, kFdpOffset = 16,
                 kStOffset = 32;

namespace fsw {
constexpr uint16_t kStackFault = 0x40, kSummary = 0x80, kC0 = 0x100, kC1 = 0x200, kC2 = 0x400, kC3 = 0x4000,
                   kBusy = 0x8000;
constexpr uint16_t kConditions = kC0 | kC1 | kC2 | kC3;
constexpr uint16_t kTopMask = 0x3800;
}  // namespace fsw

constexpr uint16_t kFcwWritable = 0x1f3f;  // FLDCW: bits 6, 7 and 13-15 are reserved; bit 6 reads as one
constexpr uint16_t kFcwReservedOne = 0x40;

enum Tag : unsigned { kTagValid = 0, kTagZero = 1, kTagSpecial = 2, kTagEmpty = 3 };

// The x87 registers inside the FXSAVE image: ST(i) at 32 + 16i, in stack order as FXSAVE stores them (so a
// change of TOP rotates the slots), and one abridged tag bit per physical register (1 = not empty).
class Registers {
 public:
  explicit Registers(std::array<uint8_t, 512>& image) : image_(image) {}

  uint16_t word(size_t offset) const {
    uint16_t v;
    std::memcpy(&v, &image_[offset], 2);
    return v;
  }
  void set_word(size_t offset, uint16_t v) { std::memcpy(&image_[offset], &v, 2); }
  uint64_t quad(size_t offset) const {
    uint64_t v;
    std::memcpy(&v, &image_[offset], 8);
    return v;
  }
  void set_quad(size_t offset, uint64_t v) { std::memcpy(&image_[offset], &v, 8); }

  uint16_t control() const { return word(kFcwOffset); }
  uint16_t status() const { return word(kFswOffset); }
  void set_status(uint16_t v) { set_word(kFswOffset, v); }
  unsigned top() const { return (status() >> 11) & 7; }
  uint8_t abridged_tags() const { return image_[kFtwOffset]; }
  void set_abridged_tags(uint8_t tags) { image_[kFtwOffset] = tags; }

  bool empty(unsigned i) const { return !((image_[kFtwOffset] >> physical(i)) & 1); }
  fp::Float80 st(unsigned i) const {
    fp::Float80 v;
    std::memcpy(&v.sig, &image_[kStOffset + 16 * i], 8);
    std::memcpy(&v.sign_exp, &image_[kStOffset + 16 * i + 8], 2);
    return v;
  }
  // Writes ST(i) and tags it valid; the slot's six reserved bytes read as zero, as FXSAVE writes them.
  void set_st(unsigned i, fp::Float80 v) {
    std::memcpy(&image_[kStOffset + 16 * i], &v.sig, 8);
    std::memcpy(&image_[kStOffset + 16 * i + 8], &v.sign_exp, 2);
    std::memset(&image_[kStOffset + 16 * i + 10], 0, 6);
    image_[kFtwOffset] = uint8_t(image_[kFtwOffset] | (1u << physical(i)));
  }
  void free(unsigned i) { image_[kFtwOffset] = uint8_t(image_[kFtwOffset] & ~(1u << physical(i))); }
  void push(fp::Float80 v) {
    rotate(-1);
    set_st(0, v);
  }
  void pop() {
    free(0);
    rotate(1);
  }
  // TOP += by; the slots move with it, so that every physical register keeps its contents.
  void rotate(int by) {
    std::array<uint8_t, 128> old;
    std::memcpy(old.data(), &image_[kStOffset], 128);
    for (unsigned i = 0; i < 8; ++i) std::memcpy(&image_[kStOffset + 16 * i], &old[16 * ((i + unsigned(by)) & 7)], 16);
    set_top((top() + unsigned(by)) & 7);
  }
  void set_top(unsigned top) { set_status(uint16_t((status() & ~fsw::kTopMask) | (top << 11))); }

  // The full tag word of FNSTENV/FNSAVE: two bits per physical register, computed from the contents as the
  // hardware does when it stores the environment.
  uint16_t tag_word() const {
    uint16_t word = 0;
    for (unsigned phys = 0; phys < 8; ++phys) {
      const unsigned i = (phys - top()) & 7;
      word = uint16_t(word | (tag_of(i) << (2 * phys)));
    }
    return word;
  }
  unsigned tag_of(unsigned i) const {
    if (empty(i)) return kTagEmpty;
    const fp::Float80 v = st(i);
    if (v.exponent() == 0) return v.sig == 0 ? kTagZero : kTagSpecial;
    if (v.exponent() == 0x7fff || !(v.sig >> 63)) return kTagSpecial;
    return kTagValid;
  }
  // Only "empty" survives a load of the full tag word: the other tags follow from the contents.
  void set_tag_word(uint16_t word) {
    uint8_t tags = 0;
    for (unsigned phys = 0; phys < 8; ++phys) {
      if (((word >> (2 * phys)) & 3) != kTagEmpty) tags = uint8_t(tags | (1u << phys));
    }
    set_abridged_tags(tags);
  }

 private:
  unsigned physical(unsigned i) const { return (top() + i) & 7; }
  std::array<uint8_t, 512>& image_;
};

bool condition_holds(unsigned which, uint64_t rflags) {
  const bool cf = rflags & rflags::kCf, zf = rflags & rflags::kZf, pf = rflags & rflags::kPf;
  switch (which & 3) {
    case 0: return cf;         // B
    case 1: return zf;         // E
    case 2: return cf || zf;   // BE
    default: return pf;        // U
  }
}

bool cpuid_bit(const CpuModel& model, uint32_t leaf, int reg, int bit) {
  CpuidResult r = model.cpuid(leaf, 0);
  uint32_t regs[4] = {r.eax, r.ebx, r.ecx, r.edx};
  return (regs[reg] >> bit) & 1;
}

}  // namespace

void InterpBackend::exec_x87(const DecodedInsn& insn) {
  Registers regs(s_.fxsave);
  const uint8_t op = insn.opcode, modrm = insn.modrm;

  // WAIT/FWAIT: #NM only when MP and TS are both set; then any pending unmasked exception.
  if (op == 0x9b) {
    if ((s_.cr0 & cr0::kMp) && (s_.cr0 & cr0::kTs)) raise(kNm);
    if ((regs.status() & fsw::kSummary) && (s_.cr0 & cr0::kNe)) raise(kMf);
    return;
  }
  const bool mem = (modrm >> 6) != 3;
  const unsigned reg = (modrm >> 3) & 7, rm = modrm & 7;
  // FISTTP is SSE3's: a model without SSE3 makes it an invalid opcode (#UD before #NM), as such CPUs do.
  if (mem && reg == 1 && (op == 0xdb || op == 0xdd || op == 0xdf) && !cpuid_bit(model_, 1, 2, 0)) raise_ud(insn, false);
  if (s_.cr0 & (cr0::kEm | cr0::kTs)) raise(kNm);

  // The no-wait control instructions (FNINIT, FNCLEX, FNSTCW, FNSTSW, FNSTENV, FNSAVE and the 8087/287 no-ops)
  // do not report a pending exception; every other x87 instruction does, as #MF when CR0.NE is set. With
  // NE clear a PC would signal FERR# to IRQ 13, which deja's machines do not wire: the exception stays pending.
  const bool no_wait = (op == 0xdb && modrm >= 0xe0 && modrm <= 0xe4) ||
                       (mem && (op == 0xd9 || op == 0xdd) && reg >= 6) || (op == 0xdf && modrm == 0xe0);
  if (!no_wait && (regs.status() & fsw::kSummary) && (s_.cr0 & cr0::kNe)) raise(kMf);

  const Operand* m = nullptr;
  for (int i = 0; i < insn.operand_count; ++i) {
    if (insn.op[i].kind == OpKind::kMem) m = &insn.op[i];
  }
  if (mem && !m) raise_ud(insn, true);
  const uint64_t address = mem ? effective_address(*m, insn) : 0;
  const int seg_index = mem ? m->seg : 3;
  const uint64_t address_mask = insn.addrsize == 64 ? ~0ull : insn.addrsize == 32 ? 0xffffffffull : 0xffffull;
  auto at = [&](uint64_t offset) { return (address + offset) & address_mask; };

  const fp::Control control{regs.control()};
  const uint8_t masks = control.masks();
  constexpr uint8_t kPreComputation = fp::flag::kInvalid | fp::flag::kDenormal | fp::flag::kZeroDivide;

  // Status word updates: exception flags are sticky; ES and B follow any unmasked one.
  auto signal = [&](uint16_t flags) {
    uint16_t status = uint16_t(regs.status() | flags);
    if (status & ~regs.control() & fp::flag::kAll) status |= fsw::kSummary | fsw::kBusy;
    regs.set_status(status);
  };
  auto set_conditions = [&](uint16_t bits, uint16_t which) {
    regs.set_status(uint16_t((regs.status() & ~which) | (bits & which)));
  };
  auto set_c1 = [&](bool value) { set_conditions(value ? fsw::kC1 : 0, fsw::kC1); };
  // A stack fault: #IS (invalid with SF), C1 = 1 for overflow and 0 for underflow. True when masked, i.e.
  // when the caller is to deliver the masked response (the indefinite).
  auto stack_fault = [&](bool overflow) {
    set_c1(overflow);
    signal(fp::flag::kInvalid | fsw::kStackFault);
    return (masks & fp::flag::kInvalid) != 0;
  };
  // An operation's exceptions: an unmasked invalid, denormal or zero-divide leaves destination and TOP as they
  // were (and hides the later exceptions); otherwise everything raised is flagged, C1 tells rounding up,
  // and the caller stores the result.
  auto accept = [&](uint8_t flags, bool rounded_up) {
    if (flags & ~masks & kPreComputation) {
      signal(flags & kPreComputation);
      set_c1(false);
      return false;
    }
    signal(flags);
    set_c1(rounded_up);
    return true;
  };
  auto read80 = [&]() {
    fp::Float80 v;
    v.sig = read_mem(seg_index, at(0), 8);
    v.sign_exp = uint16_t(read_mem(seg_index, at(8), 2));
    return v;
  };
  auto write80 = [&](fp::Float80 v) {
    probe_write(seg_index, at(0), 10);
    write_mem(seg_index, at(0), 8, v.sig);
    write_mem(seg_index, at(8), 2, v.sign_exp);
  };
  // The memory operand of the arithmetic and compare forms (m32fp, m32int, m64fp, m16int), converted exactly.
  auto load_arithmetic_operand = [&]() -> fp::Result {
    switch (op) {
      case 0xd8: return fp::from_float32(uint32_t(read_mem(seg_index, at(0), 4)), true);
      case 0xdc: return fp::from_float64(read_mem(seg_index, at(0), 8), true);
      case 0xda: return {fp::from_integer(int32_t(uint32_t(read_mem(seg_index, at(0), 4))))};
      default: return {fp::from_integer(int16_t(uint16_t(read_mem(seg_index, at(0), 2))))};
    }
  };
  // A denormal memory operand is normalized by its conversion: its #D joins the operation's flags unless a
  // NaN or an unsupported operand decides the result (those outrank #D).
  auto with_load_flags = [&](uint8_t flags, uint8_t load_flags, fp::Float80 st0) {
    const fp::Class c = fp::classify(st0);
    if (c == fp::Class::kUnsupported || fp::is_nan(c) || (flags & fp::flag::kZeroDivide)) return flags;
    return uint8_t(flags | (load_flags & fp::flag::kDenormal));
  };

  // ---- instruction groups ----
  auto arithmetic = [&](unsigned operation, unsigned dest, fp::Float80 other, uint8_t load_flags, bool other_empty,
                        bool pop) {
    if (regs.empty(0) || other_empty) {
      if (stack_fault(false)) {
        regs.set_st(dest, fp::kIndefinite);
        if (pop) regs.pop();
      }
      return;
    }
    const fp::Float80 st0 = regs.st(0);
    fp::Result r;
    switch (operation) {
      case 0: r = fp::add(st0, other, control); break;
      case 1: r = fp::multiply(st0, other, control); break;
      case 4: r = fp::subtract(st0, other, control); break;
      case 5: r = fp::subtract(other, st0, control); break;
      case 6: r = fp::divide(st0, other, control); break;
      default: r = fp::divide(other, st0, control); break;
    }
    if (!accept(with_load_flags(r.flags, load_flags, st0), r.rounded_up)) return;
    regs.set_st(dest, r.value);
    if (pop) regs.pop();
  };
  // FCOM/FUCOM/FICOM/FTST (condition codes) and FCOMI/FUCOMI (EFLAGS), popping `pops` times.
  auto compare = [&](fp::Float80 other, uint8_t load_flags, bool other_empty, bool quiet, int pops, bool to_eflags) {
    auto report = [&](fp::Relation relation) {
      if (to_eflags) {
        uint64_t bits = 0;
        switch (relation) {
          case fp::Relation::kLess: bits = rflags::kCf; break;
          case fp::Relation::kEqual: bits = rflags::kZf; break;
          case fp::Relation::kGreater: break;
          case fp::Relation::kUnordered: bits = rflags::kZf | rflags::kPf | rflags::kCf; break;
        }
        const uint64_t arithmetic_flags =
            rflags::kCf | rflags::kPf | rflags::kAf | rflags::kZf | rflags::kSf | rflags::kOf;
        s_.rflags = (s_.rflags & ~arithmetic_flags) | bits;
        set_c1(false);
        return;
      }
      uint16_t bits = 0;
      switch (relation) {
        case fp::Relation::kLess: bits = fsw::kC0; break;
        case fp::Relation::kEqual: bits = fsw::kC3; break;
        case fp::Relation::kGreater: break;
        case fp::Relation::kUnordered: bits = fsw::kC0 | fsw::kC2 | fsw::kC3; break;
      }
      set_conditions(bits, fsw::kConditions);
    };
    // The result is reported even when an unmasked exception stops the pops (the SDM says an unmasked #IA
    // leaves the codes; processors, AMD's measured here, set them as for the masked case).
    set_c1(false);
    if (regs.empty(0) || other_empty) {
      report(fp::Relation::kUnordered);
      if (stack_fault(false)) {
        for (int i = 0; i < pops; ++i) regs.pop();
      }
      return;
    }
    const fp::Float80 st0 = regs.st(0);
    const fp::Comparison c = fp::compare(st0, other, quiet);
    report(c.relation);
    if (!accept(with_load_flags(c.flags, load_flags, st0), false)) return;
    for (int i = 0; i < pops; ++i) regs.pop();
  };
  // Pushes a loaded value, with the stack-overflow check; `source_empty` is FLD ST(i) of an empty register.
  auto load = [&](fp::Float80 v, uint8_t flags, bool source_empty) {
    if (source_empty || !regs.empty(7)) {  // an empty source is reported first (C1 = 0)
      if (stack_fault(!source_empty)) regs.push(fp::kIndefinite);
      return;
    }
    // FLD m32/m64 of a denormal pushes even when #D is unmasked; only an unmasked #IA (an SNaN) stops it.
    if (flags & ~masks & fp::flag::kInvalid) {
      signal(fp::flag::kInvalid);
      set_c1(false);
      return;
    }
    signal(flags);
    set_c1(false);
    regs.push(v);
  };
  // A store from an empty ST(0): the masked response writes the indefinite (before any state changes, so that
  // a faulting write leaves everything as it was) and pops.
  auto store_underflow = [&](bool pop, auto&& write_indefinite) {
    const bool masked = masks & fp::flag::kInvalid;
    if (masked) write_indefinite();
    stack_fault(false);
    if (masked && pop) regs.pop();
  };
  // FST/FIST/FBSTP to memory: `stored` is what rounding produced; an underflowing stack stores the indefinite.
  auto store_result = [&](uint8_t flags, bool rounded_up, bool stored, bool pop, auto&& write) {
    if (flags & ~masks & fp::flag::kInvalid) {
      signal(fp::flag::kInvalid);
      set_c1(false);
      return;
    }
    if (!stored) {  // unmasked overflow or underflow: no store, no pop
      signal(flags);
      set_c1(false);
      return;
    }
    write();
    signal(flags);
    set_c1(rounded_up);
    if (pop) regs.pop();
  };
  // ST(0) = f(ST(0)).
  auto unary = [&](auto&& operation) {
    if (regs.empty(0)) {
      if (stack_fault(false)) regs.set_st(0, fp::kIndefinite);
      return;
    }
    const fp::Result r = operation(regs.st(0));
    if (accept(r.flags, r.rounded_up)) regs.set_st(0, r.value);
  };
  // ST(1) = f(ST(1), ST(0)), then pop (FPATAN, FYL2X, FYL2XP1).
  auto binary_pop = [&](auto&& operation) {
    if (regs.empty(0) || regs.empty(1)) {
      if (stack_fault(false)) {
        regs.set_st(1, fp::kIndefinite);
        regs.pop();
      }
      return;
    }
    const fp::Result r = operation(regs.st(1), regs.st(0));
    if (!accept(r.flags, r.rounded_up)) return;
    regs.set_st(1, r.value);
    regs.pop();
  };
  // ST(0) = first, then push second (FPTAN's 1.0, FSINCOS's cosine, FXTRACT's significand).
  auto replace_and_push = [&](auto&& operation) {
    if (regs.empty(0) || !regs.empty(7)) {
      if (stack_fault(!regs.empty(0))) {
        regs.set_st(0, fp::kIndefinite);
        regs.push(fp::kIndefinite);
      }
      return;
    }
    operation(regs.st(0));
  };

  // The environment of FNSTENV/FLDENV/FNSAVE/FRSTOR: 14 bytes with a 16-bit operand size, else 28 (64-bit
  // mode too); real mode stores 20-bit linear pointers. FCS and FDS are not kept (the FXSAVE64 image has no
  // place for them, and KVM does not transfer them): they read as zero, as on CPUs that deprecate them.
  const bool env16 = (insn.mode == interp::kMode16) != bool(insn.flags & interp::insn_flags::kOpsizePrefix) &&
                     !(insn.flags & interp::insn_flags::kRexW);
  const bool real_env = !(s_.cr0 & cr0::kPe) || (s_.rflags & rflags::kVm);
  const unsigned env_size = env16 ? 14 : 28;
  auto environment = [&]() {
    std::array<uint8_t, 28> env{};
    auto put16 = [&](size_t offset, uint32_t v) { std::memcpy(&env[offset], &v, 2); };
    auto put32 = [&](size_t offset, uint32_t v) { std::memcpy(&env[offset], &v, 4); };
    const uint32_t fip = uint32_t(regs.quad(kFipOffset)), fdp = uint32_t(regs.quad(kFdpOffset));
    const uint32_t fop = regs.word(kFopOffset) & 0x7ffu;
    if (quirks_.x87_environment_zeroed) {  // the words only, in either size (core/backend.h)
      const unsigned stride = env16 ? 2 : 4;
      put16(0, regs.control());
      put16(stride, regs.status());
      put16(2 * stride, regs.tag_word());
      return env;
    }
    if (env16) {
      put16(0, regs.control());
      put16(2, regs.status());
      put16(4, regs.tag_word());
      if (real_env) {
        put16(6, fip & 0xffff);
        put16(8, ((fip >> 4) & 0xf000) | fop);
        put16(10, fdp & 0xffff);
        put16(12, (fdp >> 4) & 0xf000);
      } else {
        put16(6, fip);
        put16(10, fdp);
      }
    } else {
      put32(0, 0xffff0000u | regs.control());
      put32(4, 0xffff0000u | regs.status());
      put32(8, 0xffff0000u | regs.tag_word());
      if (real_env) {
        put32(12, 0xffff0000u | (fip & 0xffff));
        put32(16, ((fip & 0xffff0000u) >> 4) | fop);
        put32(20, 0xffff0000u | (fdp & 0xffff));
        put32(24, (fdp & 0xffff0000u) >> 4);
      } else {
        put32(12, fip);
        put32(16, fop << 16);
        put32(20, fdp);
        put32(24, 0xffff0000u);
      }
    }
    return env;
  };
  auto write_bytes = [&](const uint8_t* bytes, unsigned size) {
    probe_write(seg_index, at(0), size);
    for (unsigned offset = 0; offset < size; offset += 2) {
      uint16_t v;
      std::memcpy(&v, bytes + offset, 2);
      write_mem(seg_index, at(offset), 2, v);
    }
  };
  auto read_bytes = [&](uint8_t* bytes, unsigned size) {
    for (unsigned offset = 0; offset < size; offset += 2) {
      const uint16_t v = uint16_t(read_mem(seg_index, at(offset), 2));
      std::memcpy(bytes + offset, &v, 2);
    }
  };
  // Loads an environment image read from memory; FRSTOR then supplies the registers in stack order.
  auto load_environment = [&](const uint8_t* env, const uint8_t* registers) {
    auto get16 = [&](size_t offset) {
      uint16_t v;
      std::memcpy(&v, env + offset, 2);
      return uint32_t(v);
    };
    auto get32 = [&](size_t offset) {
      uint32_t v;
      std::memcpy(&v, env + offset, 4);
      return v;
    };
    uint32_t fcw, fsw_value, ftw, fip, fdp, fop;
    if (env16) {
      fcw = get16(0), fsw_value = get16(2), ftw = get16(4);
      if (real_env) {
        fip = get16(6) | ((get16(8) & 0xf000) << 4), fop = get16(8) & 0x7ff;
        fdp = get16(10) | ((get16(12) & 0xf000) << 4);
      } else {
        fip = get16(6), fdp = get16(10), fop = 0;
      }
    } else {
      fcw = get32(0) & 0xffff, fsw_value = get32(4) & 0xffff, ftw = get32(8) & 0xffff;
      if (real_env) {
        fip = (get32(12) & 0xffff) | ((get32(16) & 0x0ffff000) << 4), fop = get32(16) & 0x7ff;
        fdp = (get32(20) & 0xffff) | ((get32(24) & 0x0ffff000) << 4);
      } else {
        fip = get32(12), fop = (get32(16) >> 16) & 0x7ff, fdp = get32(20);
      }
    }
    const unsigned old_top = regs.top();
    regs.set_word(kFcwOffset, uint16_t((fcw & kFcwWritable) | kFcwReservedOne));
    regs.set_status(uint16_t(fsw_value));
    if (registers) {
      for (unsigned i = 0; i < 8; ++i) {
        fp::Float80 v;
        std::memcpy(&v.sig, registers + 10 * i, 8);
        std::memcpy(&v.sign_exp, registers + 10 * i + 8, 2);
        std::memcpy(&s_.fxsave[kStOffset + 16 * i], &v.sig, 8);
        std::memcpy(&s_.fxsave[kStOffset + 16 * i + 8], &v.sign_exp, 2);
        std::memset(&s_.fxsave[kStOffset + 16 * i + 10], 0, 6);
      }
    } else if (regs.top() != old_top) {
      // The physical registers stay; the stack-order image follows the new TOP.
      const unsigned new_top = regs.top();
      regs.set_top(old_top);
      regs.rotate(int((new_top - old_top) & 7));
    }
    regs.set_tag_word(uint16_t(ftw));
    regs.set_quad(kFipOffset, fip);
    regs.set_quad(kFdpOffset, fdp);
    regs.set_word(kFopOffset, uint16_t(fop));
    uint16_t status = regs.status();
    if (status & ~regs.control() & fp::flag::kAll) status |= fsw::kSummary | fsw::kBusy;
    else status &= uint16_t(~(fsw::kSummary | fsw::kBusy));
    regs.set_status(status);
  };
  auto initialize = [&]() {
    regs.rotate(-int(regs.top()));  // TOP = 0; the registers keep their contents
    regs.set_word(kFcwOffset, 0x37f);
    regs.set_status(0);
    regs.set_abridged_tags(0);
    regs.set_word(kFopOffset, 0);
    regs.set_quad(kFipOffset, 0);
    regs.set_quad(kFdpOffset, 0);
  };

  // Control instructions leave FIP, FDP and FOP alone; every other one points them at itself.
  bool control_instruction = false;
  auto run = [&]() {
    switch (op) {
      case 0xd8:  // arithmetic and compares: ST(0) with m32fp or ST(i)
      case 0xdc:  // ST(0) with m64fp; ST(i) = ST(i) op ST(0)
      case 0xda:  // m32int; FCMOVB/E/BE/U, FUCOMPP
      case 0xde: {  // m16int; the popping register forms
        if (!mem && op == 0xda) {
          if (reg < 4) {
            if (regs.empty(0) || regs.empty(rm)) {
              if (stack_fault(false)) regs.set_st(0, fp::kIndefinite);
            } else if (condition_holds(reg, s_.rflags)) {
              regs.set_st(0, regs.st(rm));
            }
            return;
          }
          if (modrm == 0xe9) return compare(regs.st(1), 0, regs.empty(1), true, 2, false);  // FUCOMPP
          raise_ud(insn, true);
        }
        if (!mem && op == 0xde && reg == 3) {
          if (rm == 1) return compare(regs.st(1), 0, regs.empty(1), false, 2, false);  // FCOMPP
          raise_ud(insn, true);
        }
        if (mem) {
          const fp::Result operand = load_arithmetic_operand();
          if (reg == 2 || reg == 3) return compare(operand.value, operand.flags, false, false, reg == 3 ? 1 : 0, false);
          return arithmetic(reg, 0, operand.value, operand.flags, false, false);
        }
        if (reg == 2 || reg == 3) {  // FCOM/FCOMP ST(i) (DC and DE: aliases)
          return compare(regs.st(rm), 0, regs.empty(rm), false, (reg == 3 || op == 0xde) ? 1 : 0, false);
        }
        return arithmetic(reg, op == 0xd8 ? 0 : rm, regs.st(rm), 0, regs.empty(rm), op == 0xde);
      }
      case 0xd9: {
        if (mem) {
          switch (reg) {
            case 0: {  // FLD m32fp
              const fp::Result r = fp::from_float32(uint32_t(read_mem(seg_index, at(0), 4)));
              return load(r.value, r.flags, false);
            }
            case 2:
            case 3: {  // FST/FSTP m32fp
              if (regs.empty(0)) return store_underflow(reg == 3, [&] { write_mem(seg_index, at(0), 4, 0xffc00000u); });
              const fp::Stored s = fp::to_float32(regs.st(0), control);
              return store_result(s.flags, s.rounded_up, s.stored, reg == 3,
                                  [&] { write_mem(seg_index, at(0), 4, s.bits); });
            }
            case 4: {  // FLDENV
              control_instruction = true;
              std::array<uint8_t, 28> env{};
              read_bytes(env.data(), env_size);
              return load_environment(env.data(), nullptr);
            }
            case 5:  // FLDCW
              control_instruction = true;
              regs.set_word(kFcwOffset, uint16_t((read_mem(seg_index, at(0), 2) & kFcwWritable) | kFcwReservedOne));
              {
                uint16_t status = regs.status();
                if (status & ~regs.control() & fp::flag::kAll) status |= fsw::kSummary | fsw::kBusy;
                else status &= uint16_t(~(fsw::kSummary | fsw::kBusy));
                regs.set_status(status);
              }
              return;
            case 6: {  // FNSTENV: store, then mask every exception
              control_instruction = true;
              const auto env = environment();
              write_bytes(env.data(), env_size);
              regs.set_word(kFcwOffset, uint16_t(regs.control() | fp::flag::kAll));
              regs.set_status(uint16_t(regs.status() & ~(fsw::kSummary | fsw::kBusy)));
              return;
            }
            case 7:  // FNSTCW
              control_instruction = true;
              write_mem(seg_index, at(0), 2, regs.control());
              return;
            default: raise_ud(insn, true);
          }
        }
        switch (modrm) {
          case 0xc0: case 0xc1: case 0xc2: case 0xc3: case 0xc4: case 0xc5: case 0xc6: case 0xc7:  // FLD ST(i)
            return load(regs.st(rm), 0, regs.empty(rm));
          case 0xc8: case 0xc9: case 0xca: case 0xcb: case 0xcc: case 0xcd: case 0xce: case 0xcf:  // FXCH
            break;
          case 0xd0: return;  // FNOP
          case 0xd8: case 0xd9: case 0xda: case 0xdb: case 0xdc: case 0xdd: case 0xde: case 0xdf:  // FSTP ST(i) alias
            break;
          case 0xe0:  // FCHS
          case 0xe1:  // FABS
            if (regs.empty(0)) {
              if (stack_fault(false)) regs.set_st(0, fp::kIndefinite);
              return;
            }
            {
              fp::Float80 v = regs.st(0);
              v.sign_exp = modrm == 0xe0 ? uint16_t(v.sign_exp ^ 0x8000) : uint16_t(v.sign_exp & 0x7fff);
              regs.set_st(0, v);
              set_c1(false);
            }
            return;
          case 0xe4: return compare(fp::kPositiveZero, 0, false, false, 0, false);  // FTST
          case 0xe5: {  // FXAM: C3 C2 C0 classify ST(0), C1 is its sign
            const fp::Float80 v = regs.st(0);
            uint16_t bits = v.sign() ? fsw::kC1 : 0;
            if (regs.empty(0)) {
              bits |= fsw::kC3 | fsw::kC0;
            } else {
              switch (fp::classify(v)) {
                case fp::Class::kUnsupported: break;
                case fp::Class::kQuietNaN: case fp::Class::kSignalingNaN: bits |= fsw::kC0; break;
                case fp::Class::kNormal: bits |= fsw::kC2; break;
                case fp::Class::kInfinity: bits |= fsw::kC2 | fsw::kC0; break;
                case fp::Class::kZero: bits |= fsw::kC3; break;
                case fp::Class::kDenormal: bits |= fsw::kC3 | fsw::kC2; break;
              }
            }
            set_conditions(bits, fsw::kConditions);
            return;
          }
          case 0xe8: return load(fp::kOne, 0, false);                                          // FLD1
          case 0xe9: return load(fp::constant(fp::Constant::kLog2Of10, control), 0, false);   // FLDL2T
          case 0xea: return load(fp::constant(fp::Constant::kLog2OfE, control), 0, false);    // FLDL2E
          case 0xeb: return load(fp::constant(fp::Constant::kPi, control), 0, false);         // FLDPI
          case 0xec: return load(fp::constant(fp::Constant::kLog10Of2, control), 0, false);   // FLDLG2
          case 0xed: return load(fp::constant(fp::Constant::kLnOf2, control), 0, false);      // FLDLN2
          case 0xee: return load(fp::kPositiveZero, 0, false);                                // FLDZ
          case 0xf0: return unary([&](fp::Float80 x) { return fp::exp2_minus_1(x, control); });  // F2XM1
          case 0xf1: return binary_pop([&](fp::Float80 y, fp::Float80 x) { return fp::y_log2_x(y, x, control); });
          case 0xf2:  // FPTAN
          case 0xfb:  // FSINCOS
            return replace_and_push([&](fp::Float80 x) {
              const fp::Trig t = modrm == 0xf2 ? fp::tangent(x, control) : fp::sine_cosine(x, control);
              if (t.out_of_range) return set_conditions(fsw::kC2, fsw::kC2);
              const uint8_t flags = uint8_t(t.first.flags | t.second.flags);
              if (!accept(flags, modrm == 0xf2 ? t.first.rounded_up : t.second.rounded_up)) return;
              set_conditions(0, fsw::kC2);
              regs.set_st(0, t.first.value);
              regs.push(modrm == 0xf2 ? fp::kOne : t.second.value);
            });
          case 0xf3: return binary_pop([&](fp::Float80 y, fp::Float80 x) { return fp::arctangent(y, x, control); });
          case 0xf4:  // FXTRACT
            return replace_and_push([&](fp::Float80 x) {
              const fp::Extracted e = fp::extract(x);
              if (!accept(e.flags, false)) return;
              regs.set_st(0, e.exponent);
              regs.push(e.significand);
            });
          case 0xf5:  // FPREM1
          case 0xf8: {  // FPREM: C1 and C2 clear whatever happens; a quotient sets C0, C3 and C1
            set_conditions(0, fsw::kC1 | fsw::kC2);
            if (regs.empty(0) || regs.empty(1)) {
              if (stack_fault(false)) regs.set_st(0, fp::kIndefinite);
              return;
            }
            const fp::PartialRemainder p = fp::partial_remainder(regs.st(0), regs.st(1), modrm == 0xf5, control);
            if (!accept(p.result.flags, false)) return;
            regs.set_st(0, p.result.value);
            if (p.special) return;
            set_conditions(uint16_t((p.incomplete ? fsw::kC2 : 0) | ((p.quotient_low & 4) ? fsw::kC0 : 0) |
                                    ((p.quotient_low & 2) ? fsw::kC3 : 0) | ((p.quotient_low & 1) ? fsw::kC1 : 0)),
                           fsw::kConditions);
            return;
          }
          case 0xf6:  // FDECSTP
          case 0xf7:  // FINCSTP
            regs.rotate(modrm == 0xf7 ? 1 : -1);
            set_c1(false);
            return;
          case 0xf9:  // FYL2XP1
            return binary_pop([&](fp::Float80 y, fp::Float80 x) { return fp::y_log2_x_plus_1(y, x, control); });
          case 0xfa: return unary([&](fp::Float80 x) { return fp::square_root(x, control); });     // FSQRT
          case 0xfc: return unary([&](fp::Float80 x) { return fp::round_to_integer(x, control); });  // FRNDINT
          case 0xfd: {  // FSCALE
            if (regs.empty(0) || regs.empty(1)) {
              if (stack_fault(false)) regs.set_st(0, fp::kIndefinite);
              return;
            }
            const fp::Result r = fp::scale(regs.st(0), regs.st(1), control);
            if (accept(r.flags, r.rounded_up)) regs.set_st(0, r.value);
            return;
          }
          case 0xfe:  // FSIN
          case 0xff: {  // FCOS
            if (regs.empty(0)) {
              if (stack_fault(false)) regs.set_st(0, fp::kIndefinite);
              return;
            }
            const fp::Trig t = modrm == 0xfe ? fp::sine(regs.st(0), control) : fp::cosine(regs.st(0), control);
            if (t.out_of_range) return set_conditions(fsw::kC2, fsw::kC2);
            if (!accept(t.first.flags, t.first.rounded_up)) return;
            set_conditions(0, fsw::kC2);
            regs.set_st(0, t.first.value);
            return;
          }
          default: raise_ud(insn, true);
        }
        if (reg == 1) {  // FXCH: empty operands become the indefinite when #IS is masked
          fp::Float80 a = regs.st(0), b = regs.st(rm);
          if (regs.empty(0) || regs.empty(rm)) {
            if (!stack_fault(false)) return;
            if (regs.empty(0)) a = fp::kIndefinite;
            if (regs.empty(rm)) b = fp::kIndefinite;
          }
          regs.set_st(0, b);
          regs.set_st(rm, a);
          set_c1(false);
          return;
        }
        break;  // FSTP ST(i) alias, below
      }
      case 0xdb: {
        if (mem) {
          switch (reg) {
            case 0: return load(fp::from_integer(int32_t(uint32_t(read_mem(seg_index, at(0), 4)))), 0, false);
            case 1: case 2: case 3: {  // FISTTP, FIST, FISTP m32int
              if (regs.empty(0)) return store_underflow(reg != 2, [&] { write_mem(seg_index, at(0), 4, 0x80000000u); });
              const fp::Stored s = fp::to_integer(regs.st(0), 32, reg == 1, control);
              return store_result(s.flags, s.rounded_up, s.stored, reg != 2,
                                  [&] { write_mem(seg_index, at(0), 4, s.bits); });
            }
            case 5: return load(read80(), 0, false);  // FLD m80fp
            case 7: {  // FSTP m80fp
              if (regs.empty(0)) return store_underflow(true, [&] { write80(fp::kIndefinite); });
              write80(regs.st(0));
              set_c1(false);
              regs.pop();
              return;
            }
            default: raise_ud(insn, true);
          }
        }
        if (reg < 4) {  // FCMOVNB/NE/NBE/NU
          if (regs.empty(0) || regs.empty(rm)) {
            if (stack_fault(false)) regs.set_st(0, fp::kIndefinite);
          } else if (!condition_holds(reg, s_.rflags)) {
            regs.set_st(0, regs.st(rm));
          }
          return;
        }
        if (reg == 5 || reg == 6) return compare(regs.st(rm), 0, regs.empty(rm), reg == 5, 0, true);  // FUCOMI, FCOMI
        switch (modrm) {
          case 0xe0: case 0xe1: case 0xe4:  // FNENI, FNDISI, FNSETPM: 8087/287 controls, no-ops since the 387
            control_instruction = true;
            return;
          case 0xe2:  // FNCLEX
            control_instruction = true;
            regs.set_status(uint16_t(regs.status() & (fsw::kConditions | fsw::kTopMask)));
            return;
          case 0xe3:  // FNINIT
            control_instruction = true;
            initialize();
            return;
          default: raise_ud(insn, true);
        }
        return;
      }
      case 0xdd: {
        if (mem) {
          switch (reg) {
            case 0: {  // FLD m64fp
              const fp::Result r = fp::from_float64(read_mem(seg_index, at(0), 8));
              return load(r.value, r.flags, false);
            }
            case 1: {  // FISTTP m64int
              if (regs.empty(0)) {
                return store_underflow(true, [&] { write_mem(seg_index, at(0), 8, 0x8000000000000000ull); });
              }
              const fp::Stored s = fp::to_integer(regs.st(0), 64, true, control);
              return store_result(s.flags, s.rounded_up, s.stored, true,
                                  [&] { write_mem(seg_index, at(0), 8, s.bits); });
            }
            case 2:
            case 3: {  // FST/FSTP m64fp
              if (regs.empty(0)) {
                return store_underflow(reg == 3, [&] { write_mem(seg_index, at(0), 8, 0xfff8000000000000ull); });
              }
              const fp::Stored s = fp::to_float64(regs.st(0), control);
              return store_result(s.flags, s.rounded_up, s.stored, reg == 3,
                                  [&] { write_mem(seg_index, at(0), 8, s.bits); });
            }
            case 4: {  // FRSTOR
              control_instruction = true;
              std::array<uint8_t, 28 + 80> image{};
              read_bytes(image.data(), env_size + 80);
              return load_environment(image.data(), image.data() + env_size);
            }
            case 6: {  // FNSAVE: the environment and the registers in stack order, then FNINIT
              control_instruction = true;
              std::array<uint8_t, 28 + 80> image{};
              const auto env = environment();
              std::memcpy(image.data(), env.data(), env_size);
              for (unsigned i = 0; i < 8; ++i) {
                const fp::Float80 v = regs.st(i);
                std::memcpy(&image[env_size + 10 * i], &v.sig, 8);
                std::memcpy(&image[env_size + 10 * i + 8], &v.sign_exp, 2);
              }
              write_bytes(image.data(), env_size + 80);
              initialize();
              return;
            }
            case 7:  // FNSTSW m16
              control_instruction = true;
              write_mem(seg_index, at(0), 2, regs.status());
              return;
            default: raise_ud(insn, true);
          }
        }
        switch (reg) {
          case 0:  // FFREE
            regs.free(rm);
            set_c1(false);
            return;
          case 1: break;  // FXCH alias, below
          case 2:         // FST ST(i)
          case 3:         // FSTP ST(i)
            break;
          case 4: return compare(regs.st(rm), 0, regs.empty(rm), true, 0, false);  // FUCOM
          case 5: return compare(regs.st(rm), 0, regs.empty(rm), true, 1, false);  // FUCOMP
          default: raise_ud(insn, true);
        }
        if (reg == 1) {
          fp::Float80 a = regs.st(0), b = regs.st(rm);
          if (regs.empty(0) || regs.empty(rm)) {
            if (!stack_fault(false)) return;
            if (regs.empty(0)) a = fp::kIndefinite;
            if (regs.empty(rm)) b = fp::kIndefinite;
          }
          regs.set_st(0, b);
          regs.set_st(rm, a);
          set_c1(false);
          return;
        }
        if (regs.empty(0)) {
          if (stack_fault(false)) {
            regs.set_st(rm, fp::kIndefinite);
            if (reg == 3) regs.pop();
          }
          return;
        }
        regs.set_st(rm, regs.st(0));
        set_c1(false);
        if (reg == 3) regs.pop();
        return;
      }
      case 0xdf: {
        if (mem) {
          switch (reg) {
            case 0: return load(fp::from_integer(int16_t(uint16_t(read_mem(seg_index, at(0), 2)))), 0, false);
            case 1: case 2: case 3: {  // FISTTP, FIST, FISTP m16int
              if (regs.empty(0)) return store_underflow(reg != 2, [&] { write_mem(seg_index, at(0), 2, 0x8000); });
              const fp::Stored s = fp::to_integer(regs.st(0), 16, reg == 1, control);
              return store_result(s.flags, s.rounded_up, s.stored, reg != 2,
                                  [&] { write_mem(seg_index, at(0), 2, s.bits); });
            }
            case 4: {  // FBLD
              std::array<uint8_t, 10> bcd{};
              read_bytes(bcd.data(), 10);
              return load(fp::from_bcd(bcd), 0, false);
            }
            case 5: return load(fp::from_integer(int64_t(read_mem(seg_index, at(0), 8))), 0, false);  // FILD m64
            case 6: {  // FBSTP
              if (regs.empty(0)) {
                return store_underflow(true, [&] {
                  const std::array<uint8_t, 10> indefinite{0, 0, 0, 0, 0, 0, 0, 0xc0, 0xff, 0xff};
                  write_bytes(indefinite.data(), 10);
                });
              }
              const fp::StoredBcd s = fp::to_bcd(regs.st(0), control);
              return store_result(s.flags, s.rounded_up, s.stored, true, [&] { write_bytes(s.bcd.data(), 10); });
            }
            default: {  // FISTP m64int
              if (regs.empty(0)) {
                return store_underflow(true, [&] { write_mem(seg_index, at(0), 8, 0x8000000000000000ull); });
              }
              const fp::Stored s = fp::to_integer(regs.st(0), 64, false, control);
              return store_result(s.flags, s.rounded_up, s.stored, true,
                                  [&] { write_mem(seg_index, at(0), 8, s.bits); });
            }
          }
        }
        switch (reg) {
          case 0:  // FFREEP (undocumented): free ST(i), then pop
            regs.free(rm);
            regs.pop();
            set_c1(false);
            return;
          case 1: {  // FXCH alias
            fp::Float80 a = regs.st(0), b = regs.st(rm);
            if (regs.empty(0) || regs.empty(rm)) {
              if (!stack_fault(false)) return;
              if (regs.empty(0)) a = fp::kIndefinite;
              if (regs.empty(rm)) b = fp::kIndefinite;
            }
            regs.set_st(0, b);
            regs.set_st(rm, a);
            set_c1(false);
            return;
          }
          case 2: case 3: break;  // FSTP ST(i) aliases, below
          case 4:
            if (rm != 0) raise_ud(insn, true);
            control_instruction = true;  // FNSTSW AX
            reg_write(kRax, 2, regs.status());
            return;
          case 5: return compare(regs.st(rm), 0, regs.empty(rm), true, 1, true);   // FUCOMIP
          case 6: return compare(regs.st(rm), 0, regs.empty(rm), false, 1, true);  // FCOMIP
          default: raise_ud(insn, true);
        }
        break;
      }
      default: raise_ud(insn, true);
    }
    // FSTP ST(i) through its aliases (D9 D8+i, DF D0+i, DF D8+i).
    if (regs.empty(0)) {
      if (stack_fault(false)) {
        regs.set_st(rm, fp::kIndefinite);
        regs.pop();
      }
      return;
    }
    regs.set_st(rm, regs.st(0));
    set_c1(false);
    regs.pop();
  };
  run();
  if (control_instruction) return;
  regs.set_quad(kFipOffset, insn_rip_);
  regs.set_word(kFopOffset, uint16_t(((op & 7) << 8) | modrm));
  if (mem) regs.set_quad(kFdpOffset, address);
}

}  // namespace deja
