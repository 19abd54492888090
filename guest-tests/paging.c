/* Guest "paging": own 4-level tables with 4 KiB pages, ring-3 tasks, SYSCALL/SYSRET and INT 0x80 system calls, user page faults. */
#include "runtime/runtime.h"

#define MSR_STAR 0xC0000081
#define MSR_LSTAR 0xC0000082
#define MSR_SFMASK 0xC0000084
#define RFLAGS_TF 0x100
#define RFLAGS_IF 0x200
#define RFLAGS_DF 0x400
#define RFLAGS_AC 0x40000
#define SYS_WRITE 1
#define SYS_EXIT 60
#define MAPPED_BYTES (8u << 20) /* identity-mapped with 4 KiB pages; the image must fit below */
#define PF_PRESENT 1
#define PF_WRITE 2
#define PF_USER 4

extern char __user_start[], __user_end[];
void user_task_syscalls(void);
void user_task_read_kernel(void);
void user_task_write_code(void);
/* Enters ring 3 at `rip` with stack `rsp` and RDI = `arg`; returns the task's exit status. */
uint64_t enter_user(uint64_t rip, uint64_t rsp, uint64_t arg);
/* Abandons the current user task: back to enter_user's caller with `status` (ring 0 only). */
_Noreturn void leave_user(uint64_t status);
void syscall_entry(void);
uint64_t syscall_dispatch(uint64_t number, uint64_t arg0, uint64_t arg1, uint64_t user_cs_check);

uint64_t kernel_saved_rsp, syscall_user_rsp, syscall_stack_top;

/* Ring 3 code and data: the only pages mapped with the U bit; text read-only, data writable. */
__asm__(".section .user_text, \"ax\"\n"
        ".globl user_task_syscalls, user_task_read_kernel, user_task_write_code\n"
        "user_task_syscalls:\n"
        "  leaq user_msg_syscall(%rip), %rdi\n"
        "  movq $user_msg_syscall_end - user_msg_syscall, %rsi\n"
        "  movl $1, %eax\n" /* SYS_WRITE */
        "  syscall\n"
        "  leaq user_msg_int80(%rip), %rdi\n"
        "  movq $user_msg_int80_end - user_msg_int80, %rsi\n"
        "  movl $1, %eax\n"
        "  int $0x80\n"
        "  movq %cs, %rdi\n" /* exit status 40 + CPL: proves where we ran */
        "  andq $3, %rdi\n"
        "  addq $40, %rdi\n"
        "  movl $60, %eax\n" /* SYS_EXIT */
        "  syscall\n"
        "  ud2\n"
        "user_task_read_kernel:\n" /* RDI = a supervisor-only address */
        "  movq (%rdi), %rax\n"
        "  ud2\n"
        "user_task_write_code:\n" /* user text is mapped read-only */
        "  leaq user_task_write_code(%rip), %rax\n"
        "  movb $0x90, (%rax)\n"
        "  ud2\n"
        ".section .user_data, \"aw\"\n"
        "user_msg_syscall: .ascii \"user: hello through SYSCALL\\n\"\n"
        "user_msg_syscall_end:\n"
        "user_msg_int80: .ascii \"user: hello through INT 0x80\\n\"\n"
        "user_msg_int80_end:\n"
        ".balign 4096\n"
        ".globl user_stack_top\n"
        "user_stack: .skip 8192\n"
        "user_stack_top:\n"
        ".text\n");
extern char user_stack_top[];

__asm__(".text\n"
        ".globl enter_user, leave_user, syscall_entry\n"
        "enter_user:\n"
        "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
        "  movq %rsp, kernel_saved_rsp(%rip)\n"
        "  pushq $0x23\n" /* SS = USER_DS | 3 */
        "  pushq %rsi\n"
        "  pushq $0x202\n" /* IF set, as user code always runs */
        "  pushq $0x2b\n"  /* CS = USER_CS | 3 */
        "  pushq %rdi\n"
        "  movq %rdx, %rdi\n"
        "  iretq\n"
        "leave_user:\n"
        "  movq kernel_saved_rsp(%rip), %rsp\n"
        "  movq %rdi, %rax\n"
        "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n"
        "  ret\n"
        /* SYSCALL: RCX = user RIP, R11 = user RFLAGS, RSP still the user's; SFMASK cleared IF. */
        "syscall_entry:\n"
        "  movq %rsp, syscall_user_rsp(%rip)\n"
        "  movq syscall_stack_top(%rip), %rsp\n"
        "  pushq syscall_user_rsp(%rip)\n"
        "  pushq %rcx\n"
        "  pushq %r11\n"
        "  subq $8, %rsp\n" /* 16-byte alignment for the C call */
        "  movq %rsi, %rdx\n"
        "  movq %rdi, %rsi\n"
        "  movq %rax, %rdi\n"
        "  movq 8(%rsp), %rcx\n" /* user RFLAGS, to check that SFMASK did its job */
        "  call syscall_dispatch\n"
        "  addq $8, %rsp\n"
        "  popq %r11\n"
        "  popq %rcx\n"
        "  popq %rsp\n"
        "  sysretq\n");

