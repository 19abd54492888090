// The software CPU backend: an x86-64 interpreter with exact retired-instruction and conditional-branch counts.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "interp/block.h"
#include "interp/decoded_insn.h"
#include "interp/lazy_flags.h"
#include "interp/store_buffer.h"
#include "interp/sse.h"
#include "core/backend.h"
#include "core/cpu_model.h"
#include "core/guest_memory.h"

namespace deja {

namespace interp {
class JitBuffer;
}

// How the software CPU executes (docs/interp.md): `reference` decodes and executes one instruction at a
// time (the original executor, kept as the definition the fast path is tested against); `threaded`
// runs translated blocks of pre-bound operations; `jit` compiles them to host code (the default).
enum class InterpMode : uint8_t { kReference, kThreaded, kJit };
std::string_view interp_mode_name(InterpMode mode);
std::optional<InterpMode> parse_interp_mode(std::string_view name);
// The mode a new InterpBackend starts in: kJit, or what the environment variable DEJA_INTERP_MODE names
// (so that whole test suites can run on another mode without a flag on every command).
InterpMode default_interp_mode();

class InterpBackend : public Backend {
 public:
  InterpBackend(GuestMemory& memory, const CpuModel& model);
  ~InterpBackend() override;

  std::string_view name() const override { return "interp"; }
  Result<VcpuExit*> run() override;
  Result<CpuState> get_state() override;
  Result<> set_state(const CpuState& state) override;
  bool can_inject_interrupt() override;
  Result<> inject_interrupt(uint8_t vector) override;
  Result<> inject_nmi() override {
    nmi_pending_ = true;
    return {};
  }
  Result<> set_pause_exits(bool on) override;
  bool answer_rdtsc_inline(std::function<uint64_t()> tsc) override {
    inline_tsc_ = std::move(tsc);
    return true;
  }
  Result<> set_lock_exits(bool on) override;
  void request_interrupt_window(bool enable) override { window_requested_ = enable; }
  void kick() override { kicked_.store(true, std::memory_order_relaxed); }
  ProgressCounter* progress_counter() override { return &counter_; }
  std::optional<uint64_t> instruction_count() const override { return steps_ - rep_partial_; }
  Result<> set_debug(const DebugControl& control) override;
  std::optional<uint64_t> step_count() const override { return executed(); }
  std::vector<uint8_t> save_internal() override;
  Result<> restore_internal(std::span<const uint8_t> state) override;
  std::vector<std::string> cpu_quirks() const override;
  Result<> adopt_cpu_quirks(std::span<const std::string> quirks) override;
  Result<> adopt_software_tlb_entries(uint32_t entries) override;

  // The vCPUs of one machine (docs/smp.md, "Code one vCPU writes and another runs"): each keeps its own decoded
  // code, TLB and counts; a store by any of them into code another has decoded drops it there too, and VMM
  // writes (DMA, the loader, a checkpoint restore) drop it in all of them.
  static void share_code(std::span<InterpBackend* const> vcpus);

  // x86-TSO (`--tso`, docs/explore.md "Store buffers"): from now on this vCPU's stores to RAM wait in a store buffer
  // drawn from `plan` and its index `vcpu`, and it runs on the reference executor only (the fast path's inline
  // memory accesses would bypass the buffer).
  void enable_store_buffer(const StoreBufferPlan& plan, uint32_t vcpu);
  interp::StoreBuffer* store_buffer() { return store_buffer_.get(); }

  // An armed overflow stops the vCPU a random 0..skid branches late, drawn from a generator seeded with `seed`.
  Result<> emulate_pmu_skid(uint64_t skid, uint64_t seed) override;
  // Counted in retired steps (instructions plus REP iterations that did not finish one), so never past `n`
  // instructions.
  Result<> set_instruction_budget(uint64_t n) override {
    budget_ = n;
    budget_start_ = steps_;
    return {};
  }
  // The executor, its blocks, and the instructions that raised #UD because deja does not implement them.
  std::vector<std::string> statistics() const override;
  // Reference, threaded or JIT execution; may be changed between run() calls.
  void set_mode(InterpMode mode);
  InterpMode mode() const { return mode_; }
  // Test control for the fast-vs-reference differential test: run() returns kKicked after every block
  // (or step) the fast path runs, so the caller can compare the state with the reference at each block
  // boundary.
  void set_block_stepping(bool on) {
    block_stepping_ = on;
    if (!on) block_step_done_ = false;  // (a block's report still pending behind a HLT's exit is dropped)
  }
  // Instructions retired plus REP iterations that did not finish one: what set_instruction_budget counts.
  uint64_t retired_steps() const { return steps_; }
  // Fast-path statistics, for --stats and the benchmarks.
  struct FastStats {
    uint64_t blocks_translated = 0, block_invalidations = 0, block_cache_flushes = 0, block_cache_bytes = 0;
    // chained: blocks the runner or next_body went on to (JIT code's own links are not counted: a counter
    // there would cost a memory increment at every block).
    uint64_t blocks_entered = 0, chained = 0, fallback_steps = 0;
    uint64_t blocks_relocated = 0;  // of blocks_translated: copied from the same bytes at another RIP
  };
  FastStats fast_stats() const;

