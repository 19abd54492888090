/* Machine constants shared by the runtime's assembly and C: selectors, control-register and page-table bits. */
#pragma once

#define KERNEL_CS 0x08
#define KERNEL_DS 0x10
#define USER_CS32 0x18 /* SYSRET computes its selectors from this base (SDM: STAR[63:48]) */
#define USER_DS 0x20
#define USER_CS 0x28
#define TSS_SEL 0x30

#define CR0_PE (1 << 0)
#define CR0_MP (1 << 1)
#define CR0_EM (1 << 2)
#define CR0_TS (1 << 3)
#define CR0_NE (1 << 5)
#define CR0_WP (1 << 16)
#define CR0_PG (1 << 31)
#define CR4_PAE (1 << 5)
#define CR4_OSFXSR (1 << 9)
#define CR4_OSXMMEXCPT (1 << 10)

#define MSR_EFER 0xC0000080
#define EFER_SCE (1 << 0)
#define EFER_LME (1 << 8)
#define EFER_NXE (1 << 11)

#define PTE_P 0x1
#define PTE_W 0x2
#define PTE_U 0x4
#define PTE_PS 0x80

#define BOOT_STACK_SIZE 16384

/* Offset in struct frame of the interrupted CR0.TS, kept in FXSAVE bytes 464-511 which the CPU leaves to software. */
#define FRAME_CR0_TS 464
