// Operation handlers of the fast path: integer instructions with lazy flags and software-TLB memory access, each the reference executor's semantics exactly.
//
// Every handler does what InterpBackend::execute() does for its instruction, in the same order of
// memory accesses and register writes (so a fault or an exit leaves the same state), with two
// differences that do not show: flags are left lazy (interp/lazy_flags.h) and RAM accesses that hit
// the software TLB's fast tags go straight to host memory. Anything a handler does not cover is bound
// to `reference`, which runs execute() itself. interp_fastdiff checks the two paths against each other.
#include <Zydis/Zydis.h>

#include <algorithm>
#include <cstring>

#include "interp/alu.h"
#include "interp/interp_backend.h"
#include "interp/simd_ops.h"

namespace deja {

using interp::BinaryOp;
using interp::DecodedInsn;
using interp::LazyFlags;
using interp::Op;
using interp::OpKind;
using interp::Operand;

namespace {
constexpr uint8_t kGp = 13;
template <unsigned N>
constexpr uint64_t mask_of() {
  return N >= 8 ? ~0ull : (1ull << (N * 8)) - 1;
}
}  // namespace

struct InterpBackend::Ops {
  // ---- plumbing ----------------------------------------------------------------------------------
  // A handler as JIT code calls it: nothing may unwind through JIT frames, so a fault or an exit is
  // kept (jit_trap_) and rethrown by the runner once the block's code has returned; the operation that
  // ended the block is left in running_op_.
  template <interp::OpHandler H>
  static const Op* guarded(InterpBackend& c, const Op* op) noexcept {
    try {
      const Op* next = H(c, op);
      if (!next) c.running_op_ = op;
      return next;
    } catch (const GuestException& fault) {
      c.running_op_ = op;
      c.jit_fault_ = fault;
      c.jit_trap_ = kJitFault;
      return nullptr;
    } catch (const ExitRequest&) {
      c.running_op_ = op;
      c.jit_trap_ = kJitExit;
      return nullptr;
    }
  }
  struct Pair {
    interp::OpHandler fn = nullptr, jit = nullptr;
    explicit operator bool() const { return fn != nullptr; }
  };
  template <interp::OpHandler H>
  static constexpr Pair pair() {
    return {H, &guarded<H>};
  }

  // The end of an operation: the next one, or the end of the block when a store rewrote this block's
  // code or an access hit a watchpoint.
  [[gnu::always_inline]] static const Op* next(InterpBackend& c, const Op* op) {
    if (c.end_block_after_op_) [[unlikely]] {
      c.s_.rip = op->next_rip;
      return nullptr;
    }
    return op + 1;
  }

  // Gives the reference executor the per-instruction context it reads (RIP-relative addresses, the
  // RIP an exit or a watchpoint names).
  [[gnu::always_inline]] static void enter_reference(InterpBackend& c, const Op* op) {
    c.insn_rip_ = op->rip;
    c.next_rip_ = op->next_rip;
  }

  // An instruction that defers its exit inside a block other than through reference_may_exit (none does):
  // its exit is thrown as every exit from a block is.
  [[noreturn]] static void throw_deferred_exit(InterpBackend& c) {
    c.exit_pending_ = false;
    throw ExitRequest{};
  }
  // An instruction the fast path has no handler of its own for: the reference executor, in place.
  static const Op* reference(InterpBackend& c, const Op* op) {
    c.materialize_flags();
    enter_reference(c, op);
    c.execute(op->insn);
    if (c.exit_pending_) [[unlikely]] throw_deferred_exit(c);
    if (c.watch_hit_) c.end_block_after_op_ = true;
    return next(c, op);
  }
  // The same for an SSE instruction that neither reads nor writes RFLAGS (flagless_sse): the lazy flags
  // stay lazy (materializing them for every SSE instruction was 2% of a Linux workload). A fault or an
  // exit from it materializes them on the way out, as from any handler.
  static const Op* reference_sse(InterpBackend& c, const Op* op) {
    enter_reference(c, op);
    c.execute(op->insn);
    if (c.exit_pending_) [[unlikely]] throw_deferred_exit(c);
    if (c.watch_hit_) c.end_block_after_op_ = true;
    return next(c, op);
  }
  // A near control transfer through the reference executor: ends the block.
  static const Op* reference_transfer(InterpBackend& c, const Op* op) {
    c.materialize_flags();
    enter_reference(c, op);
    c.execute(op->insn);
    if (c.exit_pending_) [[unlikely]] throw_deferred_exit(c);
    c.s_.rip = c.next_rip_;
    return nullptr;
  }
  // An instruction after which the run loop must look at the CPU (role_of): it ends its block and the
  // run of blocks. STI's interrupt shadow is set as step() sets it; the run loop then runs the next
  // instruction alone.
  static const Op* reference_ends_run(InterpBackend& c, const Op* op) {
    c.materialize_flags();
    enter_reference(c, op);
    c.shadow_next_ = false;
    c.execute(op->insn);
    if (c.exit_pending_) [[unlikely]] throw_deferred_exit(c);
    c.s_.rip = c.next_rip_;
    c.s_.interrupt_shadow = c.shadow_next_;
    c.end_block_after_op_ = true;
    return nullptr;
  }
  // An instruction that may exit without unwinding (defer_exit: RDTSC, IN, OUT) ends its block. When it
  // exits, it is not retired: RIP stays on it, the runner does not count it and returns, and run() hands
  // exit_ to the VMM, as after step().
  static const Op* reference_may_exit(InterpBackend& c, const Op* op) {
    c.materialize_flags();
    enter_reference(c, op);
    // The instructions before it in the block have retired: an RDTSC answered inline reads the count.
    struct RetiredInBlock {
      InterpBackend& c;
      uint64_t before;
      ~RetiredInBlock() { c.steps_ -= before; }
    } retired{c, op->index};
    c.steps_ += op->index;
    c.execute(op->insn);
    if (c.exit_pending_) {
      c.s_.rip = op->rip;
      c.end_block_after_op_ = true;
    } else {
      c.s_.rip = c.next_rip_;
    }
    return nullptr;
  }
  // PTEST and the string compares (glibc's SSE4.2 string functions): they write all six arithmetic flags, so
  // the lazy ones are dropped instead of computed, once the instruction has completed (a fault leaves them).
  static const Op* simd_flags(InterpBackend& c, const Op* op) {
    enter_reference(c, op);
    c.exec_sse4(op->insn);
    c.s_.xinuse |= op->insn.xinuse;
    c.lazy_.cc = interp::kCcNone;
    if (c.watch_hit_) c.end_block_after_op_ = true;
    return next(c, op);
  }
  // The end of a block that does not end in a control transfer (not an instruction).
  static const Op* fall_through(InterpBackend& c, const Op* op) {
    c.s_.rip = op->rip;
    return nullptr;
  }
  static const Op* nop(InterpBackend&, const Op* op) { return op + 1; }

