// The engine's choke point for injected faults (deja explore): whether a disk request fails, decided from the seed.
#include <algorithm>

#include "replay/engine.h"

namespace deja {

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
  // (A run's faults are few: at most one a disk request; kept to report them.)
  const uint64_t ordinal = faults_drawn_count_++;
  const bool suppressed =
      std::find(faults_.suppressed.begin(), faults_.suppressed.end(), ordinal) != faults_.suppressed.end();
  if (faults_drawn_.size() < kFaultsKept) {
    faults_drawn_.push_back(FaultDrawn{ordinal, suppressed, disk, write, sector, where_ ? where_() : Position{}});
  }
  if (suppressed) return {};
  ++faults_injected_;
  return f;
}

}  // namespace deja
