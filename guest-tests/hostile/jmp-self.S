// Hostile guest: `jmp .` with interrupts off: no branch that counts, no register change, no exit, ever.
        .text
        .globl _start
_start:
        cli
1:      jmp 1b