static uint64_t pml4[512] __attribute__((aligned(4096)));
static uint64_t pdpt[512] __attribute__((aligned(4096)));
static uint64_t pd[512] __attribute__((aligned(4096)));
static uint64_t pt[MAPPED_BYTES >> 21][512] __attribute__((aligned(4096)));
static uint8_t syscall_stack[8192] __attribute__((aligned(16)));
static uint8_t int80_stack[8192] __attribute__((aligned(16)));
static volatile uint64_t kernel_secret __attribute__((aligned(4096))) = 0x5ec7e7;
static int syscall_count, int80_count;

static int user_range_ok(uint64_t address, uint64_t length) {
  return address >= (uint64_t)__user_start && length <= (uint64_t)(__user_end - __user_start) &&
         address + length <= (uint64_t)__user_end;
}

static uint64_t sys_write(const char *how, uint64_t address, uint64_t length) {
  if (!user_range_ok(address, length)) {
    printf("kernel: %s write with a bad user buffer %#lx+%lu refused\n", how, address, length);
    return (uint64_t)-14; /* -EFAULT */
  }
  printf("kernel: %s write of %lu bytes: ", how, length);
  serial_write((const char *)address, length);
  return length;
}

uint64_t syscall_dispatch(uint64_t number, uint64_t arg0, uint64_t arg1, uint64_t user_rflags) {
  ++syscall_count;
  uint64_t flags;
  __asm__ volatile("pushfq; popq %0" : "=r"(flags));
  if (flags & RFLAGS_IF) fail("SYSCALL entered with IF set: SFMASK not applied");
  if (!(user_rflags & RFLAGS_IF)) fail("SYSCALL: R11 lost the user's IF");
  if (number == SYS_WRITE) return sys_write("SYSCALL", arg0, arg1);
  if (number == SYS_EXIT) leave_user(arg0);
  printf("kernel: unknown SYSCALL %lu\n", number);
  return (uint64_t)-38; /* -ENOSYS */
}

static struct frame *on_int80(struct frame *f) {
  ++int80_count;
  if ((f->cs & 3) != 3 || f->ss != (USER_DS | 3)) fail("INT 0x80 frame: cs=%#lx ss=%#lx, not ring 3", f->cs, f->ss);
  uint64_t here = (uint64_t)f;
  int on_rsp0_stack = here >= (uint64_t)int80_stack && here < (uint64_t)int80_stack + sizeof int80_stack;
  printf("kernel: INT 0x80 on the TSS.RSP0 stack: %s\n", on_rsp0_stack ? "yes" : "no");
  if (!on_rsp0_stack) fail("INT 0x80 handler frame at %#lx, not on the RSP0 stack", here);
  if (f->rax == SYS_WRITE) f->rax = sys_write("INT 0x80", f->rdi, f->rsi);
  else if (f->rax == SYS_EXIT) leave_user(f->rdi);
  else f->rax = (uint64_t)-38;
  return f;
}

static uint64_t last_fault_error, last_fault_address;

static struct frame *on_page_fault(struct frame *f) {
  uint64_t cr2 = read_cr2();
  if ((f->cs & 3) != 3) {
    printf("FAIL: kernel page fault at rip=%#lx cr2=%#lx error=%#lx\n", f->rip, cr2, f->error_code);
    exit_guest(1);
  }
  last_fault_error = f->error_code;
  last_fault_address = cr2;
  printf("kernel: user page fault, error=%#lx (%s, %s, %s)\n", f->error_code,
         f->error_code & PF_PRESENT ? "protection" : "not present", f->error_code & PF_WRITE ? "write" : "read",
         f->error_code & PF_USER ? "user" : "supervisor");
  /* Kill the task: resume in ring 0 at leave_user, which unwinds to enter_user's caller. */
  f->rip = (uint64_t)leave_user;
  f->cs = KERNEL_CS;
  f->ss = KERNEL_DS;
  f->rsp = kernel_saved_rsp;
  f->rflags = 0x2;
  f->rdi = 0xdead;
  return f;
}

