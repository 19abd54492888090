// tsc-spin: a user-space program of the bundled Linux guest that spins on the TSC, for record/replay tests.
//
// Usage: tsc-spin TICKS NS
//   spins on RDTSC until TICKS TSC ticks have passed, then on clock_gettime(CLOCK_MONOTONIC) (the vDSO, which reads
//   the TSC itself, no system call) until NS nanoseconds have passed, each loop making 16 reads at least, and prints
//   one line per loop: how many reads it made, the span they covered, the smallest and largest step, how many steps
//   went backwards, and a hash of every step. The line depends on every value read, so a replay whose TSC (or vDSO
//   time) differed anywhere would print differently; and the number of reads depends on how fast time went by, so it
//   differs between recordings.
//   It exits 1 if time went backwards or did not advance.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static uint64_t rdtsc(void) {
  uint32_t lo, hi;
  __asm__ volatile("rdtsc" : "=a"(lo), "=d"(hi));
  return ((uint64_t)hi << 32) | lo;
}

static uint64_t monotonic_ns(void) {
  struct timespec ts;
  if (clock_gettime(CLOCK_MONOTONIC, &ts) != 0) {
    perror("tsc-spin: clock_gettime");
    exit(2);
  }
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

// What one loop saw. FNV-1a over each step, so both the values and their order count.
struct seen {
  uint64_t reads, span, min_step, max_step, backwards, hash;
};

static void note(struct seen *s, uint64_t prev, uint64_t now) {
  uint64_t step = now - prev;
  if (now < prev) {
    s->backwards++;
    step = prev - now;
  }
  if (step < s->min_step) s->min_step = step;
  if (step > s->max_step) s->max_step = step;
  for (int i = 0; i < 8; i++) s->hash = (s->hash ^ ((step >> (8 * i)) & 0xff)) * 0x100000001b3u;
  s->reads++;
}

static struct seen spin(uint64_t (*read)(void), uint64_t duration) {
  struct seen s = {0, 0, UINT64_MAX, 0, 0, 0xcbf29ce484222325u};
  uint64_t start = read(), prev = start, now = start;
  // Ends when `duration` has passed since the start and it has read at least kMinReads times (on a loaded host one
  // step of a vCPU that exits for each RDTSC can take the whole duration); a clock that went backwards past the
  // start would spin for ever, so it also ends at the first step backwards.
  enum { kMinReads = 16 };
  while ((now - start < duration || s.reads < kMinReads) && s.backwards == 0) {
    now = read();
    note(&s, prev, now);
    prev = now;
  }
  s.span = now - start;
  return s;
}

static int report(const char *what, const char *unit, const struct seen *s) {
  printf("tsc-spin: %s %llu reads over %llu %s, steps %llu-%llu, %llu backwards, hash %016llx\n", what,
         (unsigned long long)s->reads, (unsigned long long)s->span, unit, (unsigned long long)s->min_step,
         (unsigned long long)s->max_step, (unsigned long long)s->backwards, (unsigned long long)s->hash);
  return s->backwards == 0 && s->reads > 0 && s->max_step > 0;
}

int main(int argc, char **argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: tsc-spin TICKS NS\n");
    return 2;
  }
  uint64_t ticks = strtoull(argv[1], NULL, 0), ns = strtoull(argv[2], NULL, 0);
  struct seen tsc = spin(rdtsc, ticks);
  struct seen mono = spin(monotonic_ns, ns);
  int ok = report("rdtsc", "ticks", &tsc);
  ok &= report("clock_gettime", "ns", &mono);
  return ok ? 0 : 1;
}
