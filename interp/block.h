// Translated blocks of the software CPU's fast path: pre-bound operations per guest basic block, and the bounded cache that holds them.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "interp/decoded_insn.h"

namespace deja {
class InterpBackend;
}

namespace deja::interp {

struct Op;
// Runs one operation; returns the next one to run, or nullptr when the block is over (its end, a
// control transfer, or an early exit the handler asked for).
using OpHandler = const Op* (*)(InterpBackend& cpu, const Op* op);

// What the JIT knows how to emit inline (docs/interp.md, "The fast path"); everything else is a call
// to `fn`. The threaded interpreter ignores it.
enum class OpForm : uint8_t {
  kCall,  // no inline template: call the handler
};

// One guest instruction, decoded once, with its handler bound.
struct Op {
  OpHandler fn = nullptr;
  OpHandler jit_fn = nullptr;  // the same handler as JIT code calls it (faults and exits kept, not thrown)
  uint64_t rip = 0;       // this instruction's RIP (CS-relative, as the guest sees it)
  uint64_t next_rip = 0;  // RIP of the instruction after it, masked to the code size
  uint64_t target = 0;    // direct control transfers: the target RIP, masked like next_rip
  uint16_t index = 0;     // position in its block: instructions before it retire if it faults
  uint8_t width = 0;      // operand width in bytes (op[0]), for the handlers
  uint8_t cond = 0;       // Jcc/SETcc/CMOVcc condition (low nibble of the opcode)
  bool target_ok = false; // `target` is valid: a direct transfer whose target needs no canonical check at run time
  bool self_counting = false;  // counts its own steps (a REP string instruction: one per iteration)
  OpForm form = OpForm::kCall;
  DecodedInsn insn;       // the whole decode, for handlers that need more and for the reference executor
};

// A value in a block's host code that depends on where the block is (its RIP and linear address) or on its Op and
// Block objects: rewritten when the code is copied for the same guest bytes at another address (another mapping of
// the same physical page: a shared library under ASLR in every process; BlockCache::find_same_code).
struct Reloc {
  enum Kind : uint8_t {
    kRip,      // a RIP or a linear address in the block's page(s): moves with the block
    kVpn,      // the block's linear page number
    kTlbDisp,  // the displacement of the block's page's software-TLB entry (indexed by its linear page)
    kOp,       // a pointer into the block's operations
    kBlock,    // a pointer into the Block
  };
  // The encoding, which a moved value must keep (the copy has the source's layout), and which the assembler would
  // pick for it (so that a copy is what compiling it gives).
  enum Form : uint8_t {
    kImm64,       // mov r64, imm64: a value beyond 32 bits
    kImm32Zero,   // mov r32, imm32 (zero-extended): up to 0xffffffff
    kImm32Sign,   // mov r64, imm32 (sign-extended): a negative int32
    kStoreImm32,  // mov m64, imm32 (sign-extended): any int32
    kDisp32,      // a ModRM disp32: beyond a disp8's range
  };
  uint32_t at = 0;  // the field's offset in the code
  Kind kind = kRip;
  Form form = kImm64;
};

// A guest basic block: instructions that run one after the other with no control transfer, decoded
// from one guest-physical page, ending at a control transfer, before an instruction the fast path
// leaves to the reference executor, at the page's end or at kMaxInstructions.
struct Block {
  static constexpr unsigned kMaxInstructions = 64;

  uint64_t rip = 0;     // first instruction (CS-relative)
  uint64_t linear = 0;  // its linear address
  uint64_t phys = 0;    // its guest-physical address
  uint32_t key = 0;     // the CPU mode the operations were bound for (InterpBackend::block_key())
  uint32_t bytes = 0;   // guest code bytes covered: [phys, phys + bytes), all in one page
  uint32_t count = 0;   // instructions; 0 = the first one is not on the fast path (run it with step())
  uint64_t source_hash = 0;  // of the guest bytes [phys, phys + bytes) it was translated from (DEJA_BLOCK_STATS)
  bool dead = false;    // invalidated (self-modifying code, a VMM write, a flush): never entered again
  std::vector<Op> ops;  // `count` instructions, then the block's end (a synthetic fall-through op if needed)

