// Guest RAM: one memfd-backed mapping, with bounds- and overflow-checked guest-physical access.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/types.h"

namespace deja {

class GuestMemory {
 public:
  // Creates `size` bytes of zeroed RAM at guest-physical 0 (size a multiple of 4 KiB, >= 1 MiB).
  static Result<GuestMemory> create(uint64_t size);

  GuestMemory(GuestMemory&& other) noexcept;
  GuestMemory& operator=(GuestMemory&& other) noexcept;
  GuestMemory(const GuestMemory&) = delete;
  GuestMemory& operator=(const GuestMemory&) = delete;
  ~GuestMemory();

  uint64_t size() const { return size_; }
  int fd() const { return fd_; }            // the memfd, for KVM slots and copy-on-write checkpoints
  uint8_t* host_base() const { return base_; }

  // True when [gpa, gpa+len) lies inside RAM (overflow-safe).
  bool contains(Gpa gpa, uint64_t len) const {
    return gpa.value <= size_ && len <= size_ - gpa.value;
  }

  // Checked views: fail (with the range in the message) when the range leaves RAM.
  Result<std::span<uint8_t>> span(Gpa gpa, uint64_t len);
  Result<std::span<const uint8_t>> span(Gpa gpa, uint64_t len) const;

  // Writes by the VMM itself (loaders, devices doing DMA) go through here so that
  // dirty tracking (decode caches, checkpoints) sees them.
  Result<> write(Gpa gpa, std::span<const uint8_t> data);
  Result<> read(Gpa gpa, std::span<uint8_t> out) const;

  template <typename T>
  Result<> write_obj(Gpa gpa, const T& value) {
    return write(gpa, std::span(reinterpret_cast<const uint8_t*>(&value), sizeof(T)));
  }

  // Pages written by the VMM (not the guest) since the last call, each once, in the order first written;
  // the interp backend drops decoded code for them. A backend that never asks (KVM) keeps at most one
  // entry per page: a bitmap dedupes, so the list is bounded by RAM's page count, not by the writes.
  std::vector<uint64_t> take_vmm_dirty_pages();

  // Checkpoint dirty tracking: one bit per page written since the last take_dirty_pages(), by the
  // VMM (write()) or by a backend that writes RAM itself (the software CPU marks every store here;
  // KVM ORs its dirty log in through Backend::sync_dirty_log()). Independent of the list above,
  // which the decode cache consumes.
  void mark_dirty(uint64_t gpa, uint64_t len) {
    if (len == 0) return;
    for (uint64_t page = gpa >> 12, last = (gpa + len - 1) >> 12; page <= last; ++page)
      dirty_bits_[page >> 6] |= uint64_t{1} << (page & 63);
  }
  // The bitmap itself (size()/4096 bits, little-endian words), for backends that OR into it.
  std::span<uint64_t> dirty_bitmap() { return dirty_bits_; }
  // Page numbers marked since the last call, ascending; clears the bitmap.
  std::vector<uint64_t> take_dirty_pages();
  // Counts take_dirty_pages() calls: a backend that skips marking pages it knows are marked (the software
  // CPU's fast stores) must mark again after the bitmap was cleared.
  uint64_t dirty_generation() const { return dirty_generation_; }
  // Marks every page (checkpoint tracking starts from an unknown base).
  void mark_all_dirty();
  // A checkpoint restore rewrote these pages behind everyone's back: they go on the VMM-write list
  // (decode caches drop them) but not into the dirty bitmap (they equal the restored image).
  void note_restored_pages(std::span<const uint64_t> pages) {
    for (uint64_t page : pages) note_vmm_write(page);
  }

 private:
  GuestMemory(int fd, uint8_t* base, uint64_t size)
      : fd_(fd),
        base_(base),
        size_(size),
        vmm_dirty_bits_((size / kPageSize + 63) / 64, 0),
        dirty_bits_((size / kPageSize + 63) / 64, 0) {}
  void release();
  void note_vmm_write(uint64_t page) {
    uint64_t& word = vmm_dirty_bits_[page >> 6];
    const uint64_t bit = uint64_t{1} << (page & 63);
    if (word & bit) return;
    word |= bit;
    vmm_dirty_.push_back(page);
  }

  int fd_ = -1;
  uint8_t* base_ = nullptr;
  uint64_t size_ = 0;
  std::vector<uint64_t> vmm_dirty_;       // pages, each at most once (vmm_dirty_bits_)
  std::vector<uint64_t> vmm_dirty_bits_;  // one bit per page on vmm_dirty_
  std::vector<uint64_t> dirty_bits_;
  uint64_t dirty_generation_ = 0;
};

// Parses a size such as "256M", "1G", "65536", "512K" (binary units).
Result<uint64_t> parse_size(const std::string& text);

}  // namespace deja
