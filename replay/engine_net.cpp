// The engine's network choke point: frames the guest sends go to the user-mode network (recorded with their length
// and hash, and the frame for inspect) or, in replay, are checked against the recording; received frames travel
// inside Async events. With a simulated host, both ways cross a seeded wire (NetworkLink).
#include <xxhash.h>

#include <algorithm>

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
  if (nic >= networks_.size()) return;
  if (networks_simulated()) {
    send_on_link(nic, NetworkLink::Way::kToNetwork, std::vector<uint8_t>(frame.begin(), frame.end()));
  } else {
    networks_[nic]->input(frame);
  }
}

void Engine::send_on_link(unsigned nic, NetworkLink::Way way, std::vector<uint8_t> frame) {
  NetworkLink& link = links_[nic];
  const NetworkFate fate = network_fate(nic, way, link.sent(way), frame);
  using Fault = NetworkFate::Fault;
  const uint64_t arrival = std::max(derived_now_ns(), network_now_ns_) + fate.latency_ns;
  if (fate.fault == Fault::kDrop) {
    link.lose(way);
    return;
  }
  if (fate.fault == Fault::kDuplicate) link.send(way, frame, arrival);
  link.send(way, std::move(frame), arrival, fate.fault != Fault::kReorder);
}

void Engine::exchange_network(uint64_t now_ns) {
  network_now_ns_ = std::max(network_now_ns_, now_ns);
  for (size_t nic = 0; nic < links_.size(); ++nic) {
    UserNetwork& network = *networks_[nic];
    for (const auto& frame : links_[nic].take_arrived(NetworkLink::Way::kToNetwork, now_ns, SIZE_MAX)) {
      network.input(frame);
    }
    network.poll_simulated();
    for (auto& frame : network.take(network.pending())) {
      send_on_link(unsigned(nic), NetworkLink::Way::kToGuest, std::move(frame));
    }
  }
}

std::vector<std::vector<uint8_t>> Engine::network_frames_arrived(unsigned nic, uint64_t now_ns, size_t max) {
  if (nic >= links_.size()) return {};
  return links_[nic].take_arrived(NetworkLink::Way::kToGuest, now_ns, max);
}

std::optional<uint64_t> Engine::next_network_ns(unsigned nic, bool nic_can_receive) const {
  if (nic >= links_.size()) return std::nullopt;
  std::optional<uint64_t> next = earliest(links_[nic].next_arrival(NetworkLink::Way::kToNetwork),
                                          networks_[nic]->next_wake_ns());
  return nic_can_receive ? earliest(next, links_[nic].next_arrival(NetworkLink::Way::kToGuest)) : next;
}

}  // namespace deja
