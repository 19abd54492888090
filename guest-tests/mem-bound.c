/* Guest "mem-bound" (benchmark): random read-modify-writes over 64 MiB mapped with 4 KiB pages, so nearly every access misses a TLB. */
#include "runtime/runtime.h"

/* 64 MiB of RAM (guest-physical 64-128 MiB) mapped at linear 4 GiB with 16,384 4 KiB pages: far more than
   any TLB holds, so the random accesses below miss nearly every time and a software CPU walks the tables
   (or refills its software TLB) on each. One iteration is about 25 instructions: a xorshift64 step, the
   page and offset, a load-add-store and a load XORed into the checksum. The default n = 20,000,000 is
   about 5e8 instructions; pass "n=NUMBER". */
#define DEFAULT_ITERATIONS 20000000ull
#define REGION_BYTES (64ull << 20)
#define REGION_PHYS (64ull << 20)
#define REGION_LINEAR (4ull << 30)
#define REGION_PAGES (REGION_BYTES >> 12)

extern uint64_t boot_pdpt[512];
static uint64_t region_pd[512] __attribute__((aligned(4096)));
static uint64_t region_pt[REGION_PAGES / 512][512] __attribute__((aligned(4096)));

static void map_region(void) {
  for (uint64_t page = 0; page < REGION_PAGES; ++page)
    region_pt[page >> 9][page & 511] = (REGION_PHYS + (page << 12)) | PTE_P | PTE_W;
  for (uint64_t i = 0; i < REGION_PAGES / 512; ++i) region_pd[i] = (uint64_t)region_pt[i] | PTE_P | PTE_W;
  boot_pdpt[REGION_LINEAR >> 30] = (uint64_t)region_pd | PTE_P | PTE_W;
  write_cr3(read_cr3());
}

static uint64_t workload(uint64_t iterations) {
  uint64_t state = 0x2545f4914f6cdd1dull, checksum = 0;
  volatile uint64_t *region = (volatile uint64_t *)REGION_LINEAR;
  for (uint64_t i = 0; i < iterations; ++i) {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    uint64_t slot = ((state & (REGION_PAGES - 1)) << 9) | ((state >> 32) & 511);
    region[slot] += state;
    checksum ^= region[slot];
  }
  return checksum;
}

int guest_main(void) {
  const struct boot_info *info = boot_info();
  if ((info->flags & 1) && ((uint64_t)info->mem_upper_kib << 10) + (1 << 20) < REGION_PHYS + REGION_BYTES)
    fail("mem-bound needs %llu MiB of RAM", (REGION_PHYS + REGION_BYTES) >> 20);
  uint64_t iterations = boot_arg_u64("n", DEFAULT_ITERATIONS);
  map_region();
  printf("mem-bound: n=%lu random accesses over %llu MiB of 4 KiB pages\n", iterations, REGION_BYTES >> 20);
  printf("mem-bound: checksum=%#018lx\n", workload(iterations));
  return 0;
}
