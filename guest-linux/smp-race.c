// smp-race: a user-space program of the bundled Linux guest whose threads, one per CPU, race on shared memory.
//
// Usage: smp-race THREADS INCREMENTS
//   Starts THREADS threads, thread i pinned to CPU i % (CPUs online), each adding 1 INCREMENTS times to a counter
//   without a lock (a load, some work, a store: updates another CPU makes in between are lost), to one under a
//   pthread mutex (futexes when contended) and to one with an atomic add; the threads then pass a token round a
//   ring of pipes. It prints the three totals and where each thread ran. The unlocked total depends on how the CPUs
//   interleaved (on deja: the schedule's seed); the other two are exact, or it exits 1.
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static volatile uint64_t unlocked_counter;
static uint64_t locked_counter, atomic_counter;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static uint64_t increments;
static int threads;
static int (*ring)[2];

struct worker {
  pthread_t thread;
  int index;
  int cpu;  // where it ran at the end
};

static void* work(void* arg) {
  struct worker* w = arg;
  const long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(w->index % (cpus > 0 ? cpus : 1), &set);
  if (sched_setaffinity(0, sizeof set, &set) != 0) perror("smp-race: sched_setaffinity");
  for (uint64_t k = 0; k < increments; ++k) {
    uint64_t value = unlocked_counter;  // load ...
    uint64_t scratch = value + (uint64_t)w->index;
    for (int i = 0; i < 8; ++i) scratch = scratch * 6364136223846793005ull + 1442695040888963407ull;
    __asm__ volatile("" ::"r"(scratch));  // the work widens the window between load and store
    unlocked_counter = value + 1;       // ... store
    pthread_mutex_lock(&lock);
    ++locked_counter;
    pthread_mutex_unlock(&lock);
    __atomic_fetch_add(&atomic_counter, 1, __ATOMIC_SEQ_CST);
  }
  // A token round the ring of pipes, 100 times: each pass wakes the next thread on its CPU.
  char token = 0;
  for (int round = 0; round < 100; ++round) {
    if (w->index == 0 && round == 0) token = 1;
    else if (read(ring[w->index][0], &token, 1) != 1) return NULL;
    if (write(ring[(w->index + 1) % threads][1], &token, 1) != 1) return NULL;
  }
  if (w->index == 0 && read(ring[0][0], &token, 1) != 1) return NULL;  // the last pass
  w->cpu = sched_getcpu();
  return NULL;
}

int main(int argc, char** argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: smp-race THREADS INCREMENTS\n");
    return 2;
  }
  threads = atoi(argv[1]);
  increments = strtoull(argv[2], NULL, 10);
  if (threads < 1 || threads > 64) return 2;
  struct worker* workers = calloc((size_t)threads, sizeof *workers);
  ring = calloc((size_t)threads, sizeof *ring);
  for (int i = 0; i < threads; ++i) {
    if (pipe(ring[i]) != 0) return 2;
  }
  for (int i = 0; i < threads; ++i) {
    workers[i].index = i;
    if (pthread_create(&workers[i].thread, NULL, work, &workers[i]) != 0) return 2;
  }
  for (int i = 0; i < threads; ++i) pthread_join(workers[i].thread, NULL);
  const uint64_t expected = (uint64_t)threads * increments;
  printf("smp-race: %d threads x %llu: mutex %llu, atomic %llu, unlocked %llu (%llu lost); cpus", threads,
         (unsigned long long)increments, (unsigned long long)locked_counter, (unsigned long long)atomic_counter,
         (unsigned long long)unlocked_counter, (unsigned long long)(expected - unlocked_counter));
  for (int i = 0; i < threads; ++i) printf(" %d", workers[i].cpu);
  printf("\n");
  return locked_counter == expected && atomic_counter == expected && unlocked_counter <= expected ? 0 : 1;
}
