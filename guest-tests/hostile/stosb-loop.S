// Hostile guest: `rep stosb` over a page again and again, interrupts off: the only change between turns is inside a
// REP instruction (RCX and RDI), which a recording can stop in the middle of.
        .text
        .globl _start
_start:
        cli
        xorl %eax, %eax
1:      leaq buffer(%rip), %rdi
        movl $4096, %ecx
        incb %al
        rep stosb
        jmp 1b

        .bss
        .balign 4096
buffer: .skip 4096
