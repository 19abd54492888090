// splitmix64, the one seeded generator of every choice deja draws from a seed (schedules, exploration, faults).
#pragma once

#include <cstdint>

namespace deja {

// splitmix64 (Steele, Lea, Flood 2014): fully specified, so the same seed gives the same numbers on every host and
// build (the standard library's distributions are not).
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  // Uniform in [0, n) (n > 0), by rejection: no modulo bias.
  uint64_t below(uint64_t n) {
    const uint64_t limit = UINT64_MAX - UINT64_MAX % n;
    uint64_t v;
    do v = next(); while (v >= limit);
    return v % n;
  }
  uint64_t state() const { return state_; }
  void set_state(uint64_t state) { state_ = state; }

 private:
  uint64_t state_;
};

// One draw that depends only on (seed, key): a choice made again the same wherever it is asked for.
inline uint64_t seeded_hash(uint64_t seed, uint64_t key) {
  SplitMix64 g(seed ^ (key * 0xd1342543de82ef95ull));
  return g.next();
}

}  // namespace deja