  // ---- registers -----------------------------------------------------------------------------------
  template <unsigned N>
  [[gnu::always_inline]] static uint64_t get(const InterpBackend& c, const Operand& o) {
    if (N == 1 && o.kind == OpKind::kGprHigh8) return (c.s_.gpr[o.reg] >> 8) & 0xff;
    return c.s_.gpr[o.reg] & mask_of<N>();
  }
  // Register writes: 32-bit writes zero-extend, 8- and 16-bit writes merge.
  template <unsigned N>
  [[gnu::always_inline]] static void put_reg(InterpBackend& c, int reg, uint64_t v) {
    uint64_t& r = c.s_.gpr[reg];
    if (N == 8) r = v;
    else if (N == 4) r = v & 0xffffffffu;
    else if (N == 2) r = (r & ~0xffffull) | (v & 0xffff);
    else r = (r & ~0xffull) | (v & 0xff);
  }
  template <unsigned N>
  [[gnu::always_inline]] static void put(InterpBackend& c, const Operand& o, uint64_t v) {
    if (N == 1 && o.kind == OpKind::kGprHigh8) {
      c.s_.gpr[o.reg] = (c.s_.gpr[o.reg] & ~0xff00ull) | ((v & 0xff) << 8);
      return;
    }
    put_reg<N>(c, o.reg, v);
  }

  // ---- memory ----------------------------------------------------------------------------------------
  struct Mem {
    uint64_t offset;  // the effective address (segment offset)
    uint64_t linear;
    int seg;
  };
  [[gnu::always_inline]] static Mem mem_of(const InterpBackend& c, const Op* op, const Operand& o) {
    uint64_t a = uint64_t(o.disp);
    if (o.base == interp::kRipBase) a += op->next_rip;
    else if (o.base != interp::kNoReg) a += c.s_.gpr[o.base];
    if (o.index != interp::kNoReg) a += c.s_.gpr[o.index] * o.scale;
    if (op->insn.addrsize == 32) a &= 0xffffffffu;
    else if (op->insn.addrsize == 16) a &= 0xffff;
    return at(c, op, o.seg, a);
  }
  [[gnu::always_inline]] static Mem at(const InterpBackend& c, const Op* op, int seg, uint64_t offset) {
    // 64-bit mode: only FS and GS have a base, and a non-canonical address misses the TLB (the slow
    // path raises #GP/#SS); otherwise the segment base, wrapped to 32 bits.
    if (op->insn.mode == interp::kMode64) return {offset, seg >= 4 ? offset + c.segment_base(seg) : offset, seg};
    return {offset, (c.segment_base(seg) + offset) & 0xffffffffu, seg};
  }

  template <unsigned N>
  [[gnu::always_inline]] static uint64_t load(InterpBackend& c, const Op* op, const Mem& m) {
    const TlbEntry& t = c.tlb_entry(m.linear);
    if (t.read_tag[c.s_.cs.dpl == 3] == ((m.linear + N - 1) >> 12)) [[likely]] {
      uint64_t v = 0;
      std::memcpy(&v, reinterpret_cast<const void*>(m.linear + t.addend), N);
      return v;
    }
    return load_slow(c, op, m, N);
  }
  template <unsigned N>
  [[gnu::always_inline]] static void store(InterpBackend& c, const Op* op, const Mem& m, uint64_t v) {
    const TlbEntry& t = c.tlb_entry(m.linear);
    if (t.write_tag[c.s_.cs.dpl == 3] == ((m.linear + N - 1) >> 12)) [[likely]] {
      std::memcpy(reinterpret_cast<void*>(m.linear + t.addend), &v, N);
      return;
    }
    store_slow(c, op, m, N, v);
  }
  // The reference's own access path (segment checks, watchpoints, page walks, MMIO exits, code
  // invalidation), then fast tags for the page if it has become eligible.
  [[gnu::noinline]] static uint64_t load_slow(InterpBackend& c, const Op* op, const Mem& m, unsigned n) {
    enter_reference(c, op);
    const uint64_t v = c.read_mem(m.seg, m.offset, n);
    c.refresh_fast_entry(m.linear);
    if (c.watch_hit_) c.end_block_after_op_ = true;
    return v;
  }
  [[gnu::noinline]] static void store_slow(InterpBackend& c, const Op* op, const Mem& m, unsigned n, uint64_t v) {
    enter_reference(c, op);
    c.write_mem(m.seg, m.offset, n, v);
    c.refresh_fast_entry(m.linear);
    if (c.watch_hit_) c.end_block_after_op_ = true;
  }

  // A read-modify-write destination: read once (memory: `m` keeps the address), written back there.
  template <unsigned N>
  [[gnu::always_inline]] static uint64_t load_rmw(InterpBackend& c, const Op* op, const Operand& d, Mem& m) {
    if (d.kind != OpKind::kMem) return get<N>(c, d);
    m = mem_of(c, op, d);
    return load<N>(c, op, m);
  }
  template <unsigned N>
  [[gnu::always_inline]] static void store_rmw(InterpBackend& c, const Op* op, const Operand& d, const Mem& m, uint64_t v) {
    if (d.kind == OpKind::kMem) store<N>(c, op, m, v);
    else put<N>(c, d, v);
  }

  // Operand access by kind, as read_operand/write_operand do (immediates come sign-extended).
  template <unsigned N>
  [[gnu::always_inline]] static uint64_t read(InterpBackend& c, const Op* op, int i) {
    const Operand& o = op->insn.op[i];
    switch (o.kind) {
      case OpKind::kGpr:
      case OpKind::kGprHigh8: return get<N>(c, o);
      case OpKind::kImm: return uint64_t(o.disp) & mask_of<N>();
      default: return load<N>(c, op, mem_of(c, op, o));
    }
  }
  template <unsigned N>
  [[gnu::always_inline]] static void write(InterpBackend& c, const Op* op, int i, uint64_t v) {
    const Operand& o = op->insn.op[i];
    if (o.kind == OpKind::kMem) store<N>(c, op, mem_of(c, op, o), v);
    else put<N>(c, o, v);
  }

  [[gnu::always_inline]] static void set_flags(InterpBackend& c, interp::CcKind kind, unsigned n, uint64_t r, uint64_t a, uint64_t b) {
    c.lazy_.cc = interp::cc_code(kind, n);
    c.lazy_.dst = r;
    c.lazy_.src1 = a;
    c.lazy_.src2 = b;
  }
  [[gnu::always_inline]] static bool condition(const InterpBackend& c, unsigned cc) { return interp::cc_condition(c.lazy_, cc, c.s_.rflags); }
  [[gnu::always_inline]] static bool carry(const InterpBackend& c) { return interp::cc_carry(c.lazy_, c.s_.rflags); }

