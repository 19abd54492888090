// Test shim that boots an ELF64 guest the way deja's direct loader does, so QEMU can exercise _start64.
//
// QEMU loads this Multiboot image with -kernel and the guest's segments with
// `-device loader,file=GUEST.elf`, plus a raw copy of the guest file at GUEST_FILE_COPY
// (`-device loader,file=GUEST.elf,addr=0x2000000,force-raw=on`) from which the entry point is read.
// The shim then applies deja's protocol: long mode, low 4 GiB identity-mapped, flat CS/DS/SS,
// RSP valid, RDI = Multiboot info, RSI = 0x2BADB002, jump to e_entry.

#define MB_MAGIC 0x1BADB002
#define MB_FLAGS 0x00000003
#define GUEST_FILE_COPY 0x2000000
#define ELF64_ENTRY_OFFSET 24

        .section .multiboot, "a"
        .balign 4
        .long MB_MAGIC, MB_FLAGS, -(MB_MAGIC + MB_FLAGS)

        .text
        .code32
        .globl _start
_start:
        cli
        movl %ebx, info_pointer
        movl $stack_top, %esp
        // Identity map 4 GiB with 2 MiB pages, built here so the shim shares nothing with the runtime.
        movl $pdpt, %eax
        orl $3, %eax
        movl %eax, pml4
        xorl %ecx, %ecx
1:      movl %ecx, %eax
        shll $12, %eax
        addl $pd, %eax
        orl $3, %eax
        movl %eax, pdpt(, %ecx, 8)
        incl %ecx
        cmpl $4, %ecx
        jb 1b
        xorl %ecx, %ecx
2:      movl %ecx, %eax
        shll $21, %eax
        orl $0x83, %eax
        movl %eax, pd(, %ecx, 8)
        incl %ecx
        cmpl $2048, %ecx
        jb 2b
        lgdt gdt_pointer
        movl %cr4, %eax
        orl $0x20, %eax                 // PAE
        movl %eax, %cr4
        movl $pml4, %eax
        movl %eax, %cr3
        movl $0xC0000080, %ecx
        rdmsr
        orl $0x100, %eax                // EFER.LME
        wrmsr
        movl %cr0, %eax
        orl $0x80000001, %eax
        movl %eax, %cr0
        ljmp $0x08, $long_mode

        .code64
long_mode:
        movw $0x10, %ax
        movw %ax, %ds
        movw %ax, %es
        movw %ax, %ss
        movl info_pointer(%rip), %edi
        movl $0x2BADB002, %esi
        movq GUEST_FILE_COPY + ELF64_ENTRY_OFFSET, %rax
        // Poison what the protocol leaves undefined, so the guest cannot depend on it.
        movq $0xdeadbeefdeadbeef, %rbx
        movq %rbx, %rcx
        movq %rbx, %rdx
        movq %rbx, %rbp
        jmp *%rax

        .data
        .balign 8
gdt:
        .quad 0
        .quad 0x00AF9A000000FFFF        // 64-bit code
        .quad 0x00CF92000000FFFF        // data
gdt_end:
gdt_pointer:
        .word gdt_end - gdt - 1
        .quad gdt
info_pointer:
        .long 0

        .bss
        .balign 4096
pml4:   .skip 4096
pdpt:   .skip 4096
pd:     .skip 4 * 4096
        .skip 4096
stack_top:

        .section .note.GNU-stack, "", @progbits
