// Hostile guest: reads upward through guest-physical space above RAM (256 MiB), one read every 64 bytes, until
// the identity map ends at 4 GiB; every address is an unmapped MMIO read.
        .text
        .globl _start
_start:
        cli
        movq $0x10000000, %rax
1:      movq (%rax), %rbx
        addq $64, %rax
        jmp 1b