  // Instructions that raised #UD because deja does not implement them, by mnemonic.
  std::map<std::string, uint64_t> unimplemented_counts() const { return unimplemented_; }
  // Decoded code dropped because it was overwritten: decode-cache entries and translated blocks.
  uint64_t decode_invalidations() const { return cache_.invalidations() + blocks_.invalidations(); }

  // Exceptions and exits unwind out of the executor as these (private to the implementation).
  struct GuestException {
    uint8_t vector;
    uint32_t error_code;
    bool has_error_code;
  };
  struct ExitRequest {};
  // JIT code cannot unwind: a handler it calls keeps the fault or exit here for the runner to rethrow.
  static constexpr uint8_t kJitFault = 1, kJitExit = 2;

 private:
  enum class Access : uint8_t { kRead, kWrite, kExec };
  struct TlbEntry {
    uint64_t tag = ~0ull;  // linear page number; ~0 = empty
    uint64_t phys = 0;     // physical page base
    // The fast path's view of the same translation (docs/interp.md, "Software TLB"): a read or write
    // at privilege [0] supervisor / [1] user goes straight to host memory at linear + addend when its
    // last byte's page number equals read_tag / write_tag (~0 = never: not RAM, not yet dirty, read-only,
    // decoded code in the page, a watchpoint in the page). One compare also rejects page-crossing accesses.
    uint64_t read_tag[2] = {~0ull, ~0ull};
    uint64_t write_tag[2] = {~0ull, ~0ull};
    uint64_t addend = 0;
    bool writable = false, user = false, nx = false, global = false, dirty = false;
    bool listed = false;  // its index is in tlb_live_
  };

  // Execution.
  void step();
  // Resets what one step tracks (the instruction's RIP, its shadow, software interrupt, REP state).
  void begin_step(uint64_t rip);
  // Delivers the fault an instruction raised (it did not retire): the end of a faulting step.
  void take_fault(const GuestException& fault);
  uint64_t executed() const { return steps_ + faulted_; }

