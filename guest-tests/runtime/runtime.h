/* The whole guest runtime API: port I/O, serial printf, interrupts, PIC/PIT, Multiboot info, exit. */
#pragma once

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include "layout.h"

/* Each guest defines this; returning 0 reports success through isa-debug-exit, anything else failure. */
int guest_main(void);

/* ---- port I/O and CPU helpers ---- */
static inline void outb(uint16_t port, uint8_t v) { __asm__ volatile("outb %0, %1" ::"a"(v), "Nd"(port)); }
static inline void outw(uint16_t port, uint16_t v) { __asm__ volatile("outw %0, %1" ::"a"(v), "Nd"(port)); }
static inline void outl(uint16_t port, uint32_t v) { __asm__ volatile("outl %0, %1" ::"a"(v), "Nd"(port)); }
static inline uint8_t inb(uint16_t port) {
  uint8_t v;
  __asm__ volatile("inb %1, %0" : "=a"(v) : "Nd"(port));
  return v;
}
static inline void cli(void) { __asm__ volatile("cli" ::: "memory"); }
static inline void sti(void) { __asm__ volatile("sti" ::: "memory"); }
/* STI's one-instruction interrupt shadow makes this atomic: no wakeup is lost between the check and HLT. */
static inline void sti_hlt(void) { __asm__ volatile("sti; hlt" ::: "memory"); }
static inline void cpu_pause(void) { __asm__ volatile("pause" ::: "memory"); }
static inline uint64_t read_cr0(void) { uint64_t v; __asm__ volatile("mov %%cr0, %0" : "=r"(v)); return v; }
static inline uint64_t read_cr2(void) { uint64_t v; __asm__ volatile("mov %%cr2, %0" : "=r"(v)); return v; }
static inline uint64_t read_cr3(void) { uint64_t v; __asm__ volatile("mov %%cr3, %0" : "=r"(v)); return v; }
static inline uint64_t read_cr4(void) { uint64_t v; __asm__ volatile("mov %%cr4, %0" : "=r"(v)); return v; }
static inline void write_cr3(uint64_t v) { __asm__ volatile("mov %0, %%cr3" ::"r"(v) : "memory"); }
static inline void invlpg(const volatile void *p) { __asm__ volatile("invlpg (%0)" ::"r"(p) : "memory"); }
static inline uint64_t rdmsr(uint32_t msr) {
  uint32_t lo, hi;
  __asm__ volatile("rdmsr" : "=a"(lo), "=d"(hi) : "c"(msr));
  return ((uint64_t)hi << 32) | lo;
}
static inline void wrmsr(uint32_t msr, uint64_t v) {
  __asm__ volatile("wrmsr" ::"c"(msr), "a"((uint32_t)v), "d"((uint32_t)(v >> 32)) : "memory");
}
struct cpuid_regs {
  uint32_t eax, ebx, ecx, edx;
};
static inline struct cpuid_regs cpuid(uint32_t leaf, uint32_t subleaf) {
  struct cpuid_regs r;
  __asm__ volatile("cpuid" : "=a"(r.eax), "=b"(r.ebx), "=c"(r.ecx), "=d"(r.edx) : "a"(leaf), "c"(subleaf));
  return r;
}
static inline uint64_t rdtsc(void) {
  uint32_t lo, hi;
  __asm__ volatile("rdtsc" : "=a"(lo), "=d"(hi));
  return ((uint64_t)hi << 32) | lo;
}

/* ---- freestanding libc subset (GCC may emit calls to the first four on its own) ---- */
void *memset(void *dst, int c, size_t n);
void *memcpy(void *dst, const void *src, size_t n);
void *memmove(void *dst, const void *src, size_t n);
int memcmp(const void *a, const void *b, size_t n);
size_t strlen(const char *s);
int strncmp(const char *a, const char *b, size_t n);

