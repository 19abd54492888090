// virtio-rng: an entropy source whose bytes come from the engine's Entropy port (recorded, replayed).
#pragma once

#include <cstdint>
#include <optional>

#include "devices/device.h"
#include "devices/virtio.h"

namespace deja {

// Virtio 1.1, 5.4: one request queue, no features, no configuration. Requests complete as timed work, like
// virtio-blk's: a notification makes the device due at once and advance() (inside a recorded asynchronous event)
// fills each chain's device-writable buffers from the Entropy port - at most kMaxBytesPerRequest a chain, so a
// driver posting huge buffers cannot make the trace grow by more than that per request.
class VirtioRng : public VirtioDevice {
 public:
  static constexpr uint32_t kMaxBytesPerRequest = 4096;

  explicit VirtioRng(Entropy& entropy) : entropy_(entropy) {}

  std::string_view name() const override { return "virtio-rng"; }
  uint16_t device_id() const override { return virtio::kIdEntropy; }
  uint32_t pci_class() const override { return 0xff0000; }  // unclassified
  uint64_t device_features() const override { return 0; }
  unsigned queue_count() const override { return 1; }
  unsigned config_size() const override { return 0; }
  void read_config(unsigned, std::span<uint8_t>) override {}
  void reset() override { pending_ = false; }
  void queue_notified(unsigned) override { pending_ = true; }
  std::optional<uint64_t> next_deadline_ns() const override {
    return pending_ ? std::optional<uint64_t>(0) : std::nullopt;
  }
  void advance(uint64_t now_ns) override;
  void save(StateWriter& w) const override { w.boolean(pending_); }
  void restore(StateReader& r) override { pending_ = r.boolean(); }

  uint64_t bytes_supplied() const { return bytes_; }

 private:
  Entropy& entropy_;
  bool pending_ = false;
  uint64_t bytes_ = 0;
};

}  // namespace deja
