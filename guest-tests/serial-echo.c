/* Guest "serial-echo": receives COM1 bytes by interrupt (IRQ4) until a newline or 256 bytes; prints count, FNV-1a and the bytes. */
#include "runtime/runtime.h"

#define MAX_BYTES 256
#define UART_IER_RX_AVAILABLE 0x01
#define UART_MCR_OUT2 0x08 /* gates the UART's interrupt onto the PC's IRQ line */

static volatile uint8_t received[MAX_BYTES];
static volatile int received_count;
static volatile int saw_newline;
static int interrupts;

/* The input starts with '#' padding, skipped here: a 16550 empties its receiver when the FIFO is
   enabled (PC16550D datasheet, FCR0), so a byte the host sends before serial_init may be lost, and
   a VMM may deliver input that early. Padding makes the payload independent of that race. */
static volatile int in_padding = 1;

static void store(uint8_t byte) {
  if (in_padding && byte == '#') return;
  in_padding = 0;
  if (received_count < MAX_BYTES && !saw_newline) {
    received[received_count++] = byte;
    if (byte == '\n') saw_newline = 1;
  }
}

static struct frame *on_uart(struct frame *f) {
  ++interrupts;
  (void)inb(COM1 + 2); /* IIR: acknowledges the interrupt source */
  while (inb(COM1 + 5) & 0x01) store(inb(COM1 + 0)); /* drain while LSR.DR */
  return f;
}

static uint32_t fnv1a32(const volatile uint8_t *data, int length) {
  uint32_t hash = 2166136261u;
  for (int i = 0; i < length; ++i) hash = (hash ^ data[i]) * 16777619u;
  return hash;
}

int guest_main(void) {
  int early = serial_take_early_byte();
  if (early >= 0) store((uint8_t)early);
  set_interrupt_handler(IRQ_BASE + 4, on_uart);
  outb(COM1 + 4, inb(COM1 + 4) | UART_MCR_OUT2);
  outb(COM1 + 1, UART_IER_RX_AVAILABLE);
  pic_unmask(4);
  printf("serial-echo: ready for input\n");
  for (;;) {
    cli();
    if (saw_newline || received_count >= MAX_BYTES) break;
    sti_hlt();
  }
  outb(COM1 + 1, 0);
  pic_mask(4);
  int n = received_count;
  printf("serial-echo: received %d bytes by interrupt, fnv1a32=%08x\n", n, fnv1a32(received, n));
  printf("serial-echo: data: \"");
  for (int i = 0; i < n; ++i) {
    uint8_t c = received[i];
    if (c >= 0x20 && c < 0x7f && c != '"' && c != '\\') serial_putc((char)c);
    else printf("\\x%02x", c);
  }
  printf("\"\n");
  return interrupts > 0 ? 0 : 1;
}
