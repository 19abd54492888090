/* Guest "explore-race": a planted rare race for `deja explore` (docs/explore.md): each processor claims a slot with an unlocked check-then-act, and only an interleaving that runs the other processor's whole claim between one's check and its act gives two owners. */
#include "runtime/runtime.h"

/* The BSP reaches its claim after a little work, the AP after much more: under round robin or random slices the BSP
 * claims long before the AP gets there, so the race needs the BSP held between its check and its act while the AP does
 * all its work (or the reverse), which a PCT change point at that one event does. */
#define BSP_WORK 20000
#define AP_WORK 400000

static volatile int claimed, owners, finished;
static uint64_t bsp_work = BSP_WORK, ap_work = AP_WORK;

static uint64_t work(uint64_t n, uint64_t x) {
  for (uint64_t i = 0; i < n; ++i) x = x * 6364136223846793005ull + 1442695040888963407ull;
  return x;
}

static void claim(int cpu) {
  if (!claimed) {  /* check ... */
    outb(0x80, (uint8_t)cpu); /* a device access between check and act (a log write, a doorbell) */
    claimed = 1;  /* ... act: another processor's check in between also sees 0 */
    __atomic_fetch_add(&owners, 1, __ATOMIC_SEQ_CST);
  }
}

static void ap_main(int cpu) {
  uint64_t x = work(ap_work, (uint64_t)cpu);
  __asm__ volatile("" ::"r"(x));
  claim(cpu);
  __atomic_fetch_add(&finished, 1, __ATOMIC_SEQ_CST);
}

int guest_main(void) {
  bsp_work = boot_arg_u64("bsp-work", BSP_WORK);
  ap_work = boot_arg_u64("ap-work", AP_WORK);
  int cpus = smp_start(ap_main);
  uint64_t x = work(bsp_work, 0);
  __asm__ volatile("" ::"r"(x));
  claim(0);
  while (finished < cpus - 1) cpu_pause();
  if (owners != 1) {
    printf("BUG: %d owners of one slot\n", owners);
    return 1;
  }
  printf("explore-race: one owner\n");
  return 0;
}
