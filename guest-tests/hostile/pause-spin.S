// Hostile guest: a spin-wait that never ends, `pause; jmp` (PAUSE is `rep nop`, F3 90), interrupts off.
        .text
        .globl _start
_start:
        cli
1:      pause
        jmp 1b