  // The fast path (interp/fast_exec.cpp): translated blocks, run one after another while no stop
  // condition of the run loop can become due, so every stop still lands on its exact instruction.
  struct Ops;  // the operation handlers (nested, so they reach the state)
  struct Jit;  // the block compiler (interp/jit.cpp)
  // Binds the handler of a decoded instruction (interp/fast_ops.cpp); `transfer`: it ends its block.
  static void bind_op(interp::Op& op, bool transfer);
  static void bind_block_end(interp::Op& op);
  // Writes the lazy flags (interp/lazy_flags.h) into RFLAGS; everything outside the fast path's handlers
  // sees RFLAGS only.
  void materialize_flags() {
    if (lazy_.cc != interp::kCcNone) [[likely]] {
      s_.rflags = (s_.rflags & ~interp::kArithFlags) | interp::cc_compute(lazy_);
      lazy_.cc = interp::kCcNone;
    }
  }
  void run_fast();
  // Runs one block's operations (its host code, or the handlers one after the other); returns the
  // operation that ended it; faults and exits are thrown as from the reference executor.
  const interp::Op* run_block(const interp::Block& block);
  // Compiles `block` to host code (interp/jit.cpp); false when the code buffer is full.
  bool compile_block(interp::Block& block);
  // Gives `to` (a copy of `from`'s operations moved to another RIP) a copy of `from`'s host code with its
  // address-dependent values rewritten (Block::relocs); false when they do not fit their encodings or the
  // buffer is full (then `to` is compiled afresh). `room`: where to put it (a dropped block's code of that size),
  // else at the buffer's end.
  bool relocate_code(interp::Block& to, const interp::Block& from, void* room = nullptr);
  uint32_t block_key() const;
  static constexpr uint32_t kKeyPaging = 1u << 4;  // block_key(): CR0.PG
  // Chaining (docs/interp.md, "The fast path"): may `from` link to `next`, the block that followed it? Within
  // one linear page always (`from` was entered through the translation `next` was found through). Into
  // another page where each use can check the translation with a TLB hit, which has no side effects, as the
  // reference's fetch on a TLB hit: 64-bit code with paging, or no paging at all (identity: the same block
  // is found for the same RIP as long as `from` is).
  static bool linkable(const interp::Block& from, const interp::Block& next) {
    return ((next.linear ^ from.linear) >> 12) == 0 || !(from.key & kKeyPaging) || (from.key & 3) == interp::kMode64;
  }
  // Whether a link to `next` may be followed now: another page is entered only on a TLB hit that maps it
  // where `next` was translated from, executable at the block's privilege.
  bool link_current(const interp::Block& from, const interp::Block& next) const {
    if (((next.linear ^ from.linear) >> 12) == 0 || !(from.key & kKeyPaging)) return true;
    const TlbEntry& e = tlb_entry(next.linear);
    return e.tag == (next.linear >> 12) && e.phys == (next.phys & ~0xfffull) && !e.nx &&
           (((from.key >> 2) & 3) != 3 || e.user);
  }
  interp::Block* lookup_block();
  interp::Block* translate_block(uint64_t rip, uint64_t linear, uint64_t phys, uint32_t key);
  // The block at `rip` made from `from`, a block of the same bytes and mode at another RIP (nullptr: it cannot be).
  interp::Block* clone_block(const interp::Block& from, uint64_t rip);
  // Adds a translated block to the cache.
  interp::Block* insert_block(std::unique_ptr<interp::Block> block);
  bool breakpoint_in(uint64_t linear_begin, uint64_t linear_end) const;
  // The step count at which the run loop must look again (budget, stop_at_step): blocks that would
  // cross it are not entered.
  uint64_t step_limit() const;
  void execute(const interp::DecodedInsn& insn);
  const interp::DecodedInsn& fetch_decoded();
  const interp::DecodedInsn& fetch_decoded_slow(uint64_t linear, uint64_t phys, uint8_t mode);
  void invalidate_fetch() { fetch_page_ = ~0ull; }
  void decode_at(uint64_t linear, interp::DecodedInsn& out);
  uint8_t decode_mode() const;
  uint64_t current_linear_rip() const {
    return decode_mode() == interp::kMode64 ? s_.rip : ((s_.cs.base + s_.rip) & 0xffffffffu);
  }
  void raise(uint8_t vector, uint32_t error_code = 0, bool has_error_code = false) const;
  [[noreturn]] void raise_ud(const interp::DecodedInsn& insn, bool unimplemented);
  void exec_string(const interp::DecodedInsn& insn);
  void exec_system(const interp::DecodedInsn& insn);
  void exec_sse(const interp::DecodedInsn& insn);
  void exec_x87(const interp::DecodedInsn& insn);  // interp/x87.cpp: ESC opcodes D8-DF and FWAIT
  void exec_avx(const interp::DecodedInsn& insn);    // interp/exec_avx.cpp: every VEX-encoded instruction
  void exec_bmi(const interp::DecodedInsn& insn);    // interp/exec_bmi.cpp: BMI1/BMI2 (VEX-encoded, GPRs only)
  void exec_xsave(const interp::DecodedInsn& insn);  // interp/exec_xsave.cpp: XSAVE*, XRSTOR, XGETBV, XSETBV
  // CPUID as the guest sees it now: the model's answer with the bits that follow CR4 and XCR0 (OSXSAVE, the
  // XSAVE area sizes of leaf 0DH), as KVM computes them (interp/exec_xsave.cpp).
  CpuidResult cpuid(uint32_t leaf, uint32_t subleaf) const;
  // Whether the model has the feature of CPUID.leaf(subleaf 0):reg[bit] (reg 0-3: EAX..EDX).
  bool model_has(uint32_t leaf, int reg, int bit) const;
  // The model's features each VEX instruction checks (interp::VexIsa), read once.
  std::array<bool, 16> vex_features_{};
  // The SIMD extensions after SSE2: every instruction with an MMX register, EMMS, SSE3, SSSE3, SSE4.1 and
  // SSE4.2 (interp/exec_mmx.cpp, interp/exec_sse4.cpp); false for anything else.
  bool exec_simd_extension(const interp::DecodedInsn& insn);
  void exec_mmx(const interp::DecodedInsn& insn);
  void exec_sse4(const interp::DecodedInsn& insn);

