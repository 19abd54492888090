// Bus implementation: sorted ranges, binary search, unknown-access accounting.
#include "devices/bus.h"

#include <algorithm>

namespace deja {

Result<> Bus::add(uint64_t base, uint64_t length, Device* device) {
  if (length == 0 || base + length < base) {
    return fail(ErrorKind::kInvalidArgument, "{} bus: empty or wrapping range at {:#x} for {}", name_, base,
                device->name());
  }
  for (const auto& r : ranges_) {
    if (base < r.base + r.length && r.base < base + length) {
      return fail(ErrorKind::kInvalidArgument, "{} bus: {} at [{:#x}, +{:#x}) overlaps {} at [{:#x}, +{:#x})", name_,
                  device->name(), base, length, r.device->name(), r.base, r.length);
    }
  }
  ranges_.push_back({base, length, device});
  std::sort(ranges_.begin(), ranges_.end(), [](const Range& a, const Range& b) { return a.base < b.base; });
  return {};
}

bool Bus::remove(uint64_t base, const Device* device) {
  auto it = std::find_if(ranges_.begin(), ranges_.end(),
                         [&](const Range& r) { return r.base == base && r.device == device; });
  if (it == ranges_.end()) return false;
  ranges_.erase(it);
  return true;
}

const Bus::Range* Bus::find(uint64_t address, uint64_t size) const {
  auto it = std::upper_bound(ranges_.begin(), ranges_.end(), address,
                             [](uint64_t a, const Range& r) { return a < r.base; });
  if (it == ranges_.begin()) return nullptr;
  --it;
  if (address - it->base + size > it->length) return nullptr;
  return &*it;
}

Bus::UnknownAccess& Bus::unknown_at(uint64_t address) {
  auto it = unknown_.find(address);
  if (it != unknown_.end()) return it->second;
  if (unknown_.size() >= kUnknownSample) return unsampled_;
  return unknown_[address];
}

bool Bus::read(uint64_t address, std::span<uint8_t> data) {
  if (const Range* r = find(address, data.size())) {
    r->device->read(address - r->base, data);
    return true;
  }
  std::fill(data.begin(), data.end(), uint8_t{0xff});
  ++unknown_at(address).reads;
  return false;
}

bool Bus::write(uint64_t address, std::span<const uint8_t> data) {
  if (const Range* r = find(address, data.size())) {
    r->device->write(address - r->base, data);
    return true;
  }
  ++unknown_at(address).writes;
  return false;
}

}  // namespace deja