  // ---- data movement ---------------------------------------------------------------------------------
  template <unsigned N>
  static const Op* mov(InterpBackend& c, const Op* op) {
    write<N>(c, op, 0, read<N>(c, op, 1));
    return next(c, op);
  }
  template <unsigned N>
  static const Op* mov_rr(InterpBackend& c, const Op* op) {
    put<N>(c, op->insn.op[0], get<N>(c, op->insn.op[1]));
    return op + 1;
  }
  template <unsigned N>
  static const Op* mov_ri(InterpBackend& c, const Op* op) {
    put<N>(c, op->insn.op[0], uint64_t(op->insn.op[1].disp));
    return op + 1;
  }
  // MOVZX/MOVSX/MOVSXD: destination N bytes, source S bytes.
  template <unsigned N, unsigned S, bool Signed>
  static const Op* extend(InterpBackend& c, const Op* op) {
    uint64_t v = read<S>(c, op, 1);
    if (Signed) v = interp::sign_extend(v, S * 8);
    put<N>(c, op->insn.op[0], v);
    return next(c, op);
  }
  template <unsigned N>
  static const Op* lea(InterpBackend& c, const Op* op) {
    put<N>(c, op->insn.op[0], mem_of(c, op, op->insn.op[1]).offset);
    return op + 1;
  }
  template <unsigned N>
  static const Op* xchg(InterpBackend& c, const Op* op) {
    const uint64_t a = read<N>(c, op, 0), b = read<N>(c, op, 1);
    write<N>(c, op, 0, b);
    write<N>(c, op, 1, a);
    return next(c, op);
  }
  template <unsigned N>
  static const Op* cmov(InterpBackend& c, const Op* op) {
    const uint64_t src = read<N>(c, op, 1);
    // A 32-bit CMOV writes (zero-extends) its destination even when the condition is false.
    put<N>(c, op->insn.op[0], condition(c, op->cond) ? src : get<N>(c, op->insn.op[0]));
    return next(c, op);
  }
  static const Op* setcc(InterpBackend& c, const Op* op) {
    write<1>(c, op, 0, condition(c, op->cond) ? 1 : 0);
    return next(c, op);
  }

  // ---- arithmetic -----------------------------------------------------------------------------------
  template <BinaryOp Kind, unsigned N>
  static const Op* alu(InterpBackend& c, const Op* op) {
    constexpr uint64_t kMask = mask_of<N>();
    const Operand& d = op->insn.op[0];
    Mem m{};
    const uint64_t a = load_rmw<N>(c, op, d, m);
    const uint64_t b = read<N>(c, op, 1);
    uint64_t r;
    interp::CcKind kind;
    switch (Kind) {
      case BinaryOp::kAdd: r = (a + b) & kMask; kind = interp::kCcAdd; break;
      case BinaryOp::kAdc: r = (a + b + (carry(c) ? 1 : 0)) & kMask; kind = interp::kCcAdc; break;
      case BinaryOp::kSub:
      case BinaryOp::kCmp: r = (a - b) & kMask; kind = interp::kCcSub; break;
      case BinaryOp::kSbb: r = (a - b - (carry(c) ? 1 : 0)) & kMask; kind = interp::kCcSbb; break;
      case BinaryOp::kAnd:
      case BinaryOp::kTest: r = a & b; kind = interp::kCcLogic; break;
      case BinaryOp::kOr: r = a | b; kind = interp::kCcLogic; break;
      default: r = a ^ b; kind = interp::kCcLogic; break;
    }
    if (Kind != BinaryOp::kCmp && Kind != BinaryOp::kTest) {
      store_rmw<N>(c, op, d, m, r);
    }
    set_flags(c, kind, N, r, a, b);
    return next(c, op);
  }
  // INC/DEC/NEG/NOT on a register or memory.
  enum class Unary { kInc, kDec, kNeg, kNot };
  template <Unary Kind, unsigned N>
  static const Op* unary(InterpBackend& c, const Op* op) {
    constexpr uint64_t kMask = mask_of<N>();
    const Operand& d = op->insn.op[0];
    Mem m{};
    const uint64_t a = load_rmw<N>(c, op, d, m);
    uint64_t r;
    switch (Kind) {
      case Unary::kInc: r = (a + 1) & kMask; break;
      case Unary::kDec: r = (a - 1) & kMask; break;
      case Unary::kNeg: r = (0 - a) & kMask; break;
      default: r = ~a & kMask; break;
    }
    // INC/DEC keep CF: read it before the store (which may fault and must leave flags alone anyway).
    const bool cf = (Kind == Unary::kInc || Kind == Unary::kDec) ? carry(c) : false;
    store_rmw<N>(c, op, d, m, r);
    if (Kind == Unary::kInc) set_flags(c, interp::kCcInc, N, r, a, cf ? interp::kCf : 0);
    if (Kind == Unary::kDec) set_flags(c, interp::kCcDec, N, r, a, cf ? interp::kCf : 0);
    if (Kind == Unary::kNeg) set_flags(c, interp::kCcSub, N, r, 0, a);
    return next(c, op);
  }
  // SHL/SHR/SAR. The count is masked to 5 bits (6 for 64-bit); a zero count changes no flag but the
  // destination is still written back, as the reference does.
  template <interp::ShiftOp Kind, unsigned N>
  static const Op* shift(InterpBackend& c, const Op* op) {
    constexpr unsigned kWidth = N * 8;
    const Operand& d = op->insn.op[0];
    const uint64_t raw_count = (op->insn.operand_count >= 2 && op->insn.op[1].kind != OpKind::kNone)
                                   ? read<1>(c, op, 1)
                                   : 1;
    Mem m{};
    const uint64_t a = load_rmw<N>(c, op, d, m);
    const unsigned count = unsigned(raw_count & (N == 8 ? 63 : 31));
    uint64_t r = a;
    uint64_t cf_of = 0;
    if (count != 0) {
      if (N >= 4) {
        bool cf = false, of = false;
        if (Kind == interp::ShiftOp::kShl) {
          r = (a << count) & mask_of<N>();
          cf = (a >> (kWidth - count)) & 1;
          of = ((r >> (kWidth - 1)) & 1) ^ cf;
        } else if (Kind == interp::ShiftOp::kShr) {
          r = a >> count;
          cf = (a >> (count - 1)) & 1;
          of = (a >> (kWidth - 1)) & 1;
        } else {
          const int64_t sa = int64_t(interp::sign_extend(a, kWidth));
          r = uint64_t(sa >> count) & mask_of<N>();
          cf = (sa >> (count - 1)) & 1;
        }
        cf_of = (cf ? interp::kCf : 0) | (of ? interp::kOf : 0);
      } else {
        // 8/16-bit counts can reach or pass the width: the ALU knows those rules.
        const interp::AluResult res = interp::alu_shift(Kind, a, count, kWidth, 0);
        r = res.value;
        cf_of = res.flags & (interp::kCf | interp::kOf | interp::kAf);
      }
    }
    store_rmw<N>(c, op, d, m, r);
    if (count != 0) set_flags(c, interp::kCcSzp, N, r, 0, cf_of);
    return next(c, op);
  }
  // ROL/ROR/RCL/RCR change only CF and OF: the other flags come from whatever set them last.
  template <interp::ShiftOp Kind, unsigned N>
  static const Op* rotate(InterpBackend& c, const Op* op) {
    const Operand& d = op->insn.op[0];
    const uint64_t raw_count = (op->insn.operand_count >= 2 && op->insn.op[1].kind != OpKind::kNone)
                                   ? read<1>(c, op, 1)
                                   : 1;
    Mem m{};
    const uint64_t a = load_rmw<N>(c, op, d, m);
    c.materialize_flags();
    const interp::AluResult res = interp::alu_shift(Kind, a, raw_count & 0xff, N * 8, c.s_.rflags);
    store_rmw<N>(c, op, d, m, res.value);
    c.s_.rflags = res.flags;
    return next(c, op);
  }
  template <unsigned N>
  static const Op* imul(InterpBackend& c, const Op* op) {
    const uint64_t a = op->insn.operand_count >= 3 ? read<N>(c, op, 1) : get<N>(c, op->insn.op[0]);
    const uint64_t b = op->insn.operand_count >= 3 ? read<N>(c, op, 2) : read<N>(c, op, 1);
    const interp::AluResult res = interp::alu_imul(a, b, N * 8, 0);
    put<N>(c, op->insn.op[0], res.value);
    set_flags(c, interp::kCcSzp, N, res.value, 0, res.flags & (interp::kCf | interp::kOf | interp::kAf));
    return next(c, op);
  }
  template <unsigned N>
  static const Op* xadd(InterpBackend& c, const Op* op) {
    const uint64_t dst = read<N>(c, op, 0), src = read<N>(c, op, 1);
    const uint64_t r = (dst + src) & mask_of<N>();
    // Source first: with the same register in both operands the sum is what remains.
    write<N>(c, op, 1, dst);
    write<N>(c, op, 0, r);
    set_flags(c, interp::kCcAdd, N, r, dst, src);
    return next(c, op);
  }
  template <unsigned N>
  static const Op* cmpxchg(InterpBackend& c, const Op* op) {
    const uint64_t dst = read<N>(c, op, 0);
    const uint64_t acc = c.s_.gpr[kRax] & mask_of<N>();
    const uint64_t r = (acc - dst) & mask_of<N>();
    if (r == 0) {
      write<N>(c, op, 0, read<N>(c, op, 1));
    } else {
      // The destination is written back unchanged (the locked cycle always writes), then RAX loaded.
      if (op->insn.op[0].kind == OpKind::kMem) write<N>(c, op, 0, dst);
      put_reg<N>(c, kRax, dst);
    }
    set_flags(c, interp::kCcSub, N, r, acc, dst);
    return next(c, op);
  }

