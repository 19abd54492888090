// virtio-rng requests: each chain's writable buffers filled from the Entropy port, bounded per request.
#include "devices/virtio_rng.h"

#include <algorithm>
#include <vector>

namespace deja {

void VirtioRng::advance(uint64_t /*now_ns*/) {
  if (!pending_) return;
  pending_ = false;
  bool pushed = false;
  std::vector<uint8_t> bytes;
  while (auto chain = transport().pop(0)) {
    bytes.resize(size_t(std::min<uint64_t>(chain->writable_bytes, kMaxBytesPerRequest)));
    if (!bytes.empty()) entropy_.fill(bytes);
    VirtqWriter out(transport().memory(), chain->writable);
    out.write(bytes);
    bytes_ += bytes.size();
    transport().push(0, chain->head, uint32_t(bytes.size()));
    pushed = true;
  }
  if (pushed) transport().notify_used(0);
}

}  // namespace deja
