// virtio-blk: a block device over a BlockStore (a hashed raw image plus the guest's writes in an overlay).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "devices/block_store.h"
#include "devices/virtio.h"

namespace deja {

namespace virtio_blk {
constexpr uint64_t kFeatureSegMax = 1ull << 2, kFeatureRo = 1ull << 5, kFeatureBlkSize = 1ull << 6,
                   kFeatureFlush = 1ull << 9, kFeatureDiscard = 1ull << 13, kFeatureWriteZeroes = 1ull << 14;
constexpr uint32_t kTypeIn = 0, kTypeOut = 1, kTypeFlush = 4, kTypeGetId = 8, kTypeDiscard = 11,
                   kTypeWriteZeroes = 13;
constexpr uint8_t kStatusOk = 0, kStatusIoErr = 1, kStatusUnsupp = 2;
constexpr unsigned kConfigSize = 60;
constexpr uint32_t kSectorSize = 512;
constexpr unsigned kIdBytes = 20;
}  // namespace virtio_blk

// Virtio 1.1, 5.2. One request queue of 256 entries. Features: SEG_MAX (254), BLK_SIZE (512), FLUSH, DISCARD
// and WRITE_ZEROES (one segment per request, up to 2^16 sectors, 4 KiB aligned), RO for a read-only store.
// Requests complete as timed work: a notification makes the device due at once (next_deadline_ns() is 0), and
// advance() - which the machine runs inside an asynchronous event, at a recorded coordinate - takes every
// available chain. What a request reads comes from the store (the image and the guest's own earlier writes),
// so a recording holds no disk data. Answers:
//   - a chain without a 16-byte header or a status byte breaks the protocol: DEVICE_NEEDS_RESET;
//   - IN/OUT whose length is not a multiple of 512, or that reaches past the capacity: IOERR, nothing moved;
//   - OUT on a read-only disk: IOERR; a store failure (reported to the machine as a host failure or divergence): IOERR;
//   - GET_ID: the 20-byte serial, NUL-padded; FLUSH: the store's flush;
//   - DISCARD or WRITE_ZEROES: exactly one 16-byte segment, else IOERR; an unknown flag, or DISCARD with the unmap
//     flag: UNSUPP; a range past the capacity or above the maximum: IOERR. Both leave zeros (deterministic
//     reads after a discard);
//   - any other type (or DISCARD / WRITE_ZEROES / FLUSH not negotiated): UNSUPP.
class VirtioBlk : public VirtioDevice {
 public:
  VirtioBlk(BlockStore& store, std::string serial);

  std::string_view name() const override { return name_; }
  uint16_t device_id() const override { return virtio::kIdBlock; }
  uint32_t pci_class() const override { return 0x018000; }  // mass storage, other
  uint64_t device_features() const override;
  unsigned queue_count() const override { return 1; }
  unsigned config_size() const override { return virtio_blk::kConfigSize; }
  void read_config(unsigned offset, std::span<uint8_t> data) override;
  void reset() override { pending_ = false; }
  void queue_notified(unsigned) override { pending_ = true; }
  std::optional<uint64_t> next_deadline_ns() const override;
  void advance(uint64_t now_ns) override;
  void save(StateWriter& w) const override;
  void restore(StateReader& r) override;

  void set_name(std::string name) { name_ = std::move(name); }
  // Exploration: every read and write asks `faults` (as disk `index`) whether it fails (VIRTIO_BLK_S_IOERR).
  void set_faults(BlockFaults* faults, unsigned index) {
    faults_ = faults;
    index_ = index;
  }
  // Requests answered, by status (for tests and --stats).
  uint64_t completed(uint8_t status) const { return status < 3 ? completed_[status] : 0; }

 private:
  static constexpr uint32_t kMaxDiscardSectors = 1u << 16;  // 32 MiB: bounds the overlay work of one request
  uint8_t handle(const VirtqChain& chain, uint32_t* written);
  uint8_t handle_discard(const VirtqChain& chain, uint32_t type);

  BlockStore& store_;
  std::string serial_;
  std::string name_ = "virtio-blk";
  bool pending_ = false;
  uint64_t completed_[3] = {};
  BlockFaults* faults_ = nullptr;
  unsigned index_ = 0;
};

}  // namespace deja
