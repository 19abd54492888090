// The software CPU's fast path: block lookup and translation, the threaded block runner with exact stops, and the operation handlers.
#include <Zydis/Zydis.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "interp/interp_backend.h"

namespace deja {

using interp::Block;
using interp::DecodedInsn;
using interp::Op;
using interp::OpKind;

std::string_view interp_mode_name(InterpMode mode) {
  switch (mode) {
    case InterpMode::kReference: return "reference";
    case InterpMode::kThreaded: return "threaded";
    case InterpMode::kJit: return "jit";
  }
  return "?";
}

std::optional<InterpMode> parse_interp_mode(std::string_view name) {
  for (InterpMode mode : {InterpMode::kReference, InterpMode::kThreaded, InterpMode::kJit})
    if (name == interp_mode_name(mode)) return mode;
  return std::nullopt;
}

InterpMode default_interp_mode() {
  if (const char* env = std::getenv("DEJA_INTERP_MODE")) {
    if (auto mode = parse_interp_mode(env)) return *mode;
  }
  return InterpMode::kJit;
}

void InterpBackend::set_mode(InterpMode mode) {
  // Blocks are translated for one mode (with host code or without): a switch starts afresh.
  if (mode != mode_) blocks_.clear();
  mode_ = mode;
}

InterpBackend::FastStats InterpBackend::fast_stats() const {
  FastStats stats = fast_stats_;
  stats.blocks_translated = blocks_.translations();
  stats.block_invalidations = blocks_.invalidations();
  stats.block_cache_flushes = blocks_.flushes();
  stats.block_cache_bytes = blocks_.bytes();
  return stats;
}

namespace {

// How an instruction takes part in the fast path.
enum class Role : uint8_t {
  kFallback,  // run alone by step() (the reference executor): ends the block before it
  kInBlock,   // runs inside a block and falls through to the next instruction
  kTransfer,  // a near control transfer that runs inside a block and ends it
};

bool has_operand(const DecodedInsn& insn, OpKind kind) {
  for (int i = 0; i < insn.operand_count; ++i)
    if (insn.op[i].kind == kind) return true;
  return false;
}

bool is_string(const DecodedInsn& insn) {
  switch (ZydisMnemonic(insn.mnemonic)) {
    case ZYDIS_MNEMONIC_MOVSB: case ZYDIS_MNEMONIC_MOVSW: case ZYDIS_MNEMONIC_MOVSQ:
    case ZYDIS_MNEMONIC_STOSB: case ZYDIS_MNEMONIC_STOSW: case ZYDIS_MNEMONIC_STOSD: case ZYDIS_MNEMONIC_STOSQ:
    case ZYDIS_MNEMONIC_LODSB: case ZYDIS_MNEMONIC_LODSW: case ZYDIS_MNEMONIC_LODSD: case ZYDIS_MNEMONIC_LODSQ:
    case ZYDIS_MNEMONIC_CMPSB: case ZYDIS_MNEMONIC_CMPSW: case ZYDIS_MNEMONIC_CMPSQ:
    case ZYDIS_MNEMONIC_SCASB: case ZYDIS_MNEMONIC_SCASW: case ZYDIS_MNEMONIC_SCASD: case ZYDIS_MNEMONIC_SCASQ:
      return true;
    case ZYDIS_MNEMONIC_MOVSD:
    case ZYDIS_MNEMONIC_CMPSD:
      return insn.opcode_map == ZYDIS_OPCODE_MAP_DEFAULT;
    default:
      return false;
  }
}

Role string_role(const DecodedInsn& insn, bool rep) {
  if (!rep) return Role::kInBlock;
  return insn.addrsize == 16 ? Role::kFallback : Role::kTransfer;
}

// Instructions whose whole effect is on general registers, arithmetic flags, DF, XMM/MXCSR and memory
// (and CLI): nothing the run loop looks at between instructions (IF becoming 1, TF, shadows, mode, CPL,
// segments, exits other than MMIO) can change, so they may run back to back. A few more end their block
// and the run (STI, POPF, IRET, INVLPG; RDTSC, IN, OUT, which may exit). Everything else is left to
// step().
Role role_of(const DecodedInsn& insn) {
  if (!insn.valid) return Role::kFallback;
  // Every VEX instruction (AVX, AVX2, FMA, F16C, BMI1/2, VZEROUPPER, VLDMXCSR) works on registers, MXCSR, flags
  // and memory only.
  if (insn.flags & interp::insn_flags::kVex) return Role::kInBlock;
  const bool rep = insn.flags & (interp::insn_flags::kRep | interp::insn_flags::kRepne);
  switch (ZydisMnemonic(insn.mnemonic)) {
    case ZYDIS_MNEMONIC_MOV:
      // Reading a segment register's selector (a kernel saves them at every context switch) has no effect
      // beyond its destination; loading one, and control and debug registers, change the CPU's mode.
      if (insn.op[0].kind == OpKind::kSeg || has_operand(insn, OpKind::kCr) || has_operand(insn, OpKind::kDr))
        return Role::kFallback;
      return Role::kInBlock;
    case ZYDIS_MNEMONIC_PUSH:
      return Role::kInBlock;
    case ZYDIS_MNEMONIC_POP:
      return has_operand(insn, OpKind::kSeg) ? Role::kFallback : Role::kInBlock;
    case ZYDIS_MNEMONIC_MOVZX: case ZYDIS_MNEMONIC_MOVSX: case ZYDIS_MNEMONIC_MOVSXD: case ZYDIS_MNEMONIC_MOVNTI:
    case ZYDIS_MNEMONIC_LEA: case ZYDIS_MNEMONIC_XCHG: case ZYDIS_MNEMONIC_BSWAP: case ZYDIS_MNEMONIC_MOVBE:
    case ZYDIS_MNEMONIC_CMOVB: case ZYDIS_MNEMONIC_CMOVBE: case ZYDIS_MNEMONIC_CMOVL: case ZYDIS_MNEMONIC_CMOVLE:
    case ZYDIS_MNEMONIC_CMOVNB: case ZYDIS_MNEMONIC_CMOVNBE: case ZYDIS_MNEMONIC_CMOVNL: case ZYDIS_MNEMONIC_CMOVNLE:
    case ZYDIS_MNEMONIC_CMOVNO: case ZYDIS_MNEMONIC_CMOVNP: case ZYDIS_MNEMONIC_CMOVNS: case ZYDIS_MNEMONIC_CMOVNZ:
    case ZYDIS_MNEMONIC_CMOVO: case ZYDIS_MNEMONIC_CMOVP: case ZYDIS_MNEMONIC_CMOVS: case ZYDIS_MNEMONIC_CMOVZ:
    case ZYDIS_MNEMONIC_SETB: case ZYDIS_MNEMONIC_SETBE: case ZYDIS_MNEMONIC_SETL: case ZYDIS_MNEMONIC_SETLE:
    case ZYDIS_MNEMONIC_SETNB: case ZYDIS_MNEMONIC_SETNBE: case ZYDIS_MNEMONIC_SETNL: case ZYDIS_MNEMONIC_SETNLE:
    case ZYDIS_MNEMONIC_SETNO: case ZYDIS_MNEMONIC_SETNP: case ZYDIS_MNEMONIC_SETNS: case ZYDIS_MNEMONIC_SETNZ:
    case ZYDIS_MNEMONIC_SETO: case ZYDIS_MNEMONIC_SETP: case ZYDIS_MNEMONIC_SETS: case ZYDIS_MNEMONIC_SETZ:
    case ZYDIS_MNEMONIC_CBW: case ZYDIS_MNEMONIC_CWDE: case ZYDIS_MNEMONIC_CDQE: case ZYDIS_MNEMONIC_CWD:
    case ZYDIS_MNEMONIC_CDQ: case ZYDIS_MNEMONIC_CQO: case ZYDIS_MNEMONIC_LAHF: case ZYDIS_MNEMONIC_SAHF:
    case ZYDIS_MNEMONIC_XLAT:
    case ZYDIS_MNEMONIC_PUSHF: case ZYDIS_MNEMONIC_PUSHFD: case ZYDIS_MNEMONIC_PUSHFQ:
    case ZYDIS_MNEMONIC_ENTER: case ZYDIS_MNEMONIC_LEAVE:
    case ZYDIS_MNEMONIC_ADD: case ZYDIS_MNEMONIC_OR: case ZYDIS_MNEMONIC_ADC: case ZYDIS_MNEMONIC_SBB:
    case ZYDIS_MNEMONIC_AND: case ZYDIS_MNEMONIC_SUB: case ZYDIS_MNEMONIC_XOR: case ZYDIS_MNEMONIC_CMP:
    case ZYDIS_MNEMONIC_TEST: case ZYDIS_MNEMONIC_INC: case ZYDIS_MNEMONIC_DEC: case ZYDIS_MNEMONIC_NEG:
    case ZYDIS_MNEMONIC_NOT: case ZYDIS_MNEMONIC_ROL: case ZYDIS_MNEMONIC_ROR: case ZYDIS_MNEMONIC_RCL:
    case ZYDIS_MNEMONIC_RCR: case ZYDIS_MNEMONIC_SHL: case ZYDIS_MNEMONIC_SHR: case ZYDIS_MNEMONIC_SAR:
    case ZYDIS_MNEMONIC_SHLD: case ZYDIS_MNEMONIC_SHRD: case ZYDIS_MNEMONIC_BT: case ZYDIS_MNEMONIC_BTS:
    case ZYDIS_MNEMONIC_BTR: case ZYDIS_MNEMONIC_BTC: case ZYDIS_MNEMONIC_BSF: case ZYDIS_MNEMONIC_BSR:
    case ZYDIS_MNEMONIC_TZCNT: case ZYDIS_MNEMONIC_LZCNT: case ZYDIS_MNEMONIC_POPCNT:
    case ZYDIS_MNEMONIC_MUL: case ZYDIS_MNEMONIC_IMUL: case ZYDIS_MNEMONIC_DIV: case ZYDIS_MNEMONIC_IDIV:
    case ZYDIS_MNEMONIC_XADD: case ZYDIS_MNEMONIC_CMPXCHG: case ZYDIS_MNEMONIC_CMPXCHG8B:
    case ZYDIS_MNEMONIC_CMPXCHG16B:
    case ZYDIS_MNEMONIC_CLC: case ZYDIS_MNEMONIC_STC: case ZYDIS_MNEMONIC_CMC: case ZYDIS_MNEMONIC_CLD:
    case ZYDIS_MNEMONIC_STD:
    case ZYDIS_MNEMONIC_NOP: case ZYDIS_MNEMONIC_PAUSE: case ZYDIS_MNEMONIC_LFENCE: case ZYDIS_MNEMONIC_MFENCE:
    case ZYDIS_MNEMONIC_SFENCE: case ZYDIS_MNEMONIC_PREFETCHT0: case ZYDIS_MNEMONIC_PREFETCHT1:
    case ZYDIS_MNEMONIC_PREFETCHT2: case ZYDIS_MNEMONIC_PREFETCHNTA: case ZYDIS_MNEMONIC_PREFETCHW:
    case ZYDIS_MNEMONIC_ENDBR32: case ZYDIS_MNEMONIC_ENDBR64: case ZYDIS_MNEMONIC_CLFLUSH:
      return Role::kInBlock;
    // CLI only clears IF: nothing becomes deliverable, and no run-loop stop depends on it (the next
    // stop that could, an open interrupt window, needs an STI, POPF or IRET, which end the run).
    case ZYDIS_MNEMONIC_CLI:
      return Role::kInBlock;
    // After these the run loop must look at the CPU before the next instruction: IF may be 1 now (and
    // STI's shadow on), TF set, CPL and mode changed (IRET), a translation gone (INVLPG). They end their
    // block and the run of blocks (bind_op: reference_ends_run), which is what step() costs without the
    // round trip through the runner. A Linux boot runs 350,000 of them.
    case ZYDIS_MNEMONIC_STI: case ZYDIS_MNEMONIC_POPF: case ZYDIS_MNEMONIC_POPFD: case ZYDIS_MNEMONIC_POPFQ:
    case ZYDIS_MNEMONIC_IRET: case ZYDIS_MNEMONIC_IRETD: case ZYDIS_MNEMONIC_IRETQ: case ZYDIS_MNEMONIC_INVLPG:
      return Role::kTransfer;
    // The commonest exits (defer_exit): the block ends at them, and when the instruction exits the run
    // returns with it unretired (bind_op: reference_may_exit), as step() would; step() runs it again with
    // the VMM's answer. A Linux boot makes 200,000 of them.
    case ZYDIS_MNEMONIC_RDTSC: case ZYDIS_MNEMONIC_RDTSCP: case ZYDIS_MNEMONIC_IN: case ZYDIS_MNEMONIC_OUT:
      return Role::kTransfer;
    // String instructions: a REP form ends its block (its handler runs the iterations, each a step of
    // its own); with a 16-bit address size they stay with step().
    case ZYDIS_MNEMONIC_MOVSB: case ZYDIS_MNEMONIC_MOVSW: case ZYDIS_MNEMONIC_MOVSQ:
    case ZYDIS_MNEMONIC_STOSB: case ZYDIS_MNEMONIC_STOSW: case ZYDIS_MNEMONIC_STOSD: case ZYDIS_MNEMONIC_STOSQ:
    case ZYDIS_MNEMONIC_LODSB: case ZYDIS_MNEMONIC_LODSW: case ZYDIS_MNEMONIC_LODSD: case ZYDIS_MNEMONIC_LODSQ:
    case ZYDIS_MNEMONIC_CMPSB: case ZYDIS_MNEMONIC_CMPSW: case ZYDIS_MNEMONIC_CMPSQ:
    case ZYDIS_MNEMONIC_SCASB: case ZYDIS_MNEMONIC_SCASW: case ZYDIS_MNEMONIC_SCASD: case ZYDIS_MNEMONIC_SCASQ:
      return string_role(insn, rep);
    case ZYDIS_MNEMONIC_MOVSD:
    case ZYDIS_MNEMONIC_CMPSD:
      if (insn.opcode_map == ZYDIS_OPCODE_MAP_DEFAULT) return string_role(insn, rep);
      return Role::kInBlock;  // the SSE2 forms
    case ZYDIS_MNEMONIC_JO: case ZYDIS_MNEMONIC_JNO: case ZYDIS_MNEMONIC_JB: case ZYDIS_MNEMONIC_JNB:
    case ZYDIS_MNEMONIC_JZ: case ZYDIS_MNEMONIC_JNZ: case ZYDIS_MNEMONIC_JBE: case ZYDIS_MNEMONIC_JNBE:
    case ZYDIS_MNEMONIC_JS: case ZYDIS_MNEMONIC_JNS: case ZYDIS_MNEMONIC_JP: case ZYDIS_MNEMONIC_JNP:
    case ZYDIS_MNEMONIC_JL: case ZYDIS_MNEMONIC_JNL: case ZYDIS_MNEMONIC_JLE: case ZYDIS_MNEMONIC_JNLE:
    case ZYDIS_MNEMONIC_JCXZ: case ZYDIS_MNEMONIC_JECXZ: case ZYDIS_MNEMONIC_JRCXZ:
    case ZYDIS_MNEMONIC_LOOP: case ZYDIS_MNEMONIC_LOOPE: case ZYDIS_MNEMONIC_LOOPNE:
      return Role::kTransfer;
    case ZYDIS_MNEMONIC_JMP:
    case ZYDIS_MNEMONIC_CALL: {
      const interp::Operand& target = insn.op[0];
      const bool far = target.kind == OpKind::kPtr || (target.kind == OpKind::kMem && target.size == insn.opsize / 8 + 2);
      return far ? Role::kFallback : Role::kTransfer;
    }
    case ZYDIS_MNEMONIC_RET:
      return (insn.opcode == 0xc2 || insn.opcode == 0xc3) ? Role::kTransfer : Role::kFallback;
    case ZYDIS_MNEMONIC_LDMXCSR: case ZYDIS_MNEMONIC_STMXCSR:
      return Role::kInBlock;
    // MMX (its transition changes x87 state only), SSE4.2's CRC32: registers and memory only.
    case ZYDIS_MNEMONIC_EMMS: case ZYDIS_MNEMONIC_CRC32:
      return Role::kInBlock;
    default:
      // SSE data instructions (an XMM operand) and MMX ones: registers, MXCSR, the x87 registers and memory only.
      return has_operand(insn, OpKind::kXmm) || has_operand(insn, OpKind::kMmx) ? Role::kInBlock : Role::kFallback;
  }
}

}  // namespace

// ---- translation ----------------------------------------------------------------------------------

uint32_t InterpBackend::block_key() const {
  // Everything the operations of a block were bound for: the decode mode, the privilege (software TLB
  // permissions), paging on or off, the stack's address size, long mode.
  return uint32_t(decode_mode()) | (cpl() << 2) | ((s_.cr0 & cr0::kPg) ? kKeyPaging : 0) | (s_.ss.db ? 1u << 5 : 0) |
         (long_mode() ? 1u << 6 : 0);
}

interp::Block* InterpBackend::lookup_block() {
  const uint8_t mode = decode_mode();
  const uint64_t linear = mode == interp::kMode64 ? s_.rip : ((s_.cs.base + s_.rip) & 0xffffffffu);
  uint64_t phys = 0;
  const uint64_t cr2 = s_.cr2;
  try {
    if (mode == interp::kMode64) canonical_check(linear, false);
    phys = translate(linear, Access::kExec, is_user());
  } catch (const GuestException&) {
    // step() raises the fault, exactly as the reference does; until then the failed walk leaves no
    // trace (it wrote nothing but CR2).
    s_.cr2 = cr2;
    return nullptr;
  }
  if (phys >= ram_size_) return nullptr;
  const uint32_t key = block_key();
  if (Block* block = blocks_.find(phys, s_.rip, key)) return block;
  // The same bytes at another RIP: a shared library mapped elsewhere in another process (ASLR), which would
  // otherwise be translated again in every process.
  if ((key & kKeyPaging) && (key & 3) == interp::kMode64) {
    if (const Block* same = blocks_.find_same_code(phys, key)) {
      if (Block* block = clone_block(*same, s_.rip)) return block;
    }
  }
  return translate_block(s_.rip, linear, phys, key);
}

interp::Block* InterpBackend::clone_block(const Block& from, uint64_t rip) {
  // 64-bit code: RIP is the linear address, and the two differ by whole pages (the same physical offset).
  const uint64_t delta = rip - from.rip;
  auto block = std::make_unique<Block>();
  block->rip = rip;
  block->linear = from.linear + delta;
  block->phys = from.phys;
  block->key = from.key;
  block->bytes = from.bytes;
  block->count = from.count;
  block->source_hash = from.source_hash;
  block->ops = from.ops;
  for (Op& op : block->ops) {
    op.rip += delta;
    op.next_rip += delta;
    if (op.target_ok || op.target != 0) {
      op.target += delta;
      // (A target that stops or starts being canonical changes what the code checks: translated afresh.)
      if (op.target_ok != is_canonical(op.target)) return nullptr;
    }
  }
  // The oldest copy goes (it is not `from`, the newest), and its host code's room takes the new one: copies of
  // one code have the same size. (No block runs here, and no link or jump-cache entry names a dropped one.)
  void* room = nullptr;
  if (Block* old = blocks_.same_code_to_evict(from.phys, from.key)) {
    if (old->code_bytes == from.code_bytes) room = reinterpret_cast<void*>(old->code);
    blocks_.evict(old);
  }
  if (mode_ == InterpMode::kJit && !relocate_code(*block, from, room)) return nullptr;
  if (interp::TranslationHistory* history = blocks_.history()) history->translated(*block);
  ++fast_stats_.blocks_relocated;
  return insert_block(std::move(block));
}

interp::Block* InterpBackend::insert_block(std::unique_ptr<Block> block) {
  // A page that held no decoded code may have fast write tags (a store into it since its last blocks
  // were dropped earned them): they go now, so that every store into the page checks for this block.
  const uint64_t pfn = block->phys >> 12;
  const bool was_code = is_code_page(pfn);
  Block* inserted = blocks_.insert(std::move(block));
  if (!was_code) code_appeared(pfn);
  return inserted;
}

interp::Block* InterpBackend::translate_block(uint64_t rip, uint64_t linear, uint64_t phys, uint32_t key) {
  const uint8_t mode = decode_mode();
  const uint64_t rip_mask = mode == interp::kMode64 ? ~0ull : mode == interp::kMode32 ? 0xffffffffull : 0xffffull;
  auto block = std::make_unique<Block>();
  block->rip = rip;
  block->linear = linear;
  block->phys = phys;
  block->key = key;
  const uint64_t page = phys & ~0xfffull;
  uint64_t offset = phys & 0xfff;
  uint64_t at = rip;
  bool transfer = false;
  uint32_t first_length = 0;
  std::vector<Op>& ops = op_scratch_;  // built here, then copied into the block at its size
  ops.clear();
  while (block->count < Block::kMaxInstructions && offset < 4096) {
    const uint64_t available = std::min<uint64_t>({15, 4096 - offset, ram_size_ - (page + offset)});
    DecodedInsn insn;
    if (!interp::decode_bytes(ram_ + page + offset, available, mode, insn)) {
      if (block->count == 0) first_length = uint32_t(4096 - offset);  // crosses the page: step() fetches it
      break;
    }
    if (block->count == 0) first_length = insn.length;
    // A PAUSE that may exit (set_pause_exits) and a locked instruction that exits (set_lock_exits) stay with step(),
    // which reports them.
    const Role role = (pause_in_step_ && insn.mnemonic == ZYDIS_MNEMONIC_PAUSE) || (lock_exits_ && interp::is_locked(insn))
                          ? Role::kFallback
                          : role_of(insn);
    if (role == Role::kFallback) break;
    const uint64_t next = (at + insn.length) & rip_mask;
    if (next < at && mode != interp::kMode64) break;  // IP wraps: the next instruction is not the next byte
    Op op;
    op.rip = at;
    op.next_rip = next;
    op.index = uint16_t(block->count);
    op.width = insn.op[0].size;
    op.cond = insn.opcode & 0xf;
    op.insn = insn;
    if (role == Role::kTransfer && insn.op[0].kind == OpKind::kImm) {
      // A direct target, as the reference computes it (jump_target, then set_rip's checks).
      uint64_t target = next + uint64_t(insn.op[0].disp);
      if (insn.opsize == 16) target &= 0xffff;
      else if (insn.opsize == 32) target &= 0xffffffffu;
      op.target = target;
      op.target_ok = mode != interp::kMode64 || is_canonical(target);
    }
    bind_op(op, role == Role::kTransfer);
    // A REP string instruction must count its iterations; one without a handler for that is left to step().
    if (role == Role::kTransfer && (insn.flags & (interp::insn_flags::kRep | interp::insn_flags::kRepne)) &&
        !op.self_counting && is_string(insn))
      break;
    ops.push_back(op);
    ++block->count;
    offset += insn.length;
    at = next;
    if (role == Role::kTransfer) {
      transfer = true;
      break;
    }
  }
  if (block->count == 0) {
    block->bytes = std::max<uint32_t>(first_length, 1);
  } else {
    block->bytes = uint32_t(offset - (phys & 0xfff));
    if (!transfer) {
      Op end;
      bind_block_end(end);
      end.rip = at;
      end.next_rip = at;
      end.index = uint16_t(block->count);
      ops.push_back(end);
    }
  }
  block->ops.assign(ops.begin(), ops.end());  // (one allocation of the exact size)
  if (interp::TranslationHistory* history = blocks_.history()) {
    uint64_t hash = 0xcbf29ce484222325ull;
    for (uint64_t i = 0; i < block->bytes && phys + i < ram_size_; ++i) hash = (hash ^ ram_[phys + i]) * 0x100000001b3ull;
    block->source_hash = hash;
    history->translated(*block);
  }
  if (mode_ == InterpMode::kJit && block->count > 0) compile_block(*block);  // (without code: handlers)
  return insert_block(std::move(block));
}

bool InterpBackend::breakpoint_in(uint64_t begin, uint64_t end) const {
  if (debug_.breakpoint && *debug_.breakpoint >= begin && *debug_.breakpoint < end) return true;
  for (uint64_t address : debug_.breakpoints)
    if (address >= begin && address < end) return true;
  return false;
}

uint64_t InterpBackend::step_limit() const {
  uint64_t limit = ~0ull;
  if (budget_ != 0) limit = budget_start_ + budget_;
  if (debug_.stop_at_step) {
    const uint64_t at = *debug_.stop_at_step;
    limit = std::min(limit, at > faulted_ ? at - faulted_ : 0);
  }
  return limit;
}

// ---- the block runner -----------------------------------------------------------------------------

void InterpBackend::run_fast() {
  blocks_.release_retired();
  Block* block = lookup_block();
  const uint64_t limit = step_limit();
  const bool breakpoints = debug_.breakpoint || !debug_.breakpoints.empty();
  // The first block: its start was checked by the run loop (a breakpoint there already stopped it).
  if (!block || block->count == 0 || steps_ + block->count > limit ||
      (breakpoints && breakpoint_in(block->linear + 1, block->end_linear()))) {
    ++fast_stats_.fallback_steps;
    step();
    return;
  }
  const uint64_t branch_limit = overflow_at_.value_or(~0ull);
  fast_step_limit_ = limit;
  branch_limit_ = branch_limit;
  chain_ok_ = !breakpoints && !block_stepping_;
  watch_hit_.reset();
  // Flags stay lazy from block to block; whatever leaves here (a return, a fault, an exit) sees RFLAGS.
  struct FlagsOnExit {
    InterpBackend& cpu;
    ~FlagsOnExit() { cpu.materialize_flags(); }
  } flags_on_exit{*this};
  for (;;) {
    // Between blocks nothing dropped is referenced any more (`block` itself is live: just looked up, or
    // linked, and links name live blocks only), so the graveyard goes here too: a long chain must not pile
    // it up.
    blocks_.release_retired();
    ++fast_stats_.blocks_entered;
    running_block_ = block;
    end_block_after_op_ = false;
    try {
      running_op_ = run_block(*block);
      block = running_block_;  // JIT code may have gone on to linked blocks
    } catch (const GuestException& fault) {
      // The faulting instruction did not retire; those before it did.
      running_block_ = nullptr;
      steps_ += running_op_->index;
      s_.rip = running_op_->rip;
      insn_rip_ = running_op_->rip;
      materialize_flags();
      take_fault(fault);
      return;
    } catch (const ExitRequest&) {
      // The instruction stops for the VMM and runs again (through step()) when it has answered.
      running_block_ = nullptr;
      steps_ += running_op_->index;
      s_.rip = running_op_->rip;
      throw;
    }
    running_block_ = nullptr;
    // The handler that returned nullptr has set RIP; the block retired up to and including it (the
    // synthetic end is not an instruction), or up to it when it stops for an exit (exit_pending_).
    steps_ += running_op_->index +
              (running_op_->index < block->count && !running_op_->self_counting && !exit_pending_ ? 1 : 0);
    // Whatever would stop the run loop before the next instruction stops here, before that
    // instruction's fetch (a translation can set accessed bits): the reference would not have fetched it.
    if (end_block_after_op_ || watch_hit_ || branches_ >= branch_limit || steps_ >= limit || block_stepping_ ||
        kicked_.load(std::memory_order_relaxed) || (breakpoints && breakpoint_in(current_linear_rip(), current_linear_rip() + 1)))
      return;
    // The next block: chained when it followed this one before, else looked up.
    const int slot = s_.rip == running_op_->next_rip ? 1 : 0;
    Block* next = block->link[slot];
    if (next && next->rip == s_.rip && link_current(*block, *next)) {
      ++fast_stats_.chained;
    } else {
      next = lookup_block();
      // Links within one linear page, or into another one checked at each use (linkable, link_current).
      // Only blocks that run as blocks are linked (JIT code jumps into a linked block's code).
      if (next && linkable(*block, *next) && next->count > 0 && (next->code != nullptr || block->code == nullptr)) {
        blocks_.link(*block, slot, next);
      }
    }
    if (!next || next->count == 0 || steps_ + next->count > limit ||
        (breakpoints && breakpoint_in(next->linear, next->end_linear())))
      return;
    block = next;
  }
}

}  // namespace deja