  // SIMD state, all in s_.fxsave: XMM registers, MXCSR, and the MMX registers on the x87 stack's mantissas.
  interp::sse::Xmm xmm(unsigned n) const {
    interp::sse::Xmm x;
    std::memcpy(&x, s_.fxsave.data() + 160 + 16 * n, 16);
    return x;
  }
  void set_xmm(unsigned n, interp::sse::Xmm x) { std::memcpy(s_.fxsave.data() + 160 + 16 * n, &x, 16); }
  uint32_t mxcsr() const {
    uint32_t value;
    std::memcpy(&value, s_.fxsave.data() + 24, 4);
    return value;
  }
  void set_mxcsr(uint32_t value) { std::memcpy(s_.fxsave.data() + 24, &value, 4); }
  // MMn is physical x87 register n, wherever TOP puts it in the FXSAVE image's stack order.
  uint64_t mm(unsigned n) const;
  // The x87-to-MMX transition of every MMX instruction but EMMS (TOP = 0, every register tagged valid),
  // then MMn's mantissa = value and its exponent all ones (SDM vol. 1, 9.5).
  void mmx_transition();
  void set_mm(unsigned n, uint64_t value);
  // MASKMOVQ/MASKMOVDQU: the `n` bytes of `data` whose `mask` byte has its sign set, to DS:[RDI].
  void masked_store(const interp::DecodedInsn& insn, const uint8_t* data, const uint8_t* mask, unsigned n);
  // The extensions of the CPU model the SIMD executors check (an instruction of one the model lacks is #UD).
  struct SimdFeatures {
    bool mmx = false, sse3 = false, ssse3 = false, sse41 = false, sse42 = false;
  };
  static SimdFeatures simd_features_of(const CpuModel& model);

  // Register and operand access.
  uint64_t reg_read(int index, unsigned bytes) const {
    return bytes >= 8 ? s_.gpr[index] : s_.gpr[index] & ((1ull << (bytes * 8)) - 1);
  }
  void reg_write(int index, unsigned bytes, uint64_t value) {
    switch (bytes) {
      case 8: s_.gpr[index] = value; break;
      case 4: s_.gpr[index] = value & 0xffffffffu; break;
      case 2: s_.gpr[index] = (s_.gpr[index] & ~0xffffull) | (value & 0xffff); break;
      default: s_.gpr[index] = (s_.gpr[index] & ~0xffull) | (value & 0xff); break;
    }
  }
  uint64_t effective_address(const interp::Operand& op, const interp::DecodedInsn& insn) const;
  // Register and immediate operands inline; everything else takes the out-of-line path.
  uint64_t read_operand(const interp::DecodedInsn& insn, int i) {
    const interp::Operand& op = insn.op[i];
    if (op.kind == interp::OpKind::kGpr) [[likely]] return reg_read(op.reg, op.size);
    if (op.kind == interp::OpKind::kImm) return uint64_t(op.disp);
    return read_operand_slow(insn, i);
  }
  void write_operand(const interp::DecodedInsn& insn, int i, uint64_t value) {
    const interp::Operand& op = insn.op[i];
    if (op.kind == interp::OpKind::kGpr) [[likely]] return reg_write(op.reg, op.size, value);
    write_operand_slow(insn, i, value);
  }
  uint64_t read_operand_slow(const interp::DecodedInsn& insn, int i);
  void write_operand_slow(const interp::DecodedInsn& insn, int i, uint64_t value);
  uint64_t segment_base(int seg) const;

