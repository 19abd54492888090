// A small x86-64 assembler for the software CPU's JIT: the instructions its templates emit, with labels and rel32 fixups.
#pragma once

#include <cstdint>
#include <cstring>
#include <iterator>
#include <vector>

namespace deja::interp::x64 {

// Host registers by encoding number.
enum Reg : uint8_t { rax, rcx, rdx, rbx, rsp, rbp, rsi, rdi, r8, r9, r10, r11, r12, r13, r14, r15, kNoReg = 0xff };

// A memory operand [base + index * scale + disp] (base required; index optional).
struct Mem {
  Reg base;
  int32_t disp = 0;
  Reg index = kNoReg;
  uint8_t scale = 1;
};
inline Mem at(Reg base, int32_t disp = 0) { return Mem{base, disp}; }
inline Mem at(Reg base, Reg index, uint8_t scale, int32_t disp = 0) { return Mem{base, disp, index, scale}; }

// Condition codes (the low nibble of Jcc/SETcc), as the guest's.
enum Cond : uint8_t { kO, kNo, kB, kAe, kE, kNe, kBe, kA, kS, kNs, kP, kNp, kL, kGe, kLe, kG };

// ALU operations by their /digit in opcodes 0x81/0x83 (and *8 + 1 / + 3 for the r/m forms).
enum Alu : uint8_t { kAdd = 0, kOr = 1, kAdc = 2, kSbb = 3, kAnd = 4, kSub = 5, kXor = 6, kCmp = 7 };
// Shifts and rotates by their /digit in 0xC1/0xD3.
enum Shift : uint8_t { kRol = 0, kRor = 1, kShl = 4, kShr = 5, kSar = 7 };

struct Label {
  int position = -1;  // byte offset once bound
  // rel32 fields to patch: the first few inline (labels are made by the thousand while blocks translate).
  int inline_uses[4];
  unsigned inline_count = 0;
  std::vector<int> more_uses;
};

class Assembler {
 public:
  // Storage: the code is code[0, size()); the rest is room (sized once and reused from block to block,
  // so a byte costs a store and a compare: vector::push_back was 2.5% of a Linux boot).
  std::vector<uint8_t> code;
  unsigned binds = 0;  // labels bound so far: code after a bound label can be reached from elsewhere

  size_t size() const { return size_; }
  void reset() {
    size_ = 0;
    if (code.size() < 4096) code.resize(4096);
  }
  [[gnu::always_inline]] void u8(uint8_t v) {
    room(1);
    code[size_++] = v;
  }
  [[gnu::always_inline]] void u32(uint32_t v) {
    room(4);
    std::memcpy(&code[size_], &v, 4);
    size_ += 4;
  }
  void u64(uint64_t v) {
    room(8);
    std::memcpy(&code[size_], &v, 8);
    size_ += 8;
  }

  // ---- encoding -------------------------------------------------------------------------------------
  // REX prefix for an operation of `bytes` width with ModRM.reg = `reg` and r/m (or SIB base/index).
  void rex(unsigned bytes, unsigned reg, unsigned index, unsigned base, bool force = false) {
    uint8_t r = 0x40;
    if (bytes == 8) r |= 8;
    if (reg & 8) r |= 4;
    if (index != kNoReg && (index & 8)) r |= 2;
    if (base != kNoReg && (base & 8)) r |= 1;
    if (r != 0x40 || force) u8(r);
  }
  // Operand-size prefix and REX for `bytes` wide operations on registers `reg`/`rm` (byte ops on SPL..DIL
  // need a REX even without extension bits).
  void prefix_rr(unsigned bytes, unsigned reg, unsigned rm) {
    if (bytes == 2) u8(0x66);
    rex(bytes, reg, kNoReg, rm, bytes == 1 && (reg >= 4 || rm >= 4));
  }
  void prefix_rm(unsigned bytes, unsigned reg, const Mem& m) {
    if (bytes == 2) u8(0x66);
    rex(bytes, reg, m.index, m.base, bytes == 1 && reg >= 4 && reg < 8);
  }
  void modrm_rr(unsigned reg, unsigned rm) { u8(uint8_t(0xc0 | ((reg & 7) << 3) | (rm & 7))); }
  void modrm_mem(unsigned reg, const Mem& m) {
    const unsigned base = m.base & 7;
    const bool need_sib = m.index != kNoReg || base == rsp;
    unsigned mod = m.disp == 0 && base != rbp ? 0 : (m.disp >= -128 && m.disp <= 127 ? 1 : 2);
    u8(uint8_t((mod << 6) | ((reg & 7) << 3) | (need_sib ? 4 : base)));
    if (need_sib) {
      const unsigned scale_bits = m.scale == 8 ? 3 : m.scale == 4 ? 2 : m.scale == 2 ? 1 : 0;
      const unsigned index = m.index == kNoReg ? 4 : (m.index & 7);
      u8(uint8_t((scale_bits << 6) | (index << 3) | base));
    }
    if (mod == 1) u8(uint8_t(int8_t(m.disp)));
    if (mod == 2) u32(uint32_t(m.disp));
  }
  // op reg, r/m or op r/m, reg with a one- or two-byte opcode.
  void op_rr(unsigned bytes, uint8_t opcode, unsigned reg, unsigned rm) {
    prefix_rr(bytes, reg, rm);
    u8(opcode);
    modrm_rr(reg, rm);
  }
  void op_rm(unsigned bytes, uint8_t opcode, unsigned reg, const Mem& m) {
    prefix_rm(bytes, reg, m);
    u8(opcode);
    modrm_mem(reg, m);
  }
  void op2_rr(unsigned bytes, uint8_t opcode2, unsigned reg, unsigned rm) {
    prefix_rr(bytes, reg, rm);
    u8(0x0f);
    u8(opcode2);
    modrm_rr(reg, rm);
  }
  void op2_rm(unsigned bytes, uint8_t opcode2, unsigned reg, const Mem& m) {
    prefix_rm(bytes, reg, m);
    u8(0x0f);
    u8(opcode2);
    modrm_mem(reg, m);
  }