/* ---- serial console on COM1 ---- */
#define COM1 0x3f8
void serial_init(void);
void serial_putc(char c);
void serial_write(const char *s, size_t n);
/* A byte the UART held before serial_init enabled the FIFO (which clears it); -1 if none. */
int serial_take_early_byte(void);
int printf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
int vprintf(const char *fmt, va_list ap);
int snprintf(char *buf, size_t size, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
int puts(const char *s); /* appends "\n", like libc */

/* ---- interrupts ---- */
/* Saved state of an interrupted context, lowest address first, exactly as boot.S builds it. */
struct frame {
  uint8_t fxsave[464];   /* FXSAVE image; its last 48 bytes are software-available, so: */
  uint64_t cr0_ts;       /* CR0.TS of the interrupted context; a #NM handler zeroes it to keep TS clear */
  uint8_t fxsave_available[40];
  uint64_t r15, r14, r13, r12, r11, r10, r9, r8, rbp, rdi, rsi, rdx, rcx, rbx, rax;
  uint64_t vector, error_code;
  uint64_t rip, cs, rflags, rsp, ss; /* pushed by the CPU */
};
_Static_assert(sizeof(struct frame) == 512 + 22 * 8, "frame must match boot.S");
_Static_assert(offsetof(struct frame, cr0_ts) == FRAME_CR0_TS, "frame must match boot.S");

/* A handler returns the frame to resume: normally its argument; a scheduler may return another thread's. */
typedef struct frame *(*interrupt_handler)(struct frame *);
void set_interrupt_handler(uint8_t vector, interrupt_handler handler);
/* Lets ring 3 raise `vector` with INT n (system-call gates, INT3). */
void set_gate_user_callable(uint8_t vector, int user_callable);
/* Never returns: loads `f` (e.g. a new thread's first frame) with IRETQ. */
_Noreturn void isr_resume_frame(struct frame *f);
void tss_set_rsp0(uint64_t rsp0);
const char *exception_name(uint8_t vector);

/* ---- 8259A PIC and 8254 PIT ---- */
#define IRQ_BASE 0x20 /* master at 0x20-0x27, slave at 0x28-0x2f */
void pic_init(void);  /* remaps and masks everything; runtime_start calls it */
void pic_unmask(uint8_t irq);
void pic_mask(uint8_t irq);
void pic_eoi(uint8_t irq);
#define PIT_HZ 1193182u
#define PIT_MODE_RATE 2   /* rate generator */
#define PIT_MODE_SQUARE 3 /* square wave */
/* Programs channel 0 (IRQ0); returns the divisor used. */
uint16_t pit_start(uint32_t hz, int mode);
uint16_t pit_read_counter(void);

/* ---- Multiboot v1 information ---- */
struct memory_region {
  uint64_t base, length;
  uint32_t type; /* 1 = usable RAM */
};
struct boot_info {
  int multiboot;           /* the loader passed 0x2BADB002 */
  uint32_t flags;          /* Multiboot info flags */
  uint32_t mem_lower_kib;  /* valid when flags bit 0 */
  uint32_t mem_upper_kib;  /* RAM above 1 MiB, up to the first hole; valid when flags bit 0 */
  const char *cmdline;     /* full command line, "" when absent */
  const char *args;        /* cmdline without a leading image path (GRUB and QEMU put it first) */
  int region_count;
  struct memory_region regions[32];
};
const struct boot_info *boot_info(void);
/* Looks up "key=NUMBER" in the arguments; returns `fallback` when absent or malformed. */
uint64_t boot_arg_u64(const char *key, uint64_t fallback);

/* ---- multiprocessor (runtime/smp.c): the MP table's processors, started by INIT-SIPI-SIPI ---- */
#define SMP_MAX_CPUS 16
#define LAPIC_BASE 0xfee00000ul
/* The processors the MP table lists (1 without a table), and their local APIC IDs, the BSP's first. */
int smp_cpu_count(void);
uint8_t smp_apic_id(int cpu);
/* Starts the application processors: each runs ap_main(cpu) (cpu = 1 .. count-1) in long mode on a stack of its
   own, with the BSP's GDT, IDT and page tables and its local APIC software-enabled, interrupts off. Returns the
   number of processors running (the BSP included) once every one has started, or fails the guest. */
int smp_start(void (*ap_main)(int cpu));
/* This processor's index (0 on the BSP), from its local APIC ID. */
int smp_cpu_index(void);
/* A spinlock (XCHG, PAUSE while waiting) for output and shared state. */
void smp_lock(volatile int *lock);
void smp_unlock(volatile int *lock);
/* printf under one lock, so that lines from several processors do not mix. */
int smp_printf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static inline uint32_t lapic_read32(uint32_t reg) { return *(volatile uint32_t *)(LAPIC_BASE + reg); }
static inline void lapic_write32(uint32_t reg, uint32_t v) { *(volatile uint32_t *)(LAPIC_BASE + reg) = v; }
/* Sends an IPI (xAPIC): `icr_low` (vector, delivery mode, destination mode, shorthand) to `destination`. */
void lapic_send_ipi(uint8_t destination, uint32_t icr_low);
/* Loads the runtime's IDT on this processor. */
void idt_load(void);

/* ---- exit ---- */
#define DEBUG_EXIT_PORT 0xf4
/* 0 = success (QEMU exit status 1), anything else = failure (status 3); HLT forever if no device. */
_Noreturn void exit_guest(int failure);
/* Prints "FAIL: ..." and exits with failure. */
_Noreturn void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Image bounds from the linker script. */
extern char __image_start[], _end[];
