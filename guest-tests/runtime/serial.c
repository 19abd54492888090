/* COM1 16550A driver (polled output) and the runtime's printf family. */
#include "runtime.h"

#define UART_RBR 0 /* receive buffer (DLAB=0) */
#define UART_THR 0 /* transmit holding (DLAB=0) */
#define UART_DLL 0 /* divisor latch (DLAB=1) */
#define UART_IER 1
#define UART_DLM 1
#define UART_FCR 2
#define UART_LCR 3
#define UART_MCR 4
#define UART_LSR 5
#define LSR_DATA_READY 0x01
#define LSR_THR_EMPTY 0x20

static int early_byte = -1;

void serial_init(void) {
  outb(COM1 + UART_IER, 0x00);
  /* Enabling the FIFO clears the receiver (PC16550D datasheet, FCR0), so a byte that arrived
     before us would be lost; keep it for the guest. */
  if (inb(COM1 + UART_LSR) & LSR_DATA_READY) early_byte = inb(COM1 + UART_RBR);
  outb(COM1 + UART_LCR, 0x80); /* DLAB: program the baud divisor */
  outb(COM1 + UART_DLL, 1);    /* 115200 = 1.8432 MHz / 16 / 1 */
  outb(COM1 + UART_DLM, 0);
  outb(COM1 + UART_LCR, 0x03); /* 8 data bits, no parity, 1 stop bit */
  /* FIFO on, both cleared, receive trigger at 1 byte so an interrupt-driven reader never waits
     for the character-timeout interrupt. */
  outb(COM1 + UART_FCR, 0x07);
  outb(COM1 + UART_MCR, 0x03); /* DTR, RTS; OUT2 (IRQ gate) only when a guest wants interrupts */
}

int serial_take_early_byte(void) {
  int b = early_byte;
  early_byte = -1;
  return b;
}

void serial_putc(char c) {
  while (!(inb(COM1 + UART_LSR) & LSR_THR_EMPTY)) cpu_pause();
  outb(COM1 + UART_THR, (uint8_t)c);
}

void serial_write(const char *s, size_t n) {
  for (size_t i = 0; i < n; ++i) serial_putc(s[i]);
}

int puts(const char *s) {
  serial_write(s, strlen(s));
  serial_putc('\n');
  return 0;
}

/* ---- formatting ---- */
struct sink {
  void (*put)(struct sink *, char);
  char *buf;
  size_t size, used;
  int count;
};

static void emit(struct sink *s, char c) {
  s->put(s, c);
  ++s->count;
}

static void emit_padding(struct sink *s, int n, char c) {
  while (n-- > 0) emit(s, c);
}

static void format(struct sink *s, const char *fmt, va_list ap) {
  for (; *fmt; ++fmt) {
    if (*fmt != '%') {
      emit(s, *fmt);
      continue;
    }
    ++fmt;
    int left = 0, zero = 0, alt = 0, width = 0, precision = -1, longs = 0;
    for (;; ++fmt) {
      if (*fmt == '-') left = 1;
      else if (*fmt == '0') zero = 1;
      else if (*fmt == '#') alt = 1;
      else break;
    }
    if (*fmt == '*') {
      width = va_arg(ap, int);
      ++fmt;
    } else {
      while (*fmt >= '0' && *fmt <= '9') width = width * 10 + (*fmt++ - '0');
    }
    if (*fmt == '.') {
      ++fmt;
      precision = 0;
      if (*fmt == '*') {
        precision = va_arg(ap, int);
        ++fmt;
      } else {
        while (*fmt >= '0' && *fmt <= '9') precision = precision * 10 + (*fmt++ - '0');
      }
    }
    while (*fmt == 'l' || *fmt == 'z' || *fmt == 'h') {
      if (*fmt != 'h') ++longs;
      ++fmt;
    }
    char digits[24];
    int n = 0, negative = 0;
    const char *prefix = "";
    switch (*fmt) {
      case 'c': {
        char c = (char)va_arg(ap, int);
        if (!left) emit_padding(s, width - 1, ' ');
        emit(s, c);
        if (left) emit_padding(s, width - 1, ' ');
        continue;
      }
      case 's': {
        const char *str = va_arg(ap, const char *);
        if (!str) str = "(null)";
        int len = 0;
        while (str[len] && (precision < 0 || len < precision)) ++len;
        if (!left) emit_padding(s, width - len, ' ');
        for (int i = 0; i < len; ++i) emit(s, str[i]);
        if (left) emit_padding(s, width - len, ' ');
        continue;
      }
      case '%':
        emit(s, '%');
        continue;
      case 'd':
      case 'i':
      case 'u':
      case 'x':
      case 'X':
      case 'p': {
        uint64_t value;
        int base = (*fmt == 'x' || *fmt == 'X' || *fmt == 'p') ? 16 : 10;
        if (*fmt == 'p') {
          value = (uint64_t)va_arg(ap, void *);
          alt = 1;
        } else if (*fmt == 'd' || *fmt == 'i') {
          int64_t v = longs ? va_arg(ap, int64_t) : va_arg(ap, int);
          negative = v < 0;
          value = negative ? -(uint64_t)v : (uint64_t)v;
        } else {
          value = longs ? va_arg(ap, uint64_t) : va_arg(ap, unsigned);
        }
        const char *alphabet = *fmt == 'X' ? "0123456789ABCDEF" : "0123456789abcdef";
        do {
          digits[n++] = alphabet[value % base];
          value /= base;
        } while (value);
        if (negative) prefix = "-";
        else if (alt && base == 16) prefix = *fmt == 'X' ? "0X" : "0x";
        int prefix_len = (int)strlen(prefix);
        int pad = width - n - prefix_len;
        if (!left && !zero) emit_padding(s, pad, ' ');
        for (const char *p = prefix; *p; ++p) emit(s, *p);
        if (!left && zero) emit_padding(s, pad, '0');
        while (n) emit(s, digits[--n]);
        if (left) emit_padding(s, pad, ' ');
        continue;
      }
      default: /* unknown conversion: show it rather than guess */
        emit(s, '%');
        if (*fmt) emit(s, *fmt);
        else return;
    }
  }
}

static void put_serial(struct sink *s, char c) {
  (void)s;
  serial_putc(c);
}

static void put_buffer(struct sink *s, char c) {
  if (s->used + 1 < s->size) s->buf[s->used++] = c;
}

int vprintf(const char *fmt, va_list ap) {
  struct sink s = {put_serial, 0, 0, 0, 0};
  format(&s, fmt, ap);
  return s.count;
}

int printf(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = vprintf(fmt, ap);
  va_end(ap);
  return n;
}

int snprintf(char *buf, size_t size, const char *fmt, ...) {
  struct sink s = {put_buffer, buf, size, 0, 0};
  va_list ap;
  va_start(ap, fmt);
  format(&s, fmt, ap);
  va_end(ap);
  if (size) buf[s.used] = 0;
  return s.count;
}
