/* Guest runtime core: start-up after boot.S, GDT/TSS/IDT, interrupt dispatch, PIC/PIT, Multiboot parsing, exit. */
#include "runtime.h"

/* ---- descriptor tables ---- */
struct tss64 {
  uint32_t reserved0;
  uint64_t rsp[3];
  uint64_t reserved1;
  uint64_t ist[7];
  uint64_t reserved2;
  uint16_t reserved3;
  uint16_t iomap_base;
} __attribute__((packed));
_Static_assert(sizeof(struct tss64) == 104, "64-bit TSS is 104 bytes (SDM vol. 3, figure 8-11)");

struct idt_gate {
  uint16_t offset_low, selector;
  uint8_t ist, type_attr;
  uint16_t offset_mid;
  uint32_t offset_high, reserved;
} __attribute__((packed));

extern uint64_t gdt[];
extern const uint64_t isr_stub_table[256];

static struct tss64 tss;
static struct idt_gate idt[256];
static interrupt_handler handlers[256];
static uint8_t interrupt_stack[16384] __attribute__((aligned(16)));
static uint8_t double_fault_stack[4096] __attribute__((aligned(16)));

static void tss_init(void) {
  tss.rsp[0] = (uint64_t)(interrupt_stack + sizeof interrupt_stack);
  /* IST1: a #DF must run on a known-good stack even when the fault was a stack overflow. */
  tss.ist[0] = (uint64_t)(double_fault_stack + sizeof double_fault_stack);
  tss.iomap_base = sizeof tss; /* no I/O bitmap: ring 3 port access faults */
  uint64_t base = (uint64_t)&tss, limit = sizeof tss - 1;
  gdt[TSS_SEL / 8] = (limit & 0xffff) | (base & 0xffffff) << 16 | (uint64_t)0x89 << 40 | ((limit >> 16) & 0xf) << 48 |
                     ((base >> 24) & 0xff) << 56;
  gdt[TSS_SEL / 8 + 1] = base >> 32;
  __asm__ volatile("ltr %w0" ::"r"(TSS_SEL));
}

void tss_set_rsp0(uint64_t rsp0) { tss.rsp[0] = rsp0; }

static void set_gate(int vector, uint64_t target, int dpl, int ist) {
  struct idt_gate *g = &idt[vector];
  g->offset_low = target & 0xffff;
  g->selector = KERNEL_CS;
  g->ist = ist;
  g->type_attr = 0x80 | (dpl << 5) | 0xe; /* present, 64-bit interrupt gate: IF cleared on entry */
  g->offset_mid = (target >> 16) & 0xffff;
  g->offset_high = target >> 32;
  g->reserved = 0;
}

void idt_load(void) {
  struct {
    uint16_t limit;
    uint64_t base;
  } __attribute__((packed)) pointer = {sizeof idt - 1, (uint64_t)idt};
  __asm__ volatile("lidt %0" ::"m"(pointer));
}

static void idt_init(void) {
  for (int v = 0; v < 256; ++v) set_gate(v, isr_stub_table[v], 0, v == 8 ? 1 : 0);
  set_gate(3, isr_stub_table[3], 3, 0); /* INT3 works from ring 3 as on every OS */
  idt_load();
}

void set_gate_user_callable(uint8_t vector, int user_callable) {
  set_gate(vector, isr_stub_table[vector], user_callable ? 3 : 0, vector == 8 ? 1 : 0);
}

void set_interrupt_handler(uint8_t vector, interrupt_handler handler) { handlers[vector] = handler; }

const char *exception_name(uint8_t vector) {
  static const char *const names[32] = {
      "#DE divide error", "#DB debug", "NMI", "#BP breakpoint", "#OF overflow", "#BR bound range",
      "#UD invalid opcode", "#NM device not available", "#DF double fault", "coprocessor segment overrun",
      "#TS invalid TSS", "#NP segment not present", "#SS stack fault", "#GP general protection",
      "#PF page fault", "reserved 15", "#MF x87 error", "#AC alignment check", "#MC machine check",
      "#XM SIMD exception", "#VE virtualization exception", "#CP control protection", "reserved 22",
      "reserved 23", "reserved 24", "reserved 25", "reserved 26", "reserved 27", "#HV hypervisor injection",
      "#VC VMM communication", "#SX security exception", "reserved 31"};
  return vector < 32 ? names[vector] : "interrupt";
}

