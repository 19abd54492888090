// Checkpoint files that travel with a trace: sections, zstd-compressed pages and disk blocks, checksum and the checks that refuse a damaged or foreign file.
#include "snapshot/trace_checkpoint.h"

#include <zstd.h>

#include <cstring>
#include <fstream>
#include <iterator>

#include <fmt/format.h>

#include "core/guest_memory.h"
#include "devices/state_codec.h"
#include "logging/trace_format.h"

namespace deja {
namespace {

constexpr char kMagic[8] = {'D', 'E', 'J', 'A', 'T', 'C', 'K', 'P'};
constexpr size_t kSections = 7;
constexpr uint64_t kMaxStateSection = uint64_t{64} << 20;  // everything but RAM and disks
// A recording compresses its checkpoints on its own thread. A full one (all of RAM) at zstd level 1: level 3's last 9%
// of size cost 1.8 times the CPU (a Linux guest's 66 MiB of pages: level 1 4.14x at 242 MB/s, level 3 4.54x at
// 130 MB/s here). The pages changed since the one before (a few MiB) at level 3, which stores them 13-24% smaller.
constexpr int kFullCompressionLevel = 1;
constexpr int kIncrementalCompressionLevel = 3;

void put_le(std::vector<uint8_t>& out, uint64_t v, int n) {
  for (int i = 0; i < n; ++i) out.push_back(uint8_t(v >> (8 * i)));
}

void put_string(StateWriter& w, const std::string& s) {
  w.u32(uint32_t(s.size()));
  w.bytes(std::span(reinterpret_cast<const uint8_t*>(s.data()), s.size()));
}
std::string get_string(StateReader& r, uint32_t limit) {
  const uint32_t n = r.u32();
  if (n > limit) {
    r.invalid(fmt::format("a string of {} bytes (at most {})", n, limit));
    return {};
  }
  std::string s(n, '\0');
  r.bytes(std::span(reinterpret_cast<uint8_t*>(s.data()), n));
  return s;
}

// One zstd frame, written piece by piece.
class ZstdWriter {
 public:
  explicit ZstdWriter(int level) : cctx_(ZSTD_createCCtx()) {
    ZSTD_CCtx_setParameter(cctx_, ZSTD_c_compressionLevel, level);
  }
  ~ZstdWriter() { ZSTD_freeCCtx(cctx_); }
  void write(const void* data, size_t n) {
    raw_ += n;
    ZSTD_inBuffer in{data, n, 0};
    while (in.pos < in.size) pump(in, ZSTD_e_continue);
  }
  void u64(uint64_t v) {
    uint8_t b[8];
    trace_detail::put_u64(b, v);
    write(b, 8);
  }
  void u32(uint32_t v) {
    uint8_t b[4];
    trace_detail::put_u32(b, v);
    write(b, 4);
  }
  // The section: the raw length, then the frame.
  Result<std::vector<uint8_t>> finish() {
    ZSTD_inBuffer in{nullptr, 0, 0};
    while (pump(in, ZSTD_e_end) != 0) {
    }
    if (!error_.empty()) return fail(ErrorKind::kHost, "compressing a checkpoint failed: {}", error_);
    std::vector<uint8_t> out;
    put_le(out, raw_, 8);
    out.insert(out.end(), frame_.begin(), frame_.end());
    return out;
  }

