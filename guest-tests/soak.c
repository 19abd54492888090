/* Guest "soak" (benchmark, not in the test matrix): PIT at 1000 Hz, serial input taken by polling at every tick, the
   CMOS clock read every second, a status line printed every second, for "seconds=N" of guest time (default 600). */
#include "runtime/runtime.h"

static volatile uint64_t ticks;

static struct frame *on_tick(struct frame *f) {
  ++ticks;
  return f;
}

static uint8_t cmos(uint8_t reg) {
  outb(0x70, reg);
  return inb(0x71);
}

int guest_main(void) {
  const uint64_t seconds = boot_arg_u64("seconds", 600);
  set_interrupt_handler(IRQ_BASE + 0, on_tick);
  pit_start(1000, PIT_MODE_RATE);
  pic_unmask(0);
  uint64_t received = 0, fnv = 0xcbf29ce484222325ull, seen = 0;
  for (uint64_t second = 1; second <= seconds; ++second) {
    while (ticks < second * 1000) {
      cli();
      if (ticks == seen) sti_hlt();
      else sti();
      seen = ticks;
      while (inb(COM1 + 5) & 1) {  /* LSR data ready: take every received byte */
        fnv = (fnv ^ inb(COM1)) * 0x100000001b3ull;
        ++received;
      }
    }
    printf("soak: %lu s, %lu ticks, %lu bytes in (fnv %016lx), rtc second %02x\n", (unsigned long)second,
           (unsigned long)ticks, (unsigned long)received, (unsigned long)fnv, cmos(0));
  }
  pic_mask(0);
  printf("soak: done after %lu s of guest time\n", (unsigned long)seconds);
  return 0;
}