static _Noreturn void unexpected_exception(const struct frame *f) {
  printf("FAIL: unexpected %s (vector %lu) error=%#lx at rip=%#lx cs=%#lx rflags=%#lx rsp=%#lx cr2=%#lx\n",
         exception_name(f->vector), f->vector, f->error_code, f->rip, f->cs, f->rflags, f->rsp, read_cr2());
  printf("  rax=%#lx rbx=%#lx rcx=%#lx rdx=%#lx rsi=%#lx rdi=%#lx rbp=%#lx\n", f->rax, f->rbx, f->rcx, f->rdx,
         f->rsi, f->rdi, f->rbp);
  exit_guest(1);
}

/* 8259A in-service register: tells a real IRQ 7/15 from a spurious one (which must not get an EOI). */
static uint8_t pic_in_service(uint16_t command_port) {
  outb(command_port, 0x0b); /* OCW3: read ISR */
  return inb(command_port);
}

struct frame *interrupt_dispatch(struct frame *f);
struct frame *interrupt_dispatch(struct frame *f) {
  uint8_t vector = (uint8_t)f->vector;
  if (vector >= IRQ_BASE && vector < IRQ_BASE + 16) {
    uint8_t irq = vector - IRQ_BASE;
    if (irq == 7 && !(pic_in_service(0x20) & 0x80)) return f;
    if (irq == 15 && !(pic_in_service(0xa0) & 0x80)) {
      pic_eoi(2); /* the master did see its cascade line */
      return f;
    }
    struct frame *next = handlers[vector] ? handlers[vector](f) : f;
    pic_eoi(irq);
    return next;
  }
  if (handlers[vector]) return handlers[vector](f);
  unexpected_exception(f);
}

/* ---- 8259A PIC ---- */
static uint8_t pic_masks[2] = {0xff, 0xff};

/* No POST-port delays between the ICWs: they were for the original 8259A on ISA; emulated PICs (and
   VMMs that refuse unknown ports such as 0x80) need none. */
void pic_init(void) {
  outb(0x20, 0x11); /* ICW1: edge triggered, cascade, ICW4 follows */
  outb(0xa0, 0x11);
  outb(0x21, IRQ_BASE); /* ICW2: vector base */
  outb(0xa1, IRQ_BASE + 8);
  outb(0x21, 0x04); /* ICW3: slave on IRQ2 */
  outb(0xa1, 0x02); /* ICW3: slave identity 2 */
  outb(0x21, 0x01); /* ICW4: 8086 mode, normal EOI */
  outb(0xa1, 0x01);
  pic_masks[0] = 0xfb; /* everything masked except the cascade */
  pic_masks[1] = 0xff;
  outb(0x21, pic_masks[0]);
  outb(0xa1, pic_masks[1]);
}

void pic_unmask(uint8_t irq) {
  int chip = irq >= 8;
  pic_masks[chip] &= ~(1u << (irq & 7));
  outb(chip ? 0xa1 : 0x21, pic_masks[chip]);
}

void pic_mask(uint8_t irq) {
  int chip = irq >= 8;
  pic_masks[chip] |= 1u << (irq & 7);
  outb(chip ? 0xa1 : 0x21, pic_masks[chip]);
}

void pic_eoi(uint8_t irq) {
  if (irq >= 8) outb(0xa0, 0x20);
  outb(0x20, 0x20);
}

/* ---- 8254 PIT channel 0 ---- */
uint16_t pit_start(uint32_t hz, int mode) {
  uint32_t divisor = (PIT_HZ + hz / 2) / hz;
  if (divisor < 2) divisor = 2;
  if (divisor > 65535) divisor = 0; /* 0 means 65536 */
  outb(0x43, (uint8_t)(0x30 | (mode << 1))); /* channel 0, lobyte/hibyte, binary */
  outb(0x40, divisor & 0xff);
  outb(0x40, (divisor >> 8) & 0xff);
  return (uint16_t)divisor;
}

uint16_t pit_read_counter(void) {
  outb(0x43, 0x00); /* counter latch, channel 0 */
  uint8_t lo = inb(0x40);
  uint8_t hi = inb(0x40);
  return (uint16_t)(lo | hi << 8);
}

