// The engine's block choke point: lazily hashed disk blocks, recorded at first read and checked there in replay; the
// guest's reads and writes, recorded for inspect.
#include <fmt/format.h>

#include "logging/trace_inspect.h"
#include "replay/engine.h"

namespace deja {

Result<> Engine::check_disk_block(unsigned disk, uint64_t block, uint64_t hash) {
  if (mode_ == Mode::kRecord) {
    trace::Event e;
    auto* d = e.mutable_disk_block();
    d->set_disk(disk);
    d->set_block(block);
    d->set_hash(hash);
    append(std::move(e));
  } else if (mode_ == Mode::kReplay) {
    const std::string name = disk < disk_names_.size() ? disk_names_[disk] : fmt::format("disk {}", disk);
    std::string what = fmt::format("disk_block disk={} block={} hash={:016x}", disk, block, hash);
    const auto* e = expect(trace::Event::kDiskBlock, what);
    if (!e) return fail(ErrorKind::kDivergence, "replay diverged before reading {}", name);
    const auto& d = e->disk_block();
    if (d.disk() != disk || d.block() != block) {
      diverge("the guest read another disk block than recorded", describe_event(*e), what);
      return fail(ErrorKind::kDivergence, "replay diverged reading {}", name);
    }
    if (d.hash() != hash) {
      const uint64_t start = block * DiskImage::kHashBlock;
      diverge(fmt::format("the disk image {} differs from the recording's in block {} (bytes {} to {})", name, block,
                          start, start + DiskImage::kHashBlock - 1),
              describe_event(*e), what);
      return fail(ErrorKind::kDivergence, "{} differs from the recording's", name);
    }
  }
  return {};
}

void Engine::disk_io(unsigned disk, bool write, bool zeroes, uint64_t offset, uint64_t length) {
  if (mode_ != Mode::kRecord || !writer_) return;
  trace::Event e;
  auto* d = e.mutable_disk_io();
  d->set_disk(disk);
  d->set_offset(offset);
  d->set_length(length);
  d->set_write(write);
  d->set_zeroes(zeroes);
  if (auto r = writer_->append(e); !r && write_error_.empty()) write_error_ = r.error().message;
}

}  // namespace deja
