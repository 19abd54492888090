/* Guest "timer": PIT channel 0 at 1000 Hz on IRQ0; counts ticks while halting, then while spinning on a volatile counter. */
#include "runtime/runtime.h"

#define TICK_HZ 1000
#define TICKS_PER_PHASE 50

/* The handler counts up to the phase's target and no further, so the printed counts are exact even
   when a slow emulator delivers late ticks back to back; the surplus is kept apart. */
static volatile uint64_t ticks, target, surplus;

static struct frame *on_tick(struct frame *f) {
  if (ticks < target) ++ticks;
  else ++surplus;
  return f;
}

int guest_main(void) {
  set_interrupt_handler(IRQ_BASE + 0, on_tick);
  target = TICKS_PER_PHASE;
  uint16_t divisor = pit_start(TICK_HZ, PIT_MODE_RATE);
  printf("timer: PIT channel 0, mode 2, divisor %u (%u Hz)\n", divisor, TICK_HZ);
  pic_unmask(0);

  /* Halting: each HLT ends at an interrupt; the check runs with interrupts off so no wakeup is missed. */
  uint64_t wakeups = 0;
  for (;;) {
    cli();
    if (ticks >= TICKS_PER_PHASE) break;
    sti_hlt();
    ++wakeups;
  }
  uint64_t halted = ticks;
  printf("halting: %lu ticks\n", halted);
  if (wakeups == 0) fail("halting: no HLT wakeups");

  /* Spinning: interrupts stay enabled; the counter is read through a volatile, so it is reloaded. */
  target = 2 * TICKS_PER_PHASE;
  sti();
  uint64_t polls = 0;
  while (ticks < target) {
    cpu_pause();
    ++polls;
  }
  cli();
  printf("spinning: %lu ticks\n", ticks - halted);
  if (polls == 0) fail("spinning: the counter was never polled");

  uint16_t count = pit_read_counter();
  printf("timer: latched PIT count within the divisor: %s\n", count <= divisor ? "yes" : "no");
  pic_mask(0);
  return count <= divisor ? 0 : 1;
}