  // Memory.
  uint64_t translate(uint64_t linear, Access access, bool user) {
    if (s_.cr0 & cr0::kPg) [[likely]] {
      const TlbEntry& entry = tlb_entry(linear);
      // Hit: a read, or a write to a page already marked dirty and writable for this privilege.
      if (entry.tag == (linear >> 12) && (!user || entry.user) &&
          (access == Access::kRead ||
           (access == Access::kWrite && entry.dirty && (entry.writable || (!user && !(s_.cr0 & cr0::kWp)))) ||
           (access == Access::kExec && !entry.nx))) [[likely]]
        return entry.phys | (linear & 0xfff);
    }
    return translate_slow(linear, access, user);
  }
  uint64_t translate_slow(uint64_t linear, Access access, bool user);
  uint64_t walk(uint64_t linear, Access access, bool user);
  void read_linear(uint64_t linear, void* out, unsigned size, Access access = Access::kRead);
  void write_linear(uint64_t linear, const void* data, unsigned size);
  void read_phys(uint64_t gpa, void* out, unsigned size);
  void write_phys(uint64_t gpa, const void* data, unsigned size);
  // A store into RAM reaching memory: marks its page dirty, drops decoded code it overwrites.
  void write_ram(uint64_t gpa, const void* data, unsigned size) {
    std::memcpy(ram_ + gpa, data, size);
    // Callers pass ranges within one page (write_linear splits at page boundaries).
    dirty_bits_[gpa >> 18] |= uint64_t{1} << ((gpa >> 12) & 63);
    if (is_code_page(gpa >> 12)) [[unlikely]] note_code_write(gpa, size);
  }
  // With a store buffer: puts a store into RAM in it (false: it must go to memory now, after the buffer's stores).
  bool buffer_store(uint64_t gpa, const void* data, unsigned size);
  // Whether the instruction just fetched may hold bytes this vCPU's buffer has stores to: then the buffer drains and
  // the instruction is fetched again, as processors snoop their store buffers for self-modifying code.
  bool fetch_sees_buffered_store(const interp::DecodedInsn& insn) const;
  // Writes the oldest buffered store to memory; every one, oldest first.
  void commit_oldest_store();
  void drain_store_buffer();
  uint64_t read_mem(int seg, uint64_t offset, unsigned size);
  void write_mem(int seg, uint64_t offset, unsigned size, uint64_t value);
  // Raises the fault a write of [offset, offset+size) would raise, without accessing memory.
  void probe_write(int seg, uint64_t offset, unsigned size);
  // System-structure access (descriptor tables, TSS, IDT) is supervisor regardless of CPL.
  uint64_t read_sys(uint64_t linear, unsigned size);
  void write_sys(uint64_t linear, unsigned size, uint64_t value);
  void flush_tlb(bool include_global);
  // Recomputes the fast-path tags of `entry` (see TlbEntry) from its translation and what is known now.
  void fill_fast_tags(TlbEntry& entry);
  // Drops the fast write tags of every entry that maps guest page `pfn` (it now holds decoded code).
  void revoke_fast_writes(uint64_t pfn);
  // After a slow-path access to `linear` succeeded: gives its entry fast tags again (and, with paging
  // off, an identity entry), so that the next access to the page is fast.
  void refresh_fast_entry(uint64_t linear);
  // Host memory for the n bytes at `offset` in segment `seg` (64-bit mode, one page) when the fast
  // path's tags allow the whole access (read or write, at the current privilege), else nullptr: then
  // the reference's access path must make it. For bulk accesses (FXSAVE/FXRSTOR) that would otherwise
  // take that path once per 8 bytes.
  uint8_t* fast_host_range(int seg, uint64_t offset, uint64_t n, bool write);
  bool is_user() const { return cpl() == 3; }

  // Stack.
  void push(uint64_t value, unsigned size);
  uint64_t pop(unsigned size);
  unsigned stack_addr_size() const;

  // Modes and segments.
  unsigned cpl() const { return s_.cs.dpl; }
  bool long_mode() const { return s_.efer & efer::kLma; }
  bool mode64() const { return long_mode() && s_.cs.l; }
  SegmentReg& seg(int index);
  // `by_transfer`: SS (or CS) loaded by a far transfer, IRET or event delivery rather than MOV/POP Sreg.
  void load_segment(int index, uint16_t selector, bool by_transfer = false);
  void mark_accessed(uint16_t selector, SegmentReg& desc, bool by_transfer);
  SegmentReg read_descriptor(uint16_t selector, uint8_t vector_on_fault);
  uint64_t descriptor_address(uint16_t selector, uint8_t vector_on_fault);
  void load_code_segment_far(uint16_t selector, uint64_t target, bool is_call, unsigned opsize);
  void far_return(unsigned opsize, uint16_t pop_extra);
  void iret(unsigned opsize);
  void set_cr(int cr, uint64_t value);
  uint64_t get_cr(int cr) const;
  void set_efer(uint64_t value);
  void update_mode();
  void write_rflags(uint64_t value, uint64_t mask);
  static bool is_canonical(uint64_t address) { return uint64_t(int64_t(address << 16) >> 16) == address; }
  uint64_t canonical_check(uint64_t address, bool use_ss) const {
    if (!is_canonical(address)) [[unlikely]] raise(use_ss ? 12 : 13, 0, true);
    return address;
  }
  // The linear address of segment:offset for a data access; in 64-bit mode only FS and GS have a base,
  // and the address must be canonical (#SS through SS, else #GP).
  uint64_t data_linear(int seg_index, uint64_t offset) const {
    if (!mode64()) return (segment_base(seg_index) + offset) & 0xffffffffu;
    uint64_t linear = seg_index >= 4 ? offset + segment_base(seg_index) : offset;
    canonical_check(linear, seg_index == 2);
    return linear;
  }

