/* Guest "cpu-bound": a fixed, deterministic integer workload (about 1e9 instructions by default) ending in a checksum. */
#include "runtime/runtime.h"

/* One iteration is 16 or 17 instructions (16.5 on average: the ROL runs on odd states): a
   xorshift64 step, a load-add-store into a 64-entry table, a data-dependent branch and the loop
   branch. The default n = 60,000,000 is therefore about 1.0e9 instructions; pass "n=NUMBER". */
#define DEFAULT_ITERATIONS 60000000ull

static uint64_t table[64];

static uint64_t workload(uint64_t iterations) {
  uint64_t state = 0x9e3779b97f4a7c15ull, accumulator = 0;
  if (iterations == 0) return 0;
  __asm__ volatile(
      "1:\n\t"
      "movq %[s], %%rdx\n\tshlq $13, %%rdx\n\txorq %%rdx, %[s]\n\t"
      "movq %[s], %%rdx\n\tshrq $7, %%rdx\n\txorq %%rdx, %[s]\n\t"
      "movq %[s], %%rdx\n\tshlq $17, %%rdx\n\txorq %%rdx, %[s]\n\t"
      "movl %k[s], %%edx\n\tandl $63, %%edx\n\t"
      "addq (%[t],%%rdx,8), %[a]\n\t"
      "movq %[a], (%[t],%%rdx,8)\n\t"
      "testb $1, %b[s]\n\tjz 2f\n\t"
      "rolq $5, %[a]\n"
      "2:\n\t"
      "decq %[n]\n\tjnz 1b\n"
      : [s] "+a"(state), [a] "+b"(accumulator), [n] "+c"(iterations)
      : [t] "S"(table)
      : "rdx", "cc", "memory");
  uint64_t checksum = accumulator ^ state;
  for (int i = 0; i < 64; ++i) checksum = (checksum ^ table[i]) * 0x100000001b3ull;
  return checksum;
}

int guest_main(void) {
  uint64_t iterations = boot_arg_u64("n", DEFAULT_ITERATIONS);
  printf("cpu-bound: n=%lu iterations\n", iterations);
  printf("cpu-bound: checksum=%#018lx\n", workload(iterations));
  return 0;
}
