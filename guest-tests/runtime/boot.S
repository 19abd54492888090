// Guest runtime entry: Multiboot v1 header, 32-bit entry that switches to long mode, 64-bit direct entry, GDT, page tables, interrupt stubs.
#include "layout.h"

#define MB_MAGIC 0x1BADB002
#define MB_FLAGS 0x00000003 /* page-align modules, give us memory info */

        .section .multiboot, "a"
        .balign 4
multiboot_header:
        .long MB_MAGIC
        .long MB_FLAGS
        .long -(MB_MAGIC + MB_FLAGS)

// ---------------------------------------------------------------------------
// 32-bit protected-mode entry (QEMU -kernel, GRUB): EAX = 0x2BADB002, EBX = info.
        .section .text.boot32, "ax"
        .code32
        .globl _start
_start:
        cli
        cld
        movl %eax, boot_magic
        movl %ebx, boot_info_phys
        movl $boot_stack_top, %esp
        lgdt gdt_pointer

        movl %cr4, %eax
        orl $CR4_PAE, %eax
        movl %eax, %cr4
        movl $boot_pml4, %eax
        movl %eax, %cr3

        // EFER.NXE only where the CPU has NX, or the WRMSR would #GP before we have an IDT.
        movl $0x80000000, %eax
        cpuid
        xorl %esi, %esi
        cmpl $0x80000001, %eax
        jb 1f
        movl $0x80000001, %eax
        cpuid
        btl $20, %edx
        jnc 1f
        movl $EFER_NXE, %esi
1:      movl $MSR_EFER, %ecx
        rdmsr
        orl $EFER_LME, %eax
        orl %esi, %eax
        wrmsr

        movl %cr0, %eax
        orl $(CR0_PG | CR0_PE), %eax
        movl %eax, %cr0
        ljmp $KERNEL_CS, $long_mode_from_32

        .code64
long_mode_from_32:
        movw $KERNEL_DS, %ax
        movw %ax, %ds
        movw %ax, %es
        movw %ax, %ss
        xorw %ax, %ax
        movw %ax, %fs
        movw %ax, %gs
        jmp common64

// ---------------------------------------------------------------------------
// 64-bit direct entry (deja's ELF64 loader): RIP here in long mode, low 4 GiB identity-mapped,
// RDI = Multiboot info physical address, RSI = 0x2BADB002. Everything the loader set up is
// replaced by our own GDT and page tables so the guest sees the same machine on every path.
        .section .text.boot64, "ax"
        .globl _start64
_start64:
        cli
        cld
        movq %rsi, boot_magic(%rip)
        movq %rdi, boot_info_phys(%rip)
        leaq boot_stack_top(%rip), %rsp
        lgdt gdt_pointer(%rip)
        pushq $KERNEL_CS
        leaq 1f(%rip), %rax
        pushq %rax
        lretq
1:      movw $KERNEL_DS, %ax
        movw %ax, %ds
        movw %ax, %es
        movw %ax, %ss
        xorw %ax, %ax
        movw %ax, %fs
        movw %ax, %gs
        movq %cr4, %rax
        orq $CR4_PAE, %rax
        movq %rax, %cr4
        leaq boot_pml4(%rip), %rax
        movq %rax, %cr3
        movl $0x80000000, %eax
        cpuid
        cmpl $0x80000001, %eax
        jb common64
        movl $0x80000001, %eax
        cpuid
        btl $20, %edx
        jnc common64
        movl $MSR_EFER, %ecx
        rdmsr
        orl $EFER_NXE, %eax
        wrmsr
        jmp common64

// ---------------------------------------------------------------------------
// Both entries meet here in long mode with our GDT, our page tables and the boot stack.
common64:
        // SSE: no emulation, monitor coprocessor; native x87 errors; supervisor honours read-only pages.
        movq %cr0, %rax
        andq $~CR0_EM, %rax
        orq $(CR0_MP | CR0_NE | CR0_WP), %rax
        movq %rax, %cr0
        movq %cr4, %rax
        orq $(CR4_OSFXSR | CR4_OSXMMEXCPT), %rax
        movq %rax, %cr4
        fninit
        // Zero .bss (the stack lives there but holds nothing yet); loaders should have, but a
        // runtime that depends on it would hide a loader bug as a guest-visible difference.
        leaq __bss_start(%rip), %rdi
        leaq _end(%rip), %rcx
        subq %rdi, %rcx
        xorl %eax, %eax
        rep stosb
        leaq boot_stack_top(%rip), %rsp
        xorl %ebp, %ebp
        call runtime_start
2:      cli
        hlt
        jmp 2b

// ---------------------------------------------------------------------------
// Interrupt stubs: one per vector, so a C dispatcher sees every vector with the same frame.
// Frame layout (low to high): fxsave area, r15..rax, vector, error code, CPU frame; see runtime.h.
        .section .text.isr, "ax"
        .balign 16
