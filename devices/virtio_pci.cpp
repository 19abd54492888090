// Virtio PCI transport: capabilities, common configuration, status and feature negotiation, ISR, notifications.
#include "devices/virtio_pci.h"

#include <algorithm>

namespace deja {
namespace {

struct Field {
  unsigned offset, size;
};
constexpr Field kCommonFields[] = {
    {VirtioPci::kDeviceFeatureSelect, 4}, {VirtioPci::kDeviceFeature, 4}, {VirtioPci::kDriverFeatureSelect, 4},
    {VirtioPci::kDriverFeature, 4},       {VirtioPci::kMsixConfig, 2},    {VirtioPci::kNumQueues, 2},
    {VirtioPci::kDeviceStatus, 1},        {VirtioPci::kConfigGeneration, 1}, {VirtioPci::kQueueSelect, 2},
    {VirtioPci::kQueueSize, 2},           {VirtioPci::kQueueMsixVector, 2}, {VirtioPci::kQueueEnable, 2},
    {VirtioPci::kQueueNotifyOff, 2},      {VirtioPci::kQueueDesc, 8},     {VirtioPci::kQueueDriver, 8},
    {VirtioPci::kQueueDevice, 8},
};

// A virtio_pci_cap body (what follows cap_vndr and cap_next): cap_len, cfg_type, bar, id, padding, offset, length.
std::vector<uint8_t> cap_body(uint8_t cap_len, uint8_t type, uint8_t bar, uint32_t offset, uint32_t length) {
  std::vector<uint8_t> b(14, 0);
  b[0] = cap_len;
  b[1] = type;
  b[2] = bar;
  for (int i = 0; i < 4; ++i) b[6 + i] = uint8_t(offset >> (8 * i));
  for (int i = 0; i < 4; ++i) b[10 + i] = uint8_t(length >> (8 * i));
  return b;
}

}  // namespace

VirtioPci::VirtioPci(VirtioDevice& device, GuestMemory& memory, MsiSink* msi)
    : PciFunction(PciIds{.vendor = kVendor,
                         .device = uint16_t(0x1040 + device.device_id()),
                         .revision = 1,
                         .class_code = device.pci_class(),
                         .subsystem_vendor = kVendor,
                         .subsystem = 0x1100,
                         .interrupt_pin = 1}),
      device_(device),
      memory_(memory),
      queues_(device.queue_count()),
      msi_(msi),
      queue_vectors_(device.queue_count(), kNoVector) {
  DEJA_ASSERT(device.queue_count() >= 1 && device.queue_count() <= 32, "{}: {} queues", device.name(),
              device.queue_count());
  DEJA_ASSERT(device.config_size() <= kRegionSize, "{}: configuration too large", device.name());
  define_bar(kBar, PciBarKind::kMemory64, kBarSize, /*prefetchable=*/true);
  add_capability(pci::kCapabilityVendor, cap_body(16, kCapCommon, kBar, kCommonOffset, kCommonSize));
  auto notify = cap_body(20, kCapNotify, kBar, kNotifyOffset, kRegionSize);
  for (int i = 0; i < 4; ++i) notify.push_back(uint8_t(kNotifyMultiplier >> (8 * i)));
  add_capability(pci::kCapabilityVendor, notify);
  add_capability(pci::kCapabilityVendor, cap_body(16, kCapIsr, kBar, kIsrOffset, 1));
  // Only a device with a configuration has the capability (Linux refuses one of length 0, and QEMU omits it).
  if (device.config_size() > 0) {
    add_capability(pci::kCapabilityVendor, cap_body(16, kCapDevice, kBar, kDeviceOffset, device.config_size()));
  }
  // The configuration access window: bar, offset, length and the 4 data bytes are the driver's to write.
  auto window = cap_body(20, kCapPciCfg, 0, 0, 0);
  window.resize(18, 0);
  std::vector<uint8_t> writable(18, 0);
  writable[2] = 0xff;
  std::fill(writable.begin() + 6, writable.end(), uint8_t{0xff});
  pci_cfg_cap_ = add_capability(pci::kCapabilityVendor, window, writable);
  if (msi_) {
    // MSI-X (PCI 3.0, 6.8.2): message control (table size - 1; function mask and enable writable), then the table's
    // and the pending-bit array's offsets with their BAR in the low 3 bits. Entries start masked.
    const unsigned vectors = device.queue_count() + 1;
    define_bar(kMsixBar, PciBarKind::kMemory32, kMsixBarSize);
    std::vector<uint8_t> body(10, 0), mask(10, 0);
    body[0] = uint8_t(vectors - 1);
    body[1] = uint8_t((vectors - 1) >> 8);
    mask[1] = 0xc0;
    body[2] = kMsixBar;
    body[6] = uint8_t(kMsixPbaOffset | kMsixBar);
    body[7] = uint8_t(kMsixPbaOffset >> 8);
    msix_cap_ = add_capability(pci::kCapabilityMsix, body, mask);
    msix_table_.assign(16 * vectors, 0);
    for (unsigned v = 0; v < vectors; ++v) msix_table_[16 * v + 12] = 1;  // vector control: masked
  }
  for (Virtqueue& q : queues_) q.reset(device.queue_max_size());
  device_.bind(*this);
}

VirtqFeatures VirtioPci::ring_features() const {
  return VirtqFeatures{.indirect = (driver_features_ & virtio::kFeatureIndirectDesc) != 0,
                       .event_idx = (driver_features_ & virtio::kFeatureEventIdx) != 0};
}

// ---- BAR 4 ------------------------------------------------------------------------------------------------

void VirtioPci::bar_read(unsigned bar, uint64_t offset, std::span<uint8_t> data) {
  std::fill(data.begin(), data.end(), uint8_t{0});
  if (bar == kMsixBar && msi_) {
    for (size_t i = 0; i < data.size(); ++i) {
      const uint64_t at = offset + i;
      if (at < msix_table_.size()) {
        data[i] = msix_table_[at];
      } else if (at >= kMsixPbaOffset && at < kMsixPbaOffset + 8) {
        data[i] = uint8_t(msix_pending_ >> (8 * (at - kMsixPbaOffset)));
      }
    }
    return;
  }
  if (bar != kBar || offset >= kBarSize) return;
  const uint64_t region = offset & ~(kRegionSize - 1), at = offset - region;
  if (region == kCommonOffset) {
    common_read(at, data);
  } else if (region == kIsrOffset) {
    if (at == 0 && !data.empty()) {
      data[0] = isr_;
      isr_ = 0;
      set_intx(false);
    }
  } else if (region == kDeviceOffset) {
    const unsigned size = device_.config_size();
    if (at < size) device_.read_config(unsigned(at), data.first(std::min<size_t>(data.size(), size - at)));
  }
  // The notify region reads as 0.
}

void VirtioPci::bar_write(unsigned bar, uint64_t offset, std::span<const uint8_t> data) {
  if (bar == kMsixBar && msi_) {
    msix_table_write(offset, data);
    return;
  }
  if (bar != kBar || offset >= kBarSize) return;
  const uint64_t region = offset & ~(kRegionSize - 1), at = offset - region;
  if (region == kCommonOffset) {
    common_write(at, data);
  } else if (region == kDeviceOffset) {
    const unsigned size = device_.config_size();
    if (at < size) device_.write_config(unsigned(at), data.first(std::min<size_t>(data.size(), size - at)));
  } else if (region == kNotifyOffset) {
    // Without VIRTIO_F_NOTIFICATION_DATA the address says which queue; the value (its index) is not needed.
    const uint64_t q = at / kNotifyMultiplier;
    if (q >= queues_.size()) return;
    if (queue_ready(unsigned(q))) {
      device_.queue_notified(unsigned(q));
    } else if (!(status_ & virtio::kStatusDriverOk)) {
      pending_notify_ |= 1u << q;
    }
  }
}

// ---- common configuration ---------------------------------------------------------------------------------

uint64_t VirtioPci::common_field(unsigned offset) const {
  const Virtqueue* q = queue_select_ < queues_.size() ? &queues_[queue_select_] : nullptr;
  switch (offset) {
    case kDeviceFeatureSelect: return device_feature_select_;
    case kDeviceFeature:
      return device_feature_select_ < 2 ? uint32_t(offered_features() >> (32 * device_feature_select_)) : 0;
    case kDriverFeatureSelect: return driver_feature_select_;
    case kDriverFeature:
      return driver_feature_select_ < 2 ? uint32_t(driver_features_ >> (32 * driver_feature_select_)) : 0;
    case kMsixConfig: return config_vector_;
    case kNumQueues: return queues_.size();
    case kDeviceStatus: return status_;
    case kConfigGeneration: return config_generation_;
    case kQueueSelect: return queue_select_;
    // An unavailable queue (beyond num_queues) reads size 0.
    case kQueueSize: return q ? q->size : 0;
    case kQueueMsixVector: return q ? queue_vectors_[queue_select_] : kNoVector;
    case kQueueEnable: return q && q->enabled;
    case kQueueNotifyOff: return q ? queue_select_ : 0;
    case kQueueDesc: return q ? q->desc : 0;
    case kQueueDriver: return q ? q->avail : 0;
    case kQueueDevice: return q ? q->used : 0;
  }
  return 0;
}

void VirtioPci::set_common_field(unsigned offset, uint64_t value) {
  Virtqueue* q = queue_select_ < queues_.size() ? &queues_[queue_select_] : nullptr;
  const bool configurable = q && !q->enabled;
  switch (offset) {
    case kDeviceFeatureSelect: device_feature_select_ = uint32_t(value); break;
    case kDriverFeatureSelect: driver_feature_select_ = uint32_t(value); break;
    case kDriverFeature:
      if (!(status_ & virtio::kStatusFeaturesOk) && driver_feature_select_ < 2) {
        const unsigned shift = 32 * driver_feature_select_;
        driver_features_ = (driver_features_ & ~(0xffffffffull << shift)) | (uint64_t(uint32_t(value)) << shift);
      }
      break;
    case kDeviceStatus: write_status(uint8_t(value)); break;
    // A vector the table does not have (or no MSI-X at all) cannot be mapped: it reads back NO_VECTOR.
    case kMsixConfig:
      config_vector_ = msi_ && value < msix_table_.size() / 16 ? uint16_t(value) : kNoVector;
      break;
    case kQueueMsixVector:
      if (q) queue_vectors_[queue_select_] = msi_ && value < msix_table_.size() / 16 ? uint16_t(value) : kNoVector;
      break;
    case kQueueSelect: queue_select_ = uint16_t(value); break;
    case kQueueSize:
      if (configurable) q->size = uint16_t(value);
      break;
    case kQueueEnable:
      // Writing 0 is not the driver's to do (4.1.4.3.2); only a reset disables a queue.
      if (configurable && value == 1) {
        if (auto bad = q->check_layout(memory_, device_.queue_max_size())) {
          device_error(fmt::format("queue {}: {}", queue_select_, *bad));
        } else {
          q->enabled = true;
        }
      }
      break;
    case kQueueDesc:
      if (configurable) q->desc = value;
      break;
    case kQueueDriver:
      if (configurable) q->avail = value;
      break;
    case kQueueDevice:
      if (configurable) q->used = value;
      break;
    default: break;  // read-only fields
  }
}

void VirtioPci::common_read(uint64_t offset, std::span<uint8_t> data) const {
  for (size_t i = 0; i < data.size(); ++i) {
    const uint64_t at = offset + i;
    for (const Field& f : kCommonFields) {
      if (at >= f.offset && at < f.offset + f.size) data[i] = uint8_t(common_field(f.offset) >> (8 * (at - f.offset)));
    }
  }
}

void VirtioPci::common_write(uint64_t offset, std::span<const uint8_t> data) {
  // Each field the access covers (drivers use the natural width; a narrower or wider access merges bytes).
  for (const Field& f : kCommonFields) {
    if (offset >= f.offset + f.size || offset + data.size() <= f.offset) continue;
    uint64_t value = common_field(f.offset);
    for (size_t i = 0; i < data.size(); ++i) {
      const uint64_t at = offset + i;
      if (at < f.offset || at >= f.offset + f.size) continue;
      const unsigned shift = unsigned(8 * (at - f.offset));
      value = (value & ~(0xffull << shift)) | (uint64_t(data[i]) << shift);
    }
    set_common_field(f.offset, value);
  }
}

void VirtioPci::write_status(uint8_t value) {
  if (value == 0) {
    reset();
    return;
  }
  uint8_t next = uint8_t(value & ~virtio::kStatusNeedsReset) | (status_ & virtio::kStatusNeedsReset);
  if ((next & virtio::kStatusFeaturesOk) && !(status_ & virtio::kStatusFeaturesOk)) {
    const bool subset = (driver_features_ & ~offered_features()) == 0;
    if (!subset || !(driver_features_ & virtio::kFeatureVersion1)) next &= uint8_t(~virtio::kStatusFeaturesOk);
  }
  const bool driver_ok = (next & virtio::kStatusDriverOk) && !(status_ & virtio::kStatusDriverOk);
  status_ = next;
  if (driver_ok) {
    if (!(status_ & virtio::kStatusFeaturesOk)) {
      device_error("DRIVER_OK without FEATURES_OK");
      return;
    }
    const uint32_t pending = std::exchange(pending_notify_, 0);
    for (unsigned q = 0; q < queues_.size(); ++q) {
      if ((pending & (1u << q)) && queue_ready(q)) device_.queue_notified(q);
    }
  }
}

void VirtioPci::reset() {
  status_ = 0;
  driver_features_ = 0;
  device_feature_select_ = driver_feature_select_ = 0;
  queue_select_ = 0;
  pending_notify_ = 0;
  for (Virtqueue& q : queues_) q.reset(device_.queue_max_size());
  config_vector_ = kNoVector;
  std::fill(queue_vectors_.begin(), queue_vectors_.end(), kNoVector);
  isr_ = 0;
  set_intx(false);
  device_.reset();
}

void VirtioPci::raise(uint8_t isr_bits, uint16_t vector) {
  isr_ |= isr_bits;
  if (msix_enabled()) {
    signal_vector(vector);
  } else {
    set_intx(true);
  }
}

// ---- MSI-X ------------------------------------------------------------------------------------------------

bool VirtioPci::msix_enabled() const { return msix_cap_ && (config_bytes()[msix_cap_ + 3] & 0x80); }
bool VirtioPci::msix_function_masked() const { return config_bytes()[msix_cap_ + 3] & 0x40; }

void VirtioPci::signal_vector(uint16_t vector) {
  const size_t vectors = msix_table_.size() / 16;
  if (vector >= vectors) return;  // NO_VECTOR: the driver asked for no interrupt
  const uint8_t* e = msix_table_.data() + 16 * vector;
  if (msix_function_masked() || (e[12] & 1)) {
    msix_pending_ |= 1ull << vector;
    return;
  }
  uint64_t address = 0;
  uint32_t data = 0;
  for (int i = 0; i < 8; ++i) address |= uint64_t(e[i]) << (8 * i);
  for (int i = 0; i < 4; ++i) data |= uint32_t(e[8 + i]) << (8 * i);
  msi_->deliver_msi(address, data);
}

void VirtioPci::deliver_pending_vectors() {
  if (!msix_enabled() || msix_function_masked()) return;
  for (uint16_t v = 0; v < msix_table_.size() / 16; ++v) {
    if (!(msix_pending_ & (1ull << v)) || (msix_table_[16 * v + 12] & 1)) continue;
    msix_pending_ &= ~(1ull << v);
    signal_vector(v);
  }
}

void VirtioPci::msix_table_write(uint64_t offset, std::span<const uint8_t> data) {
  for (size_t i = 0; i < data.size(); ++i) {
    const uint64_t at = offset + i;
    if (at >= msix_table_.size()) continue;  // the pending-bit array is read-only
    // Vector control: only the mask bit is writable.
    msix_table_[at] = at % 16 == 12 ? uint8_t(data[i] & 1) : at % 16 > 12 ? 0 : data[i];
  }
  deliver_pending_vectors();
}

// ---- the transport for the device -------------------------------------------------------------------------

bool VirtioPci::queue_ready(unsigned q) const {
  return q < queues_.size() && (status_ & virtio::kStatusDriverOk) && !(status_ & virtio::kStatusNeedsReset) &&
         queues_[q].enabled;
}

uint16_t VirtioPci::available(unsigned q) {
  if (!queue_ready(q)) return 0;
  // No side effects: the session asks this outside recorded events. A bad index is found by the next pop().
  auto n = queues_[q].available(memory_);
  return n ? *n : 0;
}

std::optional<VirtqChain> VirtioPci::pop(unsigned q) {
  if (!queue_ready(q)) return std::nullopt;
  auto chain = queues_[q].pop(memory_, ring_features());
  if (!chain) {
    device_error(fmt::format("queue {}: {}", q, chain.error().message));
    return std::nullopt;
  }
  return std::move(*chain);
}

void VirtioPci::push(unsigned q, uint16_t head, uint32_t written) {
  if (!queue_ready(q)) return;
  if (auto r = queues_[q].push(memory_, head, written); !r) device_error(fmt::format("queue {}: {}", q, r.error().message));
}

void VirtioPci::notify_used(unsigned q) {
  if (!queue_ready(q)) return;
  auto wanted = queues_[q].needs_interrupt(memory_, ring_features());
  if (!wanted) {
    device_error(fmt::format("queue {}: {}", q, wanted.error().message));
  } else if (*wanted) {
    raise(1, queue_vectors_[q]);
  }
}

void VirtioPci::device_error(const std::string& why) {
  ++errors_;
  last_error_ = why;
  if (status_ & virtio::kStatusNeedsReset) return;
  status_ |= virtio::kStatusNeedsReset;
  if (status_ & virtio::kStatusDriverOk) raise(2, config_vector_);
}

// ---- the PCI configuration access capability ---------------------------------------------------------------

bool VirtioPci::pci_cfg_window(uint64_t* offset, unsigned* length) const {
  const uint8_t* c = config_bytes() + pci_cfg_cap_;
  const uint8_t bar = c[4];
  uint32_t off = 0, len = 0;
  for (int i = 0; i < 4; ++i) off |= uint32_t(c[8 + i]) << (8 * i);
  for (int i = 0; i < 4; ++i) len |= uint32_t(c[12 + i]) << (8 * i);
  // The device ignores an access with another BAR, a length other than 1, 2 or 4, or a misaligned offset.
  if (bar != kBar || (len != 1 && len != 2 && len != 4) || off % len != 0 || off + len > kBarSize) return false;
  *offset = off;
  *length = len;
  return true;
}

void VirtioPci::before_config_read(unsigned offset, unsigned size) {
  const unsigned data = pci_cfg_cap_ + 16u;
  if (offset + size <= data || offset >= data + 4) return;
  uint64_t at = 0;
  unsigned length = 0;
  if (!pci_cfg_window(&at, &length)) return;
  bar_read(kBar, at, std::span(config_bytes() + data, length));
}

void VirtioPci::after_config_write(unsigned offset, unsigned size) {
  if (msix_cap_ && offset < msix_cap_ + 4u && offset + size > msix_cap_ + 2u) {
    // MSI-X enabled: INTx is no longer used; unmasked: what waited is sent.
    if (msix_enabled()) set_intx(false);
    deliver_pending_vectors();
  }
  const unsigned data = pci_cfg_cap_ + 16u;
  if (offset + size <= data || offset >= data + 4) return;
  uint64_t at = 0;
  unsigned length = 0;
  if (!pci_cfg_window(&at, &length)) return;
  bar_write(kBar, at, std::span<const uint8_t>(config_bytes() + data, length));
}

// ---- state ------------------------------------------------------------------------------------------------

std::vector<uint8_t> VirtioPci::save() const {
  StateWriter w("VPCI", 1);
  save_config(w);
  w.u32(device_feature_select_);
  w.u32(driver_feature_select_);
  w.u64(driver_features_);
  w.u8(status_);
  w.u8(config_generation_);
  w.u16(queue_select_);
  w.u8(isr_);
  w.u32(pending_notify_);
  w.u32(uint32_t(queues_.size()));
  for (const Virtqueue& q : queues_) q.save(w);
  w.u16(config_vector_);
  for (uint16_t v : queue_vectors_) w.u16(v);
  w.u32(uint32_t(msix_table_.size()));
  w.bytes(msix_table_);
  w.u64(msix_pending_);
  device_.save(w);
  return w.take();
}

Result<> VirtioPci::restore(std::span<const uint8_t> state) {
  StateReader r(state, "VPCI", 1);
  restore_config(r);
  device_feature_select_ = r.u32();
  driver_feature_select_ = r.u32();
  driver_features_ = r.u64();
  status_ = r.u8();
  config_generation_ = r.u8();
  queue_select_ = r.u16();
  isr_ = r.u8();
  pending_notify_ = r.u32();
  if (isr_ > 3) r.invalid(fmt::format("ISR {:#x} has bits other than 0 and 1", isr_));
  if (driver_features_ & ~offered_features()) r.invalid("driver features beyond the offered ones");
  if (r.u32() != queues_.size()) r.invalid(fmt::format("queue count differs from {}'s {}", name(), queues_.size()));
  for (Virtqueue& q : queues_) q.restore(r, device_.queue_max_size());
  const uint16_t vectors = uint16_t(msix_table_.size() / 16);
  auto vector = [&](uint16_t v) {
    if (v != kNoVector && v >= vectors) r.invalid(fmt::format("MSI-X vector {} beyond the table's {}", v, vectors));
    return v;
  };
  config_vector_ = vector(r.u16());
  for (uint16_t& v : queue_vectors_) v = vector(r.u16());
  if (r.u32() != msix_table_.size()) r.invalid("MSI-X table of another size");
  r.bytes(msix_table_);
  msix_pending_ = r.u64();
  if (vectors < 64 && (msix_pending_ >> vectors) != 0) r.invalid("MSI-X pending bits beyond the table");
  device_.restore(r);
  return r.finish();
}

}  // namespace deja