  // ---- stack (64-bit mode: 8- or 2-byte pushes on the flat 64-bit stack) ------------------------------
  template <unsigned N>
  [[gnu::always_inline]] static void push64(InterpBackend& c, const Op* op, uint64_t v) {
    const uint64_t rsp = c.s_.gpr[kRsp] - N;
    store<N>(c, op, at(c, op, 2, rsp), v);
    c.s_.gpr[kRsp] = rsp;
  }
  template <unsigned N>
  static const Op* push(InterpBackend& c, const Op* op) {
    push64<N>(c, op, read<N>(c, op, 0));
    return next(c, op);
  }
  template <unsigned N>
  static const Op* pop(InterpBackend& c, const Op* op) {
    const uint64_t saved = c.s_.gpr[kRsp];
    const uint64_t v = load<N>(c, op, at(c, op, 2, saved));
    c.s_.gpr[kRsp] = saved + N;
    if (op->insn.op[0].kind == OpKind::kMem) {
      // The destination address uses the incremented RSP; a fault there leaves RSP as it was.
      try {
        store<N>(c, op, mem_of(c, op, op->insn.op[0]), v);
      } catch (...) {
        c.s_.gpr[kRsp] = saved;
        throw;
      }
    } else {
      put<N>(c, op->insn.op[0], v);
    }
    return next(c, op);
  }

  // ---- string instructions --------------------------------------------------------------------------
  // One iteration, as exec_string does it; REP forms run iteration after iteration here, each one a
  // step of its own (the handler counts them: Op::self_counting), stopping between two iterations
  // wherever the run loop could stop (step limit, kick, a watchpoint, a store into this block's code).
  enum class Str { kMovs, kStos, kLods, kCmps, kScas };
  template <Str Kind, unsigned N>
  [[gnu::always_inline]] static void string_iteration(InterpBackend& c, const Op* op, uint64_t amask, int src_seg, uint64_t step) {
    const uint64_t rsi = c.s_.gpr[kRsi] & amask, rdi = c.s_.gpr[kRdi] & amask;
    bool advance_si = false, advance_di = false;
    switch (Kind) {
      case Str::kMovs: {
        const uint64_t v = load<N>(c, op, at(c, op, src_seg, rsi));
        store<N>(c, op, at(c, op, 0, rdi), v);
        advance_si = advance_di = true;
        break;
      }
      case Str::kStos: store<N>(c, op, at(c, op, 0, rdi), c.s_.gpr[kRax] & mask_of<N>()); advance_di = true; break;
      case Str::kLods: put_reg<N>(c, kRax, load<N>(c, op, at(c, op, src_seg, rsi))); advance_si = true; break;
      case Str::kCmps: {
        const uint64_t a = load<N>(c, op, at(c, op, src_seg, rsi)), b = load<N>(c, op, at(c, op, 0, rdi));
        set_flags(c, interp::kCcSub, N, (a - b) & mask_of<N>(), a, b);
        advance_si = advance_di = true;
        break;
      }
      case Str::kScas: {
        const uint64_t a = c.s_.gpr[kRax] & mask_of<N>(), b = load<N>(c, op, at(c, op, 0, rdi));
        set_flags(c, interp::kCcSub, N, (a - b) & mask_of<N>(), a, b);
        advance_di = true;
        break;
      }
    }
    if (advance_si) put_addr(c, kRsi, amask, rsi + step);
    if (advance_di) put_addr(c, kRdi, amask, rdi + step);
  }
  // A register written at the address size (reg_write with 2, 4 or 8 bytes).
  [[gnu::always_inline]] static void put_addr(InterpBackend& c, int reg, uint64_t amask, uint64_t v) {
    if (amask == ~0ull) c.s_.gpr[reg] = v;
    else if (amask == 0xffffffffu) c.s_.gpr[reg] = v & amask;
    else c.s_.gpr[reg] = (c.s_.gpr[reg] & ~0xffffull) | (v & 0xffff);
  }
  [[gnu::always_inline]] static uint64_t address_mask(const Op* op) {
    return op->insn.addrsize == 64 ? ~0ull : op->insn.addrsize == 32 ? 0xffffffffull : 0xffffull;
  }
  [[gnu::always_inline]] static int source_segment(const Op* op) { return op->insn.seg_override != 0xff ? op->insn.seg_override : 3; }

  template <Str Kind, unsigned N>
  static const Op* string(InterpBackend& c, const Op* op) {
    const uint64_t step = (c.s_.rflags & rflags::kDf) ? uint64_t(-int64_t(N)) : N;
    string_iteration<Kind, N>(c, op, address_mask(op), source_segment(op), step);
    return next(c, op);
  }

