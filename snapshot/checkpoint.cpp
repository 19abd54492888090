// Checkpoint files: sections, checksum, and the checks that refuse a damaged or mismatched file.
#include "snapshot/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <iterator>

#include <fmt/format.h>

#include "logging/output_file.h"
#include "logging/trace_format.h"

namespace deja {
namespace {

constexpr char kMagic[8] = {'D', 'E', 'J', 'A', 'C', 'K', 'P', 'T'};
// Every section but the memory holds machine state (registers, devices, the session): well under this.
constexpr uint64_t kMaxStateSection = uint64_t{64} << 20;

void put_u32(std::vector<uint8_t>& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(uint8_t(v >> (8 * i)));
}
void put_u64(std::vector<uint8_t>& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(uint8_t(v >> (8 * i)));
}
void put_bytes(std::vector<uint8_t>& out, std::span<const uint8_t> b) { out.insert(out.end(), b.begin(), b.end()); }
void put_string(std::vector<uint8_t>& out, const std::string& s) {
  put_u32(out, uint32_t(s.size()));
  out.insert(out.end(), s.begin(), s.end());
}

// Bounds-checked cursor over a section; the first failure sticks.
class Cursor {
 public:
  explicit Cursor(std::span<const uint8_t> data) : data_(data) {}
  bool ok() const { return ok_; }
  bool at_end() const { return pos_ == data_.size(); }
  uint64_t le(int n) {
    if (!ok_ || data_.size() - pos_ < size_t(n)) {
      ok_ = false;
      return 0;
    }
    uint64_t v = 0;
    for (int i = 0; i < n; ++i) v |= uint64_t(data_[pos_ + i]) << (8 * i);
    pos_ += n;
    return v;
  }
  uint32_t u32() { return uint32_t(le(4)); }
  uint64_t u64() { return le(8); }
  std::span<const uint8_t> bytes(uint64_t n) {
    if (!ok_ || data_.size() - pos_ < n) {
      ok_ = false;
      return {};
    }
    auto out = data_.subspan(pos_, n);
    pos_ += n;
    return out;
  }
  std::string str(uint64_t limit) {
    uint32_t n = u32();
    if (n > limit) ok_ = false;
    auto b = bytes(n);
    return std::string(b.begin(), b.end());
  }

 private:
  std::span<const uint8_t> data_;
  size_t pos_ = 0;
  bool ok_ = true;
};

std::vector<uint8_t> meta_section(const CheckpointIdentity& id, const CheckpointPosition& at) {
  std::vector<uint8_t> out;
  put_bytes(out, id.trace_header_sha256);
  put_u64(out, id.ram_bytes);
  put_string(out, id.backend);
  for (uint64_t v : {at.steps, at.events, at.branches, at.guest_exits, at.instructions}) put_u64(out, v);
  return out;
}

std::string hex_prefix(std::span<const uint8_t> b) {
  std::string s;
  for (size_t i = 0; i < std::min<size_t>(b.size(), 8); ++i) s += fmt::format("{:02x}", b[i]);
  return s;
}

}  // namespace

uint64_t MachineCheckpoint::state_bytes() const {
  uint64_t n = cpu.size() + backend.size() + session.size() + sizeof(*this);
  for (const Vcpu& v : more_vcpus) n += v.cpu.size() + v.backend.size() + sizeof(v);
  for (const auto& [name, blob] : devices) n += name.size() + blob.size();
  return n;
}

namespace {

// Writes a checkpoint file through a 1 MiB buffer, hashing every byte, so that saving costs no copy of the memory.
class StreamWriter {
 public:
  explicit StreamWriter(ProductFile& file) : file_(file) { buffer_.reserve(kBuffer); }
  void put(std::span<const uint8_t> bytes) {
    sha_.update(bytes.data(), bytes.size());
    if (!ok_) return;
    if (buffer_.size() + bytes.size() > kBuffer) flush();
    if (bytes.size() >= kBuffer) {
      write(bytes);
    } else {
      buffer_.insert(buffer_.end(), bytes.begin(), bytes.end());
    }
  }
  void put_le(uint64_t v, size_t n) {
    uint8_t b[8];
    for (size_t i = 0; i < n; ++i) b[i] = uint8_t(v >> (8 * i));
    put(std::span(b, n));
  }
  void put_u32(uint32_t v) { put_le(v, 4); }
  void put_u64(uint64_t v) { put_le(v, 8); }
  void section(const char (&tag)[5], uint64_t length) {
    put(std::span(reinterpret_cast<const uint8_t*>(tag), 4));
    put_u64(length);
  }
  // Appends the SHA-256 of everything before it and flushes.
  Result<> finish() {
    const auto sum = sha_.finish();
    buffer_.insert(buffer_.end(), sum.begin(), sum.end());
    flush();
    if (!ok_) return std::unexpected(error_);
    return {};
  }

