// The engine's choke point for injected faults (deja explore): whether a disk request fails, and what becomes of a
// frame on a simulated network's wire, decided from the seed.
#include <algorithm>

#include <fmt/format.h>

#include "logging/linux_trace.h"
#include "replay/engine.h"

namespace deja {

bool Engine::draw_fault(bool network, std::string what) {
  uint64_t& count = network ? net_faults_drawn_count_ : faults_drawn_count_;
  const std::vector<uint64_t>& suppressed = network ? faults_.net_suppressed : faults_.suppressed;
  const uint64_t ordinal = count++;
  const bool off = std::find(suppressed.begin(), suppressed.end(), ordinal) != suppressed.end();
  // (A run's faults are few enough to keep the first of each kind: what --minimize reports and takes away.)
  if (ordinal < kFaultsKept) {
    faults_drawn_.push_back(FaultDrawn{network, ordinal, off, std::move(what), where_ ? where_() : Position{}});
  }
  if (!off) ++faults_injected_;
  return off;
}

BlockFault Engine::block_fault(unsigned disk, bool write, uint64_t sector, uint64_t sectors) {
  if (!faults_.any() || sectors == 0) return {};
  // The key: the request, and where the machine is (derived time's state: the last asynchronous event's time and
  // instruction count and the device reads since), so that the same request at another time may fare otherwise;
  // recording, replay and a restored checkpoint all see the same.
  uint64_t key = sector * 0x9e3779b97f4a7c15ull ^ (sectors << 1 | uint64_t(write)) ^ (uint64_t(disk) << 56);
  for (uint64_t v : derived_time_state()) key = seeded_hash(key, v);
  const uint64_t draw = seeded_hash(faults_.seed, key);
  const uint64_t roll = draw % 1'000'000;
  BlockFault f;
  if (roll < faults_.disk_eio_ppm) {
    f.kind = BlockFault::Kind::kIoError;
  } else if (write && roll < uint64_t(faults_.disk_eio_ppm) + faults_.disk_torn_ppm) {
    f.kind = BlockFault::Kind::kTornWrite;
    f.kept_sectors = (draw >> 32) % sectors;  // fewer than asked: at least one sector is lost
  } else {
    return f;
  }
  if (draw_fault(false, fmt::format("disk {} {} sector {}", disk, write ? "write" : "read", sector))) return {};
  return f;
}

// Keyed by the NIC, the way and the frame's ordinal that way: the same frame of the same run fares the same. Only a
// run with a simulated host has wires (record; replay takes the frames that arrived from the trace).
Engine::NetworkFate Engine::network_fate(unsigned nic, NetworkLink::Way way, uint64_t ordinal,
                                         std::span<const uint8_t> frame) {
  NetworkFate fate;
  const uint64_t key = seeded_hash(ordinal, uint64_t(nic) << 1 | uint64_t(way));
  if (simulated_ && simulated_->max_timer_delay_ns) {
    fate.latency_ns = seeded_hash(simulated_->seed ^ 0x6c6174656e6379ull, key) % (simulated_->max_timer_delay_ns + 1);
  }
  if (!faults_.any_network()) return fate;
  const uint64_t draw = seeded_hash(faults_.seed ^ 0x6e65742d6661756cull, key);
  const uint64_t roll = draw % 1'000'000;
  using Fault = NetworkFate::Fault;
  const uint64_t drop = faults_.net_drop_ppm, dup = drop + faults_.net_dup_ppm, reorder = dup + faults_.net_reorder_ppm;
  const Fault fault = roll < drop ? Fault::kDrop : roll < dup ? Fault::kDuplicate : roll < reorder ? Fault::kReorder
                                                                                                  : Fault::kNone;
  if (fault == Fault::kNone) return fate;
  static constexpr const char* kWhat[] = {"", "dropped", "duplicated", "reordered"};
  const std::string what = fmt::format("net {} {}: frame {} {} ({})", nic,
                                       way == NetworkLink::Way::kToGuest ? "to the guest" : "from the guest", ordinal,
                                       kWhat[size_t(fault)], describe_frame(frame));
  if (draw_fault(true, what)) return fate;
  fate.fault = fault;
  if (fault == Fault::kReorder) {
    // Late by 1 to 10 ms, past the frames sent after it in that time (another path through the network).
    fate.latency_ns += 1'000'000 + (draw >> 32) % 9'000'001;
  }
  return fate;
}

}  // namespace deja
