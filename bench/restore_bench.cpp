// Checkpoint restore time against the number of dirty pages: two images of 256 MiB RAM differing in N pages, restored alternately.
#include <chrono>
#include <cstdio>
#include <random>

#include "interp/interp_backend.h"
#include "snapshot/cow_memory.h"
#include "core/cpu_model.h"

int main() {
  using namespace deja;
  auto ram = GuestMemory::create(256u << 20);
  if (!ram) return 1;
  auto cpu = make_interp_backend(*ram, CpuModel::x86_64_v1());
  auto mem = CheckpointMemory::create(*ram, **cpu);
  if (!cpu || !mem) return 1;
  std::mt19937_64 rng(1);
  // A guest that has touched 16 MiB of its RAM.
  for (uint64_t page = 0; page < 4096; ++page) {
    uint8_t b[1] = {uint8_t(page | 1)};
    (void)ram->write(Gpa{page * 4096 + 8}, b);
  }
  auto base = *(*mem)->capture();
  std::printf("%-12s %-14s %-14s %s\n", "dirty pages", "restore (us)", "restores/s", "capture (us)");
  for (uint64_t dirty : {1, 10, 100, 300, 1000, 3000, 10000}) {
    if (auto r = (*mem)->restore(base); !r) return 1;
    for (uint64_t i = 0; i < dirty; ++i) {
      uint8_t b[1] = {uint8_t(rng())};
      (void)ram->write(Gpa{(i * 7919 % 65536) * 4096 + 16}, b);
    }
    auto t0 = std::chrono::steady_clock::now();
    auto changed = *(*mem)->capture();
    double capture_us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    const int rounds = dirty >= 3000 ? 50 : 400;
    t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < rounds; ++i) {
      if (auto r = (*mem)->restore(i % 2 ? changed : base); !r) return 1;
    }
    double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / rounds;
    std::printf("%-12llu %-14.1f %-14.0f %.1f\n", (unsigned long long)dirty, us, 1e6 / us, capture_us);
  }
  return 0;
}
