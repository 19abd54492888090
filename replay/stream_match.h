// StreamMatch: compares the recorded serial output with the replayed guest's, byte for byte, in bounded memory.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

namespace deja {

namespace trace_detail {
class Sha256Stream;
}

// Two streams of bytes arrive interleaved in any order: the recorded output (read ahead from the
// trace) and the output the replayed guest produces. Only the side that is ahead has unmatched
// bytes. Up to `literal_cap` of them are kept and compared byte by byte (so the report names the
// first differing byte); past that, the excess of the side ahead is folded into a SHA-256, and the
// other side's bytes at the same offsets into another, compared when the other side has caught up:
// a trace claiming gigabytes of output, or a guest printing without end, costs no memory.
class StreamMatch {
 public:
  enum Side { kRecorded = 0, kReplayed = 1 };
  struct Mismatch {
    uint64_t offset = 0;       // first byte known to differ (start of the hashed range when hashed)
    uint64_t end = 0;          // hashed range: where it ends (exclusive); 0 for a byte mismatch
    uint8_t recorded = 0, replayed = 0;
  };

  explicit StreamMatch(size_t literal_cap = size_t{4} << 20);
  ~StreamMatch();

  void add(Side side, std::string_view bytes);
  const std::optional<Mismatch>& mismatch() const { return mismatch_; }
  uint64_t matched() const { return matched_; }
  // Unmatched bytes of each side (one of them is 0).
  uint64_t pending(Side side) const { return side == ahead_ ? head_.size() - head_pos_ + tail_bytes_ : 0; }
  // Bytes held in memory (for tests: bounded by literal_cap).
  size_t held() const { return head_.capacity(); }

  // The whole state while nothing is hashed (the usual case: the two sides are never megabytes apart), for
  // checkpoints: which side is ahead, its unmatched bytes, how many matched. nullopt while a tail is hashed.
  struct Literal {
    Side ahead = kRecorded;
    std::string pending;
    uint64_t matched = 0;
  };
  std::optional<Literal> literal_state() const;
  void restore(const Literal& state);  // and forgets any mismatch

 private:
  void append_ahead(std::string_view bytes);
  void consume(std::string_view bytes);

  size_t cap_;
  Side ahead_ = kRecorded;
  std::string head_;  // the side ahead: unmatched bytes kept literally, from head_pos_
  size_t head_pos_ = 0;
  uint64_t tail_bytes_ = 0;  // the side ahead: unmatched bytes after the head, hashed only
  uint64_t tail_start_ = 0;  // stream offset of the tail's first byte
  std::unique_ptr<trace_detail::Sha256Stream> tail_hash_;
  uint64_t behind_in_tail_ = 0;  // the other side's bytes hashed against the tail so far
  std::unique_ptr<trace_detail::Sha256Stream> behind_hash_;
  uint64_t matched_ = 0;
  std::optional<Mismatch> mismatch_;
};

}  // namespace deja
