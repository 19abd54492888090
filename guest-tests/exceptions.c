/* Guest "exceptions": raises #DE, #UD, #GP, #PF (read, write, NX fetch), #NM and #BP, handles each and resumes. */
#include "runtime/runtime.h"

extern volatile uint64_t boot_pd[2048]; /* runtime's identity map: one 2 MiB entry per 2 MiB of the low 4 GiB */

/* What the next exception must be; the handler refuses anything else. */
static struct {
  int armed;
  uint8_t vector;
  uint64_t fault_rip;  /* address of the instruction expected to fault */
  uint64_t resume_rip; /* where a fault that cannot be retried continues */
  /* what the handler saw */
  uint64_t seen_rip, error_code, cr2;
} ex;
static int handled;

#define PD_INDEX(va) ((uint64_t)(va) >> 21)
#define PTE_NX (1ull << 63)

static struct frame *on_exception(struct frame *f) {
  if (!ex.armed || f->vector != ex.vector) {
    printf("FAIL: unexpected %s (vector %lu) at rip=%#lx error=%#lx cr2=%#lx\n", exception_name(f->vector),
           f->vector, f->rip, f->error_code, read_cr2());
    exit_guest(1);
  }
  ex.armed = 0;
  ex.seen_rip = f->rip;
  ex.error_code = f->error_code;
  ex.cr2 = f->vector == 14 ? read_cr2() : 0;
  ++handled;
  switch (f->vector) {
    case 14: {
      /* Repair the mapping and retry the instruction, as a demand-paging kernel would. */
      volatile uint64_t *pde = &boot_pd[PD_INDEX(ex.cr2)];
      *pde = (*pde | PTE_P) & ~PTE_NX;
      invlpg((void *)ex.cr2);
      break;
    }
    case 7: /* lazy FPU switching: keep CR0.TS clear on return and retry */
      f->cr0_ts = 0;
      break;
    case 3: /* a trap: RIP already points past INT3 */
      break;
    default: /* faults that cannot be repaired: skip the instruction */
      f->rip = ex.resume_rip;
  }
  return f;
}

static void arm(uint8_t vector) {
  ex.armed = 1;
  ex.vector = vector;
  ex.seen_rip = ex.error_code = ex.cr2 = 0;
}

static void check_handled(const char *what, uint64_t expected_rip) {
  if (ex.armed) fail("%s: no exception was raised", what);
  printf("%s: error=%#lx rip %s\n", what, ex.error_code,
         ex.seen_rip == expected_rip ? "at the expected instruction" : "WRONG");
  if (ex.seen_rip != expected_rip) fail("%s: rip %#lx, expected %#lx", what, ex.seen_rip, expected_rip);
}

/* Sets ex.fault_rip to label 0 (the instruction) and ex.resume_rip to label 1 (just past it). */
#define MARK_LABELS "leaq 0f(%%rip), %%rax\n\tmovq %%rax, %[fault]\n\tleaq 1f(%%rip), %%rax\n\tmovq %%rax, %[resume]\n"
#define LABEL_OPERANDS [fault] "=m"(ex.fault_rip), [resume] "=m"(ex.resume_rip)