isr_common:
        pushq %rax
        pushq %rbx
        pushq %rcx
        pushq %rdx
        pushq %rsi
        pushq %rdi
        pushq %rbp
        pushq %r8
        pushq %r9
        pushq %r10
        pushq %r11
        pushq %r12
        pushq %r13
        pushq %r14
        pushq %r15
        // The CPU aligned RSP to 16 before its 5-qword frame; 5 + 2 + 15 qwords keeps it aligned,
        // as FXSAVE and the SysV call both require. Saving SSE here lets handlers be plain C.
        subq $512, %rsp
        // CR0.TS would make FXSAVE itself raise #NM, so the frame records TS, clears it for the
        // handler, and sets it again on the way out unless the handler cleared frame->cr0_ts.
        movq %cr0, %rax
        andq $CR0_TS, %rax
        clts
        fxsave (%rsp)
        movq %rax, FRAME_CR0_TS(%rsp)
        movq %rsp, %rdi
        cld
        call interrupt_dispatch
        // The dispatcher returns the frame to resume: the same one, or another thread's.
        movq %rax, %rdi
        // Falls through.

        .globl isr_resume_frame
// void isr_resume_frame(struct frame *f): start running a prepared frame (never returns).
isr_resume_frame:
        movq %rdi, %rsp
        fxrstor (%rsp)
        cmpq $0, FRAME_CR0_TS(%rsp)
        je 1f
        movq %cr0, %rax
        orq $CR0_TS, %rax
        movq %rax, %cr0
1:      addq $512, %rsp
        popq %r15
        popq %r14
        popq %r13
        popq %r12
        popq %r11
        popq %r10
        popq %r9
        popq %r8
        popq %rbp
        popq %rdi
        popq %rsi
        popq %rdx
        popq %rcx
        popq %rbx
        popq %rax
        addq $16, %rsp
        iretq

// Vectors whose exceptions push an error code (SDM vol. 3, table 6-1).
#define HAS_ERROR_CODE(v) ((v) == 8 || ((v) >= 10 && (v) <= 14) || (v) == 17 || (v) == 21 || (v) == 29 || (v) == 30)

        .balign 16
isr_stubs:
        .set vec, 0
        .rept 256
        .balign 16
        .if !HAS_ERROR_CODE(vec)
        pushq $0
        .endif
        pushq $vec
        jmp isr_common
        .set vec, vec + 1
        .endr

        .section .rodata.isr, "a"
        .balign 8
        .globl isr_stub_table
isr_stub_table:
        .set vec, 0
        .rept 256
        .quad isr_stubs + 16 * vec
        .set vec, vec + 1
        .endr

// ---------------------------------------------------------------------------
        .section .data.boot, "aw"
        .balign 8
        .globl boot_magic, boot_info_phys
boot_magic:     .quad 0
boot_info_phys: .quad 0

        .balign 16
        .globl gdt
// Accessed bits preset (type 0xB/0x3): the CPU never writes the table back, so the final RAM does
// not depend on which segment loads a CPU model marks (the SDM says all of them; QEMU's TCG, the
// CPU under the nested KVM harness, only MOV/POP Sreg, not IRET/far RET/JMP or event delivery).
gdt:
        .quad 0                         // 0x00 null
        .quad 0x00AF9B000000FFFF        // 0x08 kernel code, 64-bit
        .quad 0x00CF93000000FFFF        // 0x10 kernel data
        .quad 0x00CFFB000000FFFF        // 0x18 user code, 32-bit (SYSRET's STAR base)
        .quad 0x00CFF3000000FFFF        // 0x20 user data
        .quad 0x00AFFB000000FFFF        // 0x28 user code, 64-bit
        .quad 0, 0                      // 0x30 TSS (16 bytes, filled in by runtime.c)
gdt_end:
        .balign 8
        .globl gdt_pointer
gdt_pointer:
        .word gdt_end - gdt - 1
        .quad gdt

// Identity map of the first 4 GiB with 2 MiB pages, fully static so both entries just load CR3.
        .section .data.pagetables, "aw"
        .balign 4096
        .globl boot_pml4, boot_pdpt, boot_pd
boot_pml4:
        .quad boot_pdpt + PTE_P + PTE_W
        .fill 511, 8, 0
boot_pdpt:
        .quad boot_pd + 0x0000 + PTE_P + PTE_W
        .quad boot_pd + 0x1000 + PTE_P + PTE_W
        .quad boot_pd + 0x2000 + PTE_P + PTE_W
        .quad boot_pd + 0x3000 + PTE_P + PTE_W
        .fill 508, 8, 0
boot_pd:
        .set page, 0
        .rept 2048
        .quad (page << 21) + PTE_P + PTE_W + PTE_PS
        .set page, page + 1
        .endr

        .section .bss.stacks, "aw", @nobits
        .balign 16
        .globl boot_stack_top
        .skip BOOT_STACK_SIZE
boot_stack_top:
        .section .note.GNU-stack, "", @progbits
