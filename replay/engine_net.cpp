// The engine's network choke point: frames the guest sends go to the user-mode network (recorded with their length
// and hash, and the frame for inspect) or, in replay, are checked against the recording; received frames travel
// inside Async events.
#include <xxhash.h>

#include <fmt/format.h>

#include "logging/trace_inspect.h"
#include "replay/engine.h"

namespace deja {

void Engine::transmit(unsigned nic, std::span<const uint8_t> frame) {
  const uint64_t hash = XXH3_64bits(frame.data(), frame.size());
  if (mode_ == Mode::kReplay) {
    std::string what = fmt::format("net_transmit nic={} length={} hash={:016x}", nic, frame.size(), hash);
    if (const auto* e = expect(trace::Event::kNetTransmit, what)) {
      const auto& t = e->net_transmit();
      if (t.nic() != nic || t.length() != frame.size() || t.hash() != hash) {
        diverge("the guest sent another network frame than recorded", describe_event(*e), what);
      }
    }
    return;
  }
  if (mode_ == Mode::kRecord) {
    trace::Event e;
    auto* t = e.mutable_net_transmit();
    t->set_nic(nic);
    t->set_length(uint32_t(frame.size()));
    t->set_hash(hash);
    t->set_data(frame.data(), frame.size());
    append(std::move(e));
  }
  if (nic < networks_.size()) networks_[nic]->input(frame);
}

}  // namespace deja
