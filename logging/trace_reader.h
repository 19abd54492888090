// Reads a trace front to back, verifying checksums and the hash chain as it goes: one chunk in memory at a time
// (next()), or for verify a bounded batch of chunks checked on every core (scan()).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "logging/trace_format.h"

typedef struct ZSTD_DCtx_s ZSTD_DCtx;

namespace deja {

// Which of `deja verify`'s ordered checks a reader's error belongs to (docs/audit.md).
enum class TraceCheck { kStructure, kChain };

// A seal frame as read (format 6): where it is, what the stream had reached there, and its DSSE envelope, whose
// signature and claims the verifier checks (logging/trace_signature.h).
struct SealFrame {
  uint64_t offset = 0;  // of the seal frame
  uint64_t chunks = 0;  // chunk frames before it
  uint64_t events = 0;  // events in them
  Sha256 chain{};       // the chain value after those chunks (what the seal signs)
  std::string envelope;
};

// What a reader learns of one chunk's events, whoever read them (next(), one by one, or scan(), on several threads):
// what the footer is checked against, and what verify checks of the events themselves.
struct ChunkTally {
  uint32_t events = 0;
  std::vector<uint32_t> by_case;              // events by Event::kind_case()
  std::optional<trace::Coordinate> first_at;  // of the first event that has a coordinate
  std::string serial_output;                  // the SerialOutput events' bytes, in order
  std::optional<uint32_t> first_kindless;     // the first event without a known kind
  std::vector<std::pair<uint32_t, std::string>> ends;  // End events: place in the chunk, reason
  void add(const trace::Event& e);
  void add(int kind_case);  // an event the tally needs no more of than its kind (see needs_message)
  // Whether add() needs the whole event of this kind: its coordinate, serial output or End reason.
  bool needs_message(int kind_case) const;
};

class TraceReader {
 public:
  // Validates magic, version and header (checksum and protobuf).
  static Result<std::unique_ptr<TraceReader>> open(const std::string& path);
  ~TraceReader();
  TraceReader(const TraceReader&) = delete;
  TraceReader& operator=(const TraceReader&) = delete;

  const trace::Header& header() const { return header_; }
  // Next event in order; std::nullopt at the end of the valid data. A corrupt frame is a kBadTrace error naming
  // the chunk, byte offset and check that failed; an incomplete final frame (truncation) just ends the stream.
  // After an error every further call returns the same error.
  Result<std::optional<trace::Event>> next();
  // The rest of the trace read as next() would, making the same checks in the same order and failing with the same
  // error, but without handing out events: chunk bodies (chain value, zstd, framing, each event's encoding) are
  // checked on every core, and events are scanned at the wire level (logging/event_scan.h) rather than parsed where
  // that is enough. `each_chunk` hears every chunk's tally, in order, once the reader has taken the chunk in.
  // verify's pass; do not mix with next().
  Result<> scan(const std::function<void(const ChunkTally&)>& each_chunk);
  // After the stream ended: a valid footer + trailer was found and matches what was read.
  bool complete() const { return complete_; }
  bool truncated() const { return truncated_; }
  // Where and why the stream ended (or the error that stopped it).
  std::string end_description() const;
  const trace::Footer* footer() const { return footer_ ? &*footer_ : nullptr; }
  uint64_t events_read() const { return events_read_; }
  uint64_t chunks_read() const { return chunks_.size(); }
  // End of the verified data: everything before this byte offset checked out.
  uint64_t valid_bytes() const { return valid_end_; }
  uint64_t file_size() const { return file_size_; }
  const std::string& path() const { return path_; }
  // The footer index found by seeking to the trailer, without reading the chunks (fast, for seeking and summaries).
  // Checks the trailer and the footer frame against each other only; the full chain is checked by next()/verify.
  Result<trace::Footer> read_index();

