/* Guest "memory": fills RAM above the image with an address-derived pattern, verifies it, and prints the size and a checksum. */
#include "runtime/runtime.h"

/* Fixed bounds, so the output depends only on the RAM size (run with 256 MiB), not on how much the
   firmware reserves at the top (QEMU+SeaBIOS report 128 KiB less than a bare loader): from 16 MiB
   (above any image) to a 16 MiB boundary at least 1 MiB below the end of upper memory. */
#define TEST_START ((uint64_t)16 << 20)
#define FIRMWARE_MARGIN ((uint64_t)1 << 20)
#define MIB ((uint64_t)1 << 20)

static inline uint64_t pattern(uint64_t address) { return (address ^ 0x5a5a5a5a5a5a5a5aull) * 0x9e3779b97f4a7c15ull; }

static int usable(uint64_t start, uint64_t end) {
  const struct boot_info *bi = boot_info();
  if (!(bi->flags & (1u << 6))) return 1; /* no memory map: mem_upper is all we know */
  for (int i = 0; i < bi->region_count; ++i) {
    const struct memory_region *r = &bi->regions[i];
    if (r->type == 1 && r->base <= start && r->base + r->length >= end) return 1;
  }
  return 0;
}

int guest_main(void) {
  const struct boot_info *bi = boot_info();
  if (!(bi->flags & 1)) fail("the loader gave no mem_upper (Multiboot info flags bit 0 clear)");
  if ((uint64_t)_end > TEST_START) fail("image ends at %p, inside the tested range", (void *)_end);
  uint64_t upper_end = MIB + (uint64_t)bi->mem_upper_kib * 1024;
  if (upper_end < TEST_START + 2 * FIRMWARE_MARGIN) fail("only %u KiB of upper memory", bi->mem_upper_kib);
  uint64_t end = (upper_end - FIRMWARE_MARGIN) & ~(TEST_START - 1);
  printf("memory: testing %lu MiB at %#lx-%#lx\n", (end - TEST_START) / MIB, TEST_START, end);
  if (!usable(TEST_START, end)) fail("%#lx-%#lx is not one usable region of the memory map", TEST_START, end);

  volatile uint64_t *first = (volatile uint64_t *)TEST_START, *last = (volatile uint64_t *)end;
  for (volatile uint64_t *p = first; p < last; ++p) *p = pattern((uint64_t)p);

  uint64_t checksum = 0xcbf29ce484222325ull, mismatches = 0;
  for (volatile uint64_t *p = first; p < last; ++p) {
    uint64_t value = *p;
    if (value != pattern((uint64_t)p)) {
      if (mismatches < 4) printf("memory: mismatch at %p: %#lx\n", (void *)p, value);
      ++mismatches;
    }
    checksum = (checksum ^ value) * 0x100000001b3ull; /* FNV-1a over qwords, plus a fold so high bits */
    checksum ^= checksum >> 29;                       /* reach the low ones */
  }
  printf("memory: checksum=%#018lx mismatches=%lu\n", checksum, mismatches);
  return mismatches != 0;
}
