/* Guest "apic": the local APIC (self-IPIs, priority, TPR, EOI, timer one-shot/periodic with divide, x2APIC, TSC deadline), the I/O APIC (PIT on input 2, a level-triggered UART line with Remote IRR) found through the MP table, and ExtINT through LINT0. */
#include "runtime/runtime.h"

#define LAPIC 0xfee00000ul
#define APIC_BASE_MSR 0x1b
#define LAPIC_ID 0x020
#define LAPIC_VERSION 0x030
#define LAPIC_TPR 0x080
#define LAPIC_PPR 0x0a0
#define LAPIC_EOI 0x0b0
#define LAPIC_SVR 0x0f0
#define LAPIC_ISR 0x100
#define LAPIC_TMR 0x180
#define LAPIC_IRR 0x200
#define LAPIC_ICR_LOW 0x300
#define LAPIC_LVT_TIMER 0x320
#define LAPIC_LVT_LINT0 0x350
#define LAPIC_TIMER_INITIAL 0x380
#define LAPIC_TIMER_CURRENT 0x390
#define LAPIC_TIMER_DIVIDE 0x3e0
#define LVT_MASKED (1u << 16)
#define LVT_PERIODIC (1u << 17)
#define LVT_TSC_DEADLINE (2u << 17)
#define ICR_SELF (1u << 18)
#define SPURIOUS_VECTOR 0xff

#define IOAPIC_LEVEL (1u << 15)
#define IOAPIC_MASKED (1u << 16)
#define IOAPIC_REMOTE_IRR (1u << 14)

#define UART_IER_THRE 0x02
#define UART_MCR_OUT2 0x08

/* In x2APIC mode the same registers are MSRs 0x800 + offset / 16 (and the page is not decoded). */
static int x2apic_on;
static uint32_t lapic_read(uint32_t reg) {
  return x2apic_on ? (uint32_t)rdmsr(0x800 + reg / 16) : *(volatile uint32_t *)(LAPIC + reg);
}
static void lapic_write(uint32_t reg, uint32_t value) {
  if (x2apic_on) wrmsr(0x800 + reg / 16, value);
  else *(volatile uint32_t *)(LAPIC + reg) = value;
}
static void lapic_eoi(void) { lapic_write(LAPIC_EOI, 0); }
static void self_ipi(uint8_t vector) { lapic_write(LAPIC_ICR_LOW, ICR_SELF | vector); }
static int vector_bit(uint32_t reg_base, uint8_t vector) {
  return (lapic_read(reg_base + 0x10 * (vector / 32)) >> (vector % 32)) & 1;
}

/* Lets pending interrupts in: IF on across a few register reads. The reads are exits, so an
   exit-synchronous recording (which injects only at the guest's own exits) delivers here too. */
static void interrupt_window(void) {
  sti();
  for (int i = 0; i < 4; ++i) (void)lapic_read(LAPIC_TPR);
  cli();
}

static volatile uint32_t *ioapic;
static uint32_t ioapic_read(uint8_t index) {
  ioapic[0] = index;
  return ioapic[4];
}
static void ioapic_write(uint8_t index, uint32_t value) {
  ioapic[0] = index;
  ioapic[4] = value;
}
static void ioapic_route(unsigned pin, uint32_t low) {
  ioapic_write((uint8_t)(0x11 + 2 * pin), 0); /* physical destination: APIC 0 */
  ioapic_write((uint8_t)(0x10 + 2 * pin), low);
}

/* ---- the MP table (MultiProcessor Specification 1.4) ---- */
static int irq0_pin = -1, irq4_pin = -1;

static uint8_t checksum(const volatile uint8_t *p, uint32_t length) {
  uint8_t sum = 0;
  for (uint32_t i = 0; i < length; ++i) sum = (uint8_t)(sum + p[i]);
  return sum;
}

