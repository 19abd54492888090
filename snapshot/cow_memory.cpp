// Checkpoint memory: dirty pages collected from the backend and the VMM, shared page maps, minimal restores.
#include "snapshot/cow_memory.h"

#include <errno.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

namespace deja {
namespace {

bool all_zero(const uint8_t* p) {
  static const std::array<uint8_t, 4096> kZero{};
  return std::memcmp(p, kZero.data(), kZero.size()) == 0;
}

}  // namespace

std::vector<uint64_t> MemoryImage::differing_pages(const MemoryImage& a, const MemoryImage& b) {
  DEJA_ASSERT(a.page_count_ == b.page_count_, "images of different RAM sizes ({} and {} pages)", a.page_count_,
              b.page_count_);
  std::vector<uint64_t> out;
  for (size_t i = 0; i < a.leaves_.size(); ++i) {
    const Leaf* la = a.leaves_[i].get();
    const Leaf* lb = b.leaves_[i].get();
    if (la == lb) continue;
    const uint64_t first = i * kLeafPages;
    const uint64_t count = std::min(kLeafPages, a.page_count_ - first);
    for (uint64_t j = 0; j < count; ++j) {
      const PageCopy* pa = la ? (*la)[j].get() : nullptr;
      const PageCopy* pb = lb ? (*lb)[j].get() : nullptr;
      if (pa != pb) out.push_back(first + j);
    }
  }
  return out;
}

uint64_t MemoryImage::stored_pages() const {
  uint64_t n = 0;
  for (const auto& leaf : leaves_)
    if (leaf)
      for (const auto& p : *leaf) n += p != nullptr;
  return n;
}

CheckpointMemory::CheckpointMemory(GuestMemory& ram, Backend& cpu)
    : ram_(ram), cpu_(cpu), base_(std::make_shared<MemoryImage>(ram.size() / kPageSize)),
      dirty_mark_(ram.size() / kPageSize, 0) {}

Result<std::unique_ptr<CheckpointMemory>> CheckpointMemory::create(GuestMemory& ram, Backend& cpu) {
  std::unique_ptr<CheckpointMemory> m(new CheckpointMemory(ram, cpu));
  if (auto r = cpu.start_dirty_log(); !r) return std::unexpected(r.error());
  // The base is an all-zero image; what RAM holds already is unknown, so every page counts as written, except
  // the memfd's holes: never written, they read as zero (and reading one would allocate it: a replay of a guest
  // that touched 2 MiB of its 256 would fault in all 256 to compare them with zero).
  ram.take_dirty_pages();
  const off_t size = off_t(ram.size());
  for (off_t at = 0; at < size;) {
    const off_t data = ::lseek(ram.fd(), at, SEEK_DATA);
    if (data < 0) {
      if (errno == ENXIO) break;  // no data past `at`
      ram.mark_all_dirty();       // a file system without SEEK_DATA: every page
      break;
    }
    off_t hole = ::lseek(ram.fd(), data, SEEK_HOLE);
    if (hole < 0 || hole > size) hole = size;
    ram.mark_dirty(uint64_t(data), uint64_t(hole - data));
    at = hole;
  }
  return m;
}

Result<> CheckpointMemory::collect_dirty() {
  if (auto r = cpu_.sync_dirty_log(); !r) return r;
  bool added = false;
  for (uint64_t page : ram_.take_dirty_pages()) {
    if (dirty_mark_[page]) continue;
    dirty_mark_[page] = 1;
    dirty_.push_back(page);
    added = true;
  }
  if (added) std::sort(dirty_.begin(), dirty_.end());
  return {};
}

Result<uint64_t> CheckpointMemory::pending_dirty_pages() {
  if (auto r = collect_dirty(); !r) return std::unexpected(r.error());
  return dirty_.size();
}

std::shared_ptr<const PageCopy> CheckpointMemory::copy_page(const uint8_t* bytes) {
  auto counter = live_pages_;
  counter->fetch_add(1, std::memory_order_relaxed);
  auto* page = new PageCopy;
  std::memcpy(page->bytes.data(), bytes, page->bytes.size());
  return std::shared_ptr<const PageCopy>(page, [counter](const PageCopy* p) {
    counter->fetch_sub(1, std::memory_order_relaxed);
    delete p;
  });
}

Result<std::shared_ptr<const MemoryImage>> CheckpointMemory::capture() {
  if (auto r = collect_dirty(); !r) return std::unexpected(r.error());
  auto image = std::make_shared<MemoryImage>(*base_);  // shares every leaf
  const uint8_t* ram = ram_.host_base();
  size_t leaf_index = SIZE_MAX;
  std::shared_ptr<MemoryImage::Leaf> leaf;
  for (uint64_t page : dirty_) {
    dirty_mark_[page] = 0;
    const uint8_t* bytes = ram + page * kPageSize;
    if (page / MemoryImage::kLeafPages != leaf_index) {
      leaf_index = page / MemoryImage::kLeafPages;
      const auto& old = image->leaves_[leaf_index];
      leaf = old ? std::make_shared<MemoryImage::Leaf>(*old) : std::make_shared<MemoryImage::Leaf>();
      image->leaves_[leaf_index] = leaf;
    }
    auto& slot = (*leaf)[page % MemoryImage::kLeafPages];
    if (first_capture_ && all_zero(bytes)) {
      slot.reset();
    } else if (!slot || std::memcmp(slot->bytes.data(), bytes, kPageSize) != 0) {
      slot = copy_page(bytes);  // unchanged contents keep sharing the earlier copy
    }
  }
  dirty_.clear();
  first_capture_ = false;
  base_ = image;
  return std::shared_ptr<const MemoryImage>(image);
}

Result<uint64_t> CheckpointMemory::restore(const std::shared_ptr<const MemoryImage>& image) {
  DEJA_ASSERT(image && image->page_count() == base_->page_count(), "restoring an image of another RAM size");
  if (auto r = collect_dirty(); !r) return std::unexpected(r.error());
  std::vector<uint64_t> pages = MemoryImage::differing_pages(*base_, *image);
  for (uint64_t page : dirty_) {
    dirty_mark_[page] = 0;
    pages.push_back(page);
  }
  dirty_.clear();
  std::sort(pages.begin(), pages.end());
  pages.erase(std::unique(pages.begin(), pages.end()), pages.end());
  uint8_t* ram = ram_.host_base();
  for (uint64_t page : pages) {
    const PageCopy* copy = image->page(page);
    uint8_t* dst = ram + page * kPageSize;
    if (copy) std::memcpy(dst, copy->bytes.data(), kPageSize);
    else std::memset(dst, 0, kPageSize);
  }
  ram_.note_restored_pages(pages);
  base_ = image;
  first_capture_ = false;
  return pages.size();
}

CheckpointMemory::ImageBuilder CheckpointMemory::build_image(std::shared_ptr<const MemoryImage> share_with) {
  return ImageBuilder(*this, std::move(share_with));
}

CheckpointMemory::ImageBuilder::ImageBuilder(CheckpointMemory& memory, std::shared_ptr<const MemoryImage> share_with)
    : memory_(memory), share_with_(std::move(share_with)),
      image_(std::make_shared<MemoryImage>(memory.base_->page_count())) {
  if (share_with_ && share_with_->page_count() != image_->page_count()) share_with_.reset();
}

void CheckpointMemory::ImageBuilder::add(uint64_t pfn, const uint8_t* bytes) {
  DEJA_ASSERT(pfn < image_->page_count(), "page {} outside RAM", pfn);
  const size_t index = pfn / MemoryImage::kLeafPages;
  DEJA_ASSERT(leaf_index_ == SIZE_MAX || index >= leaf_index_, "pages out of order at {}", pfn);
  if (index != leaf_index_) {
    close_leaf();
    leaf_index_ = index;
    leaf_ = std::make_shared<MemoryImage::Leaf>();
  }
  auto& slot = (*leaf_)[pfn % MemoryImage::kLeafPages];
  const PageCopy* shared = share_with_ ? share_with_->page(pfn) : nullptr;
  if (shared && std::memcmp(shared->bytes.data(), bytes, kPageSize) == 0) {
    slot = (*share_with_->leaves_[index])[pfn % MemoryImage::kLeafPages];
  } else if (all_zero(bytes)) {
    slot.reset();
  } else {
    slot = memory_.copy_page(bytes);
  }
}

void CheckpointMemory::ImageBuilder::close_leaf() {
  if (!leaf_) return;
  // A leaf equal to the shared image's, page for page, is that leaf.
  const auto& theirs = share_with_ ? share_with_->leaves_[leaf_index_] : nullptr;
  const bool same = theirs ? *theirs == *leaf_
                           : std::all_of(leaf_->begin(), leaf_->end(), [](const auto& p) { return p == nullptr; });
  image_->leaves_[leaf_index_] = same ? theirs : std::shared_ptr<const MemoryImage::Leaf>(std::move(leaf_));
  leaf_.reset();
}

std::shared_ptr<const MemoryImage> CheckpointMemory::ImageBuilder::finish() {
  close_leaf();
  return std::move(image_);
}

}  // namespace deja
