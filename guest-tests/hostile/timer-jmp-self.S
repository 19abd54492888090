// Hostile guest: `jmp .` with interrupts on under a 1 kHz PIT whose handler only acknowledges: every tick lands at
// the same registers and branch count, and nothing but the tick changes between them.
#include "common.h"
        .text
        .globl _start
_start:
        cli
        idt_gate idt, 0x20, irq0
        lidt idtr(%rip)
        pic_init_irq0_only
        pit_rate 1193
        sti
1:      jmp 1b

irq0:   pushq %rax
        movb $0x20, %al
        outb %al, $0x20
        popq %rax
        iretq

        .data
        .balign 16
idt:    .fill 0x21 * 16, 1, 0
idtr:   .word 0x21 * 16 - 1
        .quad idt
