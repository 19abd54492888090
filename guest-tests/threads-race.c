/* Guest "threads-race": three kernel threads preempted round-robin by the PIT race on an unlocked counter; the result depends on interrupt timing. */
#include "runtime/runtime.h"

#define WORKERS 3
#define INCREMENTS 200000
#define TICK_HZ 1000
#define STACK_BYTES 16384

static volatile uint64_t shared_counter;
static uint64_t increments = INCREMENTS; /* "increments=N" on the command line scales the run (bench/) */
/* Written once, when thread 1 is half done: a watchpoint target far back in a long trace (bench/). */
static volatile uint64_t halfway_mark;
static volatile uint64_t progress[WORKERS + 1];
static volatile int finished[WORKERS + 1];
static volatile int sse_intact[WORKERS + 1];
static struct frame *saved[WORKERS + 1]; /* slot 0 is the boot thread */
static int current;
static uint64_t switches;
static uint8_t stacks[WORKERS + 1][STACK_BYTES] __attribute__((aligned(16)));

static _Noreturn void worker(uint64_t id) {
  /* A double accumulator lives in XMM registers across preemptions, so a scheduler that mixed up
     SSE state would show up as a wrong sum (the values are integers, exact in a double). */
  double sum = 0;
  for (uint64_t k = 0; k < increments; ++k) {
    uint64_t value = shared_counter; /* load ... */
    uint64_t scratch = value;
    for (int i = 0; i < 8; ++i) scratch = scratch * 6364136223846793005ull + 1442695040888963407ull;
    __asm__ volatile("" ::"r"(scratch)); /* keep the work: it widens the window between load and store */
    shared_counter = value + 1; /* ... store: not atomic, updates from other threads in between are lost */
    sum += (double)(k * id);
    progress[id] = k + 1;
    if (id == 1 && k == increments / 2) halfway_mark = shared_counter;
  }
  double expected = (double)id * ((double)increments * (increments - 1) / 2);
  sse_intact[id] = sum == expected;
  finished[id] = 1;
  for (;;) __asm__ volatile("hlt"); /* parked until the scheduler stops picking it */
}

static struct frame *schedule(struct frame *f) {
  saved[current] = f;
  int next = current;
  for (int step = 0; step <= WORKERS; ++step) {
    next = (next + 1) % (WORKERS + 1);
    if (next == 0 || !finished[next]) break;
  }
  if (next != current) ++switches;
  current = next;
  return saved[current];
}

/* Builds the frame a new thread starts from, as if it had been interrupted at `entry`. */
static struct frame *prepare_thread(int id, void (*entry)(uint64_t)) {
  uint8_t *top = stacks[id] + STACK_BYTES;
  struct frame *f = (struct frame *)(top - sizeof(struct frame));
  memset(f, 0, sizeof *f);
  __asm__ volatile("fxsave %0" : "=m"(f->fxsave)); /* a valid FPU/SSE image (MXCSR, control word) */
  f->cr0_ts = 0;
  f->rip = (uint64_t)entry;
  f->cs = KERNEL_CS;
  f->ss = KERNEL_DS;
  f->rflags = 0x202; /* IF: preemptible from the first instruction */
  f->rsp = (uint64_t)f - 8; /* as just after a CALL: RSP + 8 is 16-byte aligned */
  f->rdi = (uint64_t)id;
  return f;
}

int guest_main(void) {
  increments = boot_arg_u64("increments", INCREMENTS);
  printf("threads-race: %d threads x %lu unlocked increments, preempted by the PIT at %d Hz\n", WORKERS, increments,
         TICK_HZ);
  for (int id = 1; id <= WORKERS; ++id) saved[id] = prepare_thread(id, (void (*)(uint64_t))worker);
  set_interrupt_handler(IRQ_BASE + 0, schedule);
  pit_start(TICK_HZ, PIT_MODE_RATE);
  pic_unmask(0);
  for (;;) {
    cli();
    int all = 1;
    for (int id = 1; id <= WORKERS; ++id) all &= finished[id];
    if (all) break;
    sti_hlt();
  }
  pic_mask(0);
  uint64_t total = 0;
  int ok = 1;
  for (int id = 1; id <= WORKERS; ++id) {
    printf("thread %d: %lu increments, SSE state intact: %s\n", id, progress[id], sse_intact[id] ? "yes" : "no");
    total += progress[id];
    ok &= progress[id] == increments && sse_intact[id];
  }
  uint64_t final = shared_counter;
  printf("final count: %lu of %lu (lost updates: %lu)\n", final, total, total - final);
  printf("context switches: %lu\n", switches);
  /* Lost updates can only lower the count (an unlucky schedule can lower it far: any bound but >= 1
     would be a guess), and every worker had to be switched to at least once. */
  ok &= final >= 1 && final <= total && switches >= WORKERS;
  printf("threads-race: %s\n", ok ? "done" : "FAILED");
  return ok ? 0 : 1;
}
