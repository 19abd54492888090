// Hostile guest: spins with interrupts off incrementing memory; no conditional branch, no I/O, ever.
        .text
        .globl _start
_start:
        cli
1:      incq counter(%rip)
        jmp 1b

        .data
counter: .quad 0
