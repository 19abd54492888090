/* Multiprocessor start for the test guests: the MP table's processors, the INIT-SIPI-SIPI protocol, per-CPU stacks. */
#include "runtime/runtime.h"

#define TRAMPOLINE 0x8000
#define LAPIC_ID 0x020
#define LAPIC_SVR 0x0f0
#define LAPIC_ESR 0x280
#define LAPIC_ICR_LOW 0x300
#define LAPIC_ICR_HIGH 0x310
#define ICR_INIT 0x500
#define ICR_STARTUP 0x600
#define ICR_LEVEL_ASSERT (1u << 14)
#define ICR_LEVEL_TRIGGER (1u << 15)
#define ICR_DELIVERY_PENDING (1u << 12)
#define AP_STACK_BYTES 16384

extern char ap_trampoline[], ap_trampoline_end[], ap_params[];
extern char ap_entry[];
extern char gdt_pointer[];

static int cpu_count = -1;
static uint8_t apic_ids[SMP_MAX_CPUS];
static void (*ap_main_fn)(int cpu);
static volatile int started;
static volatile int print_lock;
static uint8_t ap_stacks[SMP_MAX_CPUS][AP_STACK_BYTES] __attribute__((aligned(16)));

static int checksum_ok(const uint8_t *p, size_t n) {
  uint8_t sum = 0;
  for (size_t i = 0; i < n; ++i) sum = (uint8_t)(sum + p[i]);
  return sum == 0;
}

/* MP specification 1.4: the floating pointer in the BIOS area, then the configuration table's processor entries. */
static void find_processors(void) {
  cpu_count = 1;
  apic_ids[0] = (uint8_t)(lapic_read32(LAPIC_ID) >> 24);
  for (uintptr_t at = 0xf0000; at < 0x100000; at += 16) {
    const uint8_t *fp = (const uint8_t *)at;
    if (memcmp(fp, "_MP_", 4) != 0 || !checksum_ok(fp, 16)) continue;
    uint32_t table = *(const uint32_t *)(fp + 4);
    if (table == 0) return;
    const uint8_t *t = (const uint8_t *)(uintptr_t)table;
    uint16_t length = *(const uint16_t *)(t + 4), entries = *(const uint16_t *)(t + 34);
    if (memcmp(t, "PCMP", 4) != 0 || !checksum_ok(t, length)) return;
    const uint8_t *e = t + 44;
    int n = 0;
    for (uint16_t i = 0; i < entries && e < t + length; ++i) {
      if (e[0] == 0) { /* processor: 20 bytes; enabled; the BSP first */
        if ((e[3] & 1) && n < SMP_MAX_CPUS) {
          if (e[3] & 2) {
            for (int k = n; k > 0; --k) apic_ids[k] = apic_ids[k - 1];
            apic_ids[0] = e[1];
          } else {
            apic_ids[n] = e[1];
          }
          ++n;
        }
        e += 20;
      } else {
        e += 8;
      }
    }
    if (n > 0) cpu_count = n;
    return;
  }
}

int smp_cpu_count(void) {
  if (cpu_count < 0) find_processors();
  return cpu_count;
}

uint8_t smp_apic_id(int cpu) { return apic_ids[cpu]; }

int smp_cpu_index(void) {
  uint8_t id = (uint8_t)(lapic_read32(LAPIC_ID) >> 24);
  for (int i = 0; i < smp_cpu_count(); ++i) {
    if (apic_ids[i] == id) return i;
  }
  return -1;
}

void smp_lock(volatile int *lock) {
  while (__atomic_exchange_n(lock, 1, __ATOMIC_ACQUIRE)) {
    while (*lock) cpu_pause();
  }
}

void smp_unlock(volatile int *lock) { __atomic_store_n(lock, 0, __ATOMIC_RELEASE); }

int smp_printf(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  smp_lock(&print_lock);
  int n = vprintf(fmt, ap);
  smp_unlock(&print_lock);
  va_end(ap);
  return n;
}

void lapic_send_ipi(uint8_t destination, uint32_t icr_low) {
  lapic_write32(LAPIC_ICR_HIGH, (uint32_t)destination << 24);
  lapic_write32(LAPIC_ICR_LOW, icr_low);
  while (lapic_read32(LAPIC_ICR_LOW) & ICR_DELIVERY_PENDING) cpu_pause();
}

static void lapic_enable(void) { lapic_write32(LAPIC_SVR, lapic_read32(LAPIC_SVR) | 0x100 | 0xff); }

/* The AP's first C code (from ap_entry in smp_trampoline.S). */
void smp_ap_started(void) {
  idt_load();
  lapic_enable();
  int cpu = smp_cpu_index();
  __atomic_fetch_add(&started, 1, __ATOMIC_SEQ_CST);
  ap_main_fn(cpu);
}

/* Waits up to `ticks` TSC ticks for `started` to reach `target`. */
static int wait_started(int target, uint64_t ticks) {
  uint64_t begin = rdtsc();
  while (started < target) {
    if (rdtsc() - begin > ticks) return 0;
    cpu_pause();
  }
  return 1;
}

int smp_start(void (*ap_main)(int cpu)) {
  int n = smp_cpu_count();
  ap_main_fn = ap_main;
  lapic_enable();
  size_t size = (size_t)(ap_trampoline_end - ap_trampoline);
  memcpy((void *)TRAMPOLINE, ap_trampoline, size);
  uint8_t *params = (uint8_t *)TRAMPOLINE + (ap_params - ap_trampoline);
  *(uint64_t *)(params + 0) = read_cr3();
  *(uint64_t *)(params + 8) = rdmsr(MSR_EFER) & (EFER_LME | EFER_NXE);
  *(uint64_t *)(params + 24) = (uint64_t)ap_entry;
  memcpy(params + 32, gdt_pointer, 10);
  started = 1;
  for (int cpu = 1; cpu < n; ++cpu) {
    *(volatile uint64_t *)(params + 16) = (uint64_t)(ap_stacks[cpu] + AP_STACK_BYTES);
    uint8_t id = apic_ids[cpu];
    lapic_write32(LAPIC_ESR, 0);
    lapic_send_ipi(id, ICR_INIT | ICR_LEVEL_TRIGGER | ICR_LEVEL_ASSERT);
    lapic_send_ipi(id, ICR_INIT | ICR_LEVEL_TRIGGER); /* de-assert */
    /* Two STARTUPs as the MP specification (B.4) asks; the second is ignored by a processor already started. */
    for (int attempt = 0; attempt < 2 && started <= cpu; ++attempt) {
      lapic_send_ipi(id, ICR_STARTUP | (TRAMPOLINE >> 12));
      wait_started(cpu + 1, attempt == 0 ? 2000000 : 2000000000ull); /* 1 ms, then a second, at 2 GHz */
    }
    if (started <= cpu) fail("processor %d (APIC ID %d) did not start", cpu, id);
  }
  return n;
}