  // MSRs and exits.
  uint64_t msr_read(uint32_t index);
  void msr_write(uint32_t index, uint64_t value);
  uint64_t port_in(uint16_t port, unsigned size);
  void port_out(uint16_t port, unsigned size, uint64_t value);
  // The same, false when the VMM must answer first (exit_ is set up for it; nothing else changed).
  bool try_port_in(uint16_t port, unsigned size, uint64_t& value);
  bool try_port_out(uint16_t port, unsigned size, uint64_t value);
  void check_io_permission();
  // Leaves run() with exit_ (its rip: the current instruction's, unless `rip` says otherwise).
  [[noreturn]] void request_exit(std::optional<uint64_t> rip = std::nullopt);
  // The same without unwinding, for the run loop's commonest exits (RDTSC, IN, OUT): the instruction
  // returns at once, changing nothing more; step() (or, at a block's end, the runner: reference_may_exit)
  // leaves it unretired and run() returns exit_ as its ExitRequest catch does. (A C++ throw costs
  // microseconds: they were 5-8% of a Linux boot.)
  void defer_exit() {
    exit_.rip = insn_rip_;
    exit_pending_ = true;
  }
  bool exit_pending_ = false;
  bool take_response(ExitKind kind, uint64_t key, uint64_t& value, bool* fault = nullptr, bool* ok = nullptr);

  // Interrupts and exceptions.
  void deliver_event(uint8_t vector, bool has_error_code, uint32_t error_code, bool software, uint64_t return_rip);
  void deliver(uint8_t vector, bool has_error_code, uint32_t error_code, bool software, uint64_t return_rip);
  void deliver_protected(uint8_t vector, bool has_error_code, uint32_t error_code, bool software,
                         uint64_t return_rip);
  void deliver_long(uint8_t vector, bool has_error_code, uint32_t error_code, bool software, uint64_t return_rip);
  void triple_fault(const std::string& why);

  void invalidate_vmm_writes();
  // Whether stores into page `pfn` must look for decoded code to drop: this vCPU's, or with vCPUs sharing
  // code (share_code), any of theirs (a bitmap that may keep a page a little longer than its code).
  bool own_code_page(uint64_t pfn) const { return cache_.has_code(pfn) || blocks_.has_code(pfn); }
  bool is_code_page(uint64_t pfn) const {
    if (peers_) [[unlikely]] return pfn < peers_->code.size() && peers_->code[pfn];
    return own_code_page(pfn);
  }
  // Page `pfn` holds decoded code now (it did not): stores into it, by any vCPU, lose their fast path.
  void code_appeared(uint64_t pfn);
  // Drops this vCPU's decoded code overlapping [gpa, gpa + size).
  void drop_own_code(uint64_t gpa, unsigned size);
  struct CodePeers {
    std::vector<InterpBackend*> vcpus;
    std::vector<uint8_t> code;  // per guest page: some vCPU may hold decoded code there
  };
  std::shared_ptr<CodePeers> peers_;
  // Data watchpoints (DebugControl::watchpoints): notes the first access of this step that hits one.
  void check_watch(uint64_t linear, unsigned size, bool write);
  bool user_breakpoint_here() const;
  void note_code_write(uint64_t gpa, unsigned size);
  void count_unimplemented(uint16_t mnemonic);

  GuestMemory& memory_;
  const CpuModel& model_;
  const SimdFeatures simd_ = simd_features_of(model_);
  uint8_t* ram_;
  uint64_t ram_size_;
  CpuState s_;

  interp::DecodeCache cache_;
  interp::DecodedInsn scratch_;
  // Fetch fast path: the linear page of the last fetch and where it lives, valid while the mode,
  // CPL, translations and the decode cache are unchanged (see invalidate_fetch()).
  uint64_t fetch_page_ = ~0ull;
  uint64_t fetch_phys_ = 0;
  uint8_t fetch_mode_ = 0;
  uint64_t fetch_cache_generation_ = 0;
  const uint16_t* fetch_slots_ = nullptr;
  interp::DecodedInsn* fetch_insns_ = nullptr;  // instructions that straddle a page boundary are not cached
  // The software TLB: tlb_mask_ + 1 direct-mapped entries, a machine-model parameter (stale entries and the
  // accessed bits walks set are guest-visible), so a trace records it (MachineConfig.software_tlb_entries).
  // The indexes of the entries ever filled since the last flush are listed, each once, so that a flush or a
  // scan costs what is in use rather than the whole array.
  std::array<TlbEntry, kSoftwareTlbMaxEntries> tlb_{};
  uint64_t tlb_mask_ = kSoftwareTlbEntries - 1;
  std::vector<uint16_t> tlb_live_;
  TlbEntry& tlb_entry(uint64_t linear) { return tlb_[(linear >> 12) & tlb_mask_]; }
  const TlbEntry& tlb_entry(uint64_t linear) const { return tlb_[(linear >> 12) & tlb_mask_]; }
  // The entry page `vpn` goes to, emptied and listed: for a fill.
  TlbEntry& tlb_fill(uint64_t vpn) {
    TlbEntry& entry = tlb_[vpn & tlb_mask_];
    if (!entry.listed) tlb_live_.push_back(uint16_t(vpn & tlb_mask_));
    entry = TlbEntry{};
    entry.listed = true;
    entry.tag = vpn;
    return entry;
  }