  // Chaining: the blocks that followed this one last time (0: branch taken / jump target; 1: fall
  // through), set through BlockCache::link. A dropped block is unlinked from every block linked to it
  // (`incoming`), so a link always names a live block.
  Block* link[2] = {nullptr, nullptr};
  std::vector<std::pair<Block*, uint8_t>> incoming;  // (block, slot) whose link names this one

  Block* next_in_bucket = nullptr;  // hash chain by physical address

  // The block compiled to host code (interp/jit.cpp), or nullptr: runs the operations, returns the one
  // that ended the block (a fault or exit is left in the backend's jit_trap_).
  using Code = const Op* (*)(InterpBackend* cpu);
  Code code = nullptr;
  const void* body = nullptr;  // the code after its prologue: where next_body's chains jump to
  // Where a linked block's exit jumps to (interp/jit.cpp, emit_chain_entries): [0] from a block of the
  // same page, [1] from another page, [2] and [3] the same after a counted branch.
  const void* chain_entry[4] = {};
  // A slot whose exit goes to a fixed RIP (a direct transfer, a fall-through) jumps straight to the linked
  // block's chain entry: `exit_jump` is where its jump's rel32 is (nullptr: the exit reads `link` instead,
  // as one to a varying RIP does), `exit_entry` which chain entry it takes, `exit_unlinked` where it goes
  // while nothing is linked. BlockCache::link writes the jump.
  uint8_t* exit_jump[2] = {nullptr, nullptr};
  const void* exit_unlinked[2] = {nullptr, nullptr};
  uint8_t exit_entry[2] = {0, 0};
  uint32_t code_bytes = 0;
  // Every address-dependent value in `code`; `relocatable` false when some could not be listed (the block is
  // then translated afresh at another address).
  std::vector<Reloc> relocs;
  bool relocatable = false;

  uint64_t end_linear() const { return linear + bytes; }
  uint64_t memory_bytes() const {
    return sizeof(Block) + ops.capacity() * sizeof(Op) + relocs.capacity() * sizeof(Reloc) + code_bytes;
  }
};

// Why blocks are translated again (DEJA_BLOCK_STATS=1, printed by --stats): every block dropped is remembered with
// its cause, so that each translation can be classified. Diagnostic only: nothing is recorded without it.
class TranslationHistory {
 public:
  enum Cause : uint8_t { kStore, kPage, kFlush, kEvict, kCauses };
  // Each translation, classified against what was translated and dropped before.
  enum Kind : uint8_t {
    kNew,             // bytes never translated at this RIP and mode before
    kAgainSameBytes,  // (phys, RIP, mode) dropped before, the same bytes now: [cause] says why it went
    kAgainNewBytes,   // (phys, RIP, mode) dropped before, other bytes now (code really rewritten)
    kOtherRip,        // the same bytes at the same physical address, another RIP (another mapping: ASLR)
    kOtherPhys,       // the same bytes and RIP at another physical address (a copy of the code)
    kOtherBoth,       // the same bytes and mode elsewhere (another address and RIP)
    kKinds
  };
  void translated(const Block& block);
  void dropped(const Block& block, Cause cause);
  std::vector<std::string> report() const;

