// virtio-blk requests: IN, OUT, FLUSH, GET_ID, DISCARD and WRITE_ZEROES on a BlockStore, in bounded chunks.
#include "devices/virtio_blk.h"

#include <algorithm>
#include <array>

namespace deja {
namespace {
using namespace virtio_blk;

constexpr size_t kChunk = 64 * 1024;

void put_le(std::span<uint8_t> b, unsigned offset, uint64_t v, unsigned n) {
  for (unsigned i = 0; i < n; ++i) b[offset + i] = uint8_t(v >> (8 * i));
}

uint64_t get_le(std::span<const uint8_t> b, unsigned offset, unsigned n) {
  uint64_t v = 0;
  for (unsigned i = 0; i < n; ++i) v |= uint64_t(b[offset + i]) << (8 * i);
  return v;
}

// Whether [sector * 512, + bytes) lies inside a disk of `size` bytes, overflow-safe.
bool in_range(uint64_t sector, uint64_t bytes, uint64_t size) {
  if (sector > size / kSectorSize) return false;
  return bytes <= size - sector * kSectorSize;
}

}  // namespace

VirtioBlk::VirtioBlk(BlockStore& store, std::string serial) : store_(store), serial_(std::move(serial)) {}

uint64_t VirtioBlk::device_features() const {
  uint64_t f = kFeatureSegMax | kFeatureBlkSize | kFeatureFlush | kFeatureDiscard | kFeatureWriteZeroes;
  if (store_.read_only()) f |= kFeatureRo;
  return f;
}

void VirtioBlk::read_config(unsigned offset, std::span<uint8_t> data) {
  std::array<uint8_t, kConfigSize> c{};
  put_le(c, 0, store_.size_bytes() / kSectorSize, 8);  // capacity
  put_le(c, 12, queue_max_size() - 2, 4);                // seg_max: the header and status take two descriptors
  put_le(c, 20, kSectorSize, 4);                         // blk_size
  put_le(c, 36, kMaxDiscardSectors, 4);                  // max_discard_sectors
  put_le(c, 40, 1, 4);                                   // max_discard_seg
  put_le(c, 44, 8, 4);                                   // discard_sector_alignment: 4 KiB
  put_le(c, 48, kMaxDiscardSectors, 4);                  // max_write_zeroes_sectors
  put_le(c, 52, 1, 4);                                   // max_write_zeroes_seg
  c[56] = 1;                                             // write_zeroes_may_unmap
  std::copy_n(c.begin() + offset, data.size(), data.begin());
}

std::optional<uint64_t> VirtioBlk::next_deadline_ns() const {
  return pending_ ? std::optional<uint64_t>(0) : std::nullopt;
}

void VirtioBlk::advance(uint64_t /*now_ns*/) {
  if (!pending_) return;
  pending_ = false;
  bool pushed = false;
  while (auto chain = transport().pop(0)) {
    if (chain->readable_bytes < 16 || chain->writable_bytes < 1) {
      transport().device_error(fmt::format("{}: request at head {} has no 16-byte header or no status byte", name_,
                                           chain->head));
      return;
    }
    uint32_t written = 0;
    const uint8_t status = handle(*chain, &written);
    // The status is the last device-writable byte.
    for (auto b = chain->writable.rbegin(); b != chain->writable.rend(); ++b) {
      if (b->length == 0) continue;
      auto r = transport().memory().write(Gpa{b->gpa + b->length - 1}, std::span(&status, 1));
      DEJA_ASSERT(r.has_value(), "a chain's buffers were checked to lie in RAM");
      break;
    }
    ++completed_[status];
    transport().push(0, chain->head, written + 1);
    pushed = true;
  }
  if (pushed) transport().notify_used(0);
}

uint8_t VirtioBlk::handle(const VirtqChain& chain, uint32_t* written) {
  GuestMemory& memory = transport().memory();
  VirtqReader in(memory, chain.readable);
  std::array<uint8_t, 16> header{};
  in.read(header);
  const uint32_t type = uint32_t(get_le(header, 0, 4));
  const uint64_t sector = get_le(header, 8, 8);
  const uint64_t negotiated = transport().negotiated();
  std::vector<uint8_t> buffer;
  switch (type) {
    case kTypeIn: {
      const uint64_t length = chain.writable_bytes - 1;
      if (length % kSectorSize || !in_range(sector, length, store_.size_bytes())) return kStatusIoErr;
      if (faults_ && faults_->block_fault(index_, false, sector, length / kSectorSize).kind != BlockFault::Kind::kNone) {
        return kStatusIoErr;
      }
      // Every data byte but the status byte; the status buffer may share the last descriptor.
      std::vector<VirtqBuffer> data = chain.writable;
      for (auto b = data.rbegin(); b != data.rend(); ++b) {
        if (b->length == 0) continue;
        --b->length;
        break;
      }
      VirtqWriter out(memory, data);
      buffer.resize(std::min<uint64_t>(length, kChunk));
      for (uint64_t done = 0; done < length;) {
        const size_t n = size_t(std::min<uint64_t>(length - done, kChunk));
        if (!store_.read(sector * kSectorSize + done, std::span(buffer).first(n))) return kStatusIoErr;
        out.write(std::span(buffer).first(n));
        done += n;
        *written = uint32_t(done);
      }
      return kStatusOk;
    }
    case kTypeOut: {
      const uint64_t length = chain.readable_bytes - 16;
      if (length % kSectorSize || !in_range(sector, length, store_.size_bytes())) return kStatusIoErr;
      if (store_.read_only()) return kStatusIoErr;
      // A fault: nothing written (an I/O error), or only the first sectors (a torn write), and an I/O error.
      uint64_t writing = length;
      const BlockFault fault =
          faults_ ? faults_->block_fault(index_, true, sector, length / kSectorSize) : BlockFault{};
      if (fault.kind == BlockFault::Kind::kIoError) return kStatusIoErr;
      if (fault.kind == BlockFault::Kind::kTornWrite) writing = std::min(length, fault.kept_sectors * kSectorSize);
      buffer.resize(std::min<uint64_t>(length, kChunk));
      for (uint64_t done = 0; done < writing;) {
        const size_t n = size_t(std::min<uint64_t>(writing - done, kChunk));
        in.read(std::span(buffer).first(n));
        if (!store_.write(sector * kSectorSize + done, std::span(buffer).first(n))) return kStatusIoErr;
        done += n;
      }
      return writing == length ? kStatusOk : kStatusIoErr;
    }
    case kTypeFlush:
      if (!(negotiated & kFeatureFlush)) return kStatusUnsupp;
      return store_.flush() ? kStatusOk : kStatusIoErr;
    case kTypeGetId: {
      std::array<uint8_t, kIdBytes> id{};
      std::copy_n(serial_.begin(), std::min<size_t>(serial_.size(), kIdBytes), id.begin());
      std::vector<VirtqBuffer> data = chain.writable;
      for (auto b = data.rbegin(); b != data.rend(); ++b) {
        if (b->length == 0) continue;
        --b->length;
        break;
      }
      VirtqWriter out(memory, data);
      *written = uint32_t(out.write(id));
      return kStatusOk;
    }
    case kTypeDiscard:
      if (!(negotiated & kFeatureDiscard)) return kStatusUnsupp;
      return handle_discard(chain, type);
    case kTypeWriteZeroes:
      if (!(negotiated & kFeatureWriteZeroes)) return kStatusUnsupp;
      return handle_discard(chain, type);
    default:
      return kStatusUnsupp;
  }
}

uint8_t VirtioBlk::handle_discard(const VirtqChain& chain, uint32_t type) {
  if (chain.readable_bytes != 16 + 16) return kStatusIoErr;  // exactly one segment (max_*_seg is 1)
  VirtqReader in(transport().memory(), chain.readable);
  in.skip(16);
  std::array<uint8_t, 16> segment{};
  in.read(segment);
  const uint64_t sector = get_le(segment, 0, 8);
  const uint32_t sectors = uint32_t(get_le(segment, 8, 4));
  const uint32_t flags = uint32_t(get_le(segment, 12, 4));
  constexpr uint32_t kUnmap = 1;
  if (flags & ~kUnmap) return kStatusUnsupp;
  if (type == kTypeDiscard && (flags & kUnmap)) return kStatusUnsupp;
  if (sectors > kMaxDiscardSectors || !in_range(sector, uint64_t(sectors) * kSectorSize, store_.size_bytes())) {
    return kStatusIoErr;
  }
  if (store_.read_only()) return kStatusIoErr;
  return store_.write_zeroes(sector * kSectorSize, uint64_t(sectors) * kSectorSize) ? kStatusOk : kStatusIoErr;
}

void VirtioBlk::save(StateWriter& w) const {
  w.boolean(pending_);
  auto store = store_.save();
  w.u32(uint32_t(store.size()));
  w.bytes(store);
}

void VirtioBlk::restore(StateReader& r) {
  pending_ = r.boolean();
  const uint32_t size = r.u32();
  if (size > 4096) {
    r.invalid(fmt::format("{}: disk state of {} bytes", name_, size));
    return;
  }
  std::vector<uint8_t> store(size);
  r.bytes(store);
  if (!r.ok()) return;
  if (auto done = store_.restore(store); !done) r.invalid(fmt::format("{}: {}", name_, done.error().message));
}

}  // namespace deja
