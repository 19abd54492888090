// Copy-on-write, incremental checkpoint memory: persistent page maps that share every page unchanged between checkpoints.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "core/backend.h"
#include "core/guest_memory.h"

namespace deja {

// One saved 4 KiB page, shared by every image that holds these bytes.
struct PageCopy {
  std::array<uint8_t, 4096> bytes;
};

// Guest RAM as one checkpoint saw it: a two-level persistent map from page number to a shared page
// (null = a page of zeros). Taking an image copies only the map's top level, the leaves that changed
// and the dirty pages; everything else is shared with the image it was derived from.
class MemoryImage {
 public:
  static constexpr uint64_t kLeafPages = 512;
  using Leaf = std::array<std::shared_ptr<const PageCopy>, kLeafPages>;

  explicit MemoryImage(uint64_t page_count)
      : page_count_(page_count), leaves_((page_count + kLeafPages - 1) / kLeafPages) {}

  uint64_t page_count() const { return page_count_; }
  const PageCopy* page(uint64_t pfn) const {
    const auto& leaf = leaves_[pfn / kLeafPages];
    return leaf ? (*leaf)[pfn % kLeafPages].get() : nullptr;
  }
  // Pages whose contents may differ between two images of the same RAM (pointer comparison: a shared
  // page is equal, an unshared one is listed even when its bytes happen to match).
  static std::vector<uint64_t> differing_pages(const MemoryImage& a, const MemoryImage& b);
  // Pages with a stored copy (not zero).
  uint64_t stored_pages() const;

 private:
  friend class CheckpointMemory;
  uint64_t page_count_;
  std::vector<std::shared_ptr<const Leaf>> leaves_;
};

// The live guest RAM between checkpoint images: knows which image it was last equal to (its base) and
// which pages were written since (the backend's dirty tracking plus the VMM's own writes, through
// GuestMemory's dirty bitmap), so that capture() copies only those and restore() rewrites only the
// pages that can differ.
class CheckpointMemory {
 public:
  // Starts dirty tracking on `cpu`; the first capture stores every non-zero page.
  static Result<std::unique_ptr<CheckpointMemory>> create(GuestMemory& ram, Backend& cpu);

  // An image of RAM now. Copies the pages dirtied since the base and makes the result the new base.
  Result<std::shared_ptr<const MemoryImage>> capture();
  // Makes RAM equal to `image` and the image the base. Returns the number of pages rewritten. The
  // rewritten pages go on GuestMemory's VMM-write list (the software CPU drops decoded code there)
  // but not into the dirty bitmap.
  Result<uint64_t> restore(const std::shared_ptr<const MemoryImage>& image);
  // Pages written since the base (without clearing them): what the next capture or restore would add.
  Result<uint64_t> pending_dirty_pages();

  // Bytes held by page copies that some image (or the base) still refers to.
  uint64_t stored_bytes() const { return live_pages_->load() * sizeof(PageCopy); }
  const std::shared_ptr<const MemoryImage>& base() const { return base_; }
  // Builds an image page by page, in ascending page order (a checkpoint file); pages not added are zero. A page whose
  // bytes equal `share_with`'s at the same place shares its copy (and a leaf all of whose pages do, the leaf), as a
  // captured image shares what did not change, so images loaded one after another cost what they differ by.
  class ImageBuilder {
   public:
    void add(uint64_t pfn, const uint8_t* bytes);
    std::shared_ptr<const MemoryImage> finish();

   private:
    friend class CheckpointMemory;
    ImageBuilder(CheckpointMemory& memory, std::shared_ptr<const MemoryImage> share_with);
    void close_leaf();
    CheckpointMemory& memory_;
    std::shared_ptr<const MemoryImage> share_with_;
    std::shared_ptr<MemoryImage> image_;
    std::shared_ptr<MemoryImage::Leaf> leaf_;
    size_t leaf_index_ = SIZE_MAX;
  };
  ImageBuilder build_image(std::shared_ptr<const MemoryImage> share_with);

 private:
  CheckpointMemory(GuestMemory& ram, Backend& cpu);
  Result<> collect_dirty();
  std::shared_ptr<const PageCopy> copy_page(const uint8_t* bytes);

  GuestMemory& ram_;
  Backend& cpu_;
  std::shared_ptr<const MemoryImage> base_;
  std::vector<uint64_t> dirty_;       // pages written since base_, sorted, unique
  std::vector<uint8_t> dirty_mark_;   // one byte per page: in dirty_
  bool first_capture_ = true;
  std::shared_ptr<std::atomic<uint64_t>> live_pages_ = std::make_shared<std::atomic<uint64_t>>(0);
};

}  // namespace deja
