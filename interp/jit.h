// The JIT's code buffer: one executable mapping that translated blocks are compiled into, emptied when full.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace deja::interp {

// Host code is appended and never freed one block at a time: when the buffer is full, every block is
// dropped (BlockCache::clear) and the buffer starts again from empty, as QEMU's translation buffer does.
class JitBuffer {
 public:
  // (Reserved, not committed: only the code written takes memory. A machine's is its block cache's size
  // (BlockCache::capacity_for), which counts live blocks' code; a dropped block's code is reclaimed by the next flush,
  // or by a copy of the same code taking its room.)
  static constexpr size_t kDefaultBytes = size_t{512} << 20;

  explicit JitBuffer(size_t bytes = kDefaultBytes);
  ~JitBuffer();
  JitBuffer(const JitBuffer&) = delete;
  JitBuffer& operator=(const JitBuffer&) = delete;

  bool ok() const { return base_ != nullptr; }
  // Where the compiler assembles a block before add() copies it in: kept from block to block, so that its
  // capacity is allocated once.
  std::vector<uint8_t> scratch;
  // Copies `code` in (16-byte aligned); nullptr when it does not fit.
  void* add(std::span<const uint8_t> code);
  void reset() { used_ = 0; }
  size_t used() const { return used_; }
  size_t capacity() const { return capacity_; }
  // Appends "START SIZE NAME" to /tmp/perf-PID.map when DEJA_PERF_MAP is set, so that `perf report`
  // names JIT code by guest address.
  void note_for_perf(const void* start, size_t size, uint64_t guest_rip);

 private:
  uint8_t* base_ = nullptr;
  size_t capacity_ = 0;
  size_t used_ = 0;
  int perf_map_ = -1;  // fd, when DEJA_PERF_MAP is set
};

}  // namespace deja::interp
