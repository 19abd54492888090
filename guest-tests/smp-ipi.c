/* Guest "smp-ipi": inter-processor interrupts between every pair of processors, with every kind of destination: fixed
   IPIs by physical ID, by logical flat destination, to all excluding self and to self; NMIs; replies from each
   application processor to the BSP. Every count is exact, whatever the schedule; the order of arrival is not. */
#include "runtime/runtime.h"

#define LAPIC_EOI 0x0b0
#define LAPIC_LDR 0x0d0
#define LAPIC_DFR 0x0e0
#define ICR_FIXED 0x000
#define ICR_NMI 0x400
#define ICR_LOGICAL (1u << 11)
#define ICR_SELF (1u << 18)
#define ICR_ALL_BUT_SELF (3u << 18)
#define VECTOR_PING 0x40
#define VECTOR_REPLY 0x41
#define ROUNDS 50

static volatile uint32_t pings[SMP_MAX_CPUS], replies[SMP_MAX_CPUS], nmis[SMP_MAX_CPUS];
static volatile uint32_t self_ipis;
static volatile int phase, finished, reply_turn;
static int cpus;

static struct frame *on_ping(struct frame *f) {
  __atomic_fetch_add(&pings[smp_cpu_index()], 1, __ATOMIC_SEQ_CST);
  lapic_write32(LAPIC_EOI, 0);
  return f;
}

static struct frame *on_reply(struct frame *f) {
  /* The BSP's: who replied is in the shared word the replier set before sending. */
  if (smp_cpu_index() == 0) __atomic_fetch_add(&replies[reply_turn], 1, __ATOMIC_SEQ_CST);
  else __atomic_fetch_add(&self_ipis, 1, __ATOMIC_SEQ_CST);
  lapic_write32(LAPIC_EOI, 0);
  return f;
}

static struct frame *on_nmi(struct frame *f) {
  __atomic_fetch_add(&nmis[smp_cpu_index()], 1, __ATOMIC_SEQ_CST);
  return f;
}

/* Waits with interrupts on until `*word` reaches `target`. */
static void wait_for(volatile uint32_t *word, uint32_t target) {
  while (*word < target) {
    sti();
    cpu_pause();
    cli();
  }
}

static void ap_main(int cpu) {
  lapic_write32(LAPIC_DFR, 0xffffffffu);               /* flat model */
  lapic_write32(LAPIC_LDR, (uint32_t)(1u << cpu) << 24); /* logical ID: one bit per processor */
  __atomic_fetch_add(&finished, 1, __ATOMIC_SEQ_CST);    /* ready */
  while (phase < 1) cpu_pause();
  /* Pings arrive with interrupts on, halted or spinning. */
  while (phase < 2) sti_hlt();
  cli();
  /* Replies, one AP at a time: the BSP counts them against reply_turn. */
  while (reply_turn != cpu) cpu_pause();
  for (int i = 0; i < ROUNDS; ++i) {
    uint32_t before = replies[cpu];
    lapic_send_ipi(smp_apic_id(0), ICR_FIXED | VECTOR_REPLY);
    while (replies[cpu] == before) cpu_pause();
  }
  /* A self IPI, taken once interrupts are on (the APs take turns: this is the cpu-th). */
  lapic_send_ipi(0, ICR_SELF | ICR_FIXED | VECTOR_REPLY);
  while (self_ipis < (uint32_t)cpu) {
    sti();
    cpu_pause();
    cli();
  }
  __atomic_fetch_add(&reply_turn, 1, __ATOMIC_SEQ_CST);
  __atomic_fetch_add(&finished, 1, __ATOMIC_SEQ_CST);
  for (;;) sti_hlt();
}

int guest_main(void) {
  set_interrupt_handler(VECTOR_PING, on_ping);
  set_interrupt_handler(VECTOR_REPLY, on_reply);
  set_interrupt_handler(2, on_nmi);
  cpus = smp_start(ap_main);
  printf("smp-ipi: %d processors\n", cpus);
  if (cpus < 2) fail("needs at least two processors (--cpus)");
  while (finished < cpus - 1) cpu_pause();
  phase = 1;
  uint32_t want[SMP_MAX_CPUS] = {0};
  for (int round = 0; round < ROUNDS; ++round) {
    for (int cpu = 1; cpu < cpus; ++cpu) { /* physical destination */
      lapic_send_ipi(smp_apic_id(cpu), ICR_FIXED | VECTOR_PING);
      wait_for(&pings[cpu], ++want[cpu]);
    }
    lapic_send_ipi(0, ICR_ALL_BUT_SELF | ICR_FIXED | VECTOR_PING); /* shorthand: every AP at once */
    for (int cpu = 1; cpu < cpus; ++cpu) wait_for(&pings[cpu], ++want[cpu]);
    uint8_t all_aps = (uint8_t)(((1u << cpus) - 1) & ~1u);         /* logical flat: every AP's bit */
    lapic_send_ipi(all_aps, ICR_LOGICAL | ICR_FIXED | VECTOR_PING);
    for (int cpu = 1; cpu < cpus; ++cpu) wait_for(&pings[cpu], ++want[cpu]);
    for (int cpu = 1; cpu < cpus; ++cpu) { /* NMI: taken even with interrupts off */
      lapic_send_ipi(smp_apic_id(cpu), ICR_NMI);
      wait_for(&nmis[cpu], (uint32_t)round + 1);
    }
  }
  phase = 2;
  for (int cpu = 1; cpu < cpus; ++cpu) lapic_send_ipi(smp_apic_id(cpu), ICR_FIXED | VECTOR_PING); /* wake from HLT */
  for (int cpu = 1; cpu < cpus; ++cpu) ++want[cpu];
  reply_turn = 1;
  while (reply_turn < cpus) {
    sti();
    cpu_pause();
    cli();
  }
  while (finished < 2 * (cpus - 1)) cpu_pause();
  uint32_t total_pings = 0, total_replies = 0, total_nmis = 0;
  for (int cpu = 1; cpu < cpus; ++cpu) {
    if (pings[cpu] != want[cpu]) fail("processor %d took %u pings of %u", cpu, pings[cpu], want[cpu]);
    if (replies[cpu] != ROUNDS) fail("processor %d replied %u times of %d", cpu, replies[cpu], ROUNDS);
    if (nmis[cpu] != ROUNDS) fail("processor %d took %u NMIs of %d", cpu, nmis[cpu], ROUNDS);
    total_pings += pings[cpu];
    total_replies += replies[cpu];
    total_nmis += nmis[cpu];
  }
  if (self_ipis != (uint32_t)cpus - 1) fail("%u self IPIs of %d", self_ipis, cpus - 1);
  if (pings[0] != 0 || nmis[0] != 0) fail("the BSP took its own broadcast");
  printf("smp-ipi: %u pings, %u replies, %u NMIs, %u self IPIs: all delivered\n", total_pings, total_replies,
         total_nmis, self_ipis);
  return 0;
}
