// Hostile guest: jumps into zeroed RAM at 16 MiB and executes it (00 00 = add %al,(%rax)) up to the end of RAM.
        .text
        .globl _start
_start:
        cli
        xorl %eax, %eax
        movabsq $0x1000000, %rbx
        movq %rbx, %rax
        jmp *%rbx