  // Starting part-way (a segment of the trace, segments/): moves a reader just opened to raw event `event` (serial
  // output and disk_io events counted), through the footer index to the chunk that holds it, taking the hash chain's
  // value before that chunk from the previous chunk frame's header (the header's digest for the first chunk); a
  // format-6 footer index lists that value too, and the two must agree. The chain is checked from there on, each
  // chunk against the footer index, and `deja merge` checks that every segment starts from the value the segment
  // before it computed, so that the segments together check the whole chain (docs/segments.md). Needs a complete
  // trace (its index); events_read() counts from the trace's start.
  Result<> start_at_event(uint64_t event);
  // A point of the hash chain: the value before chunk `chunk`, whose first event is `first_event`.
  struct ChainPoint {
    uint64_t chunk = 0;
    uint64_t first_event = 0;
    Sha256 chain_before{};
  };
  // The point before the chunk that holds raw event `event`, for a chunk this reader has read, or before the chunk
  // after the last one read when `event` is the first event after it (the values it computed itself, except the
  // value it started from, see start_at_event); nullopt for any other.
  std::optional<ChainPoint> chain_point(uint64_t event) const;
  // The chunk this reader started at (0 unless start_at_event moved it) and the chunks it has read from there.
  uint64_t first_chunk() const { return first_chunk_; }
  // SHA-256 of the header bytes (the chain's c0) and the chain value of the last frame read (after a complete read,
  // the footer's, which the trailer repeats).
  const Sha256& header_sha256() const { return header_sha256_; }
  const Sha256& chain_value() const { return chain_; }
  const std::vector<SealFrame>& seals() const { return seals_; }
  // The check an error belongs to: a hash-chain mismatch, or anything else about the file's structure.
  TraceCheck failed_check() const { return failed_check_; }

 private:
  TraceReader(int fd, std::string path, uint64_t file_size);
  Result<> read_at(uint64_t offset, void* data, size_t size) const;
  Result<> load_next_frame();  // sets ended_/truncated_/complete_ or loads the next chunk
  // The chunk frame whose header `frame` is at offset_, its body checked: from here on it counts as read.
  void take_chunk(const uint8_t* frame, const Sha256& chain);
  // A chunk's tally, once its events are all read: into the totals the footer is checked against.
  void take_tally(const ChunkTally& tally);
  Result<> read_footer_frame(const uint8_t* frame, uint64_t remaining);
  Result<> check_footer_against_stream();
  void end_truncated(std::string why);
  std::unexpected<Error> corrupt(std::string what, TraceCheck check = TraceCheck::kStructure);
  Result<> read_seal_frame(const uint8_t* frame, uint64_t remaining);

  int fd_ = -1;
  std::string path_;
  uint64_t file_size_ = 0;
  trace::Header header_;
  ZSTD_DCtx* dctx_ = nullptr;

  bool has_trailer_ = false;  // the last bytes look like a trailer: the file claims to be complete
  uint64_t trailer_footer_offset_ = 0;

  uint64_t offset_ = 0;     // next frame
  uint64_t valid_end_ = 0;  // end of the last verified frame
  Sha256 chain_{};
  Sha256 header_sha256_{};
  TraceCheck failed_check_ = TraceCheck::kStructure;
  std::vector<SealFrame> seals_;
  std::vector<uint8_t> compressed_;
  std::vector<uint8_t> raw_;
  size_t raw_pos_ = 0;
  uint32_t chunk_remaining_ = 0;

  bool in_footer_ = false;  // for error messages: the failing frame is the footer, not a chunk
  bool ended_ = false;
  bool complete_ = false;
  bool truncated_ = false;
  std::string end_why_;
  std::optional<Error> error_;

  uint64_t events_read_ = 0;
  std::vector<trace::ChunkIndex> chunks_;  // what was actually read, to check the footer's index against
  std::vector<Sha256> chain_before_;       // per chunk read: the chain value before it
  uint64_t first_chunk_ = 0;               // the chunk of chunks_[0] (start_at_event)
  Sha256 chunks_chain_{};                  // the chain value after the last chunk read (chain_ goes on to the footer)
  std::vector<uint64_t> count_by_case_;  // indexed by Event::kind_case(); named only when compared/written
  ChunkTally tally_;                     // next(): the current chunk's events so far
  std::unique_ptr<trace_detail::Sha256Stream> serial_sha_;
  uint64_t serial_bytes_ = 0;
  std::optional<trace::Footer> footer_;
};

}  // namespace deja
