// Address-range dispatch of port-I/O and MMIO accesses to devices; unknown addresses are counted.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "devices/device.h"

namespace deja {

class Bus {
 public:
  explicit Bus(std::string name) : name_(std::move(name)) {}

  // Maps [base, base+length) to `device`. Overlapping ranges are refused.
  Result<> add(uint64_t base, uint64_t length, Device* device);
  // Unmaps the range at `base` that `device` holds (a PCI BAR the guest moves or disables); false when none.
  bool remove(uint64_t base, const Device* device);

  // Dispatches an access. Unmapped reads return all ones; unmapped writes are ignored. Both are
  // counted for `deja run --stats`: per address for the first kUnknownSample addresses, in one
  // total for every other (a guest scanning the address space must not grow deja without bound).
  // Returns false when nothing was mapped there.
  bool read(uint64_t address, std::span<uint8_t> data);
  bool write(uint64_t address, std::span<const uint8_t> data);

  static constexpr size_t kUnknownSample = 256;
  struct UnknownAccess {
    uint64_t reads = 0;
    uint64_t writes = 0;
  };
  // The sampled addresses, and the accesses to unknown addresses outside the sample.
  const std::map<uint64_t, UnknownAccess>& unknown_accesses() const { return unknown_; }
  const UnknownAccess& unknown_unsampled() const { return unsampled_; }
  const std::string& name() const { return name_; }

 private:
  struct Range {
    uint64_t base;
    uint64_t length;
    Device* device;
  };
  const Range* find(uint64_t address, uint64_t size) const;
  UnknownAccess& unknown_at(uint64_t address);

  std::string name_;
  std::vector<Range> ranges_;  // sorted by base
  std::map<uint64_t, UnknownAccess> unknown_;
  UnknownAccess unsampled_;
};

}  // namespace deja