  // SSE: [prefix] 0F opcode with XMM (or GPR) `reg` and an XMM `rm` or memory (legacy encodings, XMM0-7).
  void sse_rr(uint8_t prefix, uint8_t opcode, unsigned reg, unsigned rm) {
    if (prefix) u8(prefix);
    op2_rr(4, opcode, reg, rm);
  }
  void sse_rm(uint8_t prefix, uint8_t opcode, unsigned reg, const Mem& m) {
    if (prefix) u8(prefix);
    op2_rm(4, opcode, reg, m);
  }
  void movdqu_load(unsigned xmm, const Mem& m) { sse_rm(0xf3, 0x6f, xmm, m); }
  void movdqu_store(const Mem& m, unsigned xmm) { sse_rm(0xf3, 0x7f, xmm, m); }
  void movq_load(unsigned xmm, const Mem& m) { sse_rm(0xf3, 0x7e, xmm, m); }   // the high quadword cleared
  void movq_store(const Mem& m, unsigned xmm) { sse_rm(0x66, 0xd6, xmm, m); }
  // [prefix] 0F `map` opcode on XMM0-7 (the three-byte opcodes of SSSE3 and SSE4: map 0x38 or 0x3A).
  void sse_rr3(uint8_t prefix, uint8_t map, uint8_t opcode, unsigned reg, unsigned rm) {
    if (prefix) u8(prefix);
    u8(0x0f);
    u8(map);
    u8(opcode);
    modrm_rr(reg, rm);
  }

  // VEX (the three-byte form): `map` 1 0F, 2 0F38, 3 0F3A; `pp` 0 none, 1 66, 2 F3, 3 F2; `reg` and `vvvv`
  // register numbers (0 for an unused VEX.vvvv), the r/m operand a register or memory.
  void vex_prefix(uint8_t map, uint8_t pp, bool l, bool w, unsigned reg, unsigned vvvv, unsigned index, unsigned base) {
    u8(0xc4);
    u8(uint8_t(((reg & 8) ? 0 : 0x80) | ((index != kNoReg && (index & 8)) ? 0 : 0x40) |
               ((base != kNoReg && (base & 8)) ? 0 : 0x20) | map));
    u8(uint8_t((w ? 0x80 : 0) | ((~vvvv & 15) << 3) | (l ? 4 : 0) | pp));
  }
  void vex_rr(uint8_t map, uint8_t pp, bool l, bool w, uint8_t opcode, unsigned reg, unsigned vvvv, unsigned rm) {
    vex_prefix(map, pp, l, w, reg, vvvv, kNoReg, rm);
    u8(opcode);
    modrm_rr(reg, rm);
  }
  void vex_rm(uint8_t map, uint8_t pp, bool l, bool w, uint8_t opcode, unsigned reg, unsigned vvvv, const Mem& m) {
    vex_prefix(map, pp, l, w, reg, vvvv, m.index, m.base);
    u8(opcode);
    modrm_mem(reg, m);
  }
  // VMOVDQU of 16 (xmm) or 32 (ymm) bytes; a 128-bit load clears bits 128-255 of the host register.
  void vmovdqu_load(unsigned v, const Mem& m, bool ymm = false) { vex_rm(1, 2, ymm, false, 0x6f, v, 0, m); }
  void vmovdqu_store(const Mem& m, unsigned v, bool ymm = false) { vex_rm(1, 2, ymm, false, 0x7f, v, 0, m); }
  // VINSERTI128 ymm_v, ymm_v, m128, 1 / VEXTRACTI128 m128, ymm_v, 1: the upper half from or to memory.
  void vinserti128_high(unsigned v, const Mem& m) {
    vex_rm(3, 1, true, false, 0x38, v, v, m);
    u8(1);
  }
  void vextracti128_high(const Mem& m, unsigned v) {
    vex_rm(3, 1, true, false, 0x39, v, 0, m);
    u8(1);
  }
  void vpxor_zero(unsigned v) { vex_rr(1, 1, false, false, 0xef, v, v, v); }  // the whole YMM register zero

