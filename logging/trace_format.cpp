// Shared trace helpers: SHA-256 (OpenSSL EVP), hex, event names and one-line event descriptions.
#include "logging/trace_format.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <vector>

#include <openssl/evp.h>

namespace deja {

namespace trace_detail {

Sha256Stream::Sha256Stream() : ctx_(EVP_MD_CTX_new()) {
  // Allocation failure of a few hundred bytes is not a recoverable input error.
  DEJA_ASSERT(ctx_ != nullptr, "EVP_MD_CTX_new failed");
  DEJA_ASSERT(EVP_DigestInit_ex(static_cast<EVP_MD_CTX*>(ctx_), EVP_sha256(), nullptr) == 1,
              "EVP_DigestInit_ex(sha256) failed");
}

Sha256Stream::~Sha256Stream() { EVP_MD_CTX_free(static_cast<EVP_MD_CTX*>(ctx_)); }

void Sha256Stream::update(const void* data, size_t size) {
  if (size == 0) return;
  DEJA_ASSERT(EVP_DigestUpdate(static_cast<EVP_MD_CTX*>(ctx_), data, size) == 1, "EVP_DigestUpdate failed");
}

Sha256 Sha256Stream::finish() {
  Sha256 out{};
  unsigned int length = 0;
  DEJA_ASSERT(EVP_DigestFinal_ex(static_cast<EVP_MD_CTX*>(ctx_), out.data(), &length) == 1 && length == 32,
              "EVP_DigestFinal_ex failed");
  return out;
}

Sha256 chain_next(const Sha256& previous, std::span<const uint8_t> frame_fields, std::span<const uint8_t> payload) {
  Sha256Stream s;
  s.update(previous.data(), previous.size());
  s.update(frame_fields.data(), frame_fields.size());
  s.update(payload.data(), payload.size());
  return s.finish();
}

}  // namespace trace_detail

std::array<uint8_t, 32> sha256_bytes(std::span<const uint8_t> bytes) {
  trace_detail::Sha256Stream s;
  s.update(bytes.data(), bytes.size());
  return s.finish();
}

Result<std::array<uint8_t, 32>> sha256_file(const std::string& path) {
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> file(std::fopen(path.c_str(), "rb"), &std::fclose);
  if (!file) return fail(ErrorKind::kHost, "cannot open {} to hash it: {}", path, std::strerror(errno));
  trace_detail::Sha256Stream s;
  std::vector<uint8_t> block(1 << 20);
  while (true) {
    size_t n = std::fread(block.data(), 1, block.size(), file.get());
    s.update(block.data(), n);
    if (n < block.size()) {
      if (std::ferror(file.get())) return fail(ErrorKind::kHost, "cannot read {} to hash it: {}", path, std::strerror(errno));
      break;
    }
  }
  return s.finish();
}

Result<std::pair<std::array<uint8_t, 32>, uint64_t>> sha256_directory(const std::string& path) {
  static constexpr size_t kMaxEntries = 100'000;
  std::vector<std::filesystem::path> files;
  std::error_code ec;
  size_t entries = 0;
  for (auto it = std::filesystem::recursive_directory_iterator(path, ec); !ec && it != decltype(it)(); it.increment(ec)) {
    if (++entries > kMaxEntries) return fail(ErrorKind::kInvalidArgument, "{} holds more than {} entries", path, kMaxEntries);
    if (it->is_regular_file(ec)) files.push_back(std::filesystem::relative(it->path(), path, ec));
  }
  if (ec) return fail(ErrorKind::kHost, "cannot list {}: {}", path, ec.message());
  std::sort(files.begin(), files.end());
  trace_detail::Sha256Stream s;
  uint64_t size = 0;
  for (const auto& file : files) {
    const std::string full = (std::filesystem::path(path) / file).string(), name = file.string();
    auto hashed = sha256_file(full);
    if (!hashed) return std::unexpected(hashed.error());
    size += std::filesystem::file_size(full, ec);
    s.update(reinterpret_cast<const uint8_t*>(name.c_str()), name.size() + 1);
    s.update(hashed->data(), hashed->size());
  }
  return std::pair(s.finish(), size);
}

std::string hex(std::span<const uint8_t> bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (uint8_t b : bytes) {
    out.push_back(kDigits[b >> 4]);
    out.push_back(kDigits[b & 15]);
  }
  return out;
}

bool unhex_sha256(std::string_view text, std::array<uint8_t, 32>& out) {
  auto digit = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  if (text.size() != 64) return false;
  for (size_t i = 0; i < 32; ++i) {
    int hi = digit(text[2 * i]), lo = digit(text[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    out[i] = uint8_t(hi << 4 | lo);
  }
  return true;
}

std::string event_kind_name(const trace::Event& e) { return trace_detail::kind_name_of_case(e.kind_case()); }

std::string trace_detail::kind_name_of_case(size_t kind_case) {
  switch (static_cast<trace::Event::KindCase>(kind_case)) {
    case trace::Event::kPortRead: return "port_read";
    case trace::Event::kMmioRead: return "mmio_read";
    case trace::Event::kClock: return "clock";
    case trace::Event::kAsync: return "async";
    case trace::Event::kInterrupt: return "interrupt";
    case trace::Event::kRdtsc: return "rdtsc";
    case trace::Event::kRdrand: return "rdrand";
    case trace::Event::kMsrRead: return "msr_read";
    case trace::Event::kDigest: return "digest";
    case trace::Event::kEnd: return "end";
    case trace::Event::kSerialOutput: return "serial_output";
    case trace::Event::kEntropy: return "entropy";
    case trace::Event::kNetTransmit: return "net_transmit";
    case trace::Event::kDiskBlock: return "disk_block";
    case trace::Event::kDiskIo: return "disk_io";
    case trace::Event::KIND_NOT_SET: return "none";
  }
  // A kind added to trace.proto by a newer deja, read by this one.
  return fmt::format("unknown_{}", kind_case);
}

const trace::Coordinate* event_coordinate(const trace::Event& e) {
  switch (e.kind_case()) {
    case trace::Event::kAsync: return e.async().has_at() ? &e.async().at() : nullptr;
    case trace::Event::kInterrupt: return e.interrupt().has_at() ? &e.interrupt().at() : nullptr;
    case trace::Event::kDigest: return e.digest().has_at() ? &e.digest().at() : nullptr;
    case trace::Event::kEnd: return e.end().has_at() ? &e.end().at() : nullptr;
    default: return nullptr;
  }
}

bool event_kind_has_coordinate(int kind_case) {
  return kind_case == trace::Event::kAsync || kind_case == trace::Event::kInterrupt ||
         kind_case == trace::Event::kDigest || kind_case == trace::Event::kEnd;
}

std::string describe_coordinate(const trace::Coordinate& c) {
  return fmt::format("@(cpu{} br={} rip={:#x} rcx={:#x} gprs={:016x} exits={})", c.vcpu(), c.branches(), c.rip(),
                     c.rcx(), c.gpr_digest(), c.guest_exits());
}

namespace {

// Printable ASCII stays readable; everything else is escaped so one event stays on one line.
std::string quoted_bytes(const std::string& data, size_t limit = 64) {
  std::string out = "\"";
  for (size_t i = 0; i < data.size() && i < limit; ++i) {
    unsigned char c = static_cast<unsigned char>(data[i]);
    if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (c == '\t') out += "\\t";
    else if (c == '"' || c == '\\') { out += '\\'; out += static_cast<char>(c); }
    else if (c >= 0x20 && c < 0x7f) out += static_cast<char>(c);
    else out += fmt::format("\\x{:02x}", c);
  }
  out += '"';
  if (data.size() > limit) out += fmt::format("...(+{} bytes)", data.size() - limit);
  return out;
}

}  // namespace

std::string describe_event(const trace::Event& e) {
  std::string head = fmt::format("{} cpu{}", event_kind_name(e), e.vcpu());
  switch (e.kind_case()) {
    case trace::Event::kPortRead: {
      const auto& p = e.port_read();
      return fmt::format("{} port={:#x} size={} value={:#x} rip={:#x}", head, p.port(), p.size(), p.value(), p.rip());
    }
    case trace::Event::kMmioRead: {
      const auto& m = e.mmio_read();
      return fmt::format("{} addr={:#x} size={} value={:#x} rip={:#x}", head, m.address(), m.size(), m.value(), m.rip());
    }
    case trace::Event::kClock: return fmt::format("{} now_ns={}", head, e.clock().now_ns());
    case trace::Event::kAsync: {
      const auto& a = e.async();
      std::string s = fmt::format("{} {} now_ns={}", head, describe_coordinate(a.at()), a.now_ns());
      if (!a.serial_input().empty()) s += fmt::format(" serial_input={}", quoted_bytes(a.serial_input()));
      if (a.input_closed()) s += " input_closed";
      for (const auto& f : a.net_frames()) s += fmt::format(" net_frame(nic={} {} bytes)", f.nic(), f.data().size());
      return s;
    }
    case trace::Event::kInterrupt:
      return fmt::format("{} {} vector={:#x}", head, describe_coordinate(e.interrupt().at()), e.interrupt().vector());
    case trace::Event::kRdtsc: {
      const auto& r = e.rdtsc();
      return fmt::format("{} value={:#x} rip={:#x}{}", head, r.value(), r.rip(), r.rdtscp() ? " rdtscp" : "");
    }
    case trace::Event::kRdrand: {
      const auto& r = e.rdrand();
      return fmt::format("{} value={:#x} ok={} rip={:#x}{}", head, r.value(), r.ok(), r.rip(), r.rdseed() ? " rdseed" : "");
    }
    case trace::Event::kMsrRead: {
      const auto& m = e.msr_read();
      return fmt::format("{} msr={:#x} value={:#x}{} rip={:#x}", head, m.msr(), m.value(), m.fault() ? " #GP" : "",
                         m.rip());
    }
    case trace::Event::kDigest: {
      const auto& d = e.digest();
      return fmt::format("{} {} instructions={} digest={}", head, describe_coordinate(d.at()), d.instructions(),
                         hex(d.digest()));
    }
    case trace::Event::kEnd: {
      const auto& d = e.end();
      return fmt::format("{} {} exit_status={} instructions={} reason={} digest={}", head, describe_coordinate(d.at()),
                         d.exit_status(), d.instructions(), quoted_bytes(d.reason(), 200), hex(d.digest()));
    }
    case trace::Event::kSerialOutput:
      return fmt::format("{} data={}", head, quoted_bytes(e.serial_output().data()));
    case trace::Event::kEntropy: return fmt::format("{} {} bytes", head, e.entropy().data().size());
    case trace::Event::kNetTransmit: {
      const auto& t = e.net_transmit();
      return fmt::format("{} nic={} length={} hash={:016x}{}", head, t.nic(), t.length(), t.hash(),
                         t.data().empty() ? "" : " (frame kept)");
    }
    case trace::Event::kDiskBlock: {
      const auto& d = e.disk_block();
      return fmt::format("{} disk={} block={} hash={:016x}", head, d.disk(), d.block(), d.hash());
    }
    case trace::Event::kDiskIo: {
      const auto& d = e.disk_io();
      return fmt::format("{} disk={} {} offset={} length={}", head, d.disk(),
                         !d.write() ? "read" : d.zeroes() ? "write-zeroes" : "write", d.offset(), d.length());
    }
    case trace::Event::KIND_NOT_SET: break;
  }
  return head;
}

}  // namespace deja
