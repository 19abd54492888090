// dispatch_proto: measures four ways to run cpu-bound's inner loop (switch, call-threaded, computed goto, template JIT) to choose interp's fast path (issue 15).
//
// Every variant runs the same 18-instruction guest loop of guest-tests/cpu-bound.c over the same
// in-memory register file with the same costs a real software CPU pays: lazy flags, a 256-entry
// software TLB on both memory accesses, exact per-block instruction and branch counts, and a
// step-limit check at every block boundary. Only the dispatch differs, so the ratios say what the
// dispatch technique is worth. Build target: bench_dispatch (bench/CMakeLists.txt).
#include <sys/mman.h>

#include <cstddef>
#include <ctime>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace {

constexpr int kRax = 0, kRcx = 1, kRdx = 2, kRbx = 3, kRsi = 6;
constexpr uint64_t kTable = 0x10000;  // guest-linear address of the 64-entry table

struct TlbEntry {
  uint64_t tag;     // linear page number, ~0 = empty
  uint64_t addend;  // host address - linear address
  uint64_t pad[2];
};

// Lazy flags: the last flag-setting operation and what it needs to derive any flag.
enum CcOp : uint32_t { kCcEflags, kCcLogic64, kCcLogic32, kCcLogic8, kCcShl64, kCcShr64, kCcDec64 };

struct State {
  uint64_t gpr[16];
  uint64_t eflags;  // valid when cc_op == kCcEflags
  uint64_t cc_dst, cc_src;
  uint32_t cc_op;
  uint64_t steps, branches, step_limit;
  TlbEntry tlb[256];
  uint8_t* ram;
};

bool parity(uint64_t v) { return !(__builtin_popcount(uint8_t(v)) & 1); }

uint64_t szp(uint64_t r, unsigned w) {
  uint64_t m = w == 64 ? ~0ull : (1ull << w) - 1;
  r &= m;
  return ((r >> (w - 1)) & 1 ? 0x80 : 0) | (r == 0 ? 0x40 : 0) | (parity(r) ? 4 : 0);
}

uint64_t compute_eflags(const State& s) {
  switch (s.cc_op) {
    case kCcEflags: return s.eflags;
    case kCcLogic64: return szp(s.cc_dst, 64);
    case kCcLogic32: return szp(s.cc_dst, 32);
    case kCcLogic8: return szp(s.cc_dst, 8);
    case kCcShl64:
    case kCcShr64: return szp(s.cc_dst, 64) | (s.cc_src & 0x801);
    case kCcDec64: return szp(s.cc_dst, 64) | (s.cc_src & 1) | (s.cc_dst == 0x7fffffffffffffffull ? 0x800 : 0) |
                          ((s.cc_dst & 0xf) == 0xf ? 0x10 : 0);
  }
  return 0;
}

uint64_t slow_translate(State& s, uint64_t linear) {
  TlbEntry& e = s.tlb[(linear >> 12) & 255];
  e.tag = linear >> 12;
  e.addend = uint64_t(s.ram) - kTable + 0 * linear;  // the table page is identity-placed at ram[0]
  return uint64_t(s.ram) + (linear - kTable);
}

inline uint64_t* host_ptr(State& s, uint64_t linear) {
  const TlbEntry& e = s.tlb[(linear >> 12) & 255];
  if (e.tag == (linear >> 12) && (linear & 0xfff) <= 4096 - 8) [[likely]]
    return reinterpret_cast<uint64_t*>(linear + e.addend);
  return reinterpret_cast<uint64_t*>(slow_translate(s, linear));
}

// ---- the guest program, as decoded operations -------------------------------------------------
enum Kind : uint8_t { kMovRR64, kMovRR32, kShlRI64, kShrRI64, kRolRI64, kXorRR64, kAndRI32, kAddRM64, kMovMR64,
                      kTestRI8, kDec64, kJz, kJnz };