  VcpuExit exit_;
  // The pending exit's response: the instruction that caused it is executed again and consumes it.
  struct Response {
    ExitKind kind;
    uint64_t key;
    uint64_t value;
    bool ok;
    bool fault;
  };
  std::vector<Response> responses_;
  size_t response_cursor_ = 0;
  bool exit_outstanding_ = false;  // exit_ was returned and its response is still to be collected

  // Counts. The hot one is steps_ (retired instructions plus REP iterations that did not finish the
  // instruction: what the budget counts); instructions = steps_ - rep_partial_, the debugger's step
  // count (executed()) = steps_ + faulted_.
  uint64_t steps_ = 0;
  uint64_t rep_partial_ = 0;  // REP iterations that left the instruction unfinished
  uint64_t faulted_ = 0;      // steps that ended in a fault (the instruction did not retire)
  uint64_t branches_ = 0;
  uint64_t budget_ = 0;
  uint64_t budget_start_ = 0;
  // The exact branch counter; with an emulated skid it stops late like a PMU overflow interrupt.
  class Counter final : public ProgressCounter {
   public:
    explicit Counter(InterpBackend& cpu) : cpu_(cpu) {}
    std::string describe() const override;
    uint64_t read() override { return cpu_.branches_; }
    Result<> arm(uint64_t at) override;
    void disarm() override { cpu_.overflow_at_.reset(); }
    uint64_t skid() const override { return skid_; }
    Result<> rebase(uint64_t count) override {
      cpu_.branches_ = count;
      disarm();
      return {};
    }

   private:
    friend class InterpBackend;
    InterpBackend& cpu_;
    uint64_t skid_ = 0;
    std::mt19937_64 random_;
  };
  Counter counter_{*this};
  std::optional<uint64_t> overflow_at_;  // branch count at which an armed overflow stops run()
  DebugControl debug_;
  struct WatchHit {
    uint64_t address;
    WatchKind kind;
    uint64_t rip;  // the accessing instruction
  };
  std::optional<WatchHit> watch_hit_;  // set during a step that touched a watched range
  uint64_t* dirty_bits_;               // GuestMemory's checkpoint dirty bitmap: every store marks its page
  uint64_t step_origin_ = 0;  // executed() when single-stepping last stopped
  // DebugControl::step_as_trap_flag: the VMM's step is RFLAGS.TF in s_ (hidden from get_state()), as KVM's is.
  bool trap_flag_steps() const { return debug_.single_step && debug_.step_as_trap_flag; }
  bool trap_flag_trapped_ = false;   // an instruction ended with the step's trap, not yet reported
  bool state_set_since_exit_ = false;
  bool window_requested_ = false;
  std::optional<uint8_t> pending_irq_;
  bool shadow_next_ = false;  // set by STI/MOV SS during the current instruction
  uint64_t insn_rip_ = 0;     // RIP of the instruction being executed
  uint64_t next_rip_ = 0;
  int software_interrupt_ = -1;  // INT n / INT3 / INTO / INT1 delivered after the instruction retires
  bool icebp_ = false;
  bool rep_continues_ = false;   // a REP iteration finished with more to do: RIP stays
  bool hlt_executed_ = false;
  uint64_t hlt_rip_ = 0;
  bool hlt_unreported_ = false;  // a HLT retired and its kHlt exit has not been returned yet
  bool nmi_pending_ = false;     // inject_nmi() not yet delivered
  bool nmi_blocked_ = false;     // an NMI handler runs: NMIs wait for its IRET
  bool pause_exits_ = false;     // set_pause_exits
  bool pause_in_step_ = false;   // PAUSE has exited once: blocks leave it to step()
  std::function<uint64_t()> inline_tsc_;  // answer_rdtsc_inline
  bool pause_executed_ = false;  // the current instruction is a PAUSE that exits once retired
  bool pause_unreported_ = false;
  bool lock_exits_ = false;       // set_lock_exits
  bool locked_executed_ = false;  // the current instruction is locked and exits once retired
  bool lock_unreported_ = false;
  uint64_t lock_rip_ = 0;
  uint64_t pause_rip_ = 0;
  int delivering_ = -1;       // vector being delivered, for double-fault classification
  bool shutdown_ = false;
  std::string shutdown_detail_;
  // The recording CPU's departures from the architecture that a replay reproduces (core/backend.h kCpuQuirk*).
  struct Quirks {
    bool accessed_only_by_segment_loads = false;
    bool fxsave_no_x87_pointers = false;
    bool fxsave_skips_reserved_bytes = false;
    bool x87_environment_zero_extended = false;
  } quirks_;
  std::map<std::string, uint64_t> unimplemented_;

