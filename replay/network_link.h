// The wire between a NIC and its user-mode network in a seeded run (deja explore): frames in flight each way, each
// arriving at its own time, in the order sent unless a fault reorders it; bounded like a NIC's queue.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <utility>
#include <vector>

namespace deja {

class NetworkLink {
 public:
  enum class Way { kToGuest = 0, kToNetwork = 1 };
  // Frames in flight each way: beyond either bound a frame is dropped (as a full queue drops it), and counted.
  static constexpr size_t kMaxFrames = 4096;
  static constexpr size_t kMaxBytes = 8u << 20;

  // A frame sent, to arrive at `arrival_ns`: in order, no earlier than the in-order frame sent before it (a wire
  // keeps order: its latency varies, its order does not); out of order, at `arrival_ns` whatever was sent before
  // or after it. Returns false when it was dropped for want of room.
  bool send(Way way, std::vector<uint8_t> frame, uint64_t arrival_ns, bool in_order = true);
  // A frame lost on the way: counted (the frames after it keep their ordinals), never arrives.
  void lose(Way way) { ++queues_[size_t(way)].sent; }
  // When the next frame arrives that way (nullopt: none in flight).
  std::optional<uint64_t> next_arrival(Way way) const;
  // The frames arrived by `now_ns`, at most `max`, in the order they arrive (frames arriving together: as sent).
  std::vector<std::vector<uint8_t>> take_arrived(Way way, uint64_t now_ns, size_t max);
  // Frames each way so far: the ordinal of the next one sent (what a frame's draws are keyed by).
  uint64_t sent(Way way) const { return queues_[size_t(way)].sent; }
  uint64_t dropped() const { return dropped_; }

 private:
  struct Queue {
    std::map<std::pair<uint64_t, uint64_t>, std::vector<uint8_t>> in_flight;  // by (arrival, order sent)
    size_t bytes = 0;
    uint64_t sent = 0;
    uint64_t last_in_order_ns = 0;
  };
  Queue queues_[2];
  uint64_t dropped_ = 0;
};

}  // namespace deja