static const volatile uint8_t *find_floating_pointer(uintptr_t from, uintptr_t length) {
  for (uintptr_t at = from; at + 16 <= from + length; at += 16) {
    const volatile uint8_t *p = (const volatile uint8_t *)at;
    if (p[0] == '_' && p[1] == 'M' && p[2] == 'P' && p[3] == '_' && checksum(p, 16u * p[8]) == 0) return p;
  }
  return 0;
}

static uint32_t le32(const volatile uint8_t *p) { return p[0] | p[1] << 8 | p[2] << 16 | (uint32_t)p[3] << 24; }

static void parse_mp_table(void) {
  /* The BIOS data area's EBDA segment (through a variable: GCC takes low constant addresses for null). */
  static volatile uintptr_t bda_ebda = 0x40e;
  uintptr_t ebda = (uintptr_t)(*(volatile uint16_t *)bda_ebda) << 4;
  const volatile uint8_t *fp = ebda ? find_floating_pointer(ebda, 1024) : 0;
  if (!fp) fp = find_floating_pointer(639 * 1024, 1024);
  if (!fp) fp = find_floating_pointer(0xf0000, 0x10000);
  if (!fp) fail("no MP floating pointer in the EBDA, at 639K or in the BIOS area");
  const volatile uint8_t *table = (const volatile uint8_t *)(uintptr_t)le32(fp + 4);
  if (!table || table[0] != 'P' || table[1] != 'C' || table[2] != 'M' || table[3] != 'P') fail("no PCMP table");
  uint16_t length = (uint16_t)(table[4] | table[5] << 8);
  if (checksum(table, length) != 0) fail("MP configuration table checksum");
  uint32_t lapic = le32(table + 36);
  uint16_t count = (uint16_t)(table[34] | table[35] << 8);
  int isa_bus = -1;
  uintptr_t ioapic_address = 0;
  const volatile uint8_t *e = table + 44;
  for (uint16_t i = 0; i < count; ++i) {
    switch (e[0]) {
      case 0: e += 20; continue; /* processor */
      case 1:                    /* bus */
        if (e[2] == 'I' && e[3] == 'S' && e[4] == 'A') isa_bus = e[1];
        break;
      case 2: /* I/O APIC */
        if (!ioapic_address) ioapic_address = le32(e + 4);
        break;
      case 3: /* I/O interrupt assignment */
        if (e[1] == 0 && e[4] == isa_bus && e[5] == 0) irq0_pin = e[7];
        if (e[1] == 0 && e[4] == isa_bus && e[5] == 4) irq4_pin = e[7];
        break;
      default: break;
    }
    e += 8;
  }
  if (!ioapic_address || irq0_pin < 0 || irq4_pin < 0) fail("the MP table lacks the I/O APIC or ISA IRQs 0 and 4");
  ioapic = (volatile uint32_t *)ioapic_address;
  printf("mp table: lapic at %#x, ioapic at %#lx, isa irq 0 -> input %d, isa irq 4 -> input %d\n", lapic,
         (unsigned long)ioapic_address, irq0_pin, irq4_pin);
}

/* ---- handlers ---- */
static volatile int spurious;
static struct frame *on_spurious(struct frame *f) {
  ++spurious; /* no EOI for the spurious vector */
  return f;
}

#define MAX_ORDER 8
static volatile uint8_t order[MAX_ORDER];
static volatile int order_count;
static volatile uint32_t ppr_in_0x65;
static volatile int isr_in_0x65;
static void note(uint8_t v) {
  if (order_count < MAX_ORDER) order[order_count++] = v;
}
static struct frame *on_ipi(struct frame *f) {
  uint8_t v = (uint8_t)f->vector;
  note(v);
  if (v == 0x65) {
    ppr_in_0x65 = lapic_read(LAPIC_PPR);
    isr_in_0x65 = vector_bit(LAPIC_ISR, 0x65);
    self_ipi(0x70); /* a higher class nests */
    self_ipi(0x62); /* the class in service: waits for the EOI */
    interrupt_window();
  }
  lapic_eoi();
  return f;
}

