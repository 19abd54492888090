// TraceReader: validates the preamble and header, then walks frames front to back checking the hash chain.
#include "logging/trace_reader.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <algorithm>
#include <atomic>
#include <cstring>
#include <system_error>
#include <thread>

#include <google/protobuf/util/message_differencer.h>
#include <zstd.h>

#include "logging/event_scan.h"

namespace deja {

using namespace trace_detail;

namespace {

// Varint as protobuf encodes it; false when it runs past `end` or is longer than 10 bytes.
bool read_varint(const uint8_t*& p, const uint8_t* end, uint64_t& value) {
  value = 0;
  for (int shift = 0; shift < 70; shift += 7) {
    if (p >= end) return false;
    uint8_t b = *p++;
    value |= static_cast<uint64_t>(b & 0x7f) << shift;
    if (!(b & 0x80)) return true;
  }
  return false;
}

std::string bad_event_message(uint64_t event) { return fmt::format("event {} is not a valid Event protobuf", event); }

// A chunk frame header's own fields; "" when they are possible.
std::string chunk_header_problem(const uint8_t* frame) {
  const uint32_t stored = get_u32(frame + 4);
  const uint32_t raw = get_u32(frame + 8);
  const uint32_t count = get_u32(frame + 12);
  if (raw > kMaxChunkRawBytes)
    return fmt::format("raw length {} exceeds the {} byte chunk limit", raw, kMaxChunkRawBytes);
  if (stored > ZSTD_compressBound(raw))
    return fmt::format("compressed length {} is impossible for raw length {}", stored, raw);
  if (count == 0 || count > raw) return fmt::format("event count {} is impossible for raw length {}", count, raw);
  return {};
}

// A chunk frame's body checked on its own, on any thread: its chain value from the value before it, zstd to exactly
// the frame's raw length (into `raw`), and exactly the frame's count of length-delimited records. The chunk is then
// wholly usable, or rejected before any of its events.
struct ChunkBody {
  Sha256 chain{};
  std::string problem;  // "" when it checked out
  TraceCheck check = TraceCheck::kStructure;
};

ChunkBody check_chunk_body(ZSTD_DCtx* dctx, const Sha256& before, const uint8_t* frame,
                           std::span<const uint8_t> payload, std::vector<uint8_t>& raw) {
  ChunkBody body;
  body.chain = chain_next(before, std::span(frame, kFrameFieldBytes), payload);
  if (std::memcmp(body.chain.data(), frame + kFrameFieldBytes, 32) != 0) {
    body.problem = "hash chain mismatch: the chunk was altered, or chunks were removed or reordered";
    body.check = TraceCheck::kChain;
    return body;
  }
  const uint32_t raw_bytes = get_u32(frame + 8);
  const uint32_t count = get_u32(frame + 12);
  raw.resize(raw_bytes);
  size_t n = ZSTD_decompressDCtx(dctx, raw.data(), raw.size(), payload.data(), payload.size());
  if (ZSTD_isError(n)) {
    body.problem = fmt::format("zstd decompression failed: {}", ZSTD_getErrorName(n));
    return body;
  }
  if (n != raw_bytes) {
    body.problem = fmt::format("decompressed to {} bytes but the frame says {}", n, raw_bytes);
    return body;
  }
  const uint8_t* p = raw.data();
  const uint8_t* end = p + raw.size();
  uint32_t framed = 0;
  while (p < end) {
    uint64_t length = 0;
    if (!read_varint(p, end, length) || length > static_cast<uint64_t>(end - p)) {
      body.problem = fmt::format("event {} of the chunk has a bad length prefix", framed);
      return body;
    }
    p += length;
    ++framed;
  }
  if (framed != count) body.problem = fmt::format("chunk holds {} events but its frame says {}", framed, count);
  return body;
}

bool same_coordinate(const trace::ChunkIndex& a, const trace::ChunkIndex& b) {
  if (a.has_first_at() != b.has_first_at()) return false;
  return !a.has_first_at() || google::protobuf::util::MessageDifferencer::Equals(a.first_at(), b.first_at());
}

}  // namespace

TraceReader::TraceReader(int fd, std::string path, uint64_t file_size)
    : fd_(fd), path_(std::move(path)), file_size_(file_size), dctx_(ZSTD_createDCtx()),
      serial_sha_(std::make_unique<Sha256Stream>()) {}

TraceReader::~TraceReader() {
  if (fd_ >= 0) ::close(fd_);
  ZSTD_freeDCtx(dctx_);
}

Result<> TraceReader::read_at(uint64_t offset, void* data, size_t size) const {
  char* p = static_cast<char*>(data);
  while (size > 0) {
    ssize_t n = ::pread(fd_, p, size, static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      return fail(ErrorKind::kHost, "cannot read trace {} at byte {}: {}", path_, offset, std::strerror(errno));
    }
    // Sizes were checked against fstat, so a short read means the file shrank under us.
    if (n == 0) return fail(ErrorKind::kBadTrace, "trace {} shrank while being read (at byte {})", path_, offset);
    p += n;
    size -= static_cast<size_t>(n);
    offset += static_cast<uint64_t>(n);
  }
  return {};
}

Result<std::unique_ptr<TraceReader>> TraceReader::open(const std::string& path) {
  // O_NONBLOCK: opening a FIFO must not wait for a writer; fstat then refuses it (reads of a regular file
  // never block, whatever the flag says).
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) return fail(ErrorKind::kHost, "cannot open trace {}: {}", path, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    return fail(ErrorKind::kHost, "cannot stat trace {}: {}", path, std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return fail(ErrorKind::kBadTrace, "{} is not a regular file ({}), so it cannot be a deja trace", path,
                S_ISFIFO(st.st_mode)  ? "a FIFO"
                : S_ISDIR(st.st_mode) ? "a directory"
                : S_ISSOCK(st.st_mode) ? "a socket"
                                       : "a device");
  }
  std::unique_ptr<TraceReader> r(new TraceReader(fd, path, static_cast<uint64_t>(st.st_size)));
  if (r->dctx_ == nullptr) return fail(ErrorKind::kHost, "cannot allocate a zstd decompression context");
  const uint64_t size = r->file_size_;
  if (size == 0)
    return fail(ErrorKind::kBadTrace, "{} is empty (0 bytes): not a deja trace (the recording wrote nothing)", path);

  uint8_t preamble[kFilePreambleBytes + 4] = {};
  size_t have = static_cast<size_t>(std::min<uint64_t>(size, sizeof preamble));
  if (auto e = r->read_at(0, preamble, have); !e) return std::unexpected(e.error());
  size_t magic_have = std::min(have, kFileMagic.size());
  if (std::memcmp(preamble, kFileMagic.data(), magic_have) != 0)
    return fail(ErrorKind::kBadTrace, "{} is not a deja trace: it does not start with the magic \"DEJATRC\\0\"", path);
  if (have < kFilePreambleBytes)
    return fail(ErrorKind::kBadTrace, "trace {} is truncated inside its file magic ({} bytes)", path, size);
  uint32_t version = get_u32(preamble + 8);
  if (version > kTraceFormatVersion)
    return fail(ErrorKind::kUnsupported, "trace format version {} of {} is newer than this deja ({}); use a newer deja",
                version, path, kTraceFormatVersion);
  if (version < kOldestTraceFormatVersion)
    return fail(ErrorKind::kUnsupported,
                "trace format version {} of {} is older than this deja reads ({} to {}); use the deja that recorded it",
                version, path, kOldestTraceFormatVersion, kTraceFormatVersion);
  if (have < sizeof preamble)
    return fail(ErrorKind::kBadTrace, "trace {} is truncated before its header ({} bytes)", path, size);
  uint64_t header_len = get_u32(preamble + 12);
  if (header_len > kMaxHeaderBytes)
    return fail(ErrorKind::kBadTrace, "trace {}: header length {} at byte 12 exceeds the {} byte limit (corrupt)", path,
                header_len, kMaxHeaderBytes);
  const uint64_t header_end = sizeof preamble + header_len + 32;
  if (header_end > size)
    return fail(ErrorKind::kBadTrace,
                "trace {} is truncated inside its header (file has {} bytes, the header ends at byte {}); "
                "the recording was interrupted before any event was written",
                path, size, header_end);
  std::vector<uint8_t> header_bytes(header_len + 32);
  if (auto e = r->read_at(sizeof preamble, header_bytes.data(), header_bytes.size()); !e)
    return std::unexpected(e.error());
  Sha256 digest = sha256_bytes(std::span(header_bytes.data(), header_len));
  if (std::memcmp(digest.data(), header_bytes.data() + header_len, 32) != 0)
    return fail(ErrorKind::kBadTrace, "trace {}: header checksum (SHA-256 at byte {}) does not match; header is corrupt",
                path, sizeof preamble + header_len);
  if (!r->header_.ParseFromArray(header_bytes.data(), static_cast<int>(header_len)))
    return fail(ErrorKind::kBadTrace, "trace {}: header at byte 16 is not a valid Header protobuf", path);
  if (r->header_.format_version() != version)
    return fail(ErrorKind::kBadTrace, "trace {}: header says format version {} but the file preamble says {}", path,
                r->header_.format_version(), version);
  r->chain_ = r->chunks_chain_ = r->header_sha256_ = digest;
  r->offset_ = r->valid_end_ = header_end;

  // A trailer at the very end means the writer finished: then an incomplete frame is corruption, not truncation.
  if (size >= header_end + kFrameHeaderBytes + kTrailerBytes) {
    uint8_t trailer[kTrailerBytes];
    if (auto e = r->read_at(size - kTrailerBytes, trailer, sizeof trailer); !e) return std::unexpected(e.error());
    if (std::memcmp(trailer, kTrailerMagic.data(), 8) == 0) {
      r->has_trailer_ = true;
      r->trailer_footer_offset_ = get_u64(trailer + 8);
    }
  }
  return r;
}

std::unexpected<Error> TraceReader::corrupt(std::string what, TraceCheck check) {
  failed_check_ = check;
  error_ = Error{ErrorKind::kBadTrace,
                 fmt::format("trace {} is corrupt at {} (byte {}, after event {}): {}", path_,
                             in_footer_ ? std::string("the footer") : fmt::format("chunk {}", first_chunk_ + chunks_.size()), offset_,
                             events_read_, what)};
  ended_ = true;
  return std::unexpected(*error_);
}

void TraceReader::end_truncated(std::string why) {
  ended_ = true;
  truncated_ = true;
  end_why_ = std::move(why);
}

std::string TraceReader::end_description() const {
  if (error_) return error_->message;
  if (complete_)
    return fmt::format("trace complete: {} chunks, {} events, footer at byte {}, {} bytes verified",
                       first_chunk_ + chunks_.size(),
                       events_read_, trailer_footer_offset_, valid_end_);
  if (truncated_) {
    std::string where =
        chunks_.empty() ? std::string("the header") : fmt::format("chunk {}", first_chunk_ + chunks_.size() - 1);
    return fmt::format("trace ends after {} (event {}) at byte {}: {} — recording was interrupted", where, events_read_,
                       valid_end_, end_why_);
  }
  return fmt::format("reading: {} chunks, {} events so far, at byte {}", first_chunk_ + chunks_.size(), events_read_,
                     valid_end_);
}

Result<std::optional<trace::Event>> TraceReader::next() {
  while (true) {
    if (error_) return std::unexpected(*error_);
    if (chunk_remaining_ > 0) {
      const uint8_t* p = raw_.data() + raw_pos_;
      const uint8_t* end = raw_.data() + raw_.size();
      uint64_t length = 0;
      // Framing was validated when the chunk was loaded; re-check anyway, it costs nothing.
      if (!read_varint(p, end, length) || length > static_cast<uint64_t>(end - p))
        return corrupt("event framing is inconsistent");
      trace::Event event;
      if (!event.ParseFromArray(p, static_cast<int>(length))) return corrupt(bad_event_message(events_read_));
      raw_pos_ = static_cast<size_t>(p - raw_.data()) + length;
      ++events_read_;
      tally_.add(event);
      if (!chunks_.back().has_first_at() && tally_.first_at) *chunks_.back().mutable_first_at() = *tally_.first_at;
      if (--chunk_remaining_ == 0) {
        take_tally(tally_);
        tally_ = {};
      }
      return std::optional<trace::Event>(std::move(event));
    }
    if (ended_) return std::optional<trace::Event>();
    if (auto r = load_next_frame(); !r) return std::unexpected(r.error());
  }
}

void ChunkTally::add(int kind_case) {
  ++events;
  if (size_t(kind_case) >= by_case.size()) by_case.resize(size_t(kind_case) + 1);
  ++by_case[size_t(kind_case)];
  if (kind_case == trace::Event::KIND_NOT_SET && !first_kindless) first_kindless = events - 1;
}

void ChunkTally::add(const trace::Event& e) {
  add(e.kind_case());
  if (!first_at)
    if (const trace::Coordinate* c = event_coordinate(e)) first_at = *c;
  if (e.has_serial_output()) serial_output += e.serial_output().data();
  if (e.has_end()) ends.emplace_back(events - 1, e.end().reason());
}

bool ChunkTally::needs_message(int kind_case) const {
  return kind_case == trace::Event::kSerialOutput || kind_case == trace::Event::kEnd ||
         (!first_at && event_kind_has_coordinate(kind_case));
}

void TraceReader::take_tally(const ChunkTally& tally) {
  if (tally.by_case.size() > count_by_case_.size()) count_by_case_.resize(tally.by_case.size());
  for (size_t kind = 0; kind < tally.by_case.size(); ++kind) count_by_case_[kind] += tally.by_case[kind];
  serial_sha_->update(tally.serial_output.data(), tally.serial_output.size());
  serial_bytes_ += tally.serial_output.size();
}

Result<> TraceReader::load_next_frame() {
  const uint64_t remaining = file_size_ - offset_;
  if (remaining == 0) {
    end_truncated("no footer (the file ends at a chunk boundary)");
    return {};
  }
  uint8_t frame[kFrameHeaderBytes];
  if (remaining >= 4) {
    if (auto r = read_at(offset_, frame, 4); !r) return r;
    uint32_t magic = get_u32(frame);
    const bool sealed_format = header_.format_version() >= 6;
    if (magic != kChunkFrameMagic && magic != kFooterFrameMagic && !(magic == kSealFrameMagic && sealed_format))
      return corrupt(fmt::format("bad frame magic {:#010x} (expected a chunk, {}footer frame)", magic,
                                 sealed_format ? "seal or " : ""));
    if (has_trailer_ && offset_ == trailer_footer_offset_ && magic != kFooterFrameMagic)
      return corrupt(fmt::format("the trailer says the footer is at byte {} but a chunk frame is there", offset_));
    if (has_trailer_ && offset_ != trailer_footer_offset_ && magic == kFooterFrameMagic)
      return corrupt(fmt::format("found a footer frame but the trailer says the footer is at byte {}",
                                 trailer_footer_offset_));
  }
  if (remaining < kFrameHeaderBytes) {
    if (has_trailer_) return corrupt("frame header runs past the end of a file that has a trailer");
    end_truncated(fmt::format("incomplete frame header ({} of {} bytes)", remaining, kFrameHeaderBytes));
    return {};
  }
  if (auto r = read_at(offset_, frame, sizeof frame); !r) return r;
  if (get_u32(frame) == kFooterFrameMagic) return read_footer_frame(frame, remaining);
  if (get_u32(frame) == kSealFrameMagic) return read_seal_frame(frame, remaining);

  const uint32_t stored = get_u32(frame + 4);
  if (std::string problem = chunk_header_problem(frame); !problem.empty()) return corrupt(problem);
  if (stored > remaining - kFrameHeaderBytes) {
    if (has_trailer_) return corrupt(fmt::format("chunk of {} bytes runs past the end of a file that has a trailer", stored));
    end_truncated(fmt::format("truncated chunk frame ({} of {} payload bytes present)", remaining - kFrameHeaderBytes,
                              stored));
    return {};
  }
  compressed_.resize(stored);
  if (auto r = read_at(offset_ + kFrameHeaderBytes, compressed_.data(), stored); !r) return r;
  ChunkBody body = check_chunk_body(dctx_, chain_, frame, compressed_, raw_);
  if (!body.problem.empty()) return corrupt(body.problem, body.check);
  take_chunk(frame, body.chain);
  raw_pos_ = 0;
  chunk_remaining_ = get_u32(frame + 12);
  return {};
}

void TraceReader::take_chunk(const uint8_t* frame, const Sha256& chain) {
  trace::ChunkIndex entry;
  entry.set_offset(offset_);
  entry.set_first_event(events_read_);
  entry.set_events(get_u32(frame + 12));
  entry.set_chain(chain.data(), chain.size());
  chunks_.push_back(entry);
  chain_before_.push_back(chain_);
  chain_ = chunks_chain_ = chain;
  offset_ += kFrameHeaderBytes + get_u32(frame + 4);
  valid_end_ = offset_;
}

namespace {

// scan(): a run of frames ahead of the reader whose chunk bodies are checked together, on every core. It holds at
// most kBatchBytes of compressed payload (or one chunk), so memory stays bounded as next()'s does.
constexpr size_t kBatchFrames = 1024;
constexpr uint64_t kBatchBytes = 16u << 20;

struct BatchFrame {
  uint64_t offset = 0;
  uint8_t header[kFrameHeaderBytes];
  bool chunk = false;  // else a seal frame, which the reader reads in its turn
  Sha256 chain_before{};
  // A chunk's body, as a worker found it.
  std::optional<Error> read_error;
  ChunkBody body;
  ChunkTally tally;
  bool bad_event = false;  // event tally.events does not parse
};

// A chunk's events as verify needs them: the wire-level scan where it is sure and nothing more is needed, else the
// full parse, whose verdict stands.
void tally_events(const std::vector<uint8_t>& raw, BatchFrame& f) {
  const uint8_t* p = raw.data();
  const uint8_t* end = p + raw.size();
  const uint32_t count = get_u32(f.header + 12);
  for (uint32_t i = 0; i < count; ++i) {
    uint64_t length = 0;
    read_varint(p, end, length);  // checked by check_chunk_body
    const EventScan scan = scan_event(p, length);
    if (scan.sure && !f.tally.needs_message(scan.kind_case)) {
      f.tally.add(scan.kind_case);
    } else {
      trace::Event event;
      if (!event.ParseFromArray(p, static_cast<int>(length))) {
        f.bad_event = true;
        return;
      }
      f.tally.add(event);
    }
    p += length;
  }
}

}  // namespace

Result<> TraceReader::scan(const std::function<void(const ChunkTally&)>& each_chunk) {
  // One worker a core: this thread (with the reader's own zstd context) and the others, each with a context.
  std::vector<std::unique_ptr<ZSTD_DCtx, decltype(&ZSTD_freeDCtx)>> contexts;
  for (unsigned i = 1; i < std::thread::hardware_concurrency(); ++i) {
    contexts.emplace_back(ZSTD_createDCtx(), &ZSTD_freeDCtx);
    if (!contexts.back()) return fail(ErrorKind::kHost, "cannot allocate a zstd decompression context");
  }
  std::vector<BatchFrame> batch;
  while (!ended_) {
    if (error_) return std::unexpected(*error_);
    // The frames ahead that load_next_frame() would take as sound chunk frames (or seal frames, read in order below);
    // anything else (the footer, a bad header, a cut) ends the batch and is load_next_frame()'s, in its turn.
    batch.clear();
    uint64_t at = offset_, bytes = 0;
    Sha256 chain = chain_;
    while (batch.size() < kBatchFrames && bytes < kBatchBytes && file_size_ - at >= kFrameHeaderBytes &&
           !(has_trailer_ && at == trailer_footer_offset_)) {
      BatchFrame f;
      if (!read_at(at, f.header, sizeof f.header)) break;
      const uint32_t magic = get_u32(f.header), stored = get_u32(f.header + 4);
      f.chunk = magic == kChunkFrameMagic;
      if (!f.chunk && !(magic == kSealFrameMagic && header_.format_version() >= 6)) break;
      if ((f.chunk && !chunk_header_problem(f.header).empty()) || stored > file_size_ - at - kFrameHeaderBytes) break;
      f.offset = at;
      if (f.chunk) {
        // The value before it, as the chunk before computes it if it checks out (it is that chunk's frame's value).
        f.chain_before = chain;
        std::memcpy(chain.data(), f.header + kFrameFieldBytes, chain.size());
        bytes += stored;
      }
      batch.push_back(std::move(f));
      at += kFrameHeaderBytes + stored;
    }
    if (batch.empty()) {
      if (auto r = load_next_frame(); !r) return r;
      DEJA_ASSERT(chunk_remaining_ == 0, "scan: load_next_frame took a chunk that the batch did not");
      continue;
    }
    std::atomic<size_t> next_frame{0};
    auto work = [&](ZSTD_DCtx* context) {
      std::vector<uint8_t> payload, raw;
      for (size_t i; (i = next_frame.fetch_add(1)) < batch.size();) {
        BatchFrame& f = batch[i];
        if (!f.chunk) continue;
        payload.resize(get_u32(f.header + 4));
        if (auto r = read_at(f.offset + kFrameHeaderBytes, payload.data(), payload.size()); !r) {
          f.read_error = r.error();
          continue;
        }
        f.body = check_chunk_body(context, f.chain_before, f.header, payload, raw);
        if (f.body.problem.empty()) tally_events(raw, f);
      }
    };
    {
      std::vector<std::jthread> threads;
      for (size_t w = 0; w < contexts.size() && w + 1 < batch.size(); ++w) {
        try {
          threads.emplace_back(work, contexts[w].get());
        } catch (const std::system_error&) {  // no more threads to be had: the ones there are do the work
          break;
        }
      }
      work(dctx_);
    }
    // In order, as next() would have met them.
    for (BatchFrame& f : batch) {
      if (!f.chunk) {
        if (auto r = load_next_frame(); !r) return r;
        continue;
      }
      if (f.read_error) return std::unexpected(*f.read_error);
      if (!f.body.problem.empty()) return corrupt(f.body.problem, f.body.check);
      take_chunk(f.header, f.body.chain);
      events_read_ += f.tally.events;
      if (f.tally.first_at) *chunks_.back().mutable_first_at() = *f.tally.first_at;
      take_tally(f.tally);
      each_chunk(f.tally);
      if (f.bad_event) return corrupt(bad_event_message(events_read_));
    }
  }
  if (error_) return std::unexpected(*error_);
  return {};
}

Result<> TraceReader::read_footer_frame(const uint8_t* frame, uint64_t remaining) {
  in_footer_ = true;
  const uint32_t stored = get_u32(frame + 4);
  const uint32_t raw = get_u32(frame + 8);
  const uint32_t chunk_count = get_u32(frame + 12);
  if (stored > kMaxFooterBytes || raw != stored)
    return corrupt(fmt::format("footer frame lengths {}/{} are invalid", stored, raw));
  if (stored > remaining - kFrameHeaderBytes) {
    if (has_trailer_) return corrupt("footer frame runs past the end of a file that has a trailer");
    end_truncated(fmt::format("truncated footer frame ({} of {} bytes present)", remaining - kFrameHeaderBytes, stored));
    return {};
  }
  std::vector<uint8_t> bytes(stored);
  if (auto r = read_at(offset_ + kFrameHeaderBytes, bytes.data(), stored); !r) return r;
  Sha256 chain = chain_next(chain_, std::span(frame, kFrameFieldBytes), bytes);
  if (std::memcmp(chain.data(), frame + kFrameFieldBytes, 32) != 0)
    return corrupt("footer hash chain mismatch: the footer was altered, or chunks before it were removed or reordered",
                   TraceCheck::kChain);
  trace::Footer footer;
  if (!footer.ParseFromArray(bytes.data(), static_cast<int>(stored))) return corrupt("footer is not a valid Footer protobuf");
  if (chunk_count != first_chunk_ + chunks_.size())
    return corrupt(fmt::format("footer frame counts {} chunks but {} were read", chunk_count,
                               first_chunk_ + chunks_.size()));
  footer_ = std::move(footer);
  if (auto r = check_footer_against_stream(); !r) return r;
  const uint64_t footer_offset = offset_;
  chain_ = chain;
  offset_ += kFrameHeaderBytes + stored;
  valid_end_ = offset_;

  const uint64_t after = file_size_ - offset_;
  if (after == 0) {
    end_truncated("the trailer is missing after the footer");
    return {};
  }
  if (after < kTrailerBytes) {
    end_truncated(fmt::format("incomplete trailer ({} of {} bytes)", after, kTrailerBytes));
    return {};
  }
  if (after > kTrailerBytes) return corrupt(fmt::format("{} unexpected bytes follow the footer", after));
  uint8_t trailer[kTrailerBytes];
  if (auto r = read_at(offset_, trailer, sizeof trailer); !r) return r;
  if (std::memcmp(trailer, kTrailerMagic.data(), 8) != 0) return corrupt("bad trailer magic");
  if (get_u64(trailer + 8) != footer_offset)
    return corrupt(fmt::format("trailer points at byte {} but the footer is at byte {}", get_u64(trailer + 8),
                               footer_offset));
  if (std::memcmp(trailer + 16, chain_.data(), 32) != 0)
    return corrupt("trailer's final chain value does not match", TraceCheck::kChain);
  trailer_footer_offset_ = footer_offset;
  offset_ = valid_end_ = file_size_;
  ended_ = true;
  complete_ = true;
  return {};
}

Result<> TraceReader::read_seal_frame(const uint8_t* frame, uint64_t remaining) {
  const uint32_t stored = get_u32(frame + 4);
  const uint32_t raw = get_u32(frame + 8);
  const uint32_t chunk_count = get_u32(frame + 12);
  if (stored > kMaxSealBytes || raw != stored || stored == 0)
    return corrupt(fmt::format("seal frame lengths {}/{} are invalid", stored, raw));
  if (stored > remaining - kFrameHeaderBytes) {
    if (has_trailer_) return corrupt("seal frame runs past the end of a file that has a trailer");
    end_truncated(fmt::format("truncated seal frame ({} of {} bytes present)", remaining - kFrameHeaderBytes, stored));
    return {};
  }
  // A seal is not chained (its signature covers it); it must sit where it says it does.
  if (chunk_count != first_chunk_ + chunks_.size())
    return corrupt(fmt::format("seal frame says it follows {} chunks but {} were read", chunk_count,
                               first_chunk_ + chunks_.size()));
  // A seal follows at least one chunk the seal before it did not cover (so there are never more seals than chunks).
  if (chunk_count == (seals_.empty() ? 0 : seals_.back().chunks))
    return corrupt("a seal frame with no chunk frame since the previous seal (or the header)");
  if (std::memcmp(frame + kFrameFieldBytes, chain_.data(), 32) != 0)
    return corrupt("seal frame names another chain value than the chunks before it have", TraceCheck::kChain);
  SealFrame seal;
  seal.offset = offset_;
  seal.chunks = chunk_count;
  seal.events = events_read_;
  seal.chain = chain_;
  seal.envelope.resize(stored);
  if (auto r = read_at(offset_ + kFrameHeaderBytes, seal.envelope.data(), stored); !r) return r;
  seals_.push_back(std::move(seal));
  offset_ += kFrameHeaderBytes + stored;
  valid_end_ = offset_;
  return {};
}

Result<trace::Footer> TraceReader::read_index() {
  if (!has_trailer_)
    return fail(ErrorKind::kBadTrace, "trace {} has no trailer (the recording was interrupted or the file is cut); "
                "its index is only available by reading it from the start", path_);
  const uint64_t trailer_at = file_size_ - kTrailerBytes;
  const uint64_t at = trailer_footer_offset_;
  if (at + kFrameHeaderBytes > trailer_at)
    return fail(ErrorKind::kBadTrace, "trace {}: trailer points at byte {} for the footer, past the end", path_, at);
  uint8_t frame[kFrameHeaderBytes];
  if (auto r = read_at(at, frame, sizeof frame); !r) return std::unexpected(r.error());
  const uint32_t stored = get_u32(frame + 4);
  if (get_u32(frame) != kFooterFrameMagic || stored != get_u32(frame + 8) || stored > kMaxFooterBytes ||
      at + kFrameHeaderBytes + stored != trailer_at)
    return fail(ErrorKind::kBadTrace, "trace {}: no valid footer frame at byte {} where the trailer points", path_, at);
  uint8_t trailer[kTrailerBytes];
  if (auto r = read_at(trailer_at, trailer, sizeof trailer); !r) return std::unexpected(r.error());
  if (std::memcmp(trailer + 16, frame + kFrameFieldBytes, 32) != 0)
    return fail(ErrorKind::kBadTrace, "trace {}: trailer and footer frame disagree on the final chain value", path_);
  std::vector<uint8_t> bytes(stored);
  if (auto r = read_at(at + kFrameHeaderBytes, bytes.data(), stored); !r) return std::unexpected(r.error());
  trace::Footer footer;
  if (!footer.ParseFromArray(bytes.data(), static_cast<int>(stored)))
    return fail(ErrorKind::kBadTrace, "trace {}: footer at byte {} is not a valid Footer protobuf", path_, at);
  return footer;
}

Result<> TraceReader::start_at_event(uint64_t event) {
  if (events_read_ != 0 || !chunks_.empty() || ended_)
    return fail(ErrorKind::kInvalidArgument, "trace {}: a reader starts part-way only before it has read", path_);
  if (event == 0) return {};
  auto index = read_index();
  if (!index) return std::unexpected(index.error());
  const auto& chunks = index->chunks();
  // The last chunk whose first event is at or before `event`.
  auto after = std::upper_bound(chunks.begin(), chunks.end(), event,
                                [](uint64_t e, const trace::ChunkIndex& c) { return e < c.first_event(); });
  if (after == chunks.begin() || event >= index->total_events())
    return fail(ErrorKind::kBadTrace, "trace {} has no event {} (its index lists {} events)", path_, event,
                index->total_events());
  const uint64_t chunk = uint64_t(after - chunks.begin()) - 1;
  const trace::ChunkIndex& at = chunks[int(chunk)];
  if (at.offset() < offset_ || at.offset() >= file_size_)
    return fail(ErrorKind::kBadTrace, "trace {}: index entry {} points at byte {}, outside its chunks", path_, chunk,
                at.offset());
  if (chunk > 0) {
    // The chain value before this chunk: the previous chunk frame's (the last 32 bytes of its header), which must end
    // at or before this chunk (a seal frame may sit between). Format 6 lists it in the footer index too: then the two
    // must agree, so that a segment's start is checked against the footer (which the trace's signature covers).
    const trace::ChunkIndex& before = chunks[int(chunk - 1)];
    const uint64_t previous = before.offset();
    uint8_t frame[kFrameHeaderBytes];
    if (previous < offset_ || previous + kFrameHeaderBytes > at.offset())
      return fail(ErrorKind::kBadTrace, "trace {}: index entries {} and {} overlap", path_, chunk - 1, chunk);
    if (auto r = read_at(previous, frame, sizeof frame); !r) return r;
    if (get_u32(frame) != kChunkFrameMagic || previous + kFrameHeaderBytes + get_u32(frame + 4) > at.offset())
      return fail(ErrorKind::kBadTrace, "trace {}: no chunk frame at byte {} ending before chunk {} begins", path_,
                  previous, chunk);
    std::memcpy(chain_.data(), frame + kFrameFieldBytes, chain_.size());
    if ((header_.format_version() >= 6 || !before.chain().empty()) &&
        (before.chain().size() != chain_.size() || std::memcmp(before.chain().data(), chain_.data(), chain_.size()) != 0))
      return fail(ErrorKind::kBadTrace, "trace {}: chunk {}'s frame has another chain value than the footer index lists",
                  path_, chunk - 1);
    chunks_chain_ = chain_;
  }
  offset_ = valid_end_ = at.offset();
  events_read_ = at.first_event();
  first_chunk_ = chunk;
  while (events_read_ < event) {
    auto skipped = next();
    if (!skipped) return std::unexpected(skipped.error());
    if (!*skipped)
      return fail(ErrorKind::kBadTrace, "trace {} ends at event {}, before event {}", path_, events_read_, event);
  }
  return {};
}

std::optional<TraceReader::ChainPoint> TraceReader::chain_point(uint64_t event) const {
  if (chunks_.empty()) {
    if (event != events_read_) return std::nullopt;
    return ChainPoint{first_chunk_, events_read_, chunks_chain_};
  }
  for (size_t i = 0; i < chunks_.size(); ++i) {
    if (event >= chunks_[i].first_event() && event < chunks_[i].first_event() + chunks_[i].events()) {
      return ChainPoint{first_chunk_ + i, chunks_[i].first_event(), chain_before_[i]};
    }
  }
  const uint64_t after = chunks_.back().first_event() + chunks_.back().events();
  if (event != after) return std::nullopt;
  return ChainPoint{first_chunk_ + chunks_.size(), after, chunks_chain_};
}

Result<> TraceReader::check_footer_against_stream() {
  const trace::Footer& f = *footer_;
  if (f.total_events() != events_read_)
    return corrupt(fmt::format("footer says {} events but {} were read", f.total_events(), events_read_));
  if (static_cast<uint64_t>(f.chunks_size()) != first_chunk_ + chunks_.size())
    return corrupt(fmt::format("footer index lists {} chunks but {} were read", f.chunks_size(),
                               first_chunk_ + chunks_.size()));
  for (size_t i = 0; i < chunks_.size(); ++i) {
    const trace::ChunkIndex& want = chunks_[i];
    const trace::ChunkIndex& got = f.chunks(static_cast<int>(first_chunk_ + i));
    if (got.offset() != want.offset() || got.first_event() != want.first_event() || got.events() != want.events())
      return corrupt(fmt::format("footer index entry {} (offset {}, first event {}, {} events) disagrees with the chunk "
                                 "read (offset {}, first event {}, {} events)",
                                 i, got.offset(), got.first_event(), got.events(), want.offset(), want.first_event(),
                                 want.events()));
    if (!same_coordinate(got, want))
      return corrupt(fmt::format("footer index entry {} has a different first coordinate than chunk {}", i, i));
    // Format 6 lists every chunk's chain value (older footers have none).
    if ((header_.format_version() >= 6 || !got.chain().empty()) && got.chain() != want.chain())
      return corrupt(fmt::format("footer index entry {} has another chain value than chunk {}", i, i),
                     TraceCheck::kChain);
  }
  // A reader that started part-way read the seals after its first chunk: the footer's last ones.
  size_t seals_before = 0;
  if (first_chunk_ > 0) {
    while (seals_before < size_t(f.seals_size()) && f.seals(int(seals_before)).chunks() <= first_chunk_) ++seals_before;
  }
  if (static_cast<size_t>(f.seals_size()) != seals_before + seals_.size())
    return corrupt(fmt::format("footer lists {} seal frames but {} were read", f.seals_size() - seals_before,
                               seals_.size()));
  for (size_t i = 0; i < seals_.size(); ++i) {
    const trace::SealIndex& got = f.seals(static_cast<int>(seals_before + i));
    if (got.offset() != seals_[i].offset || got.chunks() != seals_[i].chunks)
      return corrupt(fmt::format("footer entry for seal {} (byte {}, after {} chunks) disagrees with the seal frame "
                                 "read (byte {}, after {} chunks)",
                                 i, got.offset(), got.chunks(), seals_[i].offset, seals_[i].chunks));
  }
  // A reader that started part-way counted only its own events: the counts and the serial output are the whole
  // trace's (a full read checks them).
  if (first_chunk_ > 0) return {};
  std::map<std::string, uint64_t> listed(f.events_by_kind().begin(), f.events_by_kind().end());
  std::map<std::string, uint64_t> counted;
  for (size_t kind = 0; kind < count_by_case_.size(); ++kind)
    if (count_by_case_[kind] != 0) counted[kind_name_of_case(kind)] = count_by_case_[kind];
  if (listed != counted) return corrupt("footer's events_by_kind disagrees with the events read");
  Sha256 serial = serial_sha_->finish();
  serial_sha_ = std::make_unique<Sha256Stream>();
  if (f.serial_output_bytes() != serial_bytes_ ||
      (!f.serial_output_sha256().empty() &&
       (f.serial_output_sha256().size() != 32 || std::memcmp(f.serial_output_sha256().data(), serial.data(), 32) != 0)))
    return corrupt("footer's serial output size/SHA-256 disagrees with the SerialOutput events read");
  return {};
}

}  // namespace deja