  // ---- moves ----------------------------------------------------------------------------------------
  void mov(unsigned bytes, Reg dst, Reg src) { op_rr(bytes, bytes == 1 ? 0x88 : 0x89, src, dst); }
  void load(unsigned bytes, Reg dst, const Mem& m) { op_rm(bytes, bytes == 1 ? 0x8a : 0x8b, dst, m); }
  void store(unsigned bytes, const Mem& m, Reg src) { op_rm(bytes, bytes == 1 ? 0x88 : 0x89, src, m); }
  // Zero- and sign-extending loads to 32/64 bits.
  void movzx(Reg dst, unsigned src_bytes, const Mem& m) { op2_rm(4, src_bytes == 1 ? 0xb6 : 0xb7, dst, m); }
  void movzx(Reg dst, unsigned src_bytes, Reg src) {
    if (src_bytes == 1 && src >= 4 && src < 8) {  // SPL..DIL need a REX (without one they are AH..BH)
      rex(4, dst, kNoReg, src, true);
      u8(0x0f);
      u8(0xb6);
      modrm_rr(dst, src);
      return;
    }
    op2_rr(4, src_bytes == 1 ? 0xb6 : 0xb7, dst, src);
  }
  void movsx(unsigned bytes, Reg dst, unsigned src_bytes, Reg src) {
    if (src_bytes == 4) {
      op_rr(bytes, 0x63, dst, src);  // MOVSXD
    } else {
      prefix_rr(bytes, dst, src);
      u8(0x0f);
      u8(src_bytes == 1 ? 0xbe : 0xbf);
      modrm_rr(dst, src);
    }
  }
  void mov_imm64(Reg dst, uint64_t value) {
    if (value <= 0xffffffffu) {  // mov r32, imm32 zero-extends
      rex(4, 0, kNoReg, dst);
      u8(uint8_t(0xb8 + (dst & 7)));
      u32(uint32_t(value));
    } else if (int64_t(value) >= INT32_MIN && int64_t(value) <= INT32_MAX) {
      rex(8, 0, kNoReg, dst);
      u8(0xc7);
      modrm_rr(0, dst);
      u32(uint32_t(value));
    } else {
      rex(8, 0, kNoReg, dst);
      u8(uint8_t(0xb8 + (dst & 7)));
      u64(value);
    }
  }
  // mov r/m, imm32 (sign-extended for 8 bytes).
  void store_imm(unsigned bytes, const Mem& m, int32_t value) {
    prefix_rm(bytes, 0, m);
    u8(bytes == 1 ? 0xc6 : 0xc7);
    modrm_mem(0, m);
    if (bytes == 1) u8(uint8_t(value));
    else if (bytes == 2) { u8(uint8_t(value)); u8(uint8_t(value >> 8)); }
    else u32(uint32_t(value));
  }
  void lea(Reg dst, const Mem& m) { op_rm(8, 0x8d, dst, m); }

