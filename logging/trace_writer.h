// Writes a trace file: magic, header, hash-chained zstd chunks of events, footer index and trailer.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "logging/output_file.h"
#include "logging/trace_format.h"

typedef struct ZSTD_CCtx_s ZSTD_CCtx;

namespace deja {

class SigningKey;

// When a signing recorder seals (format 6): every `interval` of wall time, or every `chunks` chunk frames (0: not
// by count), after the chunk that makes it due; and once more before the footer.
struct SealPolicy {
  std::chrono::nanoseconds interval = std::chrono::seconds(10);
  uint64_t chunks = 0;
};

// Only the current chunk is buffered, so memory stays bounded however long the recording runs; every sealed
// chunk is on disk (write(2)) before append() returns, so a killed recorder leaves a readable prefix.
class TraceWriter {
 public:
  // Creates `path` (mode 0600; it must not exist: never a symlink, a device or someone's file) and writes
  // magic + header. Fails clearly (path + errno text). A header that would not parse back (text that is not
  // UTF-8) is refused: a trace must always be readable.
  static Result<std::unique_ptr<TraceWriter>> create(const std::string& path, const trace::Header& header);
  // Writes to `path`.partial (created as above) and renames it over `path` when finish() succeeds, so an old
  // trace at `path` survives a recording that fails or is killed part-way, whose prefix stays in the .partial
  // file. `path`, when it exists, must be a regular file.
  static Result<std::unique_ptr<TraceWriter>> create_replacing(const std::string& path, const trace::Header& header);
  static std::string partial_path(const std::string& path) { return path + ".partial"; }
  // Whether the file being written is still the one this writer created, whole; the error says what became of it
  // (removed, replaced by another file, changed, its directory removed or moved).
  Result<> check_intact() const { return file_->check_intact(); }
  ~TraceWriter();
  TraceWriter(const TraceWriter&) = delete;
  TraceWriter& operator=(const TraceWriter&) = delete;

  // Buffers; a chunk is sealed and written when its raw size reaches chunk_bytes or flush_interval has passed.
  Result<> append(const trace::Event& event);
  // Seals the current chunk now (no-op when empty).
  Result<> flush();
  // Seals, fills footer.chunks / events_by_kind / total_events / serial_output_* itself, writes footer + trailer,
  // closes the file.
  Result<> finish(trace::Footer footer);

  uint64_t events_written() const { return events_written_; }
  // The file being written (the .partial one until finish() renamed it).
  const std::string& path() const { return file_->path(); }
  uint64_t chunks_written() const { return index_.size() - (chunk_events_ > 0 ? 1 : 0); }
  void set_chunk_bytes(size_t n) { chunk_bytes_ = n == 0 ? 1 : n; }
  void set_flush_interval(std::chrono::nanoseconds interval) { flush_interval_ = interval; }
  // fdatasync after each chunk: survives a host crash, not just a killed recorder; costs a disk flush per chunk.
  void set_sync(bool sync) { sync_ = sync; }
  void set_compression_level(int level) { compression_level_ = level; }
  // Signs the chain value into a seal frame as `policy` says (docs/trace-format.md, "Seal frames"); the header
  // must name `key` as its signer. Also hashes the file as it is written (file_sha256()).
  Result<> set_sealing(std::shared_ptr<const SigningKey> key, SealPolicy policy);

  // What a signature of the finished file states, without reading it again.
  const Sha256& header_sha256() const { return header_sha256_; }
  const Sha256& chain_value() const { return chain_; }
  uint64_t bytes_written() const { return file_->bytes_written(); }
  uint64_t seals_written() const { return seals_.size(); }
  // SHA-256 of every byte written; with sealing only, after finish().
  std::optional<Sha256> file_sha256() const { return file_sha256_; }

 private:
  explicit TraceWriter(std::unique_ptr<ProductFile> file);
  // Writes magic and header to `file`, just created.
  static Result<std::unique_ptr<TraceWriter>> start(std::unique_ptr<ProductFile> file, const std::string& header_bytes);
  Result<> write_all(const void* data, size_t size);
  Result<> seal();
  Result<> write_seal_frame();

  std::unique_ptr<ProductFile> file_;  // logging/output_file.h: how deja writes a product
  Sha256 chain_{};
  Sha256 header_sha256_{};
  std::string signer_key_id_;  // from the header
  bool failed_ = false;
  bool finished_ = false;
  bool sync_ = false;
  // zstd level 6: on the events of a Linux trace (coordinates, port reads) 12% smaller than level 3 in 64 KiB chunks,
  // and no smaller at 9 or 19; it compresses 30 MB/s of incompressible frames on these machines, a 1.5% cost for an
  // 8 MiB download.
  int compression_level_ = 6;
  size_t chunk_bytes_ = kDefaultChunkBytes;
  std::chrono::nanoseconds flush_interval_ = std::chrono::seconds(1);
  std::chrono::steady_clock::time_point last_seal_;

  std::string raw_;  // length-delimited events of the open chunk
  uint32_t chunk_events_ = 0;
  bool chunk_has_coordinate_ = false;
  trace::Coordinate chunk_first_at_;
  std::vector<uint8_t> compressed_;
  ZSTD_CCtx* cctx_ = nullptr;

  uint64_t events_written_ = 0;
  std::vector<trace::ChunkIndex> index_;  // one small entry per chunk, needed for the footer
  std::vector<uint64_t> count_by_case_;  // indexed by Event::kind_case(); named only when compared/written
  trace_detail::Sha256Stream serial_sha_;
  uint64_t serial_bytes_ = 0;

  std::shared_ptr<const SigningKey> seal_key_;
  SealPolicy seal_policy_;
  std::chrono::steady_clock::time_point last_seal_frame_;
  std::vector<trace::SealIndex> seals_;
  std::unique_ptr<trace_detail::Sha256Stream> file_sha_;
  std::optional<Sha256> file_sha256_;
};

}  // namespace deja
