// virtio-net: an Ethernet NIC whose frames go out through a NetworkPort and come in as recorded input.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>

#include "devices/device.h"
#include "devices/virtio.h"

namespace deja {

namespace virtio_net {
constexpr uint64_t kFeatureMac = 1ull << 5;
constexpr unsigned kHeaderSize = 12;  // struct virtio_net_hdr with num_buffers (always, with VIRTIO_F_VERSION_1)
constexpr unsigned kConfigSize = 8;   // mac[6], status (not offered: reads 0)
constexpr unsigned kRxQueue = 0, kTxQueue = 1;
// The largest frame either way: an Ethernet frame without jumbo frames or segmentation offloads, plus room.
constexpr size_t kMaxFrame = 1514 + 4;
}  // namespace virtio_net

// Virtio 1.1, 5.1, with only VIRTIO_NET_F_MAC (and the ring features): no checksum or segmentation offloads, so
// every frame is a complete Ethernet frame with its checksums, which is what libslirp wants; no control queue,
// no mergeable receive buffers (one chain per received frame).
//   - Transmit happens when the driver notifies the transmit queue, inside that MMIO write: each chain's
//     12-byte header is skipped and the rest (at most kMaxFrame bytes; a longer chain is dropped and counted) goes
//     to the NetworkPort - which is the engine: in replay it checks the frame against the recording.
//   - Receive: the machine hands frames in (`receive`) only inside a recorded asynchronous event; each takes one
//     receive chain (header: num_buffers 1, no flags), and a frame with no chain available, or larger than its
//     chain, is dropped and counted, as a NIC drops on overrun. `rx_capacity` says how many chains wait.
class VirtioNet : public VirtioDevice {
 public:
  VirtioNet(NetworkPort& port, unsigned index, std::array<uint8_t, 6> mac);

  std::string_view name() const override { return name_; }
  uint16_t device_id() const override { return virtio::kIdNet; }
  uint32_t pci_class() const override { return 0x020000; }  // network, Ethernet
  uint64_t device_features() const override { return virtio_net::kFeatureMac; }
  unsigned queue_count() const override { return 2; }
  unsigned config_size() const override { return virtio_net::kConfigSize; }
  void read_config(unsigned offset, std::span<uint8_t> data) override;
  void reset() override {}
  void queue_notified(unsigned q) override;
  void save(StateWriter& w) const override;
  void restore(StateReader& r) override;

  // Receive chains the driver has made available (0 while the queue is not ready).
  uint16_t rx_capacity() { return transport().available(virtio_net::kRxQueue); }
  // Frames from outside, in order; one used-buffer notification at the end.
  void receive(std::span<const std::span<const uint8_t>> frames);

  unsigned index() const { return index_; }
  struct Counters {
    uint64_t tx_frames = 0, tx_bytes = 0, tx_dropped = 0;
    uint64_t rx_frames = 0, rx_bytes = 0, rx_dropped = 0;
  };
  const Counters& counters() const { return counters_; }

 private:
  void transmit();

  NetworkPort& port_;
  unsigned index_;
  std::array<uint8_t, 6> mac_;
  std::string name_;
  Counters counters_;
};

}  // namespace deja
