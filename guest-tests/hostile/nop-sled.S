// Hostile guest: fills 64 MiB at 16 MiB with NOPs, ends them with a jump back to their start, and runs them forever.
        .text
        .globl _start
_start:
        cli
        movabsq $0x1000000, %rdi
        movq $(64 << 20), %rcx
        movb $0x90, %al
        cld
        rep stosb
        // movabs $0x1000000, %rax; jmp *%rax
        movb $0x48, (%rdi)
        movb $0xb8, 1(%rdi)
        movq $0x1000000, 2(%rdi)
        movw $0xe0ff, 10(%rdi)
        movabsq $0x1000000, %rax
        jmp *%rax