struct Insn {
  Kind kind;
  uint8_t a, b;  // registers
  uint8_t imm;
};
// Blocks: 0 = loop head (15 instructions, ends in JZ), 1 = ROL; DEC; JNZ, 2 = DEC; JNZ.
const std::vector<Insn> kBlock0 = {
    {kMovRR64, kRdx, kRax, 0}, {kShlRI64, kRdx, 0, 13}, {kXorRR64, kRax, kRdx, 0}, {kMovRR64, kRdx, kRax, 0},
    {kShrRI64, kRdx, 0, 7},    {kXorRR64, kRax, kRdx, 0}, {kMovRR64, kRdx, kRax, 0}, {kShlRI64, kRdx, 0, 17},
    {kXorRR64, kRax, kRdx, 0}, {kMovRR32, kRdx, kRax, 0}, {kAndRI32, kRdx, 0, 63}, {kAddRM64, kRbx, kRdx, 0},
    {kMovMR64, kRdx, kRbx, 0}, {kTestRI8, kRax, 0, 1},    {kJz, 2, 1, 0}};
const std::vector<Insn> kBlock1 = {{kRolRI64, kRbx, 0, 5}, {kDec64, kRcx, 0, 0}, {kJnz, 0, 0xff, 0}};
const std::vector<Insn> kBlock2 = {{kDec64, kRcx, 0, 0}, {kJnz, 0, 0xff, 0}};
const std::vector<Insn>* kBlocks[3] = {&kBlock0, &kBlock1, &kBlock2};

// Shared semantics (every variant calls these, inlined).
inline void do_insn(State& s, const Insn& i) {
  uint64_t* g = s.gpr;
  switch (i.kind) {
    case kMovRR64: g[i.a] = g[i.b]; break;
    case kMovRR32: g[i.a] = uint32_t(g[i.b]); break;
    case kShlRI64: s.cc_src = ((g[i.a] >> (64 - i.imm)) & 1) | ((((g[i.a] << i.imm) >> 63) ^ ((g[i.a] >> (64 - i.imm)) & 1)) << 11);
                   g[i.a] <<= i.imm; s.cc_dst = g[i.a]; s.cc_op = kCcShl64; break;
    case kShrRI64: s.cc_src = ((g[i.a] >> (i.imm - 1)) & 1) | ((g[i.a] >> 63) << 11);
                   g[i.a] >>= i.imm; s.cc_dst = g[i.a]; s.cc_op = kCcShr64; break;
    case kRolRI64: {
      uint64_t f = compute_eflags(s);
      uint64_t r = (g[i.a] << i.imm) | (g[i.a] >> (64 - i.imm));
      g[i.a] = r;
      uint64_t cf = r & 1;
      s.eflags = (f & ~0x801ull) | cf | (((r >> 63) ^ cf) << 11);
      s.cc_op = kCcEflags;
      break;
    }
    case kXorRR64: g[i.a] ^= g[i.b]; s.cc_dst = g[i.a]; s.cc_op = kCcLogic64; break;
    case kAndRI32: g[i.a] = uint32_t(g[i.a]) & i.imm; s.cc_dst = g[i.a]; s.cc_op = kCcLogic32; break;
    case kAddRM64: {
      uint64_t v = *host_ptr(s, g[kRsi] + g[i.b] * 8);
      g[i.a] += v;
      s.cc_dst = g[i.a];
      s.cc_op = kCcLogic64;
      break;
    }
    case kMovMR64: *host_ptr(s, g[kRsi] + g[i.a] * 8) = g[i.b]; break;
    case kTestRI8: s.cc_dst = g[i.a] & i.imm & 0xff; s.cc_op = kCcLogic8; break;
    case kDec64: {
      uint64_t cf = compute_eflags(s) & 1;
      g[i.a] -= 1;
      s.cc_dst = g[i.a];
      s.cc_src = cf;
      s.cc_op = kCcDec64;
      break;
    }
    default: break;
  }
}

inline bool zf(const State& s) {
  switch (s.cc_op) {
    case kCcEflags: return s.eflags & 0x40;
    case kCcLogic32: return uint32_t(s.cc_dst) == 0;
    case kCcLogic8: return uint8_t(s.cc_dst) == 0;
    default: return s.cc_dst == 0;
  }
}

void reset(State& s, uint8_t* ram, uint64_t iterations) {
  std::memset(&s, 0, sizeof s);
  s.ram = ram;
  std::memset(ram, 0, 4096);
  for (auto& e : s.tlb) e.tag = ~0ull;
  s.gpr[kRax] = 0x9e3779b97f4a7c15ull;
  s.gpr[kRcx] = iterations;
  s.gpr[kRsi] = kTable;
  s.step_limit = ~0ull;
}

uint64_t checksum(const State& s) {
  uint64_t c = s.gpr[kRax] ^ s.gpr[kRbx];
  for (int i = 0; i < 64; ++i) c = (c ^ reinterpret_cast<const uint64_t*>(s.ram)[i]) * 0x100000001b3ull;
  return c;
}

