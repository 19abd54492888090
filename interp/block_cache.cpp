// The translated-block cache: lookup by guest-physical address, invalidation by page and byte range, a memory cap with flush.
#include <algorithm>

#include "interp/block.h"

namespace deja::interp {

BlockCache::BlockCache(uint64_t ram_bytes, uint64_t capacity_bytes)
    : buckets_(size_t{1} << kBucketBits, nullptr), has_code_((ram_bytes + 4095) / 4096, 0), capacity_(capacity_bytes) {}

BlockCache::~BlockCache() = default;

Block* BlockCache::insert(std::unique_ptr<Block> block) {
  const uint64_t cost = block->memory_bytes();
  if (bytes_ + cost > capacity_) {
    clear();
    ++flushes_;
  }
  Block* raw = block.get();
  const uint64_t pfn = raw->phys >> 12;
  Block*& head = buckets_[bucket(raw->phys)];
  raw->next_in_bucket = head;
  head = raw;
  page_blocks_[pfn].push_back(std::move(block));
  if (pfn < has_code_.size()) has_code_[pfn] = 1;
  bytes_ += cost;
  ++translations_;
  return raw;
}

void BlockCache::drop(Block* block) {
  Block** in_bucket = &buckets_[bucket(block->phys)];
  while (*in_bucket && *in_bucket != block) in_bucket = &(*in_bucket)->next_in_bucket;
  if (*in_bucket) *in_bucket = block->next_in_bucket;
  block->dead = true;
  block->next_in_bucket = nullptr;
  if (Block*& hot = recent_[recent_slot(block->phys, block->rip)]; hot == block) hot = nullptr;
  // No link may name it once it is freed: the blocks linked to it forget it, and it leaves the incoming
  // lists of those it links to.
  for (const auto& [from, slot] : block->incoming) set_link(*from, slot, nullptr);
  block->incoming.clear();
  for (int slot = 0; slot < 2; ++slot) {
    if (Block* to = block->link[slot]) forget_incoming(*to, block, slot);
    set_link(*block, slot, nullptr);
  }
  if (on_drop_) on_drop_(*block);
  bytes_ -= std::min(bytes_, block->memory_bytes());
  ++invalidations_;
}

bool BlockCache::invalidate_range(uint64_t gpa, uint64_t size) {
  const uint64_t pfn = gpa >> 12;
  auto it = page_blocks_.find(pfn);
  if (it == page_blocks_.end()) return false;
  auto& blocks = it->second;
  bool dropped = false;
  for (size_t i = 0; i < blocks.size();) {
    Block* b = blocks[i].get();
    if (b->phys < gpa + size && gpa < b->phys + std::max<uint32_t>(b->bytes, 1)) {
      drop(b);
      graveyard_.push_back(std::move(blocks[i]));
      blocks[i] = std::move(blocks.back());
      blocks.pop_back();
      dropped = true;
    } else {
      ++i;
    }
  }
  if (blocks.empty()) {
    page_blocks_.erase(it);
    if (pfn < has_code_.size()) has_code_[pfn] = 0;
  }
  return dropped;
}

bool BlockCache::invalidate_page(uint64_t pfn) {
  auto it = page_blocks_.find(pfn);
  if (it == page_blocks_.end()) return false;
  for (auto& b : it->second) {
    drop(b.get());
    graveyard_.push_back(std::move(b));
  }
  page_blocks_.erase(it);
  if (pfn < has_code_.size()) has_code_[pfn] = 0;
  return true;
}

void BlockCache::clear() {
  for (auto& [pfn, blocks] : page_blocks_) {
    for (auto& b : blocks) {
      b->dead = true;
      if (on_drop_) on_drop_(*b);
      graveyard_.push_back(std::move(b));
    }
    if (pfn < has_code_.size()) has_code_[pfn] = 0;
  }
  page_blocks_.clear();
  std::fill(buckets_.begin(), buckets_.end(), nullptr);
  std::fill(recent_.begin(), recent_.end(), nullptr);
  bytes_ = 0;
}

}  // namespace deja::interp
