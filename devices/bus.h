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

  // Dispatches an access. Unmapped reads return all ones; unmapped writes are ignored. Both are
  // counted per address for `deja run --stats`. Returns false when nothing was mapped there.
  bool read(uint64_t address, std::span<uint8_t> data);
  bool write(uint64_t address, std::span<const uint8_t> data);

  struct UnknownAccess {
    uint64_t reads = 0;
    uint64_t writes = 0;
  };
  const std::map<uint64_t, UnknownAccess>& unknown_accesses() const { return unknown_; }
  const std::string& name() const { return name_; }

 private:
  struct Range {
    uint64_t base;
    uint64_t length;
    Device* device;
  };
  const Range* find(uint64_t address, uint64_t size) const;

  std::string name_;
  std::vector<Range> ranges_;  // sorted by base
  std::map<uint64_t, UnknownAccess> unknown_;
};

}  // namespace deja