// ---- variant 1: a switch per instruction (what interp does today, minus its per-step bookkeeping)
void run_switch(State& s) {
  int block = 0;
  for (;;) {
    const std::vector<Insn>& b = *kBlocks[block];
    int next = -1;
    for (const Insn& i : b) {
      if (i.kind == kJz || i.kind == kJnz) {
        bool z = zf(s);
        next = (i.kind == kJz ? z : !z) ? i.a : i.b;
      } else {
        do_insn(s, i);
      }
      s.steps += 1;
    }
    s.branches += 1;
    if (next == 0xff || s.steps >= s.step_limit) return;
    block = next;
  }
}

// ---- variant 2: call-threaded: pre-bound handler pointers, each returns the next operation ----
struct Op;
using Handler = const Op* (*)(State&, const Op*);
struct Op {
  Handler fn;
  Insn insn;
  const Op* taken;
  const Op* fallthrough;
  uint32_t block_length;
};

template <Kind K>
const Op* handler(State& s, const Op* op) {
  Insn i = op->insn;
  i.kind = K;
  do_insn(s, i);
  return op + 1;
}
template <bool OnZero>
const Op* branch_handler(State& s, const Op* op) {
  s.steps += op->block_length;
  s.branches += 1;
  const bool go = zf(s) == OnZero;
  const Op* next = go ? op->taken : op->fallthrough;
  if (s.steps >= s.step_limit) return nullptr;
  return next;
}

Handler handler_for(Kind k) {
  switch (k) {
    case kMovRR64: return handler<kMovRR64>;
    case kMovRR32: return handler<kMovRR32>;
    case kShlRI64: return handler<kShlRI64>;
    case kShrRI64: return handler<kShrRI64>;
    case kRolRI64: return handler<kRolRI64>;
    case kXorRR64: return handler<kXorRR64>;
    case kAndRI32: return handler<kAndRI32>;
    case kAddRM64: return handler<kAddRM64>;
    case kMovMR64: return handler<kMovMR64>;
    case kTestRI8: return handler<kTestRI8>;
    case kDec64: return handler<kDec64>;
    case kJz: return branch_handler<true>;
    case kJnz: return branch_handler<false>;
  }
  return nullptr;
}

struct Threaded {
  std::vector<Op> blocks[3];
  Threaded() {
    for (int b = 0; b < 3; ++b)
      for (const Insn& i : *kBlocks[b]) blocks[b].push_back(Op{handler_for(i.kind), i, nullptr, nullptr, uint32_t(kBlocks[b]->size())});
    for (int b = 0; b < 3; ++b) {
      Op& end = blocks[b].back();
      end.taken = end.insn.a == 0xff ? nullptr : blocks[end.insn.a].data();
      end.fallthrough = end.insn.b == 0xff ? nullptr : blocks[end.insn.b].data();
    }
  }
};

void run_threaded(State& s, const Threaded& t) {
  const Op* op = t.blocks[0].data();
  while ((op = op->fn(s, op)) != nullptr) {
  }
}

// ---- variant 3: computed goto (direct threading in one function) ------------------------------
struct GotoOp {
  const void* label;
  Insn insn;
  const GotoOp* taken;
  const GotoOp* fallthrough;
  uint32_t block_length;
};

void run_goto(State& s, std::vector<GotoOp>* blocks, bool setup) {
  static const void* labels[] = {&&mov_rr64, &&mov_rr32, &&shl, &&shr, &&rol, &&xor_rr, &&and_ri,
                                 &&add_rm, &&mov_mr, &&test_ri, &&dec, &&jz, &&jnz};
  if (setup) {
    for (int b = 0; b < 3; ++b)
      for (const Insn& i : *kBlocks[b]) blocks[b].push_back(GotoOp{labels[i.kind], i, nullptr, nullptr, uint32_t(kBlocks[b]->size())});
    for (int b = 0; b < 3; ++b) {
      GotoOp& end = blocks[b].back();
      end.taken = end.insn.a == 0xff ? nullptr : blocks[end.insn.a].data();
      end.fallthrough = end.insn.b == 0xff ? nullptr : blocks[end.insn.b].data();
    }
    return;
  }
  const GotoOp* op = blocks[0].data();
#define DISPATCH() goto* op->label
#define OP(K)                \
  {                          \
    Insn i = op->insn;       \
    i.kind = K;              \
    do_insn(s, i);           \
    ++op;                    \
    DISPATCH();              \
  }
  DISPATCH();
mov_rr64: OP(kMovRR64)
mov_rr32: OP(kMovRR32)
shl: OP(kShlRI64)
shr: OP(kShrRI64)
rol: OP(kRolRI64)
xor_rr: OP(kXorRR64)
and_ri: OP(kAndRI32)
add_rm: OP(kAddRM64)
mov_mr: OP(kMovMR64)
test_ri: OP(kTestRI8)
dec: OP(kDec64)
jz:
jnz: {
  s.steps += op->block_length;
  s.branches += 1;
  const bool go = zf(s) == (op->insn.kind == kJz);
  const GotoOp* next = go ? op->taken : op->fallthrough;
  if (!next || s.steps >= s.step_limit) return;
  op = next;
  DISPATCH();
}
#undef OP
#undef DISPATCH
}

