// TraceReader: validates the preamble and header, then walks frames front to back checking the hash chain.
#include "logging/trace_reader.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <google/protobuf/util/message_differencer.h>
#include <zstd.h>

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

Result<> TraceReader::read_at(uint64_t offset, void* data, size_t size) {
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
  r->chain_ = r->header_sha256_ = digest;
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
                             in_footer_ ? std::string("the footer") : fmt::format("chunk {}", chunks_.size()), offset_,
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
    return fmt::format("trace complete: {} chunks, {} events, footer at byte {}, {} bytes verified", chunks_.size(),
                       events_read_, trailer_footer_offset_, valid_end_);
  if (truncated_) {
    std::string where = chunks_.empty() ? std::string("the header") : fmt::format("chunk {}", chunks_.size() - 1);
    return fmt::format("trace ends after {} (event {}) at byte {}: {} — recording was interrupted", where, events_read_,
                       valid_end_, end_why_);
  }
  return fmt::format("reading: {} chunks, {} events so far, at byte {}", chunks_.size(), events_read_, valid_end_);
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
      if (!event.ParseFromArray(p, static_cast<int>(length)))
        return corrupt(fmt::format("event {} is not a valid Event protobuf", events_read_));
      raw_pos_ = static_cast<size_t>(p - raw_.data()) + length;
      --chunk_remaining_;
      trace::ChunkIndex& entry = chunks_.back();
      if (!entry.has_first_at()) {
        if (const trace::Coordinate* c = event_coordinate(event)) *entry.mutable_first_at() = *c;
      }
      ++events_read_;
      size_t kind = static_cast<size_t>(event.kind_case());
      if (kind >= count_by_case_.size()) count_by_case_.resize(kind + 1);
      ++count_by_case_[kind];
      if (event.has_serial_output()) {
        serial_sha_->update(event.serial_output().data().data(), event.serial_output().data().size());
        serial_bytes_ += event.serial_output().data().size();
      }
      return std::optional<trace::Event>(std::move(event));
    }
    if (ended_) return std::optional<trace::Event>();
    if (auto r = load_next_frame(); !r) return std::unexpected(r.error());
  }
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
  const uint32_t raw = get_u32(frame + 8);
  const uint32_t count = get_u32(frame + 12);
  if (raw > kMaxChunkRawBytes)
    return corrupt(fmt::format("raw length {} exceeds the {} byte chunk limit", raw, kMaxChunkRawBytes));
  if (stored > ZSTD_compressBound(raw))
    return corrupt(fmt::format("compressed length {} is impossible for raw length {}", stored, raw));
  if (count == 0 || count > raw) return corrupt(fmt::format("event count {} is impossible for raw length {}", count, raw));
  if (stored > remaining - kFrameHeaderBytes) {
    if (has_trailer_) return corrupt(fmt::format("chunk of {} bytes runs past the end of a file that has a trailer", stored));
    end_truncated(fmt::format("truncated chunk frame ({} of {} payload bytes present)", remaining - kFrameHeaderBytes,
                              stored));
    return {};
  }
  compressed_.resize(stored);
  if (auto r = read_at(offset_ + kFrameHeaderBytes, compressed_.data(), stored); !r) return r;
  Sha256 chain = chain_next(chain_, std::span(frame, kFrameFieldBytes), compressed_);
  if (std::memcmp(chain.data(), frame + kFrameFieldBytes, 32) != 0)
    return corrupt("hash chain mismatch: the chunk was altered, or chunks were removed or reordered",
                   TraceCheck::kChain);
  raw_.resize(raw);
  size_t n = ZSTD_decompressDCtx(dctx_, raw_.data(), raw_.size(), compressed_.data(), compressed_.size());
  if (ZSTD_isError(n)) return corrupt(fmt::format("zstd decompression failed: {}", ZSTD_getErrorName(n)));
  if (n != raw) return corrupt(fmt::format("decompressed to {} bytes but the frame says {}", n, raw));
  // Check the length-delimited framing up front so a chunk is either wholly usable or rejected before any event.
  const uint8_t* p = raw_.data();
  const uint8_t* end = p + raw_.size();
  uint32_t framed = 0;
  while (p < end) {
    uint64_t length = 0;
    if (!read_varint(p, end, length) || length > static_cast<uint64_t>(end - p))
      return corrupt(fmt::format("event {} of the chunk has a bad length prefix", framed));
    p += length;
    ++framed;
  }
  if (framed != count) return corrupt(fmt::format("chunk holds {} events but its frame says {}", framed, count));

  trace::ChunkIndex entry;
  entry.set_offset(offset_);
  entry.set_first_event(events_read_);
  entry.set_events(count);
  entry.set_chain(chain.data(), chain.size());
  chunks_.push_back(entry);
  chain_ = chain;
  offset_ += kFrameHeaderBytes + stored;
  valid_end_ = offset_;
  raw_pos_ = 0;
  chunk_remaining_ = count;
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
  if (chunk_count != chunks_.size())
    return corrupt(fmt::format("footer frame counts {} chunks but {} were read", chunk_count, chunks_.size()));
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
  if (chunk_count != chunks_.size())
    return corrupt(fmt::format("seal frame says it follows {} chunks but {} were read", chunk_count, chunks_.size()));
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

Result<> TraceReader::check_footer_against_stream() {
  const trace::Footer& f = *footer_;
  if (f.total_events() != events_read_)
    return corrupt(fmt::format("footer says {} events but {} were read", f.total_events(), events_read_));
  if (static_cast<size_t>(f.chunks_size()) != chunks_.size())
    return corrupt(fmt::format("footer index lists {} chunks but {} were read", f.chunks_size(), chunks_.size()));
  for (size_t i = 0; i < chunks_.size(); ++i) {
    const trace::ChunkIndex& want = chunks_[i];
    const trace::ChunkIndex& got = f.chunks(static_cast<int>(i));
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
  if (static_cast<size_t>(f.seals_size()) != seals_.size())
    return corrupt(fmt::format("footer lists {} seal frames but {} were read", f.seals_size(), seals_.size()));
  for (size_t i = 0; i < seals_.size(); ++i) {
    const trace::SealIndex& got = f.seals(static_cast<int>(i));
    if (got.offset() != seals_[i].offset || got.chunks() != seals_[i].chunks)
      return corrupt(fmt::format("footer entry for seal {} (byte {}, after {} chunks) disagrees with the seal frame "
                                 "read (byte {}, after {} chunks)",
                                 i, got.offset(), got.chunks(), seals_[i].offset, seals_[i].chunks));
  }
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