/* ---- Multiboot v1 ---- */
#define MULTIBOOT_LOADER_MAGIC 0x2BADB002u
extern uint64_t boot_magic, boot_info_phys;
static struct boot_info info;
static char cmdline_copy[512];

static int is_space(char c) { return c == ' ' || c == '\t'; }

static void parse_multiboot(void) {
  info.cmdline = info.args = "";
  if ((uint32_t)boot_magic != MULTIBOOT_LOADER_MAGIC || boot_info_phys == 0) return;
  info.multiboot = 1;
  const uint8_t *mbi = (const uint8_t *)boot_info_phys;
  uint32_t flags = *(const uint32_t *)mbi;
  info.flags = flags;
  if (flags & (1u << 0)) {
    info.mem_lower_kib = *(const uint32_t *)(mbi + 4);
    info.mem_upper_kib = *(const uint32_t *)(mbi + 8);
  }
  if (flags & (1u << 2)) {
    /* Copied: guests may overwrite all free RAM, including where the loader put the string. */
    const char *src = (const char *)(uint64_t) * (const uint32_t *)(mbi + 16);
    size_t n = 0;
    while (src[n] && n + 1 < sizeof cmdline_copy) {
      cmdline_copy[n] = src[n];
      ++n;
    }
    cmdline_copy[n] = 0;
    info.cmdline = cmdline_copy;
    /* GRUB and QEMU put the image path first; deja may pass only the arguments. */
    const char *p = cmdline_copy;
    while (is_space(*p)) ++p;
    const char *word = p;
    int path_like = 0;
    while (*p && !is_space(*p)) {
      if (*p == '/') path_like = 1;
      ++p;
    }
    if (p - word >= 4 && strncmp(p - 4, ".elf", 4) == 0) path_like = 1;
    if (!path_like) p = word;
    while (is_space(*p)) ++p;
    info.args = p;
  }
  if (flags & (1u << 6)) {
    uint32_t length = *(const uint32_t *)(mbi + 44);
    const uint8_t *entry = (const uint8_t *)(uint64_t) * (const uint32_t *)(mbi + 48);
    const uint8_t *end = entry + length;
    while (entry < end && info.region_count < (int)(sizeof info.regions / sizeof info.regions[0])) {
      uint32_t size = *(const uint32_t *)entry;
      struct memory_region *r = &info.regions[info.region_count++];
      memcpy(&r->base, entry + 4, 8);
      memcpy(&r->length, entry + 12, 8);
      memcpy(&r->type, entry + 20, 4);
      entry += size + 4; /* `size` excludes itself */
    }
  }
}

const struct boot_info *boot_info(void) { return &info; }

uint64_t boot_arg_u64(const char *key, uint64_t fallback) {
  size_t key_len = strlen(key);
  const char *p = info.args;
  while (*p) {
    while (is_space(*p)) ++p;
    if (strncmp(p, key, key_len) == 0 && p[key_len] == '=') {
      const char *digits = p + key_len + 1;
      uint64_t base = 10, value = 0;
      if (digits[0] == '0' && (digits[1] == 'x' || digits[1] == 'X')) {
        base = 16;
        digits += 2;
      }
      int any = 0;
      for (; *digits && !is_space(*digits); ++digits, any = 1) {
        char c = *digits;
        uint64_t d;
        if (c >= '0' && c <= '9') d = c - '0';
        else if (base == 16 && c >= 'a' && c <= 'f') d = c - 'a' + 10;
        else if (base == 16 && c >= 'A' && c <= 'F') d = c - 'A' + 10;
        else return fallback;
        value = value * base + d;
      }
      return any ? value : fallback;
    }
    while (*p && !is_space(*p)) ++p;
  }
  return fallback;
}

/* ---- start and exit ---- */
void runtime_start(void);
void runtime_start(void) {
  serial_init();
  tss_init();
  idt_init();
  pic_init();
  parse_multiboot();
  int status = guest_main();
  cli();
  exit_guest(status != 0);
}

_Noreturn void exit_guest(int failure) {
  /* isa-debug-exit turns the value v into process status (v << 1) | 1. */
  outl(DEBUG_EXIT_PORT, failure ? 1 : 0);
  for (;;) __asm__ volatile("cli; hlt");
}

_Noreturn void fail(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  printf("FAIL: ");
  vprintf(fmt, ap);
  va_end(ap);
  printf("\n");
  exit_guest(1);
}
