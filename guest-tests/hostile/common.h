// Hostile guests' shared pieces: ELF64 direct boot (long mode, 4 GiB identity map, RSP = 0x80000), PIC/PIT/IDT set-up without branches.
#pragma once

#define COM1 0x3f8

// Remaps the 8259A pair to vectors 0x20-0x2f and masks every line but IRQ0.
.macro pic_init_irq0_only
        movb $0x11, %al
        outb %al, $0x20
        outb %al, $0xa0
        movb $0x20, %al
        outb %al, $0x21
        movb $0x28, %al
        outb %al, $0xa1
        movb $0x04, %al
        outb %al, $0x21
        movb $0x02, %al
        outb %al, $0xa1
        movb $0x01, %al
        outb %al, $0x21
        outb %al, $0xa1
        movb $0xfe, %al
        outb %al, $0x21
        movb $0xff, %al
        outb %al, $0xa1
.endm

// PIT channel 0, mode 2 (rate generator), 16-bit divisor.
.macro pit_rate divisor
        movb $0x34, %al
        outb %al, $0x43
        movb $(\divisor & 0xff), %al
        outb %al, $0x40
        movb $(\divisor >> 8), %al
        outb %al, $0x40
.endm

// Builds the 64-bit interrupt gate for `vector` -> `handler` in `idt` (straight-line code, clobbers RAX).
.macro idt_gate idt, vector, handler
        leaq \handler(%rip), %rax
        movw %ax, \idt + \vector * 16(%rip)
        movw $0x08, \idt + \vector * 16 + 2(%rip)
        movw $0x8e00, \idt + \vector * 16 + 4(%rip)
        shrq $16, %rax
        movw %ax, \idt + \vector * 16 + 6(%rip)
        shrq $16, %rax
        movl %eax, \idt + \vector * 16 + 8(%rip)
.endm
