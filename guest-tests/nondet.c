/* Guest "nondet": reads RDTSC twice and, when CPUID says so, RDRAND: inputs a recorder must capture because they cannot be derived. */
#include "runtime/runtime.h"

#define CPUID1_ECX_RDRAND (1u << 30)

int guest_main(void) {
  uint64_t first = rdtsc();
  /* Some work between the reads, so even a coarse TSC must advance. */
  volatile uint64_t spin = 0;
  for (int i = 0; i < 1000; ++i) spin += i;
  uint64_t second = rdtsc();
  printf("rdtsc: first=%#018lx second=%#018lx\n", first, second);
  printf("rdtsc: second is larger: %s\n", second > first ? "yes" : "no");

  if (cpuid(1, 0).ecx & CPUID1_ECX_RDRAND) {
    uint64_t value = 0;
    uint8_t ok = 0;
    /* Intel's DRNG guide: retry a few times, CF=0 means no entropy was available yet. */
    for (int attempt = 0; attempt < 10 && !ok; ++attempt)
      __asm__ volatile("rdrand %0; setc %1" : "=r"(value), "=qm"(ok)::"cc");
    if (ok) printf("rdrand: %#018lx\n", value);
    else printf("rdrand: no entropy after 10 attempts\n");
    return (second > first && ok) ? 0 : 1;
  }
  printf("rdrand: not available\n");
  return second > first ? 0 : 1;
}