 private:
  struct Key {
    uint64_t a, b, c;
    bool operator==(const Key&) const = default;
  };
  struct KeyHash {
    size_t operator()(const Key& k) const { return (k.a * 0x9e3779b97f4a7c15ull) ^ (k.b * 0xc2b2ae3d27d4eb4full) ^ k.c; }
  };
  struct Dropped {
    uint64_t hash;
    Cause cause;
  };
  std::unordered_map<Key, Dropped, KeyHash> dropped_;  // (phys, RIP, key): the last drop
  std::unordered_map<Key, uint8_t, KeyHash> by_phys_;  // (hash, phys, key) seen
  std::unordered_map<Key, uint8_t, KeyHash> by_rip_;   // (hash, RIP, key) seen
  std::unordered_map<Key, uint8_t, KeyHash> by_bytes_; // (hash, key) seen
  uint64_t kinds_[kKinds] = {};
  uint64_t again_by_cause_[kCauses] = {};
  uint64_t drops_[kCauses] = {};
};

// All translated blocks, by guest-physical address: past `capacity_bytes` everything is dropped and translation
// starts again, as QEMU flushes its translation buffer. Dropped blocks go to a graveyard freed only at safe points
// (release_retired), because the block being executed may be the one a store invalidates.
class BlockCache {
 public:
  static constexpr uint64_t kDefaultCapacityBytes = uint64_t{64} << 20;
  // The bound a machine's cache gets (host code included): as large as its RAM, from 256 to 512 MiB. A Linux boot
  // keeps ~95 MB of blocks; eight rounds of the glibc workload (a process per command, 512 MiB of RAM) flush 512 MiB
  // once, where 256 MiB flushed three times in two; a small guest stays within deja's memory promise (RAM + 512 MiB).
  static uint64_t capacity_for(uint64_t ram_bytes) {
    return std::clamp(ram_bytes, uint64_t{256} << 20, uint64_t{512} << 20);
  }

  explicit BlockCache(uint64_t ram_bytes, uint64_t capacity_bytes = kDefaultCapacityBytes);
  ~BlockCache();

  Block* find(uint64_t phys, uint64_t rip, uint32_t key) {
    // A direct-mapped cache by RIP in front of the hash table: most lookups are a return or a call to
    // code that ran before.
    Block*& hot = recent_[recent_slot(phys, rip)];
    if (hot && hot->phys == phys && hot->rip == rip && hot->key == key) return hot;
    for (Block* b = buckets_[bucket(phys)]; b; b = b->next_in_bucket) {
      if (b->phys == phys && b->rip == rip && b->key == key) {
        hot = b;
        return b;
      }
    }
    return nullptr;
  }
  // A live block of 64-bit code translated from the same guest-physical bytes for the same mode, at another RIP:
  // its operations and code can be copied rather than translated again (nullptr: none).
  // The newest is first (insert() puts blocks at the head of their bucket).
  const Block* find_same_code(uint64_t phys, uint32_t key) const {
    for (const Block* b = buckets_[bucket(phys)]; b; b = b->next_in_bucket)
      if (b->phys == phys && b->key == key && b->count > 0) return b;
    return nullptr;
  }
  // Copies of one code at other RIPs kept at once: the processes alive that map it (a pipeline's). Older ones
  // belong to processes that have most likely exited, whose mappings will not come back.
  static constexpr unsigned kMaxSameCode = 4;
  // When kMaxSameCode blocks of these bytes and mode are cached, the oldest of them, else nullptr.
  Block* same_code_to_evict(uint64_t phys, uint32_t key) const {
    unsigned count = 0;
    Block* oldest = nullptr;
    for (Block* b = buckets_[bucket(phys)]; b; b = b->next_in_bucket) {
      if (b->phys == phys && b->key == key && b->count > 0) {
        ++count;
        oldest = b;
      }
    }
    return count >= kMaxSameCode ? oldest : nullptr;
  }
  // Drops one block (as invalidation would).
  void evict(Block* block);
  // Takes ownership; returns the block. May flush everything first when the cache is full.
  Block* insert(std::unique_ptr<Block> block);