 private:
  static constexpr size_t kBuffer = 1 << 20;
  void flush() {
    write(buffer_);
    buffer_.clear();
  }
  void write(std::span<const uint8_t> bytes) {
    if (!ok_ || bytes.empty()) return;
    if (auto r = file_.write(bytes); !r) {
      ok_ = false;
      error_ = r.error();
    }
  }
  ProductFile& file_;
  std::vector<uint8_t> buffer_;
  trace_detail::Sha256Stream sha_;
  bool ok_ = true;
  Error error_;
};

// Reads a checkpoint file through a 1 MiB buffer; the first failure sticks.
class StreamReader {
 public:
  explicit StreamReader(int fd, uint64_t size) : fd_(fd), left_(size) {}
  bool ok() const { return ok_; }
  uint64_t left() const { return left_ + (buffer_.size() - pos_); }
  std::span<const uint8_t> bytes(uint64_t n) {
    out_.resize(n);
    read(out_.data(), n);
    return ok_ ? std::span<const uint8_t>(out_) : std::span<const uint8_t>();
  }
  void read(uint8_t* out, uint64_t n) {
    while (ok_ && n > 0) {
      if (pos_ == buffer_.size() && !fill()) {
        ok_ = false;
        return;
      }
      const uint64_t k = std::min<uint64_t>(n, buffer_.size() - pos_);
      std::memcpy(out, buffer_.data() + pos_, k);
      pos_ += k;
      out += k;
      n -= k;
    }
  }
  uint64_t le(int n) {
    uint8_t b[8] = {};
    read(b, uint64_t(n));
    uint64_t v = 0;
    for (int i = 0; i < n; ++i) v |= uint64_t(b[i]) << (8 * i);
    return v;
  }
  uint32_t u32() { return uint32_t(le(4)); }
  uint64_t u64() { return le(8); }

