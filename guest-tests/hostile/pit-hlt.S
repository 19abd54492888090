// Hostile guest: PIT channel 0 at its fastest rate, idling in `sti; hlt` with an ISR that only acknowledges;
// no conditional branch between interrupts, so every interrupt lands at the same registers.
#include "common.h"
        .text
        .globl _start
_start:
        cli
        idt_gate idt, 0x20, irq0
        lidt idtr(%rip)
        pic_init_irq0_only
        pit_rate 2
1:      sti
        hlt
        jmp 1b

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
