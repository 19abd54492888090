// Checkpoint files: sections, checksum, and the checks that refuse a damaged or mismatched file.
#include "snapshot/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>

#include <fmt/format.h>

#include "logging/trace_format.h"

namespace deja {
namespace {

constexpr char kMagic[8] = {'D', 'E', 'J', 'A', 'C', 'K', 'P', 'T'};
constexpr uint64_t kMaxSection = uint64_t{64} << 30;

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

Result<> write_checkpoint_file(const std::string& path, const CheckpointIdentity& identity,
                               const MachineCheckpoint& cp) {
  std::vector<uint8_t> out(std::begin(kMagic), std::end(kMagic));
  put_u32(out, kCheckpointFileVersion);
  put_u32(out, cp.more_vcpus.empty() ? 6 : 7);
  auto section = [&](const char (&tag)[5], std::span<const uint8_t> body) {
    out.insert(out.end(), tag, tag + 4);
    put_u64(out, body.size());
    put_bytes(out, body);
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
  std::vector<uint8_t> mem;
  const MemoryImage& image = *cp.memory;
  put_u64(mem, image.page_count());
  put_u64(mem, image.stored_pages());
  for (uint64_t pfn = 0; pfn < image.page_count(); ++pfn) {
    if (const PageCopy* p = image.page(pfn)) {
      put_u64(mem, pfn);
      put_bytes(mem, p->bytes);
    }
  }
  section("MEM0", mem);
  auto sum = sha256_bytes(out);
  put_bytes(out, sum);

  std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return fail(ErrorKind::kHost, "cannot create checkpoint file {}: {}", tmp, std::strerror(errno));
  size_t done = 0;
  while (done < out.size()) {
    ssize_t n = ::write(fd, out.data() + done, out.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      int e = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      return fail(ErrorKind::kHost, "writing checkpoint file {} failed: {}", tmp, std::strerror(e));
    }
    done += size_t(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0 || ::rename(tmp.c_str(), path.c_str()) != 0) {
    int e = errno;
    ::unlink(tmp.c_str());
    return fail(ErrorKind::kHost, "finishing checkpoint file {} failed: {}", path, std::strerror(e));
  }
  return {};
}

Result<MachineCheckpoint> read_checkpoint_file(const std::string& path, const CheckpointIdentity& expected,
                                               CheckpointMemory& memory) {
  auto bad = [&](std::string what) {
    return std::unexpected(Error{ErrorKind::kBadTrace, fmt::format("checkpoint file {}: {}", path, what)});
  };
  std::ifstream in(path, std::ios::binary);
  if (!in) return fail(ErrorKind::kHost, "cannot open checkpoint file {}: {}", path, std::strerror(errno));
  in.seekg(0, std::ios::end);
  const auto size = uint64_t(in.tellg());
  in.seekg(0);
  const uint64_t limit = expected.ram_bytes + (uint64_t{64} << 20) + expected.ram_bytes / 256;
  if (size > limit) return bad(fmt::format("{} bytes, more than a checkpoint of this machine can hold", size));
  std::vector<uint8_t> data(size);
  if (!in.read(reinterpret_cast<char*>(data.data()), std::streamsize(size))) return bad("cannot read the whole file");
  if (size < sizeof(kMagic) + 8 + 32) return bad(fmt::format("truncated: {} bytes", size));
  if (std::memcmp(data.data(), kMagic, sizeof(kMagic)) != 0) return bad("not a deja checkpoint (bad magic)");
  auto body = std::span<const uint8_t>(data).first(size - 32);
  auto sum = sha256_bytes(body);
  if (std::memcmp(sum.data(), data.data() + size - 32, 32) != 0) {
    return bad("checksum mismatch: the file is damaged or was cut short");
  }
  Cursor c(body.subspan(sizeof(kMagic)));
  uint32_t version = c.u32();
  if (version != kCheckpointFileVersion) {
    return bad(fmt::format("format version {}, this build reads version {}", version, kCheckpointFileVersion));
  }
  uint32_t sections = c.u32();
  MachineCheckpoint cp;
  bool have_meta = false, have_mem = false;
  for (uint32_t i = 0; i < sections && c.ok(); ++i) {
    auto tag_bytes = c.bytes(4);
    uint64_t length = c.u64();
    if (!c.ok() || length > kMaxSection) return bad(fmt::format("section {} header is malformed", i));
    auto payload = c.bytes(length);
    if (!c.ok()) return bad(fmt::format("section {} runs past the end of the file", i));
    std::string tag(tag_bytes.begin(), tag_bytes.end());
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
    } else if (tag == "MEM0") {
      uint64_t page_count = s.u64();
      uint64_t stored = s.u64();
      if (!s.ok() || page_count * kPageSize != expected.ram_bytes || stored > page_count) {
        return bad("MEM0 section does not describe this machine's RAM");
      }
      std::vector<std::pair<uint64_t, const uint8_t*>> pages;
      pages.reserve(stored);
      uint64_t previous = 0;
      for (uint64_t p = 0; p < stored && s.ok(); ++p) {
        uint64_t pfn = s.u64();
        auto bytes = s.bytes(kPageSize);
        if (!s.ok() || pfn >= page_count || (p > 0 && pfn <= previous)) return bad("MEM0 section is malformed");
        previous = pfn;
        pages.emplace_back(pfn, bytes.data());
      }
      if (!s.ok() || !s.at_end()) return bad("MEM0 section is malformed");
      cp.memory = memory.image_from_pages(pages);
      have_mem = true;
    } else {
      return bad(fmt::format("unknown section '{}'", tag));
    }
  }
  if (!c.ok() || !c.at_end()) return bad("malformed section table");
  if (!have_meta || !have_mem || cp.cpu.empty()) return bad("a required section (META, CPU0 or MEM0) is missing");
  return cp;
}

}  // namespace deja
