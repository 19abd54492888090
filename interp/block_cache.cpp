// The translated-block cache: lookup by guest-physical address, invalidation by page and byte range, a memory cap with flush.
#include <algorithm>
#include <cstdlib>

#include <fmt/format.h>

#include "interp/block.h"

namespace deja::interp {

BlockCache::BlockCache(uint64_t ram_bytes, uint64_t capacity_bytes)
    : buckets_(size_t{1} << kBucketBits, nullptr), has_code_((ram_bytes + 4095) / 4096, 0), capacity_(capacity_bytes) {
  if (std::getenv("DEJA_BLOCK_STATS")) history_ = std::make_unique<TranslationHistory>();
}

BlockCache::~BlockCache() = default;

Block* BlockCache::insert(std::unique_ptr<Block> block) {
  const uint64_t cost = block->memory_bytes();
  if (bytes_ + cost > capacity_) clear();
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
      if (history_) history_->dropped(*b, TranslationHistory::kStore);
      drop(b);
      ++invalidations_;
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

void BlockCache::evict(Block* block) {
  const uint64_t pfn = block->phys >> 12;
  auto& blocks = page_blocks_[pfn];
  for (auto& owned : blocks) {
    if (owned.get() != block) continue;
    if (history_) history_->dropped(*block, TranslationHistory::kEvict);
    drop(block);
    graveyard_.push_back(std::move(owned));
    owned = std::move(blocks.back());
    blocks.pop_back();
    break;
  }
  if (blocks.empty()) {
    page_blocks_.erase(pfn);
    if (pfn < has_code_.size()) has_code_[pfn] = 0;
  }
}

bool BlockCache::invalidate_page(uint64_t pfn) {
  auto it = page_blocks_.find(pfn);
  if (it == page_blocks_.end()) return false;
  for (auto& b : it->second) {
    if (history_) history_->dropped(*b, TranslationHistory::kPage);
    drop(b.get());
    ++invalidations_;
    graveyard_.push_back(std::move(b));
  }
  page_blocks_.erase(it);
  if (pfn < has_code_.size()) has_code_[pfn] = 0;
  return true;
}

void BlockCache::clear() {
  if (!page_blocks_.empty()) ++flushes_;
  for (auto& [pfn, blocks] : page_blocks_) {
    for (auto& b : blocks) {
      if (history_) history_->dropped(*b, TranslationHistory::kFlush);
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

void TranslationHistory::translated(const Block& block) {
  const uint64_t h = block.source_hash ^ block.bytes;
  Kind kind = kNew;
  if (auto it = dropped_.find({block.phys, block.rip, block.key}); it != dropped_.end()) {
    kind = it->second.hash == block.source_hash ? kAgainSameBytes : kAgainNewBytes;
    if (kind == kAgainSameBytes) ++again_by_cause_[it->second.cause];
    dropped_.erase(it);
  } else if (by_phys_.contains({h, block.phys, block.key})) {
    kind = kOtherRip;
  } else if (by_rip_.contains({h, block.rip, block.key})) {
    kind = kOtherPhys;
  } else if (by_bytes_.contains({h, block.key, 0})) {
    kind = kOtherBoth;
  }
  ++kinds_[kind];
  by_phys_[{h, block.phys, block.key}] = 1;
  by_rip_[{h, block.rip, block.key}] = 1;
  by_bytes_[{h, block.key, 0}] = 1;
}

void TranslationHistory::dropped(const Block& block, Cause cause) {
  ++drops_[cause];
  dropped_[{block.phys, block.rip, block.key}] = {block.source_hash, cause};
}

std::vector<std::string> TranslationHistory::report() const {
  return {
      fmt::format("  blocks dropped: by guest stores {}, by VMM/DMA page writes {}, by flushes {}, as old copies {}",
                  drops_[kStore], drops_[kPage], drops_[kFlush], drops_[kEvict]),
      fmt::format("  translations: new {}; again with the same bytes {} (dropped by stores {}, page writes {}, "
                  "flushes {}, as old copies {}); again with new bytes {}; same bytes and physical address at another RIP {}; same "
                  "bytes and RIP at another physical address {}; same bytes elsewhere {}",
                  kinds_[kNew], kinds_[kAgainSameBytes], again_by_cause_[kStore], again_by_cause_[kPage],
                  again_by_cause_[kFlush], again_by_cause_[kEvict], kinds_[kAgainNewBytes], kinds_[kOtherRip], kinds_[kOtherPhys],
                  kinds_[kOtherBoth])};
}

}  // namespace deja::interp