  // Fast path state.
  InterpMode mode_ = default_interp_mode();
  interp::LazyFlags lazy_;  // pending arithmetic flags, only while blocks run (cc == kCcNone otherwise)
  interp::BlockCache blocks_;
  // DEJA_JIT_CHECK_CLONES (tests): every relocated block's code is compared with the code compiled afresh.
  bool check_clones_ = std::getenv("DEJA_JIT_CHECK_CLONES") != nullptr;
  std::vector<interp::Op> op_scratch_ = std::vector<interp::Op>(interp::Block::kMaxInstructions + 1);  // translate_block
  interp::Block* running_block_ = nullptr;  // the block being executed, if any (JIT code moves it along a chain)
  const interp::Op* running_op_ = nullptr;        // the operation being executed (what a fault names)
  // Set during an operation when the block must end right after it: a store rewrote code of the running
  // block, or an access hit a watchpoint.
  bool end_block_after_op_ = false;
  uint64_t fast_step_limit_ = ~0ull;  // step_limit() while blocks run (REP strings stop there between iterations)
  uint64_t branch_limit_ = ~0ull;     // the armed counter overflow while blocks run
  bool chain_ok_ = false;             // JIT code may jump from block to block (no breakpoints, no block stepping)
  std::atomic<bool> kicked_{false};   // (right after chain_ok_: JIT code reads the two as one word)
  const interp::Op* chain_op_ = nullptr;  // a chain entry's caller's operation, across its call of next_body
  // 64-bit blocks by RIP for JIT code's transfers to a target its link does not hold (a RET to another
  // caller, a JMP through a register): a direct-mapped memo of Jit::next_body's finds. It names live blocks
  // only, as links do (a dropped block's entry is cleared at once); JIT code checks the key and enters as
  // through a link.
  struct JumpEntry {
    uint64_t rip = uint64_t{1} << 63;  // empty: never a 64-bit RIP (not canonical)
    interp::Block* block = nullptr;
    uint64_t unused[2] = {};  // (32 bytes: JIT code indexes by shifting)
  };
  static constexpr size_t kJumpCacheSize = 4096;
  static size_t jump_index(uint64_t rip) { return (rip ^ (rip >> 12)) & (kJumpCacheSize - 1); }
  std::array<JumpEntry, kJumpCacheSize> jump_cache_{};
  bool block_stepping_ = false;
  uint64_t dirty_generation_ = 0;  // GuestMemory::dirty_generation() the fast write tags were made for
  uint8_t jit_trap_ = 0;
  GuestException jit_fault_{};
  std::unique_ptr<interp::JitBuffer> jit_;  // host code of the JIT mode, created on first use
  bool block_step_done_ = false;  // block stepping: a block ran, report it (after a HLT's own exit)
  FastStats fast_stats_;
  // x86-TSO (enable_store_buffer): the buffer, and whether the instruction being executed orders memory
  // (interp::orders_memory), so that its own stores go straight to memory.
  std::unique_ptr<interp::StoreBuffer> store_buffer_;
  bool store_through_ = false;
};

// The hardware features of core/cpu_model.h (by name) the software CPU implements. A model advertising any
// other is refused by make_interp_backend, so a guest never meets a feature CPUID promised but interp lacks.
std::span<const std::string_view> interp_features();

// Fails with kUnsupported, naming the feature, when `model` advertises one the software CPU lacks.
Result<std::unique_ptr<Backend>> make_interp_backend(GuestMemory& memory, const CpuModel& model);

}  // namespace deja