  bool has_code(uint64_t pfn) const { return pfn < has_code_.size() && has_code_[pfn]; }
  // Drops the blocks that overlap guest-physical [gpa, gpa + size) (one page). Returns true when any was dropped.
  bool invalidate_range(uint64_t gpa, uint64_t size);
  // Drops every block of page `pfn`.
  bool invalidate_page(uint64_t pfn);
  void clear();
  // DEJA_BLOCK_STATS: why blocks are translated (nullptr when off).
  TranslationHistory* history() { return history_.get(); }
  const TranslationHistory* history() const { return history_.get(); }
  // Makes `to` the block linked in `slot` of `from` (nullptr: none). A dropped block links nowhere (the
  // runner's lookup after a block can drop it: a page walk's accessed bit stored into its page), and
  // nothing links to one: its memory goes at the next release_retired().
  void link(Block& from, int slot, Block* to) {
    if (from.dead || (to && to->dead)) return;
    Block* old = from.link[slot];
    if (old == to) return;
    if (old) forget_incoming(*old, &from, slot);
    set_link(from, slot, to);
    if (to) to->incoming.emplace_back(&from, uint8_t(slot));
  }
  // Points the direct exit of `slot` at its unlinked path (a block's code copied from another's).
  static void unlink_exit(Block& block, int slot) { set_link(block, slot, nullptr); }
  // Called with every block dropped, before anything can run again (the JIT's jump cache forgets it).
  void set_drop_listener(std::function<void(const Block&)> listener) { on_drop_ = std::move(listener); }
  // Frees dropped blocks; only between blocks, when none is being executed.
  void release_retired() {
    if (!graveyard_.empty()) graveyard_.clear();
  }

  uint64_t bytes() const { return bytes_; }
  uint64_t flushes() const { return flushes_; }
  uint64_t invalidations() const { return invalidations_; }
  uint64_t translations() const { return translations_; }

 private:
  static constexpr unsigned kBucketBits = 16;
  static constexpr size_t kRecent = 4096;  // (recent_slot() takes the top 12 bits of a hash)
  static size_t bucket(uint64_t phys) { return (phys * 0x9e3779b97f4a7c15ull) >> (64 - kBucketBits); }
  static size_t recent_slot(uint64_t phys, uint64_t rip) {
    // (Mixing the physical address in would cancel the page offset, which RIP and it share.)
    (void)phys;
    return (rip * 0x9e3779b97f4a7c15ull) >> (64 - 12);
  }
  void drop(Block* block);
  static void set_link(Block& from, int slot, Block* to) {
    from.link[slot] = to;
    if (uint8_t* rel32 = from.exit_jump[slot]) {
      const auto target = reinterpret_cast<intptr_t>(to ? to->chain_entry[from.exit_entry[slot]] : from.exit_unlinked[slot]);
      const auto displacement = int32_t(target - reinterpret_cast<intptr_t>(rel32 + 4));
      std::memcpy(rel32, &displacement, 4);
    }
  }
  static void forget_incoming(Block& to, const Block* from, int slot) {
    auto& in = to.incoming;
    for (size_t i = 0; i < in.size(); ++i) {
      if (in[i].first == from && in[i].second == slot) {
        in[i] = in.back();
        in.pop_back();
        return;
      }
    }
  }

  std::vector<Block*> buckets_;
  std::vector<Block*> recent_ = std::vector<Block*>(kRecent, nullptr);  // never holds a dropped block
  std::vector<uint8_t> has_code_;  // per guest page: it holds blocks (checked on every slow-path store)
  std::unordered_map<uint64_t, std::vector<std::unique_ptr<Block>>> page_blocks_;  // the owners, by page
  std::vector<std::unique_ptr<Block>> graveyard_;
  std::function<void(const Block&)> on_drop_;
  std::unique_ptr<TranslationHistory> history_;
  uint64_t capacity_;
  uint64_t bytes_ = 0;
  uint64_t flushes_ = 0;
  uint64_t invalidations_ = 0;
  uint64_t translations_ = 0;
};

}  // namespace deja::interp