static void build_page_tables(void) {
  if ((uint64_t)_end > MAPPED_BYTES) fail("image ends at %p, above the %u bytes this guest maps", (void *)_end, MAPPED_BYTES);
  /* The U bit must be set at every level for ring 3 to reach a page; the leaf decides. */
  for (uint64_t page = 1; page < (MAPPED_BYTES >> 12); ++page) { /* page 0 unmapped: null pointers fault */
    uint64_t address = page << 12;
    uint64_t flags = PTE_P | PTE_W;
    if (address >= (uint64_t)__user_start && address < (uint64_t)__user_end) {
      flags |= PTE_U;
      if (address < (uint64_t)user_task_syscalls + 4096 && address + 4096 > (uint64_t)user_task_syscalls)
        flags &= ~PTE_W; /* the user text page */
    }
    pt[page >> 9][page & 511] = address | flags;
  }
  for (uint64_t i = 0; i < (MAPPED_BYTES >> 21); ++i) pd[i] = (uint64_t)pt[i] | PTE_P | PTE_W | PTE_U;
  pdpt[0] = (uint64_t)pd | PTE_P | PTE_W | PTE_U;
  pml4[0] = (uint64_t)pdpt | PTE_P | PTE_W | PTE_U;
  write_cr3((uint64_t)pml4);
}

int guest_main(void) {
  printf("paging: building 4-level tables with 4 KiB pages for the first %u MiB\n", MAPPED_BYTES >> 20);
  build_page_tables();
  printf("paging: running on our own tables\n");

  wrmsr(MSR_EFER, rdmsr(MSR_EFER) | EFER_SCE);
  /* STAR[47:32]: SYSCALL CS (SS = +8); STAR[63:48]: SYSRET base (SS = +8, 64-bit CS = +16). */
  wrmsr(MSR_STAR, ((uint64_t)(USER_CS32 | 3) << 48) | ((uint64_t)KERNEL_CS << 32));
  wrmsr(MSR_LSTAR, (uint64_t)syscall_entry);
  wrmsr(MSR_SFMASK, RFLAGS_IF | RFLAGS_TF | RFLAGS_DF | RFLAGS_AC);
  syscall_stack_top = (uint64_t)(syscall_stack + sizeof syscall_stack);
  tss_set_rsp0((uint64_t)(int80_stack + sizeof int80_stack));
  set_interrupt_handler(0x80, on_int80);
  set_gate_user_callable(0x80, 1);
  set_interrupt_handler(14, on_page_fault);

  printf("paging: task 1 enters ring 3 with IRETQ\n");
  uint64_t status = enter_user((uint64_t)user_task_syscalls, (uint64_t)user_stack_top, 0);
  printf("paging: task 1 exited with status %lu (40 + CPL)\n", status);
  if (status != 43 || syscall_count != 2 || int80_count != 1) fail("task 1: status %lu, %d syscalls, %d int 0x80",
                                                                 status, syscall_count, int80_count);

  printf("paging: task 2 reads a supervisor page\n");
  status = enter_user((uint64_t)user_task_read_kernel, (uint64_t)user_stack_top, (uint64_t)&kernel_secret);
  printf("paging: task 2 killed (status %#lx), fault address is the supervisor page: %s\n", status,
         last_fault_address == (uint64_t)&kernel_secret ? "yes" : "no");
  if (status != 0xdead || last_fault_error != (PF_PRESENT | PF_USER) || last_fault_address != (uint64_t)&kernel_secret)
    fail("task 2: status %#lx error %#lx cr2 %#lx", status, last_fault_error, last_fault_address);

  printf("paging: task 3 writes its own read-only code page\n");
  status = enter_user((uint64_t)user_task_write_code, (uint64_t)user_stack_top, 0);
  printf("paging: task 3 killed (status %#lx), fault address is its code: %s\n", status,
         last_fault_address == (uint64_t)user_task_write_code ? "yes" : "no");
  if (status != 0xdead || last_fault_error != (PF_PRESENT | PF_WRITE | PF_USER) ||
      last_fault_address != (uint64_t)user_task_write_code)
    fail("task 3: status %#lx error %#lx cr2 %#lx", status, last_fault_error, last_fault_address);
  printf("paging: kernel secret intact: %s\n", kernel_secret == 0x5ec7e7 ? "yes" : "no");
  return kernel_secret == 0x5ec7e7 ? 0 : 1;
}