// ---- variant 4: a template JIT: host code per block, guest registers in memory, chained blocks --
class Emitter {
 public:
  std::vector<uint8_t> b;
  void u8(uint8_t v) { b.push_back(v); }
  void u32(uint32_t v) { for (int i = 0; i < 4; ++i) u8(uint8_t(v >> (8 * i))); }
  void u64(uint64_t v) { for (int i = 0; i < 8; ++i) u8(uint8_t(v >> (8 * i))); }
  // op r64, [rbx + disp32] with REX.W (reg in 0..15)
  void rm_rbx(uint8_t opcode, int reg, int32_t disp, bool w = true) {
    u8(uint8_t((w ? 0x48 : 0x40) | ((reg & 8) ? 4 : 0)));
    u8(opcode);
    u8(uint8_t(0x80 | ((reg & 7) << 3) | 3));
    u32(uint32_t(disp));
  }
  void load(int reg, int32_t disp) { rm_rbx(0x8b, reg, disp); }
  void store(int reg, int32_t disp) { rm_rbx(0x89, reg, disp); }
};

constexpr int32_t gpr_off(int r) { return int32_t(offsetof(State, gpr) + 8 * r); }
constexpr int32_t kCcDstOff = offsetof(State, cc_dst), kCcSrcOff = offsetof(State, cc_src), kCcOpOff = offsetof(State, cc_op);
constexpr int32_t kStepsOff = offsetof(State, steps), kBranchesOff = offsetof(State, branches),
                  kLimitOff = offsetof(State, step_limit), kTlbOff = offsetof(State, tlb);

extern "C" uint64_t proto_eflags(State* s) { return compute_eflags(*s); }
extern "C" uint64_t proto_slow(State* s, uint64_t linear) { return slow_translate(*s, linear); }

struct Jit {
  uint8_t* code = nullptr;
  size_t used = 0;
  uint8_t* block_start[3] = {};
  using Entry = void (*)(State*, void* block);
  Entry entry = nullptr;

  // Host register use: rbx = State*, rax/rcx/rdx/rsi/r8 scratch.
  void host_address(Emitter& e, int index_reg) {
    // rax = guest rsi + guest[index]*8 ; rdx = host address (TLB fast path, call on a miss)
    e.load(0, gpr_off(kRsi));
    e.load(1, gpr_off(index_reg));
    e.u8(0x48); e.u8(0x8d); e.u8(0x04); e.u8(0xc8);                 // lea rax, [rax + rcx*8]
    e.u8(0x48); e.u8(0x89); e.u8(0xc1);                             // mov rcx, rax
    e.u8(0x48); e.u8(0xc1); e.u8(0xe9); e.u8(12);                   // shr rcx, 12
    e.u8(0x0f); e.u8(0xb6); e.u8(0xd1);                             // movzx edx, cl
    e.u8(0x48); e.u8(0xc1); e.u8(0xe2); e.u8(5);                    // shl rdx, 5
    e.u8(0x48); e.u8(0x3b); e.u8(0x8c); e.u8(0x13); e.u32(kTlbOff); // cmp rcx, [rbx + rdx + tlb]
    e.u8(0x75); size_t miss = e.b.size(); e.u8(0);                  // jne miss
    e.u8(0x89); e.u8(0xc1);                                         // mov ecx, eax
    e.u8(0x81); e.u8(0xe1); e.u32(0xfff);                           // and ecx, 0xfff
    e.u8(0x81); e.u8(0xf9); e.u32(4096 - 8);                        // cmp ecx, 4088
    e.u8(0x77); size_t cross = e.b.size(); e.u8(0);                 // ja miss
    e.u8(0x48); e.u8(0x03); e.u8(0x84); e.u8(0x13); e.u32(kTlbOff + 8);  // add rax, [rbx + rdx + tlb + 8]
    e.u8(0x48); e.u8(0x89); e.u8(0xc2);                             // mov rdx, rax
    e.u8(0xeb); size_t done = e.b.size(); e.u8(0);                  // jmp done
    e.b[miss] = uint8_t(e.b.size() - miss - 1);
    e.b[cross] = uint8_t(e.b.size() - cross - 1);
    e.u8(0x48); e.u8(0x89); e.u8(0xc6);                             // mov rsi, rax
    e.u8(0x48); e.u8(0x89); e.u8(0xdf);                             // mov rdi, rbx
    e.u8(0x48); e.u8(0xb8); e.u64(uint64_t(&proto_slow));           // mov rax, proto_slow
    e.u8(0xff); e.u8(0xd0);                                         // call rax
    e.u8(0x48); e.u8(0x89); e.u8(0xc2);                             // mov rdx, rax
    e.b[done] = uint8_t(e.b.size() - done - 1);
  }

