// The application processors' start: a real-mode trampoline (copied below 1 MiB) to protected mode, then long mode.
#include "layout.h"

#define TRAMPOLINE 0x8000 /* where smp.c copies it: the STARTUP vector is TRAMPOLINE >> 12 */
#define T(x) ((x) - ap_trampoline + TRAMPOLINE)

        .section .rodata.ap_trampoline, "a"
        .balign 16
        .globl ap_trampoline, ap_trampoline_end, ap_params
        .code16
// An AP starts here in real mode with CS = TRAMPOLINE >> 4, IP = 0 (SDM 8.4.4.1), as any OS's trampoline does.
ap_trampoline:
        cli
        cld
        xorw %ax, %ax
        movw %ax, %ds
        lgdtl T(tramp_gdt_pointer)
        movl %cr0, %eax
        orl $CR0_PE, %eax
        movl %eax, %cr0
        ljmpl $0x08, $T(ap_protected)

        .code32
ap_protected:
        movw $0x10, %ax
        movw %ax, %ds
        movw %ax, %es
        movw %ax, %ss
        movl %cr4, %eax
        orl $CR4_PAE, %eax
        movl %eax, %cr4
        movl T(ap_params), %eax          // the BSP's CR3
        movl %eax, %cr3
        movl $MSR_EFER, %ecx
        rdmsr
        orl T(ap_params + 8), %eax       // LME, and NXE where the BSP has it
        wrmsr
        movl %cr0, %eax
        orl $CR0_PG, %eax
        movl %eax, %cr0
        ljmpl $0x18, $T(ap_long)

        .code64
ap_long:
        lgdt T(ap_params + 32)           // the runtime's GDT
        movq T(ap_params + 16), %rsp     // this AP's stack
        pushq $KERNEL_CS
        pushq T(ap_params + 24)          // ap_entry, in the image
        lretq

        .balign 8
tramp_gdt:
        .quad 0
        .quad 0x00CF9B000000FFFF         // 0x08 code, 32-bit
        .quad 0x00CF93000000FFFF         // 0x10 data
        .quad 0x00AF9B000000FFFF         // 0x18 code, 64-bit
tramp_gdt_end:
tramp_gdt_pointer:
        .word tramp_gdt_end - tramp_gdt - 1
        .long T(tramp_gdt)

        .balign 8
// Filled in by smp.c: CR3 (+0), EFER bits (+8), stack top (+16), entry (+24), the runtime's GDT pointer (+32).
ap_params:
        .fill 48, 1, 0
ap_trampoline_end:

        .text
// The AP's first code in the image, on its stack with the runtime's GDT: the same CPU set-up as boot.S's common64.
        .globl ap_entry
ap_entry:
        movw $KERNEL_DS, %ax
        movw %ax, %ds
        movw %ax, %es
        movw %ax, %ss
        xorw %ax, %ax
        movw %ax, %fs
        movw %ax, %gs
        movq %cr0, %rax
        andq $~CR0_EM, %rax
        orq $(CR0_MP | CR0_NE | CR0_WP), %rax
        movq %rax, %cr0
        movq %cr4, %rax
        orq $(CR4_OSFXSR | CR4_OSXMMEXCPT), %rax
        movq %rax, %cr4
        fninit
        xorl %ebp, %ebp
        call smp_ap_started
1:      cli
        hlt
        jmp 1b
        .section .note.GNU-stack, "", @progbits
