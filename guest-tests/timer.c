/* Guest "timer": PIT channel 0 at 1000 Hz on IRQ0; counts ticks while halting, then while spinning on a volatile counter. */
#include "runtime/runtime.h"

#define TICK_HZ 1000
#define TICKS_PER_PHASE 50

static volatile uint64_t ticks;

static struct frame *on_tick(struct frame *f) {
  ++ticks;
  return f;
}

int guest_main(void) {
  set_interrupt_handler(IRQ_BASE + 0, on_tick);
  uint16_t divisor = pit_start(TICK_HZ, PIT_MODE_RATE);
  printf("timer: PIT channel 0, mode 2, divisor %u (%u Hz)\n", divisor, TICK_HZ);
  pic_unmask(0);

  /* Halting: each HLT ends at an interrupt. Interrupts are off while the count is checked, so the
     loop stops exactly at the target even if the emulator delivers late ticks back to back. */
  uint64_t wakeups = 0;
  for (;;) {
    cli();
    if (ticks >= TICKS_PER_PHASE) break;
    sti_hlt();
    ++wakeups;
  }
  uint64_t halted = ticks;
  printf("halting: %lu ticks\n", halted);
  if (halted != TICKS_PER_PHASE || wakeups < TICKS_PER_PHASE) fail("halting: %lu ticks after %lu wakeups", halted, wakeups);

  /* Spinning: interrupts stay enabled; the counter is read through a volatile, so the compiler must reload it. */
  sti();
  uint64_t spins = 0;
  while (ticks < 2 * TICKS_PER_PHASE) {
    cpu_pause();
    ++spins;
  }
  cli();
  uint64_t spun = ticks - halted;
  /* A late emulator may deliver two ticks between polls; the report is capped so it stays exact. */
  printf("spinning: %lu ticks\n", spun < TICKS_PER_PHASE ? spun : (uint64_t)TICKS_PER_PHASE);
  if (spun < TICKS_PER_PHASE || spins == 0) fail("spinning: %lu ticks after %lu polls", spun, spins);

  uint16_t count = pit_read_counter();
  printf("timer: latched PIT count within the divisor: %s\n", count <= divisor ? "yes" : "no");
  pic_mask(0);
  return count <= divisor ? 0 : 1;
}
