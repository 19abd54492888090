// One vCPU's x86-TSO store buffer (`--tso`): a FIFO of stores not yet in memory, with forwarding and a seeded drain.
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <span>
#include <vector>

#include "core/backend.h"
#include "core/error.h"
#include "core/seeded_random.h"

namespace deja::interp {

struct DecodedInsn;

// A pure data structure: the backend (interp/memory.cpp) puts RAM stores in, overlays its own loads with
// forward(), and writes what pop() returns to memory. Everything that decides when a store leaves (the delay drawn
// for each store, the instructions retired, the capacity) is here and in save(), so recording, replay and a restored checkpoint drain at
// the same instructions without an event per drain.
class StoreBuffer {
 public:
  // Wider stores (FXSAVE, XSAVE) are written to memory after a full drain: in order all the same.
  static constexpr unsigned kMaxStoreBytes = 32;
  struct Entry {
    uint64_t gpa = 0;
    uint64_t due = 0;  // the retired-instruction count from which it may leave (once every older one has)
    uint8_t size = 0;
    std::array<uint8_t, kMaxStoreBytes> bytes{};
  };

  StoreBuffer(const StoreBufferPlan& plan, uint32_t vcpu);

  bool empty() const { return entries_.empty(); }
  size_t size() const { return entries_.size(); }
  bool full() const { return entries_.size() >= plan_.capacity; }
  // A store of `size` (1 to kMaxStoreBytes) bytes at guest-physical `gpa`, within RAM; the caller makes room first
  // (pop() while full()).
  void push(uint64_t gpa, const void* data, unsigned size);
  // A load by the same vCPU of [gpa, gpa + size), already read from memory into `out`: every buffered byte in that
  // range replaces it, the youngest store's last, so partial overlaps come out byte for byte.
  void forward(uint64_t gpa, uint8_t* out, unsigned size) const;
  // Whether a buffered store writes any byte of [gpa, gpa + size).
  bool overlaps(uint64_t gpa, unsigned size) const;
  // Takes the oldest store out (to be written to memory).
  Entry pop();
  // One instruction retired.
  void retire() { ++retired_; }
  // Whether the oldest store's delay has run out (the caller pops it).
  bool due() const { return !entries_.empty() && entries_.front().due <= retired_; }

  // The buffered stores, the generator and the instruction count: a "store-buffer" part of the machine's state
  // (digests, checkpoints).
  std::vector<uint8_t> save() const;
  Result<> restore(std::span<const uint8_t> state);

 private:
  static uint64_t page_bit(uint64_t gpa) { return uint64_t{1} << ((gpa >> 12) & 63); }
  // Whether a buffered store may touch the page(s) of [gpa, gpa + size): the common answer, no, without a scan.
  bool may_touch(uint64_t gpa, unsigned size) const {
    return !entries_.empty() && (pages_ & (page_bit(gpa) | page_bit(gpa + size - 1)));
  }

  StoreBufferPlan plan_;
  std::deque<Entry> entries_;
  uint64_t pages_ = 0;  // the entries' pages, hashed to one bit each (page number mod 64)
  SplitMix64 random_;
  uint64_t retired_ = 0;  // instructions retired since the buffer was made
};

// Whether `insn` orders memory under x86-TSO (SDM vol. 3 8.2.2, 8.3): a LOCK-prefixed instruction, XCHG with memory,
// MFENCE, the serializing instructions, HLT, and port I/O (devices see program order). The buffer drains before it,
// and its own stores go straight to memory. SFENCE and LFENCE are not among them: TSO's stores leave in order anyway,
// and neither orders a store before a later load.
bool orders_memory(const DecodedInsn& insn);
// A locked instruction: LOCK-prefixed, or XCHG with memory (locked whether or not it says so).
bool is_locked(const DecodedInsn& insn);

}  // namespace deja::interp