 private:
  bool fill() {
    buffer_.resize(size_t(std::min<uint64_t>(left_, 1 << 20)));
    pos_ = 0;
    size_t done = 0;
    while (done < buffer_.size()) {
      ssize_t n = ::read(fd_, buffer_.data() + done, buffer_.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return false;
      done += size_t(n);
    }
    left_ -= buffer_.size();
    return !buffer_.empty();
  }
  int fd_;
  uint64_t left_;
  std::vector<uint8_t> buffer_;
  size_t pos_ = 0;
  std::vector<uint8_t> out_;
  bool ok_ = true;
};

}  // namespace

Result<> write_checkpoint_file(const std::string& path, const CheckpointIdentity& identity,
                               const MachineCheckpoint& cp) {
  // A product (logging/output_file.h): written as PATH.partial, renamed over PATH once complete.
  auto file = ProductFile::create_replacing(path, "checkpoint", ProductFile::Unfinished::kRemove);
  if (!file) return std::unexpected(file.error());
  StreamWriter out(**file);
  out.put(std::span(reinterpret_cast<const uint8_t*>(kMagic), sizeof kMagic));
  out.put_u32(kCheckpointFileVersion);
  out.put_u32(cp.more_vcpus.empty() ? 6 : 7);
  auto section = [&](const char (&tag)[5], std::span<const uint8_t> body) {
    out.section(tag, body.size());
    out.put(body);
  };
  section("META", meta_section(identity, cp.at));
  section("CPU0", cp.cpu);
  section("BKND", cp.backend);
  std::vector<uint8_t> devs;
  put_u32(devs, uint32_t(cp.devices.size()));
  for (const auto& [name, blob] : cp.devices) {
    put_string(devs, name);
    put_u64(devs, blob.size());
    put_bytes(devs, blob);
  }
  section("DEVS", devs);
  section("SESS", cp.session);
  if (!cp.more_vcpus.empty()) {
    std::vector<uint8_t> vcpus;
    put_u32(vcpus, uint32_t(cp.more_vcpus.size()));
    for (const auto& v : cp.more_vcpus) {
      put_u64(vcpus, v.cpu.size());
      put_bytes(vcpus, v.cpu);
      put_u64(vcpus, v.backend.size());
      put_bytes(vcpus, v.backend);
    }
    section("VCPU", vcpus);
  }
  // The pages go straight from the shared copies to the file.
  const MemoryImage& image = *cp.memory;
  const uint64_t stored = image.stored_pages();
  out.section("MEM0", 16 + stored * (8 + kPageSize));
  out.put_u64(image.page_count());
  out.put_u64(stored);
  for (uint64_t pfn = 0; pfn < image.page_count(); ++pfn) {
    if (const PageCopy* p = image.page(pfn)) {
      out.put_u64(pfn);
      out.put(p->bytes);
    }
  }
  if (auto r = out.finish(); !r) return r;
  if (auto r = (*file)->sync(); !r) return r;
  return (*file)->commit();
}

Result<MachineCheckpoint> read_checkpoint_file(const std::string& path, const CheckpointIdentity& expected,
                                               CheckpointMemory& memory,
                                               const std::shared_ptr<const MemoryImage>& share_with) {
  auto bad = [&](std::string what) {
    return std::unexpected(Error{ErrorKind::kBadTrace, fmt::format("checkpoint file {}: {}", path, what)});
  };
  // O_NONBLOCK: a FIFO in a checkpoint file's place must not hang the debugger (it is refused below).
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return fail(ErrorKind::kHost, "cannot open checkpoint file {}: {}", path, std::strerror(errno));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) return bad("not a regular file");
  const auto size = uint64_t(st.st_size);
  const uint64_t limit = expected.ram_bytes + (uint64_t{64} << 20) + expected.ram_bytes / 256;
  if (size > limit) return bad(fmt::format("{} bytes, more than a checkpoint of this machine can hold", size));
  if (size < sizeof(kMagic) + 8 + 32) return bad(fmt::format("truncated: {} bytes", size));
  // First pass: the checksum, so that nothing of a damaged file is used (memory: one buffer).
  {
    StreamReader whole(fd, size);
    trace_detail::Sha256Stream sha;
    std::vector<uint8_t> chunk;
    for (uint64_t left = size - 32; left > 0 && whole.ok();) {
      const uint64_t n = std::min<uint64_t>(left, 1 << 20);
      auto b = whole.bytes(n);
      sha.update(b.data(), b.size());
      left -= n;
    }
    auto recorded = whole.bytes(32);
    if (!whole.ok()) return bad("cannot read the whole file");
    const auto sum = sha.finish();
    if (std::memcmp(sum.data(), recorded.data(), 32) != 0) {
      uint8_t magic[sizeof kMagic] = {};
      if (::pread(fd, magic, sizeof magic, 0) != ssize_t(sizeof magic) || std::memcmp(magic, kMagic, sizeof kMagic) != 0)
        return bad("not a deja checkpoint (bad magic)");
      return bad("checksum mismatch: the file is damaged or was cut short");
    }
  }
  if (::lseek(fd, 0, SEEK_SET) != 0) return bad("cannot read the whole file");
  StreamReader c(fd, size - 32);
  uint8_t magic[sizeof kMagic] = {};
  c.read(magic, sizeof magic);
  if (!c.ok() || std::memcmp(magic, kMagic, sizeof kMagic) != 0) return bad("not a deja checkpoint (bad magic)");
  uint32_t version = c.u32();
  if (version != kCheckpointFileVersion) {
    return bad(fmt::format("format version {}, this build reads version {}", version, kCheckpointFileVersion));
  }
  uint32_t sections = c.u32();
  MachineCheckpoint cp;
  bool have_meta = false, have_mem = false;
  for (uint32_t i = 0; i < sections && c.ok(); ++i) {
    std::string tag(4, '\0');
    c.read(reinterpret_cast<uint8_t*>(tag.data()), 4);
    uint64_t length = c.u64();
    if (!c.ok() || length > c.left()) return bad(fmt::format("section {} runs past the end of the file", i));
    if (tag == "MEM0") {
      uint64_t page_count = c.u64();
      uint64_t stored = c.u64();
      if (!c.ok() || page_count * kPageSize != expected.ram_bytes || stored > page_count ||
          length != 16 + stored * (8 + kPageSize)) {
        return bad("MEM0 section does not describe this machine's RAM");
      }
      // Page by page into the image, sharing every page that `share_with` holds unchanged.
      CheckpointMemory::ImageBuilder builder = memory.build_image(share_with);
      std::array<uint8_t, kPageSize> page{};
      uint64_t previous = 0;
      for (uint64_t p = 0; p < stored && c.ok(); ++p) {
        uint64_t pfn = c.u64();
        c.read(page.data(), page.size());
        if (!c.ok() || pfn >= page_count || (p > 0 && pfn <= previous)) return bad("MEM0 section is malformed");
        previous = pfn;
        builder.add(pfn, page.data());
      }
      if (!c.ok()) return bad("MEM0 section is malformed");
      cp.memory = builder.finish();
      have_mem = true;
      continue;
    }
    // Every other section is small: machine state, not memory.
    if (length > kMaxStateSection) return bad(fmt::format("section {} header is malformed", i));
    auto payload = c.bytes(length);
    if (!c.ok()) return bad(fmt::format("section {} runs past the end of the file", i));
    Cursor s(payload);
    if (tag == "META") {
      CheckpointIdentity got;
      auto sha = s.bytes(32);
      if (s.ok()) std::memcpy(got.trace_header_sha256.data(), sha.data(), 32);
      got.ram_bytes = s.u64();
      got.backend = s.str(64);
      for (uint64_t* v : {&cp.at.steps, &cp.at.events, &cp.at.branches, &cp.at.guest_exits, &cp.at.instructions})
        *v = s.u64();
      if (!s.ok() || !s.at_end()) return bad("META section is malformed");
      if (got.trace_header_sha256 != expected.trace_header_sha256) {
        return bad(fmt::format("it belongs to another trace (trace header {}..., this trace {}...)",
                               hex_prefix(got.trace_header_sha256), hex_prefix(expected.trace_header_sha256)));
      }
      if (got.ram_bytes != expected.ram_bytes) {
        return bad(fmt::format("it holds {} bytes of RAM, this machine has {}", got.ram_bytes, expected.ram_bytes));
      }
      if (got.backend != expected.backend) {
        return bad(fmt::format("it was taken on the {} backend, this replay runs on {}", got.backend,
                               expected.backend));
      }
      have_meta = true;
    } else if (tag == "CPU0") {
      cp.cpu.assign(payload.begin(), payload.end());
    } else if (tag == "BKND") {
      cp.backend.assign(payload.begin(), payload.end());
    } else if (tag == "SESS") {
      cp.session.assign(payload.begin(), payload.end());
    } else if (tag == "VCPU") {
      const uint32_t n = s.u32();
      if (n >= 1024) return bad("VCPU section claims too many vCPUs");
      for (uint32_t v = 0; v < n && s.ok(); ++v) {
        auto state = s.bytes(s.u64());
        auto backend = s.bytes(s.u64());
        cp.more_vcpus.push_back({{state.begin(), state.end()}, {backend.begin(), backend.end()}});
      }
      if (!s.ok() || !s.at_end()) return bad("VCPU section is malformed");
    } else if (tag == "DEVS") {
      uint32_t n = s.u32();
      if (n > 1024) return bad("DEVS section claims too many devices");
      for (uint32_t d = 0; d < n && s.ok(); ++d) {
        std::string name = s.str(256);
        uint64_t len = s.u64();
        auto blob = s.bytes(len);
        cp.devices.emplace_back(std::move(name), std::vector<uint8_t>(blob.begin(), blob.end()));
      }
      if (!s.ok() || !s.at_end()) return bad("DEVS section is malformed");
    } else {
      return bad(fmt::format("unknown section '{}'", tag));
    }
  }
  if (!c.ok() || c.left() != 0) return bad("malformed section table");
  if (!have_meta || !have_mem || cp.cpu.empty()) return bad("a required section (META, CPU0 or MEM0) is missing");
  return cp;
}

}  // namespace deja