int guest_main(void) {
  static const uint8_t vectors[] = {0, 3, 6, 7, 13, 14};
  for (unsigned i = 0; i < sizeof vectors; ++i) set_interrupt_handler(vectors[i], on_exception);
  printf("exceptions: start\n");

  arm(0);
  uint32_t quotient = 7;
  __asm__ volatile(MARK_LABELS "0: divl %[divisor]\n1:"
                   : LABEL_OPERANDS, "+a"(quotient)
                   : [divisor] "r"(0), "d"(0)
                   : "memory");
  check_handled("#DE divide by zero", ex.fault_rip);

  arm(6);
  __asm__ volatile(MARK_LABELS "0: ud2\n1:" : LABEL_OPERANDS::"rax", "memory");
  check_handled("#UD ud2", ex.fault_rip);

  arm(13);
  uint64_t sink;
  __asm__ volatile(MARK_LABELS "0: movabsq 0x8000000000000000, %%rax\n1:"
                   : LABEL_OPERANDS, "=a"(sink)::"memory");
  check_handled("#GP non-canonical load", ex.fault_rip);

  /* A selector past the GDT limit: #GP with the selector as error code (SDM vol. 3, 6.13). QEMU's TCG
     ignores WRMSR to unknown MSRs, so that would not be a portable #GP. */
  arm(13);
  __asm__ volatile(MARK_LABELS "0: movw %w[sel], %%fs\n1:"
                   : LABEL_OPERANDS
                   : [sel] "r"(0x40)
                   : "rax", "memory");
  check_handled("#GP selector beyond GDT limit", ex.fault_rip);
  if (ex.error_code != 0x40) fail("#GP selector: error code %#lx, expected 0x40", ex.error_code);

  /* #PF, read: take a 2 MiB page of RAM away, read it back in through the handler. */
  volatile uint64_t *read_target = (volatile uint64_t *)0x00c00128;
  *read_target = 0x1234abcd5678ef90ull;
  boot_pd[PD_INDEX(read_target)] &= ~PTE_P;
  invlpg((void *)read_target);
  arm(14);
  uint64_t value;
  __asm__ volatile(MARK_LABELS "0: movq (%[p]), %[v]\n1:"
                   : LABEL_OPERANDS, [v] "=r"(value)
                   : [p] "r"(read_target)
                   : "rax", "memory");
  check_handled("#PF read of not-present page", ex.fault_rip);
  printf("  cr2=%#lx value after remap=%#lx\n", ex.cr2, value);
  if (ex.cr2 != (uint64_t)read_target || ex.error_code != 0 || value != 0x1234abcd5678ef90ull)
    fail("#PF read: cr2 %#lx error %#lx value %#lx", ex.cr2, ex.error_code, value);

  /* #PF, write: the error code's W bit is set. */
  volatile uint64_t *write_target = (volatile uint64_t *)0x00e00ff8;
  boot_pd[PD_INDEX(write_target)] &= ~PTE_P;
  invlpg((void *)write_target);
  arm(14);
  __asm__ volatile(MARK_LABELS "0: movq %[v], (%[p])\n1:"
                   : LABEL_OPERANDS
                   : [p] "r"(write_target), [v] "r"(0x55aa55aa55aa55aaull)
                   : "rax", "memory");
  check_handled("#PF write to not-present page", ex.fault_rip);
  printf("  cr2=%#lx value written=%#lx\n", ex.cr2, *write_target);
  if (ex.cr2 != (uint64_t)write_target || ex.error_code != 2 || *write_target != 0x55aa55aa55aa55aaull)
    fail("#PF write: cr2 %#lx error %#lx", ex.cr2, ex.error_code);

  /* #PF, instruction fetch from a no-execute page (when the CPU has NX): error code P | I/D. */
  if (rdmsr(MSR_EFER) & EFER_NXE) {
    volatile uint8_t *code = (volatile uint8_t *)0x01000000;
    code[0] = 0xb8; /* mov $0x600d, %eax */
    code[1] = 0x0d;
    code[2] = 0x60;
    code[3] = 0x00;
    code[4] = 0x00;
    code[5] = 0xc3; /* ret */
    boot_pd[PD_INDEX(code)] |= PTE_NX;
    invlpg((void *)code);
    arm(14);
    int result;
    __asm__ volatile("call *%[target]" : "=a"(result) : [target] "r"(code) : "memory");
    if (ex.armed) fail("#PF NX fetch: no exception was raised");
    printf("#PF fetch from no-execute page: error=%#lx cr2=%#lx result=%#x\n", ex.error_code, ex.cr2, result);
    if (ex.error_code != 0x11 || ex.cr2 != (uint64_t)code || ex.seen_rip != (uint64_t)code || result != 0x600d)
      fail("#PF NX: error %#lx cr2 %#lx rip %#lx result %#x", ex.error_code, ex.cr2, ex.seen_rip, result);
  } else {
    fail("the CPU has no NX (CPUID 0x80000001 EDX bit 20), which this guest tests");
  }

  /* #NM: with CR0.TS set, the first SSE instruction faults so a kernel can switch FPU state lazily. */
  arm(7);
  /* TS is set inside the same asm: compiled C in between could use SSE itself and fault early. */
  __asm__ volatile("mov %%cr0, %%rax\n\tor $8, %%rax\n\tmov %%rax, %%cr0\n" MARK_LABELS "0: xorps %%xmm0, %%xmm0\n1:"
                   : LABEL_OPERANDS::"rax", "xmm0", "memory");
  check_handled("#NM SSE with CR0.TS set", ex.fault_rip);
  if (read_cr0() & 8) fail("#NM: CR0.TS still set");

  arm(3);
  __asm__ volatile(MARK_LABELS "0: int3\n1:" : LABEL_OPERANDS::"rax", "memory");
  check_handled("#BP int3", ex.resume_rip);

  printf("exceptions: %d handled, all resumed\n", handled);
  return handled == 9 ? 0 : 1;
}