  // STOS/MOVS forward, both pages fast: as many iterations as stay within them at once.
  template <Str Kind, unsigned N>
  static uint64_t bulk(InterpBackend& c, uint64_t rcx, uint64_t amask, int src_seg, const Op* op, uint64_t limit) {
    const bool user = c.s_.cs.dpl == 3;
    const Mem dst = at(c, op, 0, c.s_.gpr[kRdi] & amask);
    const TlbEntry& td = c.tlb_entry(dst.linear);
    if (td.write_tag[user] != (dst.linear >> 12)) return 0;
    uint64_t k = std::min<uint64_t>(rcx, (4096 - (dst.linear & 0xfff)) / N);
    k = std::min<uint64_t>(k, limit - c.steps_);
    uint8_t* to = reinterpret_cast<uint8_t*>(dst.linear + td.addend);
    const uint8_t* from = nullptr;
    if (Kind == Str::kMovs) {
      const Mem src = at(c, op, src_seg, c.s_.gpr[kRsi] & amask);
      const TlbEntry& ts = c.tlb_entry(src.linear);
      if (ts.read_tag[user] != (src.linear >> 12)) return 0;
      k = std::min<uint64_t>(k, (4096 - (src.linear & 0xfff)) / N);
      from = reinterpret_cast<const uint8_t*>(src.linear + ts.addend);
    }
    if (k < 2) return 0;
    if (Kind == Str::kStos) {
      const uint64_t v = c.s_.gpr[kRax];
      if (N == 1) {
        std::memset(to, int(v & 0xff), k);
      } else {
        for (uint64_t i = 0; i < k; ++i) std::memcpy(to + i * N, &v, N);
      }
    } else {
      // Element by element, as the hardware's string semantics define overlapping copies.
      for (uint64_t i = 0; i < k; ++i) {
        uint64_t v;
        std::memcpy(&v, from + i * N, N);
        std::memcpy(to + i * N, &v, N);
      }
      put_addr(c, kRsi, amask, c.s_.gpr[kRsi] + k * N);
    }
    put_addr(c, kRdi, amask, c.s_.gpr[kRdi] + k * N);
    return k;
  }

  template <Str Kind, unsigned N>
  static const Op* rep_string(InterpBackend& c, const Op* op) {
    const uint64_t amask = address_mask(op);
    const int src_seg = source_segment(op);
    const bool df = c.s_.rflags & rflags::kDf;
    const uint64_t step = df ? uint64_t(-int64_t(N)) : N;
    const bool repne = op->insn.flags & interp::insn_flags::kRepne;
    // steps_ does not count the instructions before this one in its block yet (they are added when the block
    // ends): the step limit, seen from here, is that much nearer. (Entering the block took it to fit.)
    const uint64_t limit = c.fast_step_limit_ - op->index;
    for (;;) {
      uint64_t rcx = c.s_.gpr[kRcx] & amask;
      if (rcx == 0) {  // nothing to do: retires at once
        ++c.steps_;
        c.s_.rip = op->next_rip;
        return nullptr;
      }
      if ((Kind == Str::kStos || Kind == Str::kMovs) && !df) {
        if (const uint64_t k = bulk<Kind, N>(c, rcx, amask, src_seg, op, limit)) {
          rcx -= k;
          put_addr(c, kRcx, amask, rcx);
          c.steps_ += k;
          if (rcx == 0) {
            c.rep_partial_ += k - 1;
            c.s_.rip = op->next_rip;
            return nullptr;
          }
          c.rep_partial_ += k;
          if (c.steps_ >= limit || c.kicked_.load(std::memory_order_relaxed)) {
            c.s_.rip = op->rip;
            return nullptr;
          }
          continue;
        }
      }
      string_iteration<Kind, N>(c, op, amask, src_seg, step);
      rcx = (rcx - 1) & amask;
      put_addr(c, kRcx, amask, rcx);
      bool done = rcx == 0;
      if (Kind == Str::kCmps || Kind == Str::kScas) {
        const bool zf = c.lazy_.dst == 0;
        if (repne ? zf : !zf) done = true;
      }
      ++c.steps_;
      if (done) {
        c.s_.rip = op->next_rip;
        return nullptr;
      }
      ++c.rep_partial_;
      if (c.steps_ >= limit || c.end_block_after_op_ || c.kicked_.load(std::memory_order_relaxed)) {
        c.s_.rip = op->rip;
        return nullptr;
      }
    }
  }

