// TraceWriter: frames events into hash-chained zstd chunks and writes them with write(2) as they fill.
#include "logging/trace_writer.h"

#include "logging/output_file.h"
#include "logging/signing.h"
#include "logging/trace_signature.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <zstd.h>

namespace deja {

using namespace trace_detail;

namespace {

void append_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

}  // namespace

TraceWriter::TraceWriter(std::unique_ptr<ProductFile> file)
    : file_(std::move(file)), last_seal_(std::chrono::steady_clock::now()), cctx_(ZSTD_createCCtx()),
      file_sha_(std::make_unique<Sha256Stream>()) {}

TraceWriter::~TraceWriter() {
  // An abandoned writer (error unwinding in the caller) still leaves every appended event readable:
  // the result is a valid truncated trace, exactly as if the recorder had been killed after this chunk.
  if (!finished_ && !failed_) (void)seal();
  ZSTD_freeCCtx(cctx_);
}

namespace {

// The header as the trace will hold it, refused before any file is made when it would not read back.
Result<std::string> serialize_header(const std::string& path, const trace::Header& header) {
  trace::Header h = header;
  h.set_format_version(kTraceFormatVersion);
  std::string header_bytes;
  if (!h.SerializeToString(&header_bytes))
    return fail(ErrorKind::kInvalidArgument, "cannot serialize the trace header for {}", path);
  if (header_bytes.size() > kMaxHeaderBytes)
    return fail(ErrorKind::kInvalidArgument, "trace header for {} is {} bytes, over the {} byte limit", path,
                header_bytes.size(), kMaxHeaderBytes);

  if (trace::Header check; !check.ParseFromString(header_bytes))
    return fail(ErrorKind::kInvalidArgument,
                "the trace header for {} would not be readable (a text field, such as the command line or a file "
                "name, is not valid UTF-8)",
                path);
  return header_bytes;
}

}  // namespace

Result<std::unique_ptr<TraceWriter>> TraceWriter::create(const std::string& path, const trace::Header& header) {
  auto header_bytes = serialize_header(path, header);
  if (!header_bytes) return std::unexpected(header_bytes.error());
  auto file = ProductFile::create_new(path, "trace");
  if (!file) return std::unexpected(file.error());
  return start(std::move(*file), *header_bytes);
}

Result<std::unique_ptr<TraceWriter>> TraceWriter::start(std::unique_ptr<ProductFile> file,
                                                        const std::string& header_bytes) {
  std::unique_ptr<TraceWriter> writer(new TraceWriter(std::move(file)));
  if (writer->cctx_ == nullptr) return fail(ErrorKind::kHost, "cannot allocate a zstd compression context");

  std::string preamble(kFileMagic);
  uint8_t word[4];
  put_u32(word, kTraceFormatVersion);
  preamble.append(reinterpret_cast<const char*>(word), 4);
  put_u32(word, static_cast<uint32_t>(header_bytes.size()));
  preamble.append(reinterpret_cast<const char*>(word), 4);
  preamble += header_bytes;
  auto header_span = std::span(reinterpret_cast<const uint8_t*>(header_bytes.data()), header_bytes.size());
  writer->chain_ = writer->header_sha256_ = sha256_bytes(header_span);
  if (trace::Header h; h.ParseFromString(header_bytes)) writer->signer_key_id_ = h.signer().key_id();
  preamble.append(reinterpret_cast<const char*>(writer->chain_.data()), writer->chain_.size());
  if (auto r = writer->write_all(preamble.data(), preamble.size()); !r) return std::unexpected(r.error());
  return writer;
}

Result<std::unique_ptr<TraceWriter>> TraceWriter::create_replacing(const std::string& path, const trace::Header& header) {
  auto header_bytes = serialize_header(path, header);
  if (!header_bytes) return std::unexpected(header_bytes.error());
  // A trace cut short keeps its prefix in the .partial file: it replays up to there.
  auto file = ProductFile::create_replacing(path, "trace", ProductFile::Unfinished::kKeep);
  if (!file) return std::unexpected(file.error());
  return start(std::move(*file), *header_bytes);
}

Result<> TraceWriter::write_all(const void* data, size_t size) {
  // Every byte of the file passes here: its SHA-256 for a signature costs no second read (about 1.6 GB/s here).
  file_sha_->update(data, size);
  auto r = file_->write(std::span(static_cast<const uint8_t*>(data), size));
  if (!r) failed_ = true;
  return r;
}

Result<> TraceWriter::append(const trace::Event& event) {
  if (finished_) return fail(ErrorKind::kInvalidArgument, "trace {} is already finished; cannot append", path());
  if (failed_) return fail(ErrorKind::kHost, "trace {} had a write error earlier; cannot append", path());
  size_t size = event.ByteSizeLong();
  if (size + 10 > kMaxChunkRawBytes)
    return fail(ErrorKind::kInvalidArgument, "{} event of {} bytes is too large for a trace chunk (limit {})",
                event_kind_name(event), size, kMaxChunkRawBytes - 10);
  if (raw_.size() + size + 10 > kMaxChunkRawBytes) {
    if (auto r = seal(); !r) return r;
  }
  append_varint(raw_, size);
  size_t at = raw_.size();
  raw_.resize(at + size);
  if (!event.SerializeToArray(raw_.data() + at, static_cast<int>(size)))
    return fail(ErrorKind::kInvalidArgument, "cannot serialize {} event", event_kind_name(event));

  if (chunk_events_ == 0) {
    trace::ChunkIndex entry;
    entry.set_first_event(events_written_);
    index_.push_back(entry);  // offset/events are filled when the chunk is sealed
  }
  if (!chunk_has_coordinate_) {
    if (const trace::Coordinate* c = event_coordinate(event)) {
      chunk_first_at_ = *c;
      chunk_has_coordinate_ = true;
    }
  }
  ++chunk_events_;
  ++events_written_;
  size_t kind = static_cast<size_t>(event.kind_case());
  if (kind >= count_by_case_.size()) count_by_case_.resize(kind + 1);
  ++count_by_case_[kind];
  if (event.has_serial_output()) {
    serial_sha_.update(event.serial_output().data().data(), event.serial_output().data().size());
    serial_bytes_ += event.serial_output().data().size();
  }

  if (raw_.size() >= chunk_bytes_ || std::chrono::steady_clock::now() - last_seal_ >= flush_interval_) return seal();
  return {};
}

Result<> TraceWriter::flush() {
  if (finished_ || failed_) return {};
  return seal();
}

Result<> TraceWriter::seal() {
  last_seal_ = std::chrono::steady_clock::now();
  if (chunk_events_ == 0) return {};
  compressed_.resize(ZSTD_compressBound(raw_.size()));
  size_t n = ZSTD_compressCCtx(cctx_, compressed_.data(), compressed_.size(), raw_.data(), raw_.size(),
                               compression_level_);
  if (ZSTD_isError(n)) {
    failed_ = true;
    return fail(ErrorKind::kHost, "zstd compression of a trace chunk for {} failed: {}", path(), ZSTD_getErrorName(n));
  }
  uint8_t frame[kFrameHeaderBytes];
  put_u32(frame + 0, kChunkFrameMagic);
  put_u32(frame + 4, static_cast<uint32_t>(n));
  put_u32(frame + 8, static_cast<uint32_t>(raw_.size()));
  put_u32(frame + 12, chunk_events_);
  chain_ = chain_next(chain_, std::span(frame, kFrameFieldBytes), std::span(compressed_.data(), n));
  std::memcpy(frame + kFrameFieldBytes, chain_.data(), chain_.size());

  trace::ChunkIndex& entry = index_.back();
  entry.set_offset(file_->bytes_written());
  entry.set_events(chunk_events_);
  entry.set_chain(chain_.data(), chain_.size());
  if (chunk_has_coordinate_) *entry.mutable_first_at() = chunk_first_at_;

  if (auto r = write_all(frame, sizeof frame); !r) return r;
  if (auto r = write_all(compressed_.data(), n); !r) return r;
  if (sync_) {
    if (auto r = file_->sync(); !r) {
      failed_ = true;
      return r;
    }
  }
  raw_.clear();
  // A huge event once must not pin a huge buffer for the rest of the recording.
  if (raw_.capacity() > 4 * chunk_bytes_ + 4096) raw_.shrink_to_fit();
  if (compressed_.capacity() > 4 * chunk_bytes_ + 4096) {
    compressed_.clear();
    compressed_.shrink_to_fit();
  }
  chunk_events_ = 0;
  chunk_has_coordinate_ = false;
  chunk_first_at_.Clear();
  if (seal_key_) {
    const uint64_t chunks = index_.size();
    const uint64_t since = chunks - (seals_.empty() ? 0 : seals_.back().chunks());
    const bool by_time = seal_policy_.interval.count() > 0 &&
                         last_seal_ - last_seal_frame_ >= seal_policy_.interval;
    if (by_time || (seal_policy_.chunks > 0 && since >= seal_policy_.chunks)) return write_seal_frame();
  }
  return {};
}

Result<> TraceWriter::set_sealing(std::shared_ptr<const SigningKey> key, SealPolicy policy) {
  if (!key || key->id() != signer_key_id_)
    return fail(ErrorKind::kInvalidArgument, "trace {}: the header names signer {} but the seals would be signed by {}",
                path(), signer_key_id_.empty() ? "none" : signer_key_id_, key ? key->id() : "no key");
  seal_key_ = std::move(key);
  seal_policy_ = policy;
  last_seal_frame_ = std::chrono::steady_clock::now();
  return {};
}

Result<> TraceWriter::write_seal_frame() {
  last_seal_frame_ = std::chrono::steady_clock::now();
  SealClaims claims;
  claims.sequence = seals_.size();
  claims.chunks = index_.size();
  claims.events = events_written_ - chunk_events_;
  claims.end_offset = file_->bytes_written();
  claims.chain = chain_;
  claims.header_sha256 = header_sha256_;
  claims.sealed_at_unix_ns = now_unix_ns();
  std::string envelope = DsseEnvelope::sign(*seal_key_, std::string(kSealPayloadType), seal_payload(claims)).to_json();
  if (envelope.size() > kMaxSealBytes)
    return fail(ErrorKind::kInvalidArgument, "a seal of {} bytes is over the {} byte limit", envelope.size(), kMaxSealBytes);
  uint8_t frame[kFrameHeaderBytes];
  put_u32(frame + 0, kSealFrameMagic);
  put_u32(frame + 4, static_cast<uint32_t>(envelope.size()));
  put_u32(frame + 8, static_cast<uint32_t>(envelope.size()));
  put_u32(frame + 12, static_cast<uint32_t>(index_.size()));
  std::memcpy(frame + kFrameFieldBytes, chain_.data(), chain_.size());
  trace::SealIndex entry;
  entry.set_offset(file_->bytes_written());
  entry.set_chunks(index_.size());
  if (auto r = write_all(frame, sizeof frame); !r) return r;
  if (auto r = write_all(envelope.data(), envelope.size()); !r) return r;
  seals_.push_back(entry);
  return {};
}

Result<> TraceWriter::finish(trace::Footer footer) {
  if (finished_) return fail(ErrorKind::kInvalidArgument, "trace {} is already finished", path());
  if (failed_) return fail(ErrorKind::kHost, "trace {} had a write error earlier; cannot finish it", path());
  if (auto r = seal(); !r) return r;
  // The last chunks are sealed too, so the seals alone authenticate every event.
  if (seal_key_ && !index_.empty() && (seals_.empty() || seals_.back().chunks() != index_.size())) {
    if (auto r = write_seal_frame(); !r) return r;
  }

  footer.clear_chunks();
  for (const auto& entry : index_) *footer.add_chunks() = entry;
  footer.clear_events_by_kind();
  for (size_t kind = 0; kind < count_by_case_.size(); ++kind) {
    if (count_by_case_[kind] == 0) continue;
    (*footer.mutable_events_by_kind())[kind_name_of_case(kind)] = count_by_case_[kind];
  }
  footer.set_total_events(events_written_);
  Sha256 serial = serial_sha_.finish();
  footer.set_serial_output_sha256(serial.data(), serial.size());
  footer.set_serial_output_bytes(serial_bytes_);
  footer.clear_seals();
  for (const auto& entry : seals_) *footer.add_seals() = entry;

  std::string bytes;
  // Deterministic so the same recording always produces the same file bytes (map order is otherwise unspecified).
  {
    google::protobuf::io::StringOutputStream stream(&bytes);
    google::protobuf::io::CodedOutputStream coded(&stream);
    coded.SetSerializationDeterministic(true);
    if (!footer.SerializeToCodedStream(&coded))
      return fail(ErrorKind::kInvalidArgument, "cannot serialize the trace footer for {}", path());
  }
  if (bytes.size() > kMaxFooterBytes)
    return fail(ErrorKind::kInvalidArgument, "trace footer for {} is {} bytes, over the {} byte limit", path(),
                bytes.size(), kMaxFooterBytes);

  uint64_t footer_offset = file_->bytes_written();
  uint8_t frame[kFrameHeaderBytes];
  put_u32(frame + 0, kFooterFrameMagic);
  put_u32(frame + 4, static_cast<uint32_t>(bytes.size()));
  put_u32(frame + 8, static_cast<uint32_t>(bytes.size()));
  put_u32(frame + 12, static_cast<uint32_t>(index_.size()));
  auto payload = std::span(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  chain_ = chain_next(chain_, std::span(frame, kFrameFieldBytes), payload);
  std::memcpy(frame + kFrameFieldBytes, chain_.data(), chain_.size());
  if (auto r = write_all(frame, sizeof frame); !r) return r;
  if (auto r = write_all(bytes.data(), bytes.size()); !r) return r;

  uint8_t trailer[kTrailerBytes];
  std::memcpy(trailer, kTrailerMagic.data(), 8);
  put_u64(trailer + 8, footer_offset);
  std::memcpy(trailer + 16, chain_.data(), chain_.size());
  if (auto r = write_all(trailer, sizeof trailer); !r) return r;
  file_sha256_ = file_sha_->finish();

  finished_ = true;
  if (sync_) {
    if (auto r = file_->sync(); !r) return r;
  }
  return file_->commit();
}

}  // namespace deja