 private:
  size_t pump(ZSTD_inBuffer& in, ZSTD_EndDirective mode) {
    uint8_t buffer[1 << 16];
    ZSTD_outBuffer out{buffer, sizeof buffer, 0};
    const size_t left = ZSTD_compressStream2(cctx_, &out, &in, mode);
    if (ZSTD_isError(left)) {
      if (error_.empty()) error_ = ZSTD_getErrorName(left);
      in.pos = in.size;
      return 0;
    }
    frame_.insert(frame_.end(), buffer, buffer + out.pos);
    return left;
  }
  ZSTD_CCtx* cctx_;
  std::vector<uint8_t> frame_;
  uint64_t raw_ = 0;
  std::string error_;
};

// Reads one section's zstd frame back exactly: the declared raw length, no more and no less.
class ZstdReader {
 public:
  explicit ZstdReader(std::span<const uint8_t> section) : dctx_(ZSTD_createDCtx()) {
    if (section.size() < 8) {
      error_ = "the section is shorter than its length field";
      return;
    }
    raw_left_ = trace_detail::get_u64(section.data());
    in_ = ZSTD_inBuffer{section.data() + 8, section.size() - 8, 0};
  }
  ~ZstdReader() { ZSTD_freeDCtx(dctx_); }
  uint64_t raw_left() const { return raw_left_; }
  bool read(void* data, size_t n) {
    if (!error_.empty()) return false;
    if (n > raw_left_) {
      error_ = "the section ends before its contents";
      return false;
    }
    ZSTD_outBuffer out{data, n, 0};
    while (out.pos < out.size) {
      const size_t before = out.pos;
      const size_t r = ZSTD_decompressStream(dctx_, &out, &in_);
      if (ZSTD_isError(r)) {
        error_ = ZSTD_getErrorName(r);
        return false;
      }
      frame_done_ = r == 0;
      if (out.pos == before && in_.pos == in_.size) {
        error_ = "the compressed data ends early";
        return false;
      }
    }
    raw_left_ -= n;
    return true;
  }
  bool u64(uint64_t& v) {
    uint8_t b[8];
    if (!read(b, 8)) return false;
    v = trace_detail::get_u64(b);
    return true;
  }
  bool u32(uint32_t& v) {
    uint8_t b[4];
    if (!read(b, 4)) return false;
    v = trace_detail::get_u32(b);
    return true;
  }
  // Everything declared was read and the frame is complete.
  Result<> finish(const std::string& what) {
    if (error_.empty() && raw_left_ != 0) error_ = fmt::format("{} bytes left over", raw_left_);
    if (error_.empty()) {
      // The frame's end (its last block header, its checksum) may still be unread: read on until zstd says the frame
      // is complete (once it has, another call would start a next frame), refusing any byte of content beyond the
      // declared length and anything after the frame.
      uint8_t extra;
      while (!frame_done_) {
        ZSTD_outBuffer out{&extra, 1, 0};
        const size_t before = in_.pos;
        const size_t r = ZSTD_decompressStream(dctx_, &out, &in_);
        if (ZSTD_isError(r) || out.pos != 0) {
          error_ = "the frame holds more than its declared length";
          break;
        }
        frame_done_ = r == 0;
        if (!frame_done_ && in_.pos == before) {
          error_ = "the frame does not end there";
          break;
        }
      }
      if (error_.empty() && in_.pos != in_.size) error_ = "bytes follow the frame";
    }
    if (!error_.empty()) return fail(ErrorKind::kBadTrace, "{}: {}", what, error_);
    return {};
  }
  const std::string& error() const { return error_; }