  void emit_block(Emitter& e, int index, std::vector<std::pair<size_t, int>>& fixups) {
    for (const Insn& i : *kBlocks[index]) {
      switch (i.kind) {
        case kMovRR64: e.load(0, gpr_off(i.b)); e.store(0, gpr_off(i.a)); break;
        case kMovRR32: e.rm_rbx(0x8b, 0, gpr_off(i.b), false); e.store(0, gpr_off(i.a)); break;
        case kShlRI64:
        case kShrRI64: {
          const bool left = i.kind == kShlRI64;
          e.load(0, gpr_off(i.a));
          e.u8(0x48); e.u8(0xc1); e.u8(left ? 0xe0 : 0xe8); e.u8(i.imm);  // shl/shr rax, imm
          // Host CF and OF are the guest's: rcx = CF | OF << 11 without PUSHF.
          e.u8(0x0f); e.u8(0x92); e.u8(0xc1);                              // setc cl
          e.u8(0x0f); e.u8(0x90); e.u8(0xc2);                              // seto dl
          e.u8(0x0f); e.u8(0xb6); e.u8(0xc9);                              // movzx ecx, cl
          e.u8(0x0f); e.u8(0xb6); e.u8(0xd2);                              // movzx edx, dl
          e.u8(0xc1); e.u8(0xe2); e.u8(11);                                // shl edx, 11
          e.u8(0x09); e.u8(0xd1);                                          // or ecx, edx
          e.store(1, kCcSrcOff);
          e.store(0, gpr_off(i.a));
          e.store(0, kCcDstOff);
          e.u8(0xc7); e.u8(0x83); e.u32(kCcOpOff); e.u32(left ? kCcShl64 : kCcShr64);
          break;
        }
        case kRolRI64:
          e.u8(0x48); e.u8(0x89); e.u8(0xdf);                             // mov rdi, rbx
          e.u8(0x48); e.u8(0xb8); e.u64(uint64_t(&proto_eflags));         // mov rax, proto_eflags
          e.u8(0xff); e.u8(0xd0);                                         // call rax  -> rax = eflags
          e.load(1, gpr_off(i.a));
          e.u8(0x48); e.u8(0xc1); e.u8(0xc1); e.u8(i.imm);                // rol rcx, imm
          e.store(1, gpr_off(i.a));
          e.u8(0x48); e.u8(0x25); e.u32(~0x801u);                         // and rax, ~0x801
          e.u8(0x48); e.u8(0x89); e.u8(0xca);                             // mov rdx, rcx
          e.u8(0x83); e.u8(0xe2); e.u8(1);                                // and edx, 1  (CF)
          e.u8(0x48); e.u8(0x09); e.u8(0xd0);                             // or rax, rdx
          e.u8(0x48); e.u8(0xc1); e.u8(0xe9); e.u8(63);                   // shr rcx, 63
          e.u8(0x48); e.u8(0x31); e.u8(0xd1);                             // xor rcx, rdx
          e.u8(0x48); e.u8(0xc1); e.u8(0xe1); e.u8(11);                   // shl rcx, 11
          e.u8(0x48); e.u8(0x09); e.u8(0xc8);                             // or rax, rcx
          e.store(0, offsetof(State, eflags));
          e.u8(0xc7); e.u8(0x83); e.u32(kCcOpOff); e.u32(kCcEflags);
          break;
        case kXorRR64:
          e.load(0, gpr_off(i.a));
          e.rm_rbx(0x33, 0, gpr_off(i.b));                                // xor rax, [guest b]
          e.store(0, gpr_off(i.a));
          e.store(0, kCcDstOff);
          e.u8(0xc7); e.u8(0x83); e.u32(kCcOpOff); e.u32(kCcLogic64);
          break;
        case kAndRI32:
          e.rm_rbx(0x8b, 0, gpr_off(i.a), false);
          e.u8(0x25); e.u32(i.imm);                                       // and eax, imm
          e.store(0, gpr_off(i.a));
          e.store(0, kCcDstOff);
          e.u8(0xc7); e.u8(0x83); e.u32(kCcOpOff); e.u32(kCcLogic32);
          break;
        case kAddRM64:
          host_address(e, i.b);
          e.u8(0x48); e.u8(0x8b); e.u8(0x02);                             // mov rax, [rdx]
          e.rm_rbx(0x03, 0, gpr_off(i.a));                                // add rax, [guest a]
          e.store(0, gpr_off(i.a));
          e.store(0, kCcDstOff);
          e.u8(0xc7); e.u8(0x83); e.u32(kCcOpOff); e.u32(kCcLogic64);
          break;
        case kMovMR64:
          host_address(e, i.a);
          e.load(0, gpr_off(i.b));
          e.u8(0x48); e.u8(0x89); e.u8(0x02);                             // mov [rdx], rax
          break;
        case kTestRI8:
          e.u8(0x0f); e.u8(0xb6); e.u8(0x83); e.u32(gpr_off(i.a));        // movzx eax, byte [guest a]
          e.u8(0x83); e.u8(0xe0); e.u8(i.imm);                            // and eax, imm
          e.store(0, kCcDstOff);
          e.u8(0xc7); e.u8(0x83); e.u32(kCcOpOff); e.u32(kCcLogic8);
          break;
        case kDec64:
          if (fast_flags) {
            // CF inline for the producers this loop has (materialized EFLAGS or a logic op: CF = 0);
            // a real JIT knows the producer statically within a block and calls a helper otherwise.
            e.u8(0x31); e.u8(0xc0);                                       // xor eax, eax
            e.u8(0x83); e.u8(0xbb); e.u32(kCcOpOff); e.u8(kCcEflags);     // cmp dword [cc_op], eflags
            e.u8(0x75); e.u8(10);                                         // jne over the load and the AND
            e.load(0, offsetof(State, eflags));                           // (7 bytes)
            e.u8(0x83); e.u8(0xe0); e.u8(1);                              // and eax, 1
            e.store(0, kCcSrcOff);
          } else {
          e.u8(0x48); e.u8(0x89); e.u8(0xdf);                             // mov rdi, rbx
          e.u8(0x48); e.u8(0xb8); e.u64(uint64_t(&proto_eflags));
          e.u8(0xff); e.u8(0xd0);                                         // rax = eflags (for CF)
          e.u8(0x83); e.u8(0xe0); e.u8(1);                                // and eax, 1
          e.store(0, kCcSrcOff);
          }
          e.u8(0x48); e.u8(0xff); e.u8(0x8b); e.u32(gpr_off(i.a));        // dec qword [guest a]
          e.load(0, gpr_off(i.a));
          e.store(0, kCcDstOff);
          e.u8(0xc7); e.u8(0x83); e.u32(kCcOpOff); e.u32(kCcDec64);
          break;
        case kJz:
        case kJnz: {
          const size_t n = kBlocks[index]->size();
          e.u8(0x48); e.u8(0x81); e.u8(0x83); e.u32(kStepsOff); e.u32(uint32_t(n));  // add qword [steps], n
          e.u8(0x48); e.u8(0xff); e.u8(0x83); e.u32(kBranchesOff);                   // inc qword [branches]
          e.load(0, kStepsOff);
          e.rm_rbx(0x3b, 0, kLimitOff);                                              // cmp rax, [limit]
          e.u8(0x0f); e.u8(0x83); e.u32(0);                                          // jae exit
          fixups.push_back({e.b.size() - 4, -1});
          // The loop's flags producers here are TEST r8 and DEC r64: ZF = (cc_dst == 0), of the right width.
          e.load(0, kCcDstOff);
          e.u8(0x83); e.u8(0xbb); e.u32(kCcOpOff); e.u8(kCcLogic8);                 // cmp dword [cc_op], logic8
          e.u8(0x75); e.u8(3);                                                       // jne +3
          e.u8(0x0f); e.u8(0xb6); e.u8(0xc0);                                        // movzx eax, al
          e.u8(0x48); e.u8(0x85); e.u8(0xc0);                                        // test rax, rax
          e.u8(0x0f); e.u8(i.kind == kJz ? 0x84 : 0x85); e.u32(0);                   // jz/jnz taken
          fixups.push_back({e.b.size() - 4, i.a == 0xff ? -1 : i.a});
          e.u8(0xe9); e.u32(0);                                                      // jmp fallthrough
          fixups.push_back({e.b.size() - 4, i.b == 0xff ? -1 : i.b});
          break;
        }
      }
    }
  }

