// StreamMatch: literal comparison up to a cap, hashed comparison of whatever lies beyond it.
#include "replay/stream_match.h"

#include <algorithm>
#include <cstring>

#include "logging/trace_format.h"

namespace deja {

using trace_detail::Sha256Stream;

StreamMatch::StreamMatch(size_t literal_cap) : cap_(std::max<size_t>(literal_cap, 1)) {}
StreamMatch::~StreamMatch() = default;

void StreamMatch::append_ahead(std::string_view bytes) {
  if (tail_bytes_ == 0) {
    const size_t room = cap_ - std::min(cap_, head_.size() - head_pos_);
    const size_t literal = std::min(room, bytes.size());
    if (head_pos_ > 0 && head_.size() + literal > head_.capacity()) {
      head_.erase(0, head_pos_);  // compact before growing: the buffer never exceeds the cap by much
      head_pos_ = 0;
    }
    head_.append(bytes.data(), literal);
    bytes.remove_prefix(literal);
    if (bytes.empty()) return;
    tail_start_ = matched_ + (head_.size() - head_pos_);
    tail_hash_ = std::make_unique<Sha256Stream>();
    behind_hash_ = std::make_unique<Sha256Stream>();
    behind_in_tail_ = 0;
  }
  tail_hash_->update(bytes.data(), bytes.size());
  tail_bytes_ += bytes.size();
}

void StreamMatch::consume(std::string_view bytes) {
  // Against the literal head first.
  const size_t literal = std::min(bytes.size(), head_.size() - head_pos_);
  const char* want = head_.data() + head_pos_;
  for (size_t i = 0; i < literal; ++i) {
    if (want[i] != bytes[i]) {
      uint8_t recorded = uint8_t(ahead_ == kRecorded ? want[i] : bytes[i]);
      uint8_t replayed = uint8_t(ahead_ == kRecorded ? bytes[i] : want[i]);
      mismatch_ = Mismatch{matched_ + i, 0, recorded, replayed};
      return;
    }
  }
  head_pos_ += literal;
  matched_ += literal;
  bytes.remove_prefix(literal);
  if (head_pos_ == head_.size()) {
    head_.clear();
    head_pos_ = 0;
    if (head_.capacity() > cap_) head_.shrink_to_fit();
  }
  // Then against the hashed tail, compared when this side has produced as many bytes.
  if (!bytes.empty() && tail_bytes_ > 0) {
    const uint64_t take = std::min<uint64_t>(bytes.size(), tail_bytes_ - behind_in_tail_);
    behind_hash_->update(bytes.data(), take);
    behind_in_tail_ += take;
    bytes.remove_prefix(take);
    if (behind_in_tail_ == tail_bytes_) {
      if (tail_hash_->finish() != behind_hash_->finish()) {
        mismatch_ = Mismatch{tail_start_, tail_start_ + tail_bytes_, 0, 0};
        return;
      }
      matched_ += tail_bytes_;
      tail_bytes_ = 0;
      behind_in_tail_ = 0;
      tail_hash_.reset();
      behind_hash_.reset();
    }
  }
  // Whatever is left overtakes the other side.
  if (!bytes.empty()) {
    ahead_ = Side(1 - ahead_);
    append_ahead(bytes);
  }
}

std::optional<StreamMatch::Literal> StreamMatch::literal_state() const {
  if (tail_bytes_ > 0) return std::nullopt;
  return Literal{ahead_, head_.substr(head_pos_), matched_};
}

void StreamMatch::restore(const Literal& state) {
  ahead_ = state.ahead;
  head_ = state.pending;
  head_pos_ = 0;
  matched_ = state.matched;
  tail_bytes_ = 0;
  behind_in_tail_ = 0;
  tail_hash_.reset();
  behind_hash_.reset();
  mismatch_.reset();
}

void StreamMatch::add(Side side, std::string_view bytes) {
  if (mismatch_ || bytes.empty()) return;
  if (side == ahead_ || pending(ahead_) == 0) {
    ahead_ = side;
    append_ahead(bytes);
  } else {
    consume(bytes);
  }
}

}  // namespace deja
