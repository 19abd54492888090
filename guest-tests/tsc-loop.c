/* Guest "tsc-loop" (benchmark, not in the test matrix): reads RDTSC n times in a tight loop ("n=NUMBER", default 100000), to price one RDTSC exit. */
#include "runtime/runtime.h"

int guest_main(void) {
  uint64_t n = boot_arg_u64("n", 100000);
  uint64_t first = rdtsc(), previous = first, backwards = 0;
  for (uint64_t i = 0; i < n; ++i) {
    uint64_t now = rdtsc();
    backwards += now < previous;
    previous = now;
  }
  printf("tsc-loop: %lu reads, %lu went backwards\n", (unsigned long)n, (unsigned long)backwards);
  return backwards == 0 ? 0 : 1;
}