/* Ticks count up to the target and no further, so the printed counts are exact even when a slow
   emulator delivers two back to back before the waiting loop looks (as in the timer guest). */
static volatile int ticks, target = 1 << 30;
static volatile int tmr_in_tick = -1;
static void count_tick(void) {
  if (ticks < target) ++ticks;
}
static struct frame *on_tick(struct frame *f) {
  count_tick();
  tmr_in_tick = vector_bit(LAPIC_TMR, (uint8_t)f->vector);
  lapic_eoi();
  return f;
}
static struct frame *on_pic_tick(struct frame *f) {
  count_tick(); /* the runtime's dispatcher sends the 8259A its EOI */
  return f;
}

static volatile int uart_interrupts;
static volatile int uart_remote_irr[2], uart_tmr[2];
static struct frame *on_uart(struct frame *f) {
  int n = uart_interrupts++;
  if (n < 2) {
    uart_remote_irr[n] = (ioapic_read((uint8_t)(0x10 + 2 * irq4_pin)) & IOAPIC_REMOTE_IRR) != 0;
    uart_tmr[n] = vector_bit(LAPIC_TMR, (uint8_t)f->vector);
  }
  /* The first time the source stays: after the EOI the still-asserted line is delivered again. */
  if (n >= 1) outb(COM1 + 1, 0);
  lapic_eoi();
  return f;
}

static void wait_ticks(int n) {
  target = n;
  for (;;) {
    cli();
    if (ticks >= n) break;
    sti_hlt();
  }
}

/* PIT channel 2 in mode 0, polled through port 0x61 bit 5 (as Linux calibrates the TSC). */
static void pit2_delay_us(uint32_t us) {
  uint32_t count = (uint32_t)((uint64_t)PIT_HZ * us / 1000000);
  outb(0x61, (uint8_t)((inb(0x61) & ~0x02) | 0x01)); /* gate 2 high, speaker off */
  outb(0x43, 0xb0);                                   /* channel 2, lobyte/hibyte, mode 0 */
  outb(0x42, count & 0xff);
  outb(0x42, (count >> 8) & 0xff);
  while (!(inb(0x61) & 0x20)) cpu_pause();
}

static void pit_stop(void) {
  outb(0x43, 0x30); /* channel 0, mode 0, no count: OUT low, nothing counts */
}

