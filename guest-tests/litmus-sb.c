/* Guest "litmus-sb": the store-buffering litmus test, x86-TSO's one reordering: processor 0 runs x=1; r1=y and processor 1 y=1; r2=x, round after round; r1=r2=0 needs each store still in its processor's store buffer when the other loads (deja --tso), and never happens with an MFENCE between the store and the load (fence=1). */
#include "runtime/runtime.h"

#define ROUNDS 1000
#define MAX_ROUNDS 4096

/* Fresh variables every round, so nothing needs resetting between rounds. */
static volatile uint32_t x[MAX_ROUNDS], y[MAX_ROUNDS], r1[MAX_ROUNDS], r2[MAX_ROUNDS];
/* Rounds each processor finished. Plain stores and loads: a barrier of locked instructions would empty the store
 * buffers at every round and leave only the few instructions between the store and the barrier to observe. */
static volatile uint32_t done[2];
static uint64_t rounds = ROUNDS, fence;

static void side(int cpu, volatile uint32_t *mine, volatile uint32_t *theirs, volatile uint32_t *seen) {
  for (uint32_t i = 0; i < rounds; ++i) {
    while (done[1 - cpu] < i) cpu_pause(); /* the other processor has finished round i - 1 */
    mine[i] = 1;
    if (fence) __asm__ volatile("mfence" ::: "memory");
    seen[i] = theirs[i];
    done[cpu] = i + 1;
  }
}

static void ap_main(int cpu) {
  if (cpu == 1) side(1, y, x, r2);
}

int guest_main(void) {
  rounds = boot_arg_u64("rounds", ROUNDS);
  fence = boot_arg_u64("fence", 0);
  if (rounds > MAX_ROUNDS) rounds = MAX_ROUNDS;
  int cpus = smp_start(ap_main);
  if (cpus < 2) fail("litmus-sb needs two processors (--cpus 2)");
  side(0, x, y, r1);
  while (done[1] < rounds) cpu_pause();
  uint32_t both_zero = 0;
  for (uint32_t i = 0; i < rounds; ++i) both_zero += r1[i] == 0 && r2[i] == 0;
  if (both_zero) printf("litmus-sb: r1=r2=0 seen in %u of %lu rounds%s\n", both_zero, rounds, fence ? " (with MFENCE)" : "");
  else printf("litmus-sb: r1=r2=0 never seen in %lu rounds%s\n", rounds, fence ? " (with MFENCE)" : "");
  return 0;
}
