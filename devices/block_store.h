// What a block device reads and writes: a disk's contents as the machine sees them (vmm/disk_image.h implements it).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/error.h"

namespace deja {

// A disk's bytes. The device never reaches the host through it: the implementation serves a hashed, read-only base
// image plus the guest's own writes (an overlay), so every read is a function of the image and the guest's earlier
// writes. A failure is not the guest's business: the implementation reports it to whoever runs the machine
// (a host failure, or in replay a divergence); the device then answers the request with an I/O error.
class BlockStore {
 public:
  virtual ~BlockStore() = default;
  virtual uint64_t size_bytes() const = 0;
  virtual bool read_only() const = 0;
  virtual Result<> read(uint64_t offset, std::span<uint8_t> out) = 0;
  virtual Result<> write(uint64_t offset, std::span<const uint8_t> data) = 0;
  virtual Result<> write_zeroes(uint64_t offset, uint64_t length) = 0;
  virtual Result<> flush() = 0;
  // The guest-visible contents' state beyond the base image (for state digests and checkpoints).
  virtual std::vector<uint8_t> save() const = 0;
  virtual Result<> restore(std::span<const uint8_t> state) = 0;
};

// What a request suffers, as exploration's fault plan decides it (docs/explore.md): nothing, an I/O error, or (a
// write) a torn write: its first `kept_sectors` reach the disk and the guest gets an I/O error.
struct BlockFault {
  enum class Kind : uint8_t { kNone, kIoError, kTornWrite };
  Kind kind = Kind::kNone;
  uint64_t kept_sectors = 0;
};
// Asked once per read or write request, before it touches the disk: the engine's choke point, so that a recording and
// its replay decide the same (replay/engine_faults.cpp).
class BlockFaults {
 public:
  virtual ~BlockFaults() = default;
  virtual BlockFault block_fault(unsigned disk, bool write, uint64_t sector, uint64_t sectors) = 0;
};

}  // namespace deja
