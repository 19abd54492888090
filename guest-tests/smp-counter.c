/* Guest "smp-counter": every processor increments one counter without LOCK (a load, some work, a store) and another with LOCK XADD; the locked total is exact, the unlocked one loses the updates the schedule interleaves. */
#include "runtime/runtime.h"

#define INCREMENTS 100000

static volatile uint64_t unlocked_counter, locked_counter;
static volatile int finished;
static uint64_t increments = INCREMENTS;

static void work(int cpu) {
  for (uint64_t k = 0; k < increments; ++k) {
    uint64_t value = unlocked_counter; /* load ... */
    uint64_t scratch = value + (uint64_t)cpu;
    for (int i = 0; i < 4; ++i) scratch = scratch * 6364136223846793005ull + 1442695040888963407ull;
    __asm__ volatile("" ::"r"(scratch)); /* keep the work: it widens the window between load and store */
    unlocked_counter = value + 1; /* ... store: another processor's increments in between are lost */
    __atomic_fetch_add(&locked_counter, 1, __ATOMIC_SEQ_CST);
  }
  __atomic_fetch_add(&finished, 1, __ATOMIC_SEQ_CST);
}

static void ap_main(int cpu) { work(cpu); }

int guest_main(void) {
  increments = boot_arg_u64("increments", INCREMENTS);
  int cpus = smp_start(ap_main);
  printf("smp-counter: %d processors x %lu increments\n", cpus, increments);
  work(0);
  while (finished < cpus) cpu_pause();
  uint64_t expected = (uint64_t)cpus * increments;
  printf("smp-counter: locked %lu of %lu\n", locked_counter, expected);
  printf("smp-counter: unlocked %lu (%lu lost)\n", unlocked_counter, expected - unlocked_counter);
  if (locked_counter != expected) fail("the locked counter lost updates");
  if (unlocked_counter > expected) fail("the unlocked counter counted more than was added");
  return 0;
}
