// Split virtqueue: chain walking with every hostile-driver check, the used ring, interrupt suppression.
#include "devices/virtqueue.h"

#include <algorithm>

namespace deja {
namespace {

Result<uint16_t> read16(const GuestMemory& memory, uint64_t gpa) {
  uint8_t b[2];
  if (auto r = memory.read(Gpa{gpa}, b); !r) return std::unexpected(r.error());
  return uint16_t(b[0] | b[1] << 8);
}

Result<> write16(GuestMemory& memory, uint64_t gpa, uint16_t v) {
  const uint8_t b[2] = {uint8_t(v), uint8_t(v >> 8)};
  return memory.write(Gpa{gpa}, b);
}

struct Descriptor {
  uint64_t addr;
  uint32_t len;
  uint16_t flags;
  uint16_t next;
};

Result<Descriptor> read_descriptor(const GuestMemory& memory, uint64_t table, uint32_t index) {
  uint8_t b[virtq::kDescSize];
  if (auto r = memory.read(Gpa{table + uint64_t(index) * virtq::kDescSize}, b); !r) return std::unexpected(r.error());
  Descriptor d{};
  for (int i = 0; i < 8; ++i) d.addr |= uint64_t(b[i]) << (8 * i);
  for (int i = 0; i < 4; ++i) d.len |= uint32_t(b[8 + i]) << (8 * i);
  d.flags = uint16_t(b[12] | b[13] << 8);
  d.next = uint16_t(b[14] | b[15] << 8);
  return d;
}

bool power_of_two(uint32_t v) { return v != 0 && (v & (v - 1)) == 0; }

// vring_need_event() of the virtio specification (2.6.7.2): whether `event` lies in (old, new].
bool need_event(uint16_t event, uint16_t new_idx, uint16_t old_idx) {
  return uint16_t(new_idx - event - 1) < uint16_t(new_idx - old_idx);
}

}  // namespace

void Virtqueue::reset(uint16_t max_size) {
  size = max_size;
  enabled = false;
  desc = avail = used = 0;
  last_avail_ = used_idx_ = signalled_used_ = 0;
  signalled_valid_ = false;
}

std::optional<std::string> Virtqueue::check_layout(const GuestMemory& memory, uint16_t max_size) const {
  if (!power_of_two(size) || size > max_size) {
    return fmt::format("queue size {} is not a power of two between 1 and {}", size, max_size);
  }
  if (desc % 16 || avail % 2 || used % 4) {
    return fmt::format("ring addresses desc {:#x} avail {:#x} used {:#x} are not aligned to 16, 2 and 4", desc, avail,
                       used);
  }
  struct Area {
    const char* what;
    uint64_t base, length;
  } areas[] = {{"descriptor table", desc, uint64_t(size) * virtq::kDescSize},
               {"available ring", avail, 6 + 2 * uint64_t(size)},
               {"used ring", used, 6 + 8 * uint64_t(size)}};
  for (const Area& a : areas) {
    if (!memory.contains(Gpa{a.base}, a.length)) {
      return fmt::format("the {} [{:#x}, +{:#x}) lies outside RAM", a.what, a.base, a.length);
    }
  }
  return std::nullopt;
}

Result<uint16_t> Virtqueue::available(const GuestMemory& memory) const {
  auto idx = read16(memory, avail + 2);
  if (!idx) return std::unexpected(idx.error());
  const uint16_t pending = uint16_t(*idx - last_avail_);
  if (pending > size) {
    return fail(ErrorKind::kGuest,
                "the available ring's index {} is {} entries ahead of the device's position {}, more than the queue "
                "size {}",
                *idx, pending, last_avail_, size);
  }
  return pending;
}

Result<std::optional<VirtqChain>> Virtqueue::pop(GuestMemory& memory, const VirtqFeatures& features) {
  auto pending = available(memory);
  if (!pending) return std::unexpected(pending.error());
  if (*pending == 0) {
    if (features.event_idx) {
      if (auto r = write16(memory, used + 4 + 8 * uint64_t(size), last_avail_); !r) return std::unexpected(r.error());
    }
    return std::nullopt;
  }
  auto head = read16(memory, avail + 4 + 2 * uint64_t(last_avail_ % size));
  if (!head) return std::unexpected(head.error());
  if (*head >= size) {
    return fail(ErrorKind::kGuest, "available ring entry {} names descriptor {}, beyond the queue size {}", last_avail_,
                *head, size);
  }
  VirtqChain chain;
  chain.head = *head;
  uint64_t table = desc;
  uint32_t table_entries = size;
  uint32_t index = *head;
  unsigned walked = 0;  // descriptors of the current table visited
  bool in_indirect = false;
  for (;;) {
    if (index >= table_entries) {
      return fail(ErrorKind::kGuest, "the chain at head {} names descriptor {}, beyond its {} table of {} entries",
                  *head, index, in_indirect ? "indirect" : "descriptor", table_entries);
    }
    if (++walked > size) {
      return fail(ErrorKind::kGuest, "the {}chain at head {} is longer than the queue size {} (a loop?)",
                  in_indirect ? "indirect table of the " : "", *head, size);
    }
    auto d = read_descriptor(memory, table, index);
    if (!d) return std::unexpected(d.error());
    if (d->flags & virtq::kDescIndirect) {
      if (!features.indirect) {
        return fail(ErrorKind::kGuest, "descriptor {} of the chain at head {} is indirect, but VIRTIO_F_INDIRECT_DESC "
                                       "was not negotiated", index, *head);
      }
      if (in_indirect) return fail(ErrorKind::kGuest, "the chain at head {} has an indirect table inside one", *head);
      if (d->flags & virtq::kDescNext) {
        return fail(ErrorKind::kGuest, "descriptor {} of the chain at head {} has both INDIRECT and NEXT", index,
                    *head);
      }
      if (d->len == 0 || d->len % virtq::kDescSize) {
        return fail(ErrorKind::kGuest, "the indirect table of the chain at head {} is {} bytes, not a non-zero "
                                       "multiple of 16", *head, d->len);
      }
      if (!memory.contains(Gpa{d->addr}, d->len)) {
        return fail(ErrorKind::kGuest, "the indirect table of the chain at head {} [{:#x}, +{:#x}) lies outside RAM",
                    *head, d->addr, d->len);
      }
      table = d->addr;
      table_entries = d->len / virtq::kDescSize;
      index = 0;
      walked = 0;
      in_indirect = true;
      continue;
    }
    if (!memory.contains(Gpa{d->addr}, d->len)) {
      return fail(ErrorKind::kGuest, "descriptor {} of the chain at head {} points outside RAM: [{:#x}, +{:#x})", index,
                  *head, d->addr, d->len);
    }
    if (d->flags & virtq::kDescWrite) {
      chain.writable.push_back(VirtqBuffer{d->addr, d->len});
      chain.writable_bytes += d->len;
    } else {
      if (!chain.writable.empty()) {
        return fail(ErrorKind::kGuest, "the chain at head {} has a device-readable buffer after a device-writable one",
                    *head);
      }
      chain.readable.push_back(VirtqBuffer{d->addr, d->len});
      chain.readable_bytes += d->len;
    }
    if (chain.readable_bytes > UINT32_MAX || chain.writable_bytes > UINT32_MAX) {
      return fail(ErrorKind::kGuest, "the buffers of the chain at head {} add up to 4 GiB or more", *head);
    }
    if (!(d->flags & virtq::kDescNext)) break;
    index = d->next;
  }
  ++last_avail_;
  if (features.event_idx) {
    if (auto r = write16(memory, used + 4 + 8 * uint64_t(size), last_avail_); !r) return std::unexpected(r.error());
  }
  return chain;
}

Result<> Virtqueue::push(GuestMemory& memory, uint16_t head, uint32_t written) {
  uint8_t element[8];
  for (int i = 0; i < 4; ++i) element[i] = uint8_t(uint32_t(head) >> (8 * i));
  for (int i = 0; i < 4; ++i) element[4 + i] = uint8_t(written >> (8 * i));
  if (auto r = memory.write(Gpa{used + 4 + 8 * uint64_t(used_idx_ % size)}, element); !r) return r;
  ++used_idx_;
  return write16(memory, used + 2, used_idx_);
}

Result<bool> Virtqueue::needs_interrupt(const GuestMemory& memory, const VirtqFeatures& features) {
  if (features.event_idx) {
    auto event = read16(memory, avail + 4 + 2 * uint64_t(size));
    if (!event) return std::unexpected(event.error());
    const bool valid = signalled_valid_;
    const uint16_t old = signalled_used_;
    signalled_valid_ = true;
    signalled_used_ = used_idx_;
    return !valid || need_event(*event, used_idx_, old);
  }
  auto flags = read16(memory, avail);
  if (!flags) return std::unexpected(flags.error());
  return !(*flags & virtq::kAvailNoInterrupt);
}

void Virtqueue::save(StateWriter& w) const {
  w.u16(size);
  w.boolean(enabled);
  w.u64(desc);
  w.u64(avail);
  w.u64(used);
  w.u16(last_avail_);
  w.u16(used_idx_);
  w.u16(signalled_used_);
  w.boolean(signalled_valid_);
}

void Virtqueue::restore(StateReader& r, uint16_t max_size) {
  size = r.u16();
  enabled = r.boolean();
  desc = r.u64();
  avail = r.u64();
  used = r.u64();
  last_avail_ = r.u16();
  used_idx_ = r.u16();
  signalled_used_ = r.u16();
  signalled_valid_ = r.boolean();
  // An enabled queue passed check_layout(); its size is what every ring index is reduced by.
  if (enabled && (!power_of_two(size) || size > max_size)) {
    r.invalid(fmt::format("enabled queue of size {}, not a power of two up to {}", size, max_size));
  }
}

size_t VirtqReader::read(std::span<uint8_t> out) {
  size_t done = 0;
  while (done < out.size() && index_ < buffers_.size()) {
    const VirtqBuffer& b = buffers_[index_];
    const uint64_t n = std::min<uint64_t>(b.length - offset_, out.size() - done);
    if (n > 0) {
      auto src = memory_.span(Gpa{b.gpa + offset_}, n);
      DEJA_ASSERT(src.has_value(), "a chain's buffers were checked to lie in RAM");
      std::copy(src->begin(), src->end(), out.begin() + done);
      done += n;
      offset_ += n;
    }
    if (offset_ == b.length) {
      ++index_;
      offset_ = 0;
    }
  }
  return done;
}

void VirtqReader::skip(uint64_t bytes) {
  while (bytes > 0 && index_ < buffers_.size()) {
    const uint64_t n = std::min<uint64_t>(buffers_[index_].length - offset_, bytes);
    bytes -= n;
    offset_ += n;
    if (offset_ == buffers_[index_].length) {
      ++index_;
      offset_ = 0;
    }
  }
}

uint64_t VirtqReader::remaining() const {
  uint64_t total = 0;
  for (size_t i = index_; i < buffers_.size(); ++i) total += buffers_[i].length;
  return total - offset_;
}

size_t VirtqWriter::write(std::span<const uint8_t> data) {
  size_t done = 0;
  while (done < data.size() && index_ < buffers_.size()) {
    const VirtqBuffer& b = buffers_[index_];
    const uint64_t n = std::min<uint64_t>(b.length - offset_, data.size() - done);
    if (n > 0) {
      auto r = memory_.write(Gpa{b.gpa + offset_}, data.subspan(done, n));
      DEJA_ASSERT(r.has_value(), "a chain's buffers were checked to lie in RAM");
      done += n;
      offset_ += n;
      written_ += n;
    }
    if (offset_ == b.length) {
      ++index_;
      offset_ = 0;
    }
  }
  return done;
}

uint64_t VirtqWriter::remaining() const {
  uint64_t total = 0;
  for (size_t i = index_; i < buffers_.size(); ++i) total += buffers_[i].length;
  return total - offset_;
}

}  // namespace deja
