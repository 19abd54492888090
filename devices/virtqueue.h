// A virtio split virtqueue as the device sees it: descriptor chains taken from the available ring, buffers
// returned on the used ring, interrupt suppression; every rule a hostile driver can break is checked.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "devices/state_codec.h"
#include "core/error.h"
#include "core/guest_memory.h"

namespace deja {

namespace virtq {
constexpr uint16_t kDescNext = 1, kDescWrite = 2, kDescIndirect = 4;
constexpr uint16_t kAvailNoInterrupt = 1;
constexpr unsigned kDescSize = 16;
}  // namespace virtq

// One guest buffer of a chain: guest-physical, inside RAM (checked when the chain was taken).
struct VirtqBuffer {
  uint64_t gpa = 0;
  uint32_t length = 0;
};

// A descriptor chain: its device-readable buffers, then its device-writable ones (virtio 1.1, 2.6.4.2).
struct VirtqChain {
  uint16_t head = 0;
  std::vector<VirtqBuffer> readable;
  std::vector<VirtqBuffer> writable;
  uint64_t readable_bytes = 0;  // each total is below 4 GiB (the used ring's length is 32 bits)
  uint64_t writable_bytes = 0;
};

// The ring features the driver accepted.
struct VirtqFeatures {
  bool indirect = false;   // VIRTIO_F_INDIRECT_DESC
  bool event_idx = false;  // VIRTIO_F_EVENT_IDX
};

// A split virtqueue (virtio 1.1, 2.6). The driver programs its size and the three ring addresses through the
// transport; the device keeps its position (next available entry, next used entry, the last used index it
// signalled). Every guest access goes through GuestMemory's checked spans and every device write through
// GuestMemory::write, which marks the pages dirty. A driver that breaks the rules gets an error (the transport
// then sets DEVICE_NEEDS_RESET), never unbounded work or memory:
//   - an available index more than the queue size ahead of the device's position;
//   - a descriptor index at or beyond the size of its table (ring entry, `next`, or indirect entry);
//   - a chain longer than the queue size (this also catches every loop), or an indirect table walk longer than
//     the queue size;
//   - a buffer, descriptor table or indirect table outside RAM;
//   - INDIRECT without VIRTIO_F_INDIRECT_DESC, INDIRECT with NEXT, an indirect table inside one, an indirect
//     table whose length is 0 or not a multiple of 16;
//   - a device-readable buffer after a device-writable one;
//   - device-readable or device-writable buffers adding up to 4 GiB or more.
class Virtqueue {
 public:
  // Back to the reset state: size `max_size`, disabled, addresses 0, positions 0.
  void reset(uint16_t max_size);

  // Driver-programmed registers (common configuration): writable while the queue is disabled.
  uint16_t size = 0;
  bool enabled = false;
  uint64_t desc = 0, avail = 0, used = 0;

  // Whether the driver's layout is usable (checked when it enables the queue): a power-of-two size within the
  // maximum, aligned rings (16, 2, 4) inside RAM. An error message otherwise.
  std::optional<std::string> check_layout(const GuestMemory& memory, uint16_t max_size) const;

  // Chains the driver made available and the device has not taken (an error if the index moved too far).
  Result<uint16_t> available(const GuestMemory& memory) const;
  // Takes the next chain, or nullopt when none is available. With event_idx, publishes the device's position
  // as avail_event, so the driver notifies when it adds past it.
  Result<std::optional<VirtqChain>> pop(GuestMemory& memory, const VirtqFeatures& features);
  // Returns chain `head` with `written` bytes written into its device-writable buffers.
  Result<> push(GuestMemory& memory, uint16_t head, uint32_t written);
  // After push(): whether the driver wants a used-buffer notification now (interrupt suppression: the
  // avail ring's NO_INTERRUPT flag, or used_event with VIRTIO_F_EVENT_IDX).
  Result<bool> needs_interrupt(const GuestMemory& memory, const VirtqFeatures& features);

  uint16_t next_avail() const { return last_avail_; }
  uint16_t next_used() const { return used_idx_; }

  void save(StateWriter& w) const;
  void restore(StateReader& r, uint16_t max_size);

 private:
  uint16_t last_avail_ = 0;
  uint16_t used_idx_ = 0;
  uint16_t signalled_used_ = 0;
  bool signalled_valid_ = false;
};

// Reads a chain's device-readable bytes in order, as one stream.
class VirtqReader {
 public:
  VirtqReader(const GuestMemory& memory, std::span<const VirtqBuffer> buffers) : memory_(memory), buffers_(buffers) {}
  // Copies up to out.size() bytes; returns how many (fewer at the end of the buffers).
  size_t read(std::span<uint8_t> out);
  void skip(uint64_t bytes);
  uint64_t remaining() const;

 private:
  const GuestMemory& memory_;
  std::span<const VirtqBuffer> buffers_;
  size_t index_ = 0;
  uint64_t offset_ = 0;  // into buffers_[index_]
};

// Writes into a chain's device-writable buffers in order, as one stream (GuestMemory::write: pages marked dirty).
class VirtqWriter {
 public:
  VirtqWriter(GuestMemory& memory, std::span<const VirtqBuffer> buffers) : memory_(memory), buffers_(buffers) {}
  // Copies up to data.size() bytes; returns how many (fewer when the buffers are full).
  size_t write(std::span<const uint8_t> data);
  uint64_t written() const { return written_; }
  uint64_t remaining() const;

 private:
  GuestMemory& memory_;
  std::span<const VirtqBuffer> buffers_;
  size_t index_ = 0;
  uint64_t offset_ = 0;
  uint64_t written_ = 0;
};

}  // namespace deja