  bool fast_flags;
  explicit Jit(bool fast) : fast_flags(fast) {
    code = static_cast<uint8_t*>(mmap(nullptr, 1 << 16, PROT_READ | PROT_WRITE | PROT_EXEC, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    Emitter e;
    // entry(State* rdi, void* block rsi): push rbx; mov rbx, rdi; jmp rsi.  exit: pop rbx; ret.
    e.u8(0x53); e.u8(0x48); e.u8(0x89); e.u8(0xfb); e.u8(0xff); e.u8(0xe6);
    const size_t exit_at = e.b.size();
    e.u8(0x5b); e.u8(0xc3);
    std::vector<std::pair<size_t, int>> fixups;
    size_t starts[3];
    for (int b = 0; b < 3; ++b) {
      starts[b] = e.b.size();
      emit_block(e, b, fixups);
    }
    for (auto [at, target] : fixups) {
      size_t dest = target < 0 ? exit_at : starts[target];
      int32_t rel = int32_t(int64_t(dest) - int64_t(at + 4));
      std::memcpy(&e.b[at], &rel, 4);
    }
    std::memcpy(code, e.b.data(), e.b.size());
    entry = reinterpret_cast<Entry>(code);
    for (int b = 0; b < 3; ++b) block_start[b] = code + starts[b];
  }
};

template <typename F>
double measure(const char* name, uint64_t iterations, uint8_t* ram, F run, double baseline) {
  State s;
  reset(s, ram, iterations);
  // CPU time, not wall time: this shared machine is loaded, and the process's own CPU time is what a
  // dispatch technique changes.
  timespec t0, t1;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t0);
  run(s);
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t1);
  double sec = double(t1.tv_sec - t0.tv_sec) + double(t1.tv_nsec - t0.tv_nsec) * 1e-9;
  double rate = double(s.steps) / sec / 1e6;
  std::printf("%-14s %6.3f s  %7.0f M instructions/s  %5.2fx  steps %llu branches %llu checksum %016llx\n", name, sec,
              rate, baseline > 0 ? rate / baseline : 1.0, (unsigned long long)s.steps, (unsigned long long)s.branches,
              (unsigned long long)checksum(s));
  return rate;
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t iterations = argc > 1 ? std::strtoull(argv[1], nullptr, 0) : 20000000;
  static uint8_t ram[4096] __attribute__((aligned(4096)));
  Threaded threaded;
  static std::vector<GotoOp> goto_blocks[3];
  State dummy;
  run_goto(dummy, goto_blocks, true);
  Jit jit(false), jit2(true);
  std::printf("cpu-bound inner loop, %llu iterations\n", (unsigned long long)iterations);
  for (int round = 0; round < 2; ++round) {
    double base = measure("switch", iterations, ram, [&](State& s) { run_switch(s); }, 0);
    measure("call-threaded", iterations, ram, [&](State& s) { run_threaded(s, threaded); }, base);
    measure("computed-goto", iterations, ram, [&](State& s) { run_goto(s, goto_blocks, false); }, base);
    measure("template-jit", iterations, ram, [&](State& s) { jit.entry(&s, jit.block_start[0]); }, base);
    measure("jit+inline-cf", iterations, ram, [&](State& s) { jit2.entry(&s, jit2.block_start[0]); }, base);
  }
  return 0;
}