  // ---- control transfers (the end of a block) --------------------------------------------------------
  static const Op* jcc(InterpBackend& c, const Op* op) {
    c.s_.rip = condition(c, op->cond) ? op->target : op->next_rip;
    ++c.branches_;
    return nullptr;
  }
  static const Op* jmp(InterpBackend& c, const Op* op) {
    c.s_.rip = op->target;
    return nullptr;
  }
  // A target read from a register or memory: #GP(0) when it is not canonical (64-bit mode), masked
  // to the operand size otherwise (set_rip in the reference).
  [[gnu::always_inline]] static uint64_t checked_target(InterpBackend& c, const Op* op, uint64_t target) {
    if (op->insn.mode == interp::kMode64) {
      if (!is_canonical(target)) c.raise(kGp, 0, true);
      return target;
    }
    return op->insn.opsize == 16 ? target & 0xffff : target & 0xffffffffu;
  }
  template <unsigned N>
  static const Op* jmp_indirect(InterpBackend& c, const Op* op) {
    c.s_.rip = checked_target(c, op, read<N>(c, op, 0));
    return nullptr;
  }
  template <unsigned N>
  static const Op* call(InterpBackend& c, const Op* op) {
    push64<N>(c, op, op->next_rip);
    c.s_.rip = op->target;
    return nullptr;
  }
  template <unsigned N>
  static const Op* call_indirect(InterpBackend& c, const Op* op) {
    const uint64_t target = checked_target(c, op, read<N>(c, op, 0));
    push64<N>(c, op, op->next_rip);
    c.s_.rip = target;
    return nullptr;
  }
  template <unsigned N>
  static const Op* ret(InterpBackend& c, const Op* op) {
    const uint64_t saved = c.s_.gpr[kRsp];
    const uint64_t target = load<N>(c, op, at(c, op, 2, saved));
    c.s_.gpr[kRsp] = saved + N;
    try {
      c.s_.rip = checked_target(c, op, target);
    } catch (...) {
      c.s_.gpr[kRsp] = saved;
      throw;
    }
    c.s_.gpr[kRsp] += uint64_t(op->insn.operand_count >= 1 && op->insn.op[0].kind == OpKind::kImm
                                   ? uint16_t(op->insn.op[0].disp)
                                   : 0);
    return nullptr;
  }
};

// ---- binding ----------------------------------------------------------------------------------------

namespace {

// The instantiation of a handler for an operand width of 1, 2, 4 or 8 bytes (nullptr otherwise): the
// expression after the width names the handler with N as its width.
#define DEJA_BY_WIDTH(width, ...)                       \
  [&]() -> InterpBackend::Ops::Pair {                   \
    switch (width) {                                    \
      case 1: { constexpr unsigned N = 1; return InterpBackend::Ops::pair<__VA_ARGS__>(); } \
      case 2: { constexpr unsigned N = 2; return InterpBackend::Ops::pair<__VA_ARGS__>(); } \
      case 4: { constexpr unsigned N = 4; return InterpBackend::Ops::pair<__VA_ARGS__>(); } \
      case 8: { constexpr unsigned N = 8; return InterpBackend::Ops::pair<__VA_ARGS__>(); } \
      default: return {};                               \
    }                                                   \
  }()

bool is_reg(const Operand& o) { return o.kind == OpKind::kGpr || o.kind == OpKind::kGprHigh8; }

// SSE data instructions that execute() runs through exec_sse() without looking at RFLAGS (of what
// exec_sse runs, only COMISS/COMISD/UCOMISS/UCOMISD touch it): moves, logic, integer arithmetic, shuffles.
bool flagless_sse(const DecodedInsn& insn) {
  if (insn.flags & interp::insn_flags::kVex) {
    // Of the VEX instructions only these touch RFLAGS (they write it; none reads it).
    switch (ZydisMnemonic(insn.mnemonic)) {
      case ZYDIS_MNEMONIC_VPTEST: case ZYDIS_MNEMONIC_VTESTPS: case ZYDIS_MNEMONIC_VTESTPD: case ZYDIS_MNEMONIC_VCOMISS:
      case ZYDIS_MNEMONIC_VCOMISD: case ZYDIS_MNEMONIC_VUCOMISS: case ZYDIS_MNEMONIC_VUCOMISD: case ZYDIS_MNEMONIC_ANDN:
      case ZYDIS_MNEMONIC_BEXTR: case ZYDIS_MNEMONIC_BLSI: case ZYDIS_MNEMONIC_BLSMSK: case ZYDIS_MNEMONIC_BLSR:
      case ZYDIS_MNEMONIC_BZHI: case ZYDIS_MNEMONIC_VPCMPESTRI: case ZYDIS_MNEMONIC_VPCMPESTRM:
      case ZYDIS_MNEMONIC_VPCMPISTRI: case ZYDIS_MNEMONIC_VPCMPISTRM:
        return false;
      default:
        return true;
    }
  }
  if (interp::simd_extension_is_flagless(insn)) return true;
  bool xmm = false;
  for (int i = 0; i < insn.operand_count; ++i) xmm = xmm || insn.op[i].kind == OpKind::kXmm;
  if (!xmm || insn.opcode_map == ZYDIS_OPCODE_MAP_DEFAULT) return false;
  switch (ZydisMnemonic(insn.mnemonic)) {
    case ZYDIS_MNEMONIC_MOVAPS: case ZYDIS_MNEMONIC_MOVAPD: case ZYDIS_MNEMONIC_MOVUPS: case ZYDIS_MNEMONIC_MOVUPD:
    case ZYDIS_MNEMONIC_MOVDQA: case ZYDIS_MNEMONIC_MOVDQU: case ZYDIS_MNEMONIC_MOVD: case ZYDIS_MNEMONIC_MOVQ:
    case ZYDIS_MNEMONIC_MOVSS: case ZYDIS_MNEMONIC_MOVSD: case ZYDIS_MNEMONIC_MOVLPS: case ZYDIS_MNEMONIC_MOVHPS:
    case ZYDIS_MNEMONIC_MOVLPD: case ZYDIS_MNEMONIC_MOVHPD: case ZYDIS_MNEMONIC_MOVHLPS: case ZYDIS_MNEMONIC_MOVLHPS:
    case ZYDIS_MNEMONIC_PXOR: case ZYDIS_MNEMONIC_XORPS: case ZYDIS_MNEMONIC_XORPD: case ZYDIS_MNEMONIC_PAND:
    case ZYDIS_MNEMONIC_PANDN: case ZYDIS_MNEMONIC_POR: case ZYDIS_MNEMONIC_ANDPS: case ZYDIS_MNEMONIC_ANDNPS:
    case ZYDIS_MNEMONIC_ORPS: case ZYDIS_MNEMONIC_PADDB: case ZYDIS_MNEMONIC_PADDW: case ZYDIS_MNEMONIC_PADDD:
    case ZYDIS_MNEMONIC_PADDQ: case ZYDIS_MNEMONIC_PSUBB: case ZYDIS_MNEMONIC_PSUBW: case ZYDIS_MNEMONIC_PSUBD:
    case ZYDIS_MNEMONIC_PSUBQ: case ZYDIS_MNEMONIC_PCMPEQB: case ZYDIS_MNEMONIC_PCMPEQW: case ZYDIS_MNEMONIC_PCMPEQD:
    case ZYDIS_MNEMONIC_PCMPGTB: case ZYDIS_MNEMONIC_PCMPGTW: case ZYDIS_MNEMONIC_PCMPGTD:
    case ZYDIS_MNEMONIC_PMOVMSKB: case ZYDIS_MNEMONIC_PSHUFD: case ZYDIS_MNEMONIC_PSHUFLW: case ZYDIS_MNEMONIC_PSHUFHW:
    case ZYDIS_MNEMONIC_SHUFPS: case ZYDIS_MNEMONIC_PUNPCKLBW: case ZYDIS_MNEMONIC_PUNPCKLWD:
    case ZYDIS_MNEMONIC_PUNPCKLDQ: case ZYDIS_MNEMONIC_PUNPCKLQDQ: case ZYDIS_MNEMONIC_PUNPCKHBW:
    case ZYDIS_MNEMONIC_PUNPCKHWD: case ZYDIS_MNEMONIC_PUNPCKHDQ: case ZYDIS_MNEMONIC_PUNPCKHQDQ:
    case ZYDIS_MNEMONIC_PSLLDQ: case ZYDIS_MNEMONIC_PSRLDQ: case ZYDIS_MNEMONIC_PSLLW: case ZYDIS_MNEMONIC_PSLLD:
    case ZYDIS_MNEMONIC_PSLLQ: case ZYDIS_MNEMONIC_PSRLW: case ZYDIS_MNEMONIC_PSRLD: case ZYDIS_MNEMONIC_PSRLQ:
    case ZYDIS_MNEMONIC_PSRAW: case ZYDIS_MNEMONIC_PSRAD: case ZYDIS_MNEMONIC_PMINUB: case ZYDIS_MNEMONIC_PMAXUB:
      return true;
    default:
      return false;
  }
}
bool is_simple(const Operand& o) { return is_reg(o) || o.kind == OpKind::kImm || o.kind == OpKind::kMem; }

}  // namespace

void InterpBackend::bind_block_end(Op& op) {
  op.fn = &Ops::fall_through;
  op.jit_fn = &Ops::guarded<&Ops::fall_through>;
}

void InterpBackend::bind_op(Op& op, bool transfer) {
  using O = Ops;
  const DecodedInsn& insn = op.insn;
  const Operand& o0 = insn.op[0];
  const Operand& o1 = insn.op[1];
  const unsigned w = o0.size;
  const bool mode64 = insn.mode == interp::kMode64;
  O::Pair fn;
  switch (ZydisMnemonic(insn.mnemonic)) {
    case ZYDIS_MNEMONIC_MOV:
      if (!is_simple(o0) || !is_simple(o1) || o0.kind == OpKind::kImm) break;
      if (o1.kind != OpKind::kImm && o0.size != o1.size) break;
      if (is_reg(o0) && is_reg(o1)) fn = DEJA_BY_WIDTH(w, &O::mov_rr<N>);
      else if (is_reg(o0) && o1.kind == OpKind::kImm) fn = DEJA_BY_WIDTH(w, &O::mov_ri<N>);
      else fn = DEJA_BY_WIDTH(w, &O::mov<N>);
      break;
    case ZYDIS_MNEMONIC_MOVZX:
    case ZYDIS_MNEMONIC_MOVSX:
    case ZYDIS_MNEMONIC_MOVSXD: {
      if (!is_reg(o0) || o0.kind != OpKind::kGpr || !is_simple(o1) || o1.kind == OpKind::kImm) break;
      const bool s = insn.mnemonic != ZYDIS_MNEMONIC_MOVZX;
      const unsigned src = o1.size;
#define DEJA_EXTEND(N)                                                                                \
  if (w == N) {                                                                                       \
    if (src == 1) fn = s ? O::pair<&O::extend<N, 1, true>>() : O::pair<&O::extend<N, 1, false>>();    \
    if (src == 2) fn = s ? O::pair<&O::extend<N, 2, true>>() : O::pair<&O::extend<N, 2, false>>();    \
    if (src == 4) fn = s ? O::pair<&O::extend<N, 4, true>>() : O::pair<&O::extend<N, 4, false>>();    \
  }
      DEJA_EXTEND(2)
      DEJA_EXTEND(4)
      DEJA_EXTEND(8)
#undef DEJA_EXTEND
      break;
    }
    case ZYDIS_MNEMONIC_LEA:
      if (o0.kind == OpKind::kGpr && o1.kind == OpKind::kMem) fn = DEJA_BY_WIDTH(w, &O::lea<N>);
      break;
    case ZYDIS_MNEMONIC_XCHG:
      if (is_simple(o0) && is_simple(o1) && o0.kind != OpKind::kImm && o1.kind != OpKind::kImm)
        fn = DEJA_BY_WIDTH(w, &O::xchg<N>);
      break;
    case ZYDIS_MNEMONIC_CMOVB: case ZYDIS_MNEMONIC_CMOVBE: case ZYDIS_MNEMONIC_CMOVL: case ZYDIS_MNEMONIC_CMOVLE:
    case ZYDIS_MNEMONIC_CMOVNB: case ZYDIS_MNEMONIC_CMOVNBE: case ZYDIS_MNEMONIC_CMOVNL: case ZYDIS_MNEMONIC_CMOVNLE:
    case ZYDIS_MNEMONIC_CMOVNO: case ZYDIS_MNEMONIC_CMOVNP: case ZYDIS_MNEMONIC_CMOVNS: case ZYDIS_MNEMONIC_CMOVNZ:
    case ZYDIS_MNEMONIC_CMOVO: case ZYDIS_MNEMONIC_CMOVP: case ZYDIS_MNEMONIC_CMOVS: case ZYDIS_MNEMONIC_CMOVZ:
      if (o0.kind == OpKind::kGpr && is_simple(o1) && w >= 2) fn = DEJA_BY_WIDTH(w, &O::cmov<N>);
      break;
    case ZYDIS_MNEMONIC_SETB: case ZYDIS_MNEMONIC_SETBE: case ZYDIS_MNEMONIC_SETL: case ZYDIS_MNEMONIC_SETLE:
    case ZYDIS_MNEMONIC_SETNB: case ZYDIS_MNEMONIC_SETNBE: case ZYDIS_MNEMONIC_SETNL: case ZYDIS_MNEMONIC_SETNLE:
    case ZYDIS_MNEMONIC_SETNO: case ZYDIS_MNEMONIC_SETNP: case ZYDIS_MNEMONIC_SETNS: case ZYDIS_MNEMONIC_SETNZ:
    case ZYDIS_MNEMONIC_SETO: case ZYDIS_MNEMONIC_SETP: case ZYDIS_MNEMONIC_SETS: case ZYDIS_MNEMONIC_SETZ:
      if (is_simple(o0) && o0.kind != OpKind::kImm && w == 1) fn = O::pair<&O::setcc>();
      break;
#define DEJA_ALU(MN, KIND)                                                                          \
  case ZYDIS_MNEMONIC_##MN:                                                                        \
    if (is_simple(o0) && o0.kind != OpKind::kImm && is_simple(o1) && !(o0.kind == OpKind::kMem && o1.kind == OpKind::kMem)) \
      fn = DEJA_BY_WIDTH(w, &O::alu<BinaryOp::KIND, N>);                                             \
    break;
      DEJA_ALU(ADD, kAdd)
      DEJA_ALU(OR, kOr)
      DEJA_ALU(ADC, kAdc)
      DEJA_ALU(SBB, kSbb)
      DEJA_ALU(AND, kAnd)
      DEJA_ALU(SUB, kSub)
      DEJA_ALU(XOR, kXor)
      DEJA_ALU(CMP, kCmp)
      DEJA_ALU(TEST, kTest)
#undef DEJA_ALU
#define DEJA_UNARY(MN, KIND)                                                       \
  case ZYDIS_MNEMONIC_##MN:                                                       \
    if (is_simple(o0) && o0.kind != OpKind::kImm) fn = DEJA_BY_WIDTH(w, &O::unary<O::Unary::KIND, N>); \
    break;
      DEJA_UNARY(INC, kInc)
      DEJA_UNARY(DEC, kDec)
      DEJA_UNARY(NEG, kNeg)
      DEJA_UNARY(NOT, kNot)
#undef DEJA_UNARY
#define DEJA_SHIFT(MN, HANDLER, KIND)                                                                  \
  case ZYDIS_MNEMONIC_##MN:                                                                           \
    if (is_simple(o0) && o0.kind != OpKind::kImm &&                                                   \
        (insn.operand_count < 2 || o1.kind == OpKind::kNone || o1.kind == OpKind::kImm ||             \
         (o1.kind == OpKind::kGpr && o1.reg == kRcx && o1.size == 1)))                                 \
      fn = DEJA_BY_WIDTH(w, &O::HANDLER<interp::ShiftOp::KIND, N>);                                     \
    break;
      DEJA_SHIFT(SHL, shift, kShl)
      DEJA_SHIFT(SHR, shift, kShr)
      DEJA_SHIFT(SAR, shift, kSar)
      DEJA_SHIFT(ROL, rotate, kRol)
      DEJA_SHIFT(ROR, rotate, kRor)
      DEJA_SHIFT(RCL, rotate, kRcl)
      DEJA_SHIFT(RCR, rotate, kRcr)
#undef DEJA_SHIFT
    case ZYDIS_MNEMONIC_IMUL:
      if (insn.operand_count >= 2 && o1.kind != OpKind::kNone && o0.kind == OpKind::kGpr && w >= 2 &&
          is_simple(o1) && (insn.operand_count < 3 || is_simple(insn.op[2])))
        fn = DEJA_BY_WIDTH(w, &O::imul<N>);
      break;
    case ZYDIS_MNEMONIC_XADD:
      if (is_simple(o0) && is_reg(o1)) fn = DEJA_BY_WIDTH(w, &O::xadd<N>);
      break;
    case ZYDIS_MNEMONIC_CMPXCHG:
      if (is_simple(o0) && o0.kind != OpKind::kImm && is_reg(o1)) fn = DEJA_BY_WIDTH(w, &O::cmpxchg<N>);
      break;
    case ZYDIS_MNEMONIC_NOP: case ZYDIS_MNEMONIC_PAUSE: case ZYDIS_MNEMONIC_LFENCE: case ZYDIS_MNEMONIC_MFENCE:
    case ZYDIS_MNEMONIC_SFENCE: case ZYDIS_MNEMONIC_PREFETCHT0: case ZYDIS_MNEMONIC_PREFETCHT1:
    case ZYDIS_MNEMONIC_PREFETCHT2: case ZYDIS_MNEMONIC_PREFETCHNTA: case ZYDIS_MNEMONIC_PREFETCHW:
    case ZYDIS_MNEMONIC_ENDBR32: case ZYDIS_MNEMONIC_ENDBR64:
      fn = O::pair<&O::nop>();
      break;
    case ZYDIS_MNEMONIC_PUSH:
      // 64-bit mode only (the flat stack); a segment register and the other modes go to the reference.
      if (mode64 && is_simple(o0) && (insn.opsize == 64 || insn.opsize == 16))
        fn = insn.opsize == 64 ? O::pair<&O::push<8>>() : O::pair<&O::push<2>>();
      break;
    case ZYDIS_MNEMONIC_POP:
      if (mode64 && is_simple(o0) && o0.kind != OpKind::kImm && (insn.opsize == 64 || insn.opsize == 16))
        fn = insn.opsize == 64 ? O::pair<&O::pop<8>>() : O::pair<&O::pop<2>>();
      break;
    case ZYDIS_MNEMONIC_MOVSB: case ZYDIS_MNEMONIC_MOVSW: case ZYDIS_MNEMONIC_MOVSD: case ZYDIS_MNEMONIC_MOVSQ:
    case ZYDIS_MNEMONIC_STOSB: case ZYDIS_MNEMONIC_STOSW: case ZYDIS_MNEMONIC_STOSD: case ZYDIS_MNEMONIC_STOSQ:
    case ZYDIS_MNEMONIC_LODSB: case ZYDIS_MNEMONIC_LODSW: case ZYDIS_MNEMONIC_LODSD: case ZYDIS_MNEMONIC_LODSQ:
    case ZYDIS_MNEMONIC_CMPSB: case ZYDIS_MNEMONIC_CMPSW: case ZYDIS_MNEMONIC_CMPSD: case ZYDIS_MNEMONIC_CMPSQ:
    case ZYDIS_MNEMONIC_SCASB: case ZYDIS_MNEMONIC_SCASW: case ZYDIS_MNEMONIC_SCASD: case ZYDIS_MNEMONIC_SCASQ: {
      if (insn.opcode_map != ZYDIS_OPCODE_MAP_DEFAULT || insn.addrsize == 16) break;  // (MOVSD/CMPSD: SSE2 forms)
      const bool rep = insn.flags & (interp::insn_flags::kRep | interp::insn_flags::kRepne);
      const char* name = interp::mnemonic_name(insn.mnemonic);
      const char last = name[std::strlen(name) - 1];
      const unsigned n = last == 'b' ? 1 : last == 'w' ? 2 : last == 'd' ? 4 : 8;
      O::Str kind = O::Str::kMovs;
      switch (name[0]) {
        case 's': kind = name[1] == 't' ? O::Str::kStos : O::Str::kScas; break;
        case 'l': kind = O::Str::kLods; break;
        case 'c': kind = O::Str::kCmps; break;
        default: break;
      }
#define DEJA_STRING(KIND)                                                                         \
  if (kind == O::Str::KIND)                                                                       \
    fn = rep ? DEJA_BY_WIDTH(n, &O::rep_string<O::Str::KIND, N>) : DEJA_BY_WIDTH(n, &O::string<O::Str::KIND, N>);
      DEJA_STRING(kMovs)
      DEJA_STRING(kStos)
      DEJA_STRING(kLods)
      DEJA_STRING(kCmps)
      DEJA_STRING(kScas)
#undef DEJA_STRING
      op.self_counting = rep;
      break;
    }
    case ZYDIS_MNEMONIC_JO: case ZYDIS_MNEMONIC_JNO: case ZYDIS_MNEMONIC_JB: case ZYDIS_MNEMONIC_JNB:
    case ZYDIS_MNEMONIC_JZ: case ZYDIS_MNEMONIC_JNZ: case ZYDIS_MNEMONIC_JBE: case ZYDIS_MNEMONIC_JNBE:
    case ZYDIS_MNEMONIC_JS: case ZYDIS_MNEMONIC_JNS: case ZYDIS_MNEMONIC_JP: case ZYDIS_MNEMONIC_JNP:
    case ZYDIS_MNEMONIC_JL: case ZYDIS_MNEMONIC_JNL: case ZYDIS_MNEMONIC_JLE: case ZYDIS_MNEMONIC_JNLE:
      if (op.target_ok) fn = O::pair<&O::jcc>();
      break;
    case ZYDIS_MNEMONIC_JMP:
      if (o0.kind == OpKind::kImm && op.target_ok) fn = O::pair<&O::jmp>();
      else if ((is_reg(o0) || o0.kind == OpKind::kMem) && o0.size == insn.opsize / 8)
        fn = DEJA_BY_WIDTH(o0.size, &O::jmp_indirect<N>);
      break;
    case ZYDIS_MNEMONIC_CALL:
      if (!mode64 || insn.opsize != 64) break;
      if (o0.kind == OpKind::kImm && op.target_ok) fn = O::pair<&O::call<8>>();
      else if ((is_reg(o0) || o0.kind == OpKind::kMem) && o0.size == 8) fn = O::pair<&O::call_indirect<8>>();
      break;
    case ZYDIS_MNEMONIC_RET:
      if (mode64 && insn.opsize == 64 && (insn.opcode == 0xc3 || insn.opcode == 0xc2)) fn = O::pair<&O::ret<8>>();
      break;
    case ZYDIS_MNEMONIC_STI: case ZYDIS_MNEMONIC_POPF: case ZYDIS_MNEMONIC_POPFD: case ZYDIS_MNEMONIC_POPFQ:
    case ZYDIS_MNEMONIC_IRET: case ZYDIS_MNEMONIC_IRETD: case ZYDIS_MNEMONIC_IRETQ: case ZYDIS_MNEMONIC_INVLPG:
      fn = O::pair<&O::reference_ends_run>();
      break;
    case ZYDIS_MNEMONIC_RDTSC: case ZYDIS_MNEMONIC_RDTSCP: case ZYDIS_MNEMONIC_IN: case ZYDIS_MNEMONIC_OUT:
      fn = O::pair<&O::reference_may_exit>();
      break;
    case ZYDIS_MNEMONIC_PTEST: case ZYDIS_MNEMONIC_PCMPESTRI: case ZYDIS_MNEMONIC_PCMPESTRM:
    case ZYDIS_MNEMONIC_PCMPISTRI: case ZYDIS_MNEMONIC_PCMPISTRM:
      fn = O::pair<&O::simd_flags>();
      break;
    default:
      break;
  }
  if (!fn && !transfer && flagless_sse(insn)) fn = O::pair<&O::reference_sse>();
  if (!fn) fn = transfer ? O::pair<&O::reference_transfer>() : O::pair<&O::reference>();
  op.fn = fn.fn;
  op.jit_fn = fn.jit;
}

}  // namespace deja
