// State digests: the parts hashed with SHA-256, RAM's holes skipped.
#include "segments/state_digest.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "logging/trace_format.h"

namespace deja {
namespace {

StateSha sha(std::span<const uint8_t> bytes) { return sha256_bytes(bytes); }

bool all_zero(const uint8_t* page) {
  static const uint8_t kZero[kPageSize] = {};
  return std::memcmp(page, kZero, kPageSize) == 0;
}

// RAM as the sequence of (page number, contents) of its non-zero pages, so the digest does not depend on which pages
// happen to be allocated; the memfd's holes (never written) are skipped without faulting them in.
StateSha ram_digest(const GuestMemory& memory) {
  trace_detail::Sha256Stream h;
  const off_t size = off_t(memory.size());
  for (off_t data = 0; data < size;) {
    data = ::lseek(memory.fd(), data, SEEK_DATA);
    if (data < 0) break;
    off_t hole = ::lseek(memory.fd(), data, SEEK_HOLE);
    if (hole < 0 || hole > size) hole = size;
    for (off_t page = data & ~off_t(kPageSize - 1); page < hole; page += off_t(kPageSize)) {
      const uint8_t* bytes = memory.host_base() + page;
      if (all_zero(bytes)) continue;
      uint8_t number[8];
      trace_detail::put_u64(number, uint64_t(page) / kPageSize);
      h.update(number, sizeof number);
      h.update(bytes, kPageSize);
    }
    data = hole;
  }
  return h.finish();
}

Result<StateSha> disk_digest(DiskImage& disk) {
  trace_detail::Sha256Stream h;
  const DiskImage::Contents contents = disk.contents();
  std::vector<uint8_t> block;
  uint8_t number[8];
  for (uint64_t b : contents.written) {
    block.resize(disk.block_bytes(b));
    if (auto r = disk.block_now(b, block); !r) return std::unexpected(r.error());
    trace_detail::put_u64(number, b);
    h.update(number, sizeof number);
    h.update(block.data(), block.size());
  }
  h.update("verified", 8);
  for (uint64_t b : contents.verified) {
    trace_detail::put_u64(number, b);
    h.update(number, sizeof number);
  }
  return h.finish();
}

}  // namespace

Result<StateDigest> state_digest(Session& session, const MachineCheckpoint& state) {
  StateDigest d;
  d.parts.emplace_back("cpu", sha(state.cpu));
  d.parts.emplace_back("backend", sha(state.backend));
  for (const auto& [name, blob] : state.devices) d.parts.emplace_back("device " + name, sha(blob));
  d.parts.emplace_back("loop", sha(session.shared_loop_state()));
  d.parts.emplace_back("ram", ram_digest(session.machine().memory()));
  for (size_t i = 0; i < session.disks().size(); ++i) {
    auto disk = disk_digest(*session.disks()[i]);
    if (!disk) return std::unexpected(disk.error());
    d.parts.emplace_back(fmt::format("disk {}", i), *disk);
  }
  trace_detail::Sha256Stream all;
  for (const auto& [name, digest] : d.parts) {
    all.update(name.data(), name.size() + 1);  // with its terminating NUL: names cannot run into digests
    all.update(digest.data(), digest.size());
  }
  d.value = all.finish();
  return d;
}

std::string differing_parts(const std::vector<std::pair<std::string, StateSha>>& a,
                            const std::vector<std::pair<std::string, StateSha>>& b) {
  std::string out;
  for (const auto& [name, digest] : a) {
    for (const auto& [other, other_digest] : b) {
      if (other == name && other_digest != digest) out += (out.empty() ? "" : ", ") + name;
    }
  }
  return out;
}

}  // namespace deja
