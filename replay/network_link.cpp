// NetworkLink: frames in flight by arrival time, in the order sent among equal arrivals.
#include "replay/network_link.h"

#include <algorithm>

namespace deja {

bool NetworkLink::send(Way way, std::vector<uint8_t> frame, uint64_t arrival_ns, bool in_order) {
  Queue& q = queues_[size_t(way)];
  const uint64_t order = q.sent++;
  if (q.in_flight.size() >= kMaxFrames || q.bytes + frame.size() > kMaxBytes) {
    ++dropped_;
    return false;
  }
  if (in_order) {
    arrival_ns = std::max(arrival_ns, q.last_in_order_ns);
    q.last_in_order_ns = arrival_ns;
  }
  q.bytes += frame.size();
  q.in_flight.emplace(std::pair(arrival_ns, order), std::move(frame));
  return true;
}

std::optional<uint64_t> NetworkLink::next_arrival(Way way) const {
  const Queue& q = queues_[size_t(way)];
  if (q.in_flight.empty()) return std::nullopt;
  return q.in_flight.begin()->first.first;
}

std::vector<std::vector<uint8_t>> NetworkLink::take_arrived(Way way, uint64_t now_ns, size_t max) {
  Queue& q = queues_[size_t(way)];
  std::vector<std::vector<uint8_t>> frames;
  while (frames.size() < max && !q.in_flight.empty() && q.in_flight.begin()->first.first <= now_ns) {
    auto node = q.in_flight.extract(q.in_flight.begin());
    q.bytes -= node.mapped().size();
    frames.push_back(std::move(node.mapped()));
  }
  return frames;
}

}  // namespace deja
