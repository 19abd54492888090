// State digests: the parts hashed with SHA-256, RAM page by page with its holes skipped.
#include "segments/state_digest.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "logging/trace_format.h"

namespace deja {
namespace {

StateSha sha(std::span<const uint8_t> bytes) { return sha256_bytes(bytes); }

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

bool all_zero_page(const uint8_t* page) {
  static const uint8_t kZero[kPageSize] = {};
  return std::memcmp(page, kZero, kPageSize) == 0;
}

std::vector<uint64_t> data_pages(const GuestMemory& memory) {
  std::vector<uint64_t> pages;
  const off_t size = off_t(memory.size());
  for (off_t data = 0; data < size;) {
    data = ::lseek(memory.fd(), data, SEEK_DATA);
    if (data < 0) break;
    off_t hole = ::lseek(memory.fd(), data, SEEK_HOLE);
    if (hole < 0 || hole > size) hole = size;
    for (off_t page = data & ~off_t(kPageSize - 1); page < hole; page += off_t(kPageSize)) {
      pages.push_back(uint64_t(page) / kPageSize);
    }
    data = hole;
  }
  return pages;
}

void RamPageHashes::update(const GuestMemory& memory, std::span<const uint64_t> pages) {
  for (uint64_t page : pages) {
    const uint8_t* bytes = memory.host_base() + page * kPageSize;
    if (all_zero_page(bytes)) hashes_.erase(page);
    else hashes_[page] = sha(std::span(bytes, kPageSize));
  }
}

void RamPageHashes::update_all(const GuestMemory& memory) {
  hashes_.clear();
  update(memory, data_pages(memory));
}

StateSha RamPageHashes::digest() const {
  trace_detail::Sha256Stream h;
  for (const auto& [page, hash] : hashes_) {
    uint8_t number[8];
    trace_detail::put_u64(number, page);
    h.update(number, sizeof number);
    h.update(hash.data(), hash.size());
  }
  return h.finish();
}

std::vector<uint64_t> RamPageHashes::pages() const {
  std::vector<uint64_t> out;
  out.reserve(hashes_.size());
  for (const auto& [page, hash] : hashes_) out.push_back(page);
  return out;
}

Result<StateDigest> state_digest(Session& session, const MachineCheckpoint& state, const RamPageHashes* ram) {
  StateDigest d;
  d.parts.emplace_back("cpu", sha(state.cpu));
  d.parts.emplace_back("backend", sha(state.backend));
  for (const auto& [name, blob] : state.devices) d.parts.emplace_back("device " + name, sha(blob));
  d.parts.emplace_back("loop", sha(session.shared_loop_state()));
  if (ram) {
    d.parts.emplace_back("ram", ram->digest());
  } else {
    RamPageHashes now;
    now.update_all(session.machine().memory());
    d.parts.emplace_back("ram", now.digest());
  }
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