int guest_main(void) {
  struct cpuid_regs leaf1 = cpuid(1, 0);
  int has_x2apic = (leaf1.ecx >> 21) & 1, has_deadline = (leaf1.ecx >> 24) & 1;
  printf("cpuid: apic=%s x2apic=%s tsc-deadline=%s\n", (leaf1.edx >> 9) & 1 ? "yes" : "no",
         has_x2apic ? "yes" : "no", has_deadline ? "yes" : "no");
  uint64_t base = rdmsr(APIC_BASE_MSR);
  printf("apic base: %#lx bsp=%lu enabled=%lu\n", (unsigned long)(base & ~0xffful),
         (unsigned long)(base >> 8) & 1, (unsigned long)(base >> 11) & 1);
  parse_mp_table();
  uint32_t version = lapic_read(LAPIC_VERSION);
  printf("lapic: id %u, version %#x, %u LVT entries\n", lapic_read(LAPIC_ID) >> 24, version & 0xff,
         ((version >> 16) & 0xff) + 1);

  outb(0x21, 0xff); /* the 8259A pair stays quiet until the ExtINT part */
  outb(0xa1, 0xff);
  set_interrupt_handler(SPURIOUS_VECTOR, on_spurious);
  lapic_write(LAPIC_SVR, 0x100 | SPURIOUS_VECTOR);
  lapic_write(LAPIC_LVT_LINT0, LVT_MASKED | 0x700);

  /* Self-IPIs, the task priority, and the order of delivery by priority class. */
  for (int v = 0x40; v < 0x80; ++v) set_interrupt_handler((uint8_t)v, on_ipi);
  lapic_write(LAPIC_TPR, 0x70);
  self_ipi(0x40);
  self_ipi(0x61);
  self_ipi(0x65);
  printf("ipi: irr 0x40=%d 0x61=%d 0x65=%d\n", vector_bit(LAPIC_IRR, 0x40), vector_bit(LAPIC_IRR, 0x61),
         vector_bit(LAPIC_IRR, 0x65));
  interrupt_window();
  printf("ipi: tpr 0x70 holds them: delivered %d, ppr %#x\n", order_count, lapic_read(LAPIC_PPR));
  lapic_write(LAPIC_TPR, 0);
  interrupt_window();
  printf("ipi: order");
  for (int i = 0; i < order_count; ++i) printf(" %#x", order[i]);
  printf("\nipi: in 0x65: isr bit %d, ppr %#x; afterwards ppr %#x, isr empty %s\n", isr_in_0x65, ppr_in_0x65,
         lapic_read(LAPIC_PPR), vector_bit(LAPIC_ISR, 0x65) || vector_bit(LAPIC_ISR, 0x40) ? "no" : "yes");

  /* LAPIC timer, one-shot, divide by 16: 625000 counts of the bus clock over 16. */
  set_interrupt_handler(0x80, on_tick);
  set_interrupt_handler(0x81, on_tick);
  lapic_write(LAPIC_TIMER_DIVIDE, 0x3);
  lapic_write(LAPIC_LVT_TIMER, 0x80);
  lapic_write(LAPIC_TIMER_INITIAL, 625000);
  uint32_t c1 = lapic_read(LAPIC_TIMER_CURRENT);
  pit2_delay_us(100);
  uint32_t c2 = lapic_read(LAPIC_TIMER_CURRENT);
  printf("timer: one-shot counts down: %s\n", c1 <= 625000 && c2 < c1 ? "yes" : "no");
  wait_ticks(1);
  target = 1 << 30;
  sti();
  pit2_delay_us(20000); /* long past a second expiry, had there been one */
  cli();
  printf("timer: one-shot fired %d time(s), current count %u, tmr %d\n", ticks, lapic_read(LAPIC_TIMER_CURRENT),
         tmr_in_tick);

  /* Periodic, divide by 1, 1 ms. */
  ticks = 0;
  lapic_write(LAPIC_TIMER_DIVIDE, 0xb);
  lapic_write(LAPIC_LVT_TIMER, LVT_PERIODIC | 0x81);
  lapic_write(LAPIC_TIMER_INITIAL, 1000000);
  wait_ticks(20);
  lapic_write(LAPIC_TIMER_INITIAL, 0);
  printf("timer: periodic: %d ticks\n", ticks);

  /* The I/O APIC: the PIT through the input the MP table names for ISA IRQ 0. */
  uint32_t ioapic_version = ioapic_read(1);
  printf("ioapic: version %#x, %u inputs\n", ioapic_version & 0xff, ((ioapic_version >> 16) & 0xff) + 1);
  ticks = 0;
  set_interrupt_handler(0x90, on_tick);
  ioapic_route((unsigned)irq0_pin, 0x90);
  pit_start(1000, PIT_MODE_RATE);
  wait_ticks(20);
  ioapic_route((unsigned)irq0_pin, IOAPIC_MASKED | 0x90);
  pit_stop();
  printf("ioapic: %d PIT ticks through input %d, edge (tmr %d)\n", ticks, irq0_pin, tmr_in_tick);

  /* A level-triggered line: the UART's THRE interrupt, with Remote IRR and the EOI broadcast. */
  set_interrupt_handler(0x94, on_uart);
  ioapic_route((unsigned)irq4_pin, IOAPIC_LEVEL | 0x94);
  outb(COM1 + 4, inb(COM1 + 4) | UART_MCR_OUT2);
  outb(COM1 + 1, UART_IER_THRE);
  for (;;) {
    cli();
    if (uart_interrupts >= 2) break;
    sti_hlt();
  }
  interrupt_window();
  uint32_t entry = ioapic_read((uint8_t)(0x10 + 2 * irq4_pin));
  ioapic_route((unsigned)irq4_pin, IOAPIC_MASKED | IOAPIC_LEVEL | 0x94);
  outb(COM1 + 4, inb(COM1 + 4) & ~UART_MCR_OUT2);
  printf("ioapic: level-triggered uart: %d interrupts, remote irr in handler %d %d, tmr %d %d, remote irr after "
         "eoi %d\n",
         uart_interrupts, uart_remote_irr[0], uart_remote_irr[1], uart_tmr[0], uart_tmr[1],
         (entry & IOAPIC_REMOTE_IRR) != 0);

  /* ExtINT: the 8259A through LINT0, vectors from its INTA cycle. Re-initialising the 8259A drops
     the PIT edge its IRR latched (masked) while the I/O APIC had the timer. */
  ticks = 0;
  pic_init();
  set_interrupt_handler(IRQ_BASE + 0, on_pic_tick);
  lapic_write(LAPIC_LVT_LINT0, 0x700);
  pic_unmask(0);
  pit_start(1000, PIT_MODE_RATE);
  wait_ticks(10);
  pic_mask(0);
  pit_stop();
  lapic_write(LAPIC_LVT_LINT0, LVT_MASKED | 0x700);
  printf("extint: %d PIT ticks through the 8259A and LINT0\n", ticks);

  /* x2APIC: the same registers as MSRs. */
  if (has_x2apic) {
    wrmsr(APIC_BASE_MSR, base | (3u << 10));
    x2apic_on = 1;
    uint64_t id = rdmsr(0x802), ldr = rdmsr(0x80d);
    order_count = 0;
    wrmsr(0x83f, 0x50); /* SELF IPI */
    interrupt_window();
    int self_ok = order_count == 1 && order[0] == 0x50;
    ticks = 0;
    set_interrupt_handler(0xa1, on_tick);
    wrmsr(0x83e, 0xb);     /* divide by 1 */
    wrmsr(0x832, 0xa1);    /* one-shot */
    wrmsr(0x838, 2000000); /* 2 ms */
    wait_ticks(1);
    printf("x2apic: id %lu, ldr %#lx, version %#lx, self-ipi %s, timer %s\n", (unsigned long)id, (unsigned long)ldr,
           (unsigned long)rdmsr(0x803) & 0xff, self_ok ? "ok" : "lost", ticks == 1 ? "ok" : "wrong");
    wrmsr(APIC_BASE_MSR, base & ~(3ull << 10)); /* x2APIC -> disabled -> xAPIC */
    x2apic_on = 0;
    wrmsr(APIC_BASE_MSR, base);
    lapic_write(LAPIC_SVR, 0x100 | SPURIOUS_VECTOR);
  } else {
    printf("x2apic: not available\n");
  }

  /* TSC-deadline mode, without reading the TSC (whose values KVM without kvm-deja cannot record): a
     deadline that never comes, disarming, and one long past, which fires at once. */
  if (has_deadline) {
    ticks = 0;
    target = 1 << 30;
    set_interrupt_handler(0xa2, on_tick);
    lapic_write(LAPIC_LVT_TIMER, LVT_TSC_DEADLINE | 0xa2);
    wrmsr(0x6e0, ~0ull);
    int armed = rdmsr(0x6e0) == ~0ull;
    sti();
    pit2_delay_us(5000);
    cli();
    int early = ticks;
    wrmsr(0x6e0, 0);
    int disarmed = rdmsr(0x6e0) == 0;
    wrmsr(0x6e0, 1);
    wait_ticks(1);
    printf("tsc-deadline: armed %s, early %d, disarmed %s, past deadline fired %d time(s), msr after %lu\n",
           armed ? "yes" : "no", early, disarmed ? "yes" : "no", ticks, (unsigned long)rdmsr(0x6e0));
  } else {
    printf("tsc-deadline: not available\n");
  }

  printf("spurious: %d\n", spurious);
  return 0;
}
