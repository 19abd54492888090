/* Guest "syscall-bound" (benchmark): a ring-3 loop of SYSCALLs and INT 0x80s under a 1 kHz timer interrupt, so privilege changes dominate. */
#include "runtime/runtime.h"

/* Each iteration of the user loop makes one SYSCALL (kernel entry on its own stack, a C call, SYSRETQ);
   every 8th also an INT 0x80 through the IDT (TSS.RSP0 stack switch, the runtime's full register and
   FXSAVE frame, IRETQ). The PIT interrupts ring 3 at 1 kHz meanwhile. The default n = 2,000,000 is about
   1.2e8 instructions; pass "n=NUMBER". The checksum does not depend on the timer. */
#define DEFAULT_ITERATIONS 2000000ull
#define SYS_ADD 1
#define SYS_EXIT 2
#define RFLAGS_IF (1u << 9)
#define MSR_STAR 0xC0000081
#define MSR_LSTAR 0xC0000082
#define MSR_SFMASK 0xC0000084

extern uint64_t boot_pml4[512], boot_pdpt[512], boot_pd[2048];
void user_loop(void);
uint64_t enter_user(uint64_t rip, uint64_t rsp, uint64_t arg);
_Noreturn void leave_user(uint64_t status);
void syscall_entry(void);
uint64_t syscall_dispatch(uint64_t number, uint64_t arg0, uint64_t arg1);
uint64_t kernel_saved_rsp, syscall_user_rsp, syscall_stack_top;

/* RDI = iterations. RBX accumulates what the kernel returns; SYS_EXIT hands it back. */
__asm__(".text\n"
        ".globl user_loop\n"
        "user_loop:\n"
        "  xorl %ebx, %ebx\n"
        "  movq %rdi, %r12\n"
        "1:\n"
        "  movl $1, %eax\n" /* SYS_ADD */
        "  movq %r12, %rdi\n"
        "  movq %rbx, %rsi\n"
        "  syscall\n"
        "  addq %rax, %rbx\n"
        "  testq $7, %r12\n"
        "  jnz 2f\n"
        "  movl $1, %eax\n"
        "  movq %r12, %rdi\n"
        "  int $0x80\n"
        "  xorq %rax, %rbx\n"
        "2:\n"
        "  decq %r12\n"
        "  jnz 1b\n"
        "  movl $2, %eax\n" /* SYS_EXIT */
        "  movq %rbx, %rdi\n"
        "  syscall\n"
        "  ud2\n");

__asm__(".text\n"
        ".globl enter_user, leave_user, syscall_entry\n"
        "enter_user:\n"
        "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
        "  movq %rsp, kernel_saved_rsp(%rip)\n"
        "  pushq $0x23\n" /* SS = USER_DS | 3 */
        "  pushq %rsi\n"
        "  pushq $0x202\n" /* IF set: the timer interrupts ring 3 */
        "  pushq $0x2b\n"  /* CS = USER_CS | 3 */
        "  pushq %rdi\n"
        "  movq %rdx, %rdi\n"
        "  iretq\n"
        "leave_user:\n"
        "  movq kernel_saved_rsp(%rip), %rsp\n"
        "  movq %rdi, %rax\n"
        "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n"
        "  ret\n"
        "syscall_entry:\n"
        "  movq %rsp, syscall_user_rsp(%rip)\n"
        "  movq syscall_stack_top(%rip), %rsp\n"
        "  pushq syscall_user_rsp(%rip)\n"
        "  pushq %rcx\n"
        "  pushq %r11\n"
        "  subq $8, %rsp\n"
        "  movq %rsi, %rdx\n"
        "  movq %rdi, %rsi\n"
        "  movq %rax, %rdi\n"
        "  call syscall_dispatch\n"
        "  addq $8, %rsp\n"
        "  popq %r11\n"
        "  popq %rcx\n"
        "  popq %rsp\n"
        "  sysretq\n");

static uint8_t syscall_stack[8192] __attribute__((aligned(16)));
static uint8_t interrupt_stack[16384] __attribute__((aligned(16)));
static uint8_t user_stack[8192] __attribute__((aligned(16)));
static volatile uint64_t syscalls, int80s, ticks;

uint64_t syscall_dispatch(uint64_t number, uint64_t arg0, uint64_t arg1) {
  ++syscalls;
  if (number == SYS_ADD) return (arg0 * 0x9e3779b97f4a7c15ull) ^ (arg1 >> 3);
  if (number == SYS_EXIT) leave_user(arg0);
  fail("unknown system call %lu", number);
}

static struct frame *on_int80(struct frame *f) {
  ++int80s;
  f->rax = f->rdi * 0x100000001b3ull;
  return f;
}

static struct frame *on_timer(struct frame *f) {
  ++ticks;
  return f;
}

int guest_main(void) {
  uint64_t iterations = boot_arg_u64("n", DEFAULT_ITERATIONS);
  if (iterations == 0) iterations = 1;
  /* Ring 3 reaches the low 4 GiB: the user bit on the runtime's identity map. */
  boot_pml4[0] |= PTE_U;
  for (int i = 0; i < 4; ++i) boot_pdpt[i] |= PTE_U;
  for (int i = 0; i < 2048; ++i) boot_pd[i] |= PTE_U;
  write_cr3(read_cr3());

  wrmsr(MSR_EFER, rdmsr(MSR_EFER) | EFER_SCE);
  wrmsr(MSR_STAR, ((uint64_t)(USER_CS32 | 3) << 48) | ((uint64_t)KERNEL_CS << 32));
  wrmsr(MSR_LSTAR, (uint64_t)syscall_entry);
  wrmsr(MSR_SFMASK, RFLAGS_IF);
  syscall_stack_top = (uint64_t)(syscall_stack + sizeof syscall_stack);
  tss_set_rsp0((uint64_t)(interrupt_stack + sizeof interrupt_stack));
  set_interrupt_handler(0x80, on_int80);
  set_gate_user_callable(0x80, 1);
  set_interrupt_handler(IRQ_BASE + 0, on_timer);
  pit_start(1000, PIT_MODE_RATE);
  pic_unmask(0);

  printf("syscall-bound: n=%lu iterations in ring 3\n", iterations);
  uint64_t checksum = enter_user((uint64_t)user_loop, (uint64_t)(user_stack + sizeof user_stack), iterations);
  cli();
  pic_mask(0);
  if (syscalls != iterations + 1 || int80s != iterations / 8) fail("%lu syscalls, %lu INT 0x80", syscalls, int80s);
  printf("syscall-bound: checksum=%#018lx\n", checksum);
  return 0;
}