  // ---- arithmetic -----------------------------------------------------------------------------------
  void alu(unsigned bytes, Alu op, Reg dst, Reg src) { op_rr(bytes, uint8_t(op * 8 + (bytes == 1 ? 0 : 1)), src, dst); }
  void alu(unsigned bytes, Alu op, Reg dst, const Mem& src) { op_rm(bytes, uint8_t(op * 8 + (bytes == 1 ? 2 : 3)), dst, src); }
  void alu_imm(unsigned bytes, Alu op, Reg dst, int32_t imm) {
    prefix_rr(bytes, 0, dst);
    if (bytes == 1) {
      u8(0x80);
      modrm_rr(op, dst);
      u8(uint8_t(imm));
    } else if (imm >= -128 && imm <= 127) {
      u8(0x83);
      modrm_rr(op, dst);
      u8(uint8_t(int8_t(imm)));
    } else {
      u8(0x81);
      modrm_rr(op, dst);
      if (bytes == 2) { u8(uint8_t(imm)); u8(uint8_t(imm >> 8)); }
      else u32(uint32_t(imm));
    }
  }
  void alu_imm(unsigned bytes, Alu op, const Mem& dst, int32_t imm) {
    prefix_rm(bytes, 0, dst);
    if (bytes == 1) {
      u8(0x80);
      modrm_mem(op, dst);
      u8(uint8_t(imm));
    } else if (imm >= -128 && imm <= 127) {
      u8(0x83);
      modrm_mem(op, dst);
      u8(uint8_t(int8_t(imm)));
    } else {
      u8(0x81);
      modrm_mem(op, dst);
      if (bytes == 2) { u8(uint8_t(imm)); u8(uint8_t(imm >> 8)); }
      else u32(uint32_t(imm));
    }
  }
  void test(unsigned bytes, Reg a, Reg b) { op_rr(bytes, bytes == 1 ? 0x84 : 0x85, b, a); }
  void shift_imm(unsigned bytes, Shift op, Reg dst, uint8_t count) {
    prefix_rr(bytes, 0, dst);
    u8(bytes == 1 ? 0xc0 : 0xc1);
    modrm_rr(op, dst);
    u8(count);
  }
  void shift_cl(unsigned bytes, Shift op, Reg dst) {
    prefix_rr(bytes, 0, dst);
    u8(bytes == 1 ? 0xd2 : 0xd3);
    modrm_rr(op, dst);
  }
  void setcc(Cond c, Reg dst) {
    rex(1, 0, kNoReg, dst, dst >= 4);
    u8(0x0f);
    u8(uint8_t(0x90 + c));
    modrm_rr(0, dst);
  }
  void cmov(unsigned bytes, Cond c, Reg dst, Reg src) { op2_rr(bytes, uint8_t(0x40 + c), dst, src); }
  void inc_mem64(const Mem& m) { op_rm(8, 0xff, 0, m); }
  void add_mem64_imm(const Mem& m, int32_t imm) { alu_imm(8, kAdd, m, imm); }
  void imul(unsigned bytes, Reg dst, Reg src) { op2_rr(bytes, 0xaf, dst, src); }
  void bswap(unsigned bytes, Reg r) {  // 4 or 8
    rex(bytes, 0, kNoReg, r);
    u8(0x0f);
    u8(uint8_t(0xc8 + (r & 7)));
  }
  void neg(unsigned bytes, Reg r) {
    prefix_rr(bytes, 0, r);
    u8(bytes == 1 ? 0xf6 : 0xf7);
    modrm_rr(3, r);
  }
  void not_(unsigned bytes, Reg r) {
    prefix_rr(bytes, 0, r);
    u8(bytes == 1 ? 0xf6 : 0xf7);
    modrm_rr(2, r);
  }

  // ---- control ----------------------------------------------------------------------------------------
  void push(Reg r) {
    if (r & 8) u8(0x41);
    u8(uint8_t(0x50 + (r & 7)));
  }
  void pop(Reg r) {
    if (r & 8) u8(0x41);
    u8(uint8_t(0x58 + (r & 7)));
  }
  void ret() { u8(0xc3); }
  void call_abs(uint64_t target) {  // through RAX (clobbered anyway by the call)
    mov_imm64(rax, target);
    u8(0xff);
    u8(0xd0);
  }
  void jmp_mem(const Mem& m) {
    rex(4, 4, m.index, m.base);
    u8(0xff);
    modrm_mem(4, m);
  }
  void jmp_reg(Reg r) {
    if (r & 8) u8(0x41);
    u8(0xff);
    modrm_rr(4, r);
  }
  void jmp(Label& l) {
    u8(0xe9);
    use(l);
  }
  void jcc(Cond c, Label& l) {
    u8(0x0f);
    u8(uint8_t(0x80 + c));
    use(l);
  }
  void bind(Label& l) {
    ++binds;
    l.position = int(size_);
    for (unsigned i = 0; i < l.inline_count; ++i) patch(l.inline_uses[i], l.position);
    for (int at : l.more_uses) patch(at, l.position);
    l.inline_count = 0;
    l.more_uses.clear();
  }

 private:
  size_t size_ = 0;
  [[gnu::always_inline]] void room(size_t n) {
    if (size_ + n > code.size()) [[unlikely]] code.resize(code.size() * 2 + n);
  }
  void use(Label& l) {
    const int at = int(size_);
    u32(0);
    if (l.position >= 0) patch(at, l.position);
    else if (l.inline_count < std::size(l.inline_uses)) l.inline_uses[l.inline_count++] = at;
    else l.more_uses.push_back(at);
  }
  void patch(int at, int target) {
    const int32_t rel = target - (at + 4);
    std::memcpy(&code[size_t(at)], &rel, 4);
  }
};

}  // namespace deja::interp::x64
