// virtio-net transmit (to the NetworkPort, synchronously) and receive (frames handed in by the machine).
#include "devices/virtio_net.h"

#include <algorithm>

#include <fmt/format.h>

namespace deja {
using namespace virtio_net;

VirtioNet::VirtioNet(NetworkPort& port, unsigned index, std::array<uint8_t, 6> mac)
    : port_(port), index_(index), mac_(mac), name_(fmt::format("virtio-net{}", index)) {}

void VirtioNet::read_config(unsigned offset, std::span<uint8_t> data) {
  uint8_t c[kConfigSize] = {};
  std::copy(mac_.begin(), mac_.end(), c);
  std::copy_n(c + offset, data.size(), data.begin());
}

void VirtioNet::queue_notified(unsigned q) {
  if (q == kTxQueue) transmit();
  // Receive chains are taken when frames arrive; a notification on the receive queue needs no action here.
}

void VirtioNet::transmit() {
  uint8_t frame[kMaxFrame];
  bool pushed = false;
  while (auto chain = transport().pop(kTxQueue)) {
    VirtqReader in(transport().memory(), chain->readable);
    const uint64_t length = in.remaining();
    if (length < kHeaderSize || length - kHeaderSize > kMaxFrame) {
      ++counters_.tx_dropped;
    } else {
      in.skip(kHeaderSize);
      const size_t n = in.read(std::span(frame, size_t(length - kHeaderSize)));
      ++counters_.tx_frames;
      counters_.tx_bytes += n;
      port_.transmit(index_, std::span<const uint8_t>(frame, n));
    }
    transport().push(kTxQueue, chain->head, 0);
    pushed = true;
  }
  if (pushed) transport().notify_used(kTxQueue);
}

void VirtioNet::receive(std::span<const std::span<const uint8_t>> frames) {
  bool pushed = false;
  for (std::span<const uint8_t> frame : frames) {
    auto chain = transport().pop(kRxQueue);
    if (!chain) {
      ++counters_.rx_dropped;
      continue;
    }
    if (chain->writable_bytes < kHeaderSize + frame.size()) {
      ++counters_.rx_dropped;
      transport().push(kRxQueue, chain->head, 0);
      pushed = true;
      continue;
    }
    uint8_t header[kHeaderSize] = {};
    header[10] = 1;  // num_buffers
    VirtqWriter out(transport().memory(), chain->writable);
    out.write(header);
    out.write(frame);
    ++counters_.rx_frames;
    counters_.rx_bytes += frame.size();
    transport().push(kRxQueue, chain->head, uint32_t(out.written()));
    pushed = true;
  }
  if (pushed) transport().notify_used(kRxQueue);
}

void VirtioNet::save(StateWriter& w) const { w.u32(index_); }

void VirtioNet::restore(StateReader& r) {
  if (r.u32() != index_) r.invalid(fmt::format("{}: the state of another NIC", name_));
}

}  // namespace deja