 private:
  ZSTD_DCtx* dctx_;
  ZSTD_inBuffer in_{nullptr, 0, 0};
  uint64_t raw_left_ = 0;
  bool frame_done_ = false;  // the last call to zstd ended the frame
  std::string error_;
};

std::vector<uint8_t> meta_section(const TraceCheckpointMeta& m) {
  StateWriter w("TCKM", 1);
  w.bytes(m.identity.trace_header_sha256);
  w.u64(m.identity.ram_bytes);
  put_string(w, m.identity.backend);
  w.u64(m.number);
  w.u64(m.parent);
  w.bytes(m.parent_digest);
  for (uint64_t v : {m.at.steps, m.at.events, m.at.branches, m.at.guest_exits, m.at.instructions}) w.u64(v);
  w.u64(m.next_raw_event);
  w.bytes(m.digest);
  w.u32(uint32_t(m.parts.size()));
  for (const auto& [name, digest] : m.parts) {
    put_string(w, name);
    w.bytes(digest);
  }
  return w.take();
}

Result<TraceCheckpointMeta> parse_meta(std::span<const uint8_t> bytes) {
  StateReader r(bytes, "TCKM", 1);
  TraceCheckpointMeta m;
  r.bytes(m.identity.trace_header_sha256);
  m.identity.ram_bytes = r.u64();
  m.identity.backend = get_string(r, 64);
  m.number = r.u64();
  m.parent = r.u64();
  r.bytes(m.parent_digest);
  for (uint64_t* v : {&m.at.steps, &m.at.events, &m.at.branches, &m.at.guest_exits, &m.at.instructions}) *v = r.u64();
  m.next_raw_event = r.u64();
  r.bytes(m.digest);
  const uint32_t parts = r.u32();
  if (parts > 4096) r.invalid("too many digest parts");
  for (uint32_t i = 0; i < parts && r.ok(); ++i) {
    std::string name = get_string(r, 256);
    StateSha digest{};
    r.bytes(digest);
    m.parts.emplace_back(std::move(name), digest);
  }
  if (r.ok() && (m.number == 0 || m.parent >= m.number)) r.invalid("its number and its parent's are out of order");
  if (auto done = r.finish(); !done) return std::unexpected(done.error());
  return m;
}

std::vector<uint8_t> devices_section(const MachineCheckpoint& cp) {
  StateWriter w("DEVS", 1);
  w.u32(uint32_t(cp.devices.size()));
  for (const auto& [name, blob] : cp.devices) {
    put_string(w, name);
    w.u64(blob.size());
    w.bytes(blob);
  }
  return w.take();
}

Result<> parse_devices(std::span<const uint8_t> bytes, MachineCheckpoint& cp) {
  StateReader r(bytes, "DEVS", 1);
  const uint32_t n = r.u32();
  if (n > 1024) r.invalid("too many devices");
  for (uint32_t i = 0; i < n && r.ok(); ++i) {
    std::string name = get_string(r, 256);
    const uint64_t length = r.u64();
    if (length > bytes.size()) {
      r.invalid(fmt::format("device {} claims {} bytes", name, length));
      break;
    }
    std::vector<uint8_t> blob(length);
    r.bytes(blob);
    cp.devices.emplace_back(std::move(name), std::move(blob));
  }
  return r.finish();
}

}  // namespace

Result<std::vector<uint8_t>> encode_trace_checkpoint(const TraceCheckpointSource& source) {
  const MachineCheckpoint& cp = *source.machine;
  const int level = source.meta.parent == 0 ? kFullCompressionLevel : kIncrementalCompressionLevel;
  ZstdWriter memory(level);
  memory.u64(source.meta.identity.ram_bytes / kPageSize);
  memory.u64(source.pages.size());
  for (uint64_t pfn : source.pages) {
    const uint8_t* bytes = source.page(pfn);
    memory.u64(pfn);
    const uint8_t present = bytes != nullptr;
    memory.write(&present, 1);
    if (bytes) memory.write(bytes, kPageSize);
  }
  ZstdWriter disks(level);
  disks.u32(uint32_t(source.disks.size()));
  std::vector<uint8_t> block;
  for (size_t d = 0; d < source.disks.size(); ++d) {
    const DiskCheckpoint& disk = source.disks[d];
    disks.u64(disk.state.size());
    disks.write(disk.state.data(), disk.state.size());
    disks.u64(disk.written.size());
    for (uint64_t b : disk.written) {
      if (auto r = source.block(d, b, block); !r) return std::unexpected(r.error());
      disks.u64(b);
      disks.u32(uint32_t(block.size()));
      disks.write(block.data(), block.size());
    }
    disks.u64(disk.verified.size());
    for (uint64_t b : disk.verified) disks.u64(b);
  }
  auto memory_z = memory.finish();
  if (!memory_z) return std::unexpected(memory_z.error());
  auto disks_z = disks.finish();
  if (!disks_z) return std::unexpected(disks_z.error());

  std::vector<uint8_t> out(std::begin(kMagic), std::end(kMagic));
  put_le(out, kTraceCheckpointVersion, 4);
  for (const std::vector<uint8_t>& section : {meta_section(source.meta), cp.cpu, cp.backend, devices_section(cp),
                                              cp.session, *memory_z, *disks_z}) {
    put_le(out, section.size(), 8);
    out.insert(out.end(), section.begin(), section.end());
  }
  const auto sum = sha256_bytes(out);
  out.insert(out.end(), sum.begin(), sum.end());
  return out;
}

Result<TraceCheckpointFile> read_trace_checkpoint(const std::string& path, const CheckpointIdentity& expected,
                                                  uint64_t max_bytes) {
  auto bad = [&](const std::string& what) {
    return std::unexpected(Error{ErrorKind::kBadTrace, fmt::format("checkpoint file {}: {}", path, what)});
  };
  std::ifstream in(path, std::ios::binary);
  if (!in) return fail(ErrorKind::kBadTrace, "cannot open checkpoint file {}: {}", path, std::strerror(errno));
  in.seekg(0, std::ios::end);
  const auto size = uint64_t(in.tellg());
  in.seekg(0);
  if (size > max_bytes) return bad(fmt::format("{} bytes, more than a checkpoint of this machine can hold", size));
  TraceCheckpointFile file;
  file.path = path;
  file.file_bytes = size;
  std::vector<uint8_t> data(size);
  if (!in.read(reinterpret_cast<char*>(data.data()), std::streamsize(size))) return bad("cannot read the whole file");
  if (size < sizeof kMagic + 4 + 32) return bad(fmt::format("truncated: {} bytes", size));
  if (std::memcmp(data.data(), kMagic, sizeof kMagic) != 0) return bad("not a deja trace checkpoint (bad magic)");
  const auto body = std::span<const uint8_t>(data).first(size - 32);
  if (std::memcmp(sha256_bytes(body).data(), data.data() + size - 32, 32) != 0) {
    return bad("checksum mismatch: the file is damaged or was cut short");
  }
  file.sha256 = sha256_bytes(data);
  const uint32_t version = trace_detail::get_u32(data.data() + sizeof kMagic);
  if (version != kTraceCheckpointVersion) {
    return bad(fmt::format("format version {}, this build reads version {}", version, kTraceCheckpointVersion));
  }
  std::span<const uint8_t> sections[kSections];
  size_t at = sizeof kMagic + 4;
  for (size_t i = 0; i < kSections; ++i) {
    if (body.size() - at < 8) return bad(fmt::format("section {} is missing", i));
    const uint64_t length = trace_detail::get_u64(body.data() + at);
    at += 8;
    if (length > body.size() - at) return bad(fmt::format("section {} runs past the end of the file", i));
    sections[i] = body.subspan(at, length);
    at += length;
  }
  if (at != body.size()) return bad(fmt::format("{} bytes follow the last section", body.size() - at));
  for (size_t i = 0; i < 5; ++i) {
    if (sections[i].size() > kMaxStateSection) return bad(fmt::format("section {} is larger than any state", i));
  }
  auto meta = parse_meta(sections[0]);
  if (!meta) return bad("META section: " + meta.error().message);
  file.meta = std::move(*meta);
  const CheckpointIdentity& got = file.meta.identity;
  if (got.trace_header_sha256 != expected.trace_header_sha256) {
    return bad(fmt::format("it belongs to another trace (trace header {}, this trace {})",
                           hex(got.trace_header_sha256).substr(0, 16), hex(expected.trace_header_sha256).substr(0, 16)));
  }
  if (got.ram_bytes != expected.ram_bytes) {
    return bad(fmt::format("it holds {} bytes of RAM, this machine has {}", got.ram_bytes, expected.ram_bytes));
  }
  if (got.backend != expected.backend) {
    return bad(fmt::format("it was taken on the {} backend, this replay runs on {}", got.backend, expected.backend));
  }
  file.machine.at = file.meta.at;
  file.machine.cpu.assign(sections[1].begin(), sections[1].end());
  file.machine.backend.assign(sections[2].begin(), sections[2].end());
  if (auto devices = parse_devices(sections[3], file.machine); !devices) {
    return bad("DEVS section: " + devices.error().message);
  }
  file.machine.session.assign(sections[4].begin(), sections[4].end());
  if (file.machine.cpu.empty()) return bad("the CPU section is empty");
  file.memory_z.assign(sections[5].begin(), sections[5].end());
  file.disks_z.assign(sections[6].begin(), sections[6].end());
  return file;
}

Result<> apply_checkpoint_pages(const TraceCheckpointFile& file, uint64_t page_count,
                                const std::function<void(uint64_t pfn, const uint8_t* bytes)>& page) {
  const std::string what = fmt::format("checkpoint file {}: MEMZ section", file.path);
  ZstdReader z(file.memory_z);
  uint64_t pages = 0, count = 0;
  if (!z.u64(pages) || !z.u64(count)) return z.finish(what);
  if (pages != page_count || count > page_count) {
    return fail(ErrorKind::kBadTrace, "{} describes {} pages of RAM ({} stored); this machine has {}", what, pages,
                count, page_count);
  }
  std::vector<uint8_t> bytes(kPageSize);
  uint64_t previous = 0;
  for (uint64_t i = 0; i < count; ++i) {
    uint64_t pfn = 0;
    uint8_t present = 0;
    if (!z.u64(pfn) || !z.read(&present, 1)) break;
    if (pfn >= page_count || (i > 0 && pfn <= previous) || present > 1) {
      return fail(ErrorKind::kBadTrace, "{}: page {} is out of range or order", what, pfn);
    }
    previous = pfn;
    if (present && !z.read(bytes.data(), kPageSize)) break;
    page(pfn, present ? bytes.data() : nullptr);
  }
  return z.finish(what);
}

Result<> apply_checkpoint_disks(const TraceCheckpointFile& file, size_t disk_count, const DiskCheckpointSink& sink) {
  const std::string what = fmt::format("checkpoint file {}: DSKZ section", file.path);
  ZstdReader z(file.disks_z);
  uint32_t disks = 0;
  if (!z.u32(disks)) return z.finish(what);
  if (disks != disk_count) {
    return fail(ErrorKind::kBadTrace, "{} holds {} disks, this machine has {}", what, disks, disk_count);
  }
  std::vector<uint8_t> bytes;
  for (size_t d = 0; d < disks; ++d) {
    uint64_t length = 0;
    if (!z.u64(length)) break;
    if (length > kMaxStateSection || length > z.raw_left()) break;
    bytes.resize(length);
    if (!z.read(bytes.data(), length)) break;
    if (auto r = sink.state(d, bytes); !r) return r;
    uint64_t written = 0;
    if (!z.u64(written)) break;
    for (uint64_t i = 0; i < written; ++i) {
      uint64_t block = 0;
      uint32_t n = 0;
      if (!z.u64(block) || !z.u32(n)) break;
      if (n > 4096 || n > z.raw_left()) return fail(ErrorKind::kBadTrace, "{}: block {} claims {} bytes", what, block, n);
      bytes.resize(n);
      if (!z.read(bytes.data(), n)) break;
      if (auto r = sink.block(d, block, bytes); !r) return r;
    }
    uint64_t verified = 0;
    if (!z.u64(verified)) break;
    for (uint64_t i = 0; i < verified; ++i) {
      uint64_t block = 0;
      if (!z.u64(block)) break;
      if (auto r = sink.verified(d, block); !r) return r;
    }
  }
  return z.finish(what);
}

}  // namespace deja
