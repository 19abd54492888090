// The KVM usability check's calibration guest: 64-bit CPL0 snippets, each ending in HLT with its answer in RAX.
//
// The blob between deja_usability_guest_begin and _end is copied into the probe VM's RAM at one address and
// entered at a snippet's offset; every snippet is position-independent and uses only the scratch page at
// 0x6000 (kvm/kvm_usability.cpp lays out the VM). Inputs come in RDI/RSI, the answer leaves in RAX.
        .section .rodata.deja_usability_guest, "a"
        .code64
        .p2align 4
        .globl deja_usability_guest_begin
deja_usability_guest_begin:

// Speed: RDI iterations of a two-instruction loop with one conditional branch.
        .globl deja_probe_loop
deja_probe_loop:
        mov %edi, %ecx
1:      dec %ecx
        jnz 1b
        hlt

// SSE: 1.0f + 1.0f = 2.0f (0x40000000).
        .globl deja_probe_sse
deja_probe_sse:
        mov $0x3f800000, %eax
        movd %eax, %xmm1
        addss %xmm1, %xmm1
        movd %xmm1, %eax
        hlt

// SSE2: PADDQ of 0x1234567812345678 with itself = 0x2468acf02468acf0.
        .globl deja_probe_sse2
deja_probe_sse2:
        movabs $0x1234567812345678, %rax
        movq %rax, %xmm0
        paddq %xmm0, %xmm0
        movq %xmm0, %rax
        hlt

// x87: 1 + 1 stored as an integer = 2.
        .globl deja_probe_fpu
deja_probe_fpu:
        fninit
        fld1
        fld1
        faddp
        fistpl 0x6000
        movl 0x6000, %eax
        hlt

// CMOV: 7.
        .globl deja_probe_cmov
deja_probe_cmov:
        xor %eax, %eax
        mov $7, %ecx
        test %ecx, %ecx
        cmovnz %ecx, %eax
        hlt

// CMPXCHG8B: the comparison succeeds and stores ECX:EBX = 0:9.
        .globl deja_probe_cx8
deja_probe_cx8:
        movq $5, 0x6000
        xor %edx, %edx
        mov $5, %eax
        xor %ecx, %ecx
        mov $9, %ebx
        cmpxchg8b 0x6000
        movq 0x6000, %rax
        hlt

// CMPXCHG16B: the same with RCX:RBX = 0:9 on a 16-byte-aligned operand.
        .globl deja_probe_cx16
deja_probe_cx16:
        movq $5, 0x6000
        movq $0, 0x6008
        xor %edx, %edx
        mov $5, %eax
        xor %ecx, %ecx
        mov $9, %ebx
        cmpxchg16b 0x6000
        movq 0x6000, %rax
        hlt

// POPCNT of 0xf0f0 = 8.
        .globl deja_probe_popcnt
deja_probe_popcnt:
        mov $0xf0f0, %eax
        popcnt %eax, %eax
        hlt

// LZCNT of 1 = 31 (BSR, which a host without LZCNT runs for the same bytes, gives 0).
        .globl deja_probe_lzcnt
deja_probe_lzcnt:
        mov $1, %eax
        lzcnt %eax, %eax
        hlt

// MOVBE: 0x11223344 byte-swapped = 0x44332211.
        .globl deja_probe_movbe
deja_probe_movbe:
        movl $0x11223344, 0x6000
        movbe 0x6000, %eax
        hlt

// FXSAVE/FXRSTOR round trip: 1.
        .globl deja_probe_fxsr
deja_probe_fxsr:
        fxsave 0x6000
        fxrstor 0x6000
        mov $1, %eax
        hlt

// SAHF/LAHF in 64-bit mode: AH = 0xd5 in, 0xd7 out (bit 1 reads as 1).
        .globl deja_probe_lahf
deja_probe_lahf:
        mov $0xd5, %ah
        sahf
        mov $0, %ah
        lahf
        movzbl %ah, %eax
        hlt

// CLFLUSH: 1.
        .globl deja_probe_clflush
deja_probe_clflush:
        clflush 0x6000
        mov $1, %eax
        hlt

// RDTSC executes (its value is not checked): 1.
        .globl deja_probe_tsc
deja_probe_tsc:
        rdtsc
        mov $1, %eax
        hlt

// MMX: PADDD of 5 and 4 in MM0: 9 (then EMMS, leaving the x87 as it was).
        .globl deja_probe_mmx
deja_probe_mmx:
        mov $5, %eax
        movd %eax, %mm0
        mov $4, %eax
        movd %eax, %mm1
        paddd %mm1, %mm0
        movd %mm0, %eax
        emms
        hlt

// SSE3: MOVSLDUP copies dword 0 into dword 1: 0x12345678.
        .globl deja_probe_sse3
deja_probe_sse3:
        mov $0x12345678, %eax
        movd %eax, %xmm0
        movsldup %xmm0, %xmm1
        psrldq $4, %xmm1
        movd %xmm1, %eax
        hlt

// SSSE3: PABSD of -5 = 5.
        .globl deja_probe_ssse3
deja_probe_ssse3:
        mov $-5, %eax
        movd %eax, %xmm0
        pabsd %xmm0, %xmm0
        movd %xmm0, %eax
        hlt

// SSE4.1: PINSRD then PEXTRD of dword 1: 7.
        .globl deja_probe_sse41
deja_probe_sse41:
        mov $7, %eax
        pinsrd $1, %eax, %xmm0
        pextrd $1, %xmm0, %eax
        hlt

// SSE4.2: CRC32C of the byte 'a' from 0 = 0x93ad1061.
        .globl deja_probe_sse42
deja_probe_sse42:
        xor %eax, %eax
        mov $0x61, %cl
        crc32b %cl, %eax
        hlt

// The x86-64-v3 snippets run with CR4.OSXSAVE set and XCR0 = x87 | SSE | AVX, as an OS leaves them.
// AVX: 1.0f broadcast to YMM0 and added to itself; the upper lane's first single: 2.0f (0x40000000).
        .globl deja_probe_avx
deja_probe_avx:
        movl $0x3f800000, 0x6000
        vbroadcastss 0x6000, %ymm0
        vaddps %ymm0, %ymm0, %ymm0
        vextractf128 $1, %ymm0, %xmm1
        vmovd %xmm1, %eax
        vzeroupper
        hlt

// AVX2: VPADDQ of 0x1234567812345678 broadcast to YMM0 with itself; the upper lane: 0x2468acf02468acf0.
        .globl deja_probe_avx2
deja_probe_avx2:
        movabs $0x1234567812345678, %rax
        vmovq %rax, %xmm0
        vpbroadcastq %xmm0, %ymm0
        vpaddq %ymm0, %ymm0, %ymm0
        vextracti128 $1, %ymm0, %xmm1
        vmovq %xmm1, %rax
        vzeroupper
        hlt

// FMA: 2.0 * 3.0 + 1.0 = 7 (VFMADD231SD), truncated to an integer.
        .globl deja_probe_fma
deja_probe_fma:
        mov $2, %eax
        vcvtsi2sd %eax, %xmm0, %xmm0
        mov $3, %eax
        vcvtsi2sd %eax, %xmm1, %xmm1
        mov $1, %eax
        vcvtsi2sd %eax, %xmm2, %xmm2
        vfmadd231sd %xmm1, %xmm0, %xmm2
        vcvttsd2si %xmm2, %eax
        hlt

// F16C: the half-precision 2.0 (0x4000) converted to single precision: 0x40000000.
        .globl deja_probe_f16c
deja_probe_f16c:
        mov $0x4000, %eax
        vmovd %eax, %xmm0
        vcvtph2ps %xmm0, %xmm1
        vmovd %xmm1, %eax
        hlt

// BMI1: ANDN of 0xf0 with 0xff = 0x0f.
        .globl deja_probe_bmi1
deja_probe_bmi1:
        mov $0xf0, %ecx
        mov $0xff, %edx
        andn %edx, %ecx, %eax
        hlt

// BMI2: PDEP deposits 0b1011 into the mask 0xf0: 0xb0.
        .globl deja_probe_bmi2
deja_probe_bmi2:
        mov $0xb, %edx
        mov $0xf0, %ecx
        pdep %ecx, %edx, %eax
        hlt

// XSAVE: XGETBV reads XCR0 (7); XSAVE and XSAVEOPT store YMM0 = 4 x 0x1122334455667788 at 0x6000 (header zeroed
// first), VXORPS clears it, XRSTOR brings it back. RAX = YMM0's upper quadword XOR XCR0 = 0x112233445566778f.
        .globl deja_probe_xsave
deja_probe_xsave:
        xor %ecx, %ecx
        xgetbv
        mov %rax, %r8
        movabs $0x1122334455667788, %rax
        mov %rax, 0x6800
        vbroadcastsd 0x6800, %ymm0
        xor %eax, %eax
        mov $0x6200, %edi
        mov $8, %ecx
        rep stosq
        mov $7, %eax
        xor %edx, %edx
        xsave 0x6000
        xsaveopt 0x6000
        vxorps %ymm0, %ymm0, %ymm0
        xrstor 0x6000
        vextractf128 $1, %ymm0, %xmm1
        vmovq %xmm1, %rax
        xor %r8, %rax
        vzeroupper
        hlt

// XSETBV in the guest: entered with XCR0 = x87 alone, it enables the SSE and AVX state, leaves the guest (CPUID exits
// to KVM) and runs deja_probe_avx's sum: 2.0f. A KVM that never saw the XSETBV restores its own XCR0 = 1 on the
// way back in, and the AVX instruction raises #UD.
        .globl deja_probe_xsetbv
deja_probe_xsetbv:
        xor %ecx, %ecx
        mov $7, %eax
        xor %edx, %edx
        xsetbv
        xor %eax, %eax
        cpuid
        jmp deja_probe_avx

// CPUID of leaf RDI, sub-leaf RSI: the answer stays in EAX, EBX, ECX, EDX.
        .globl deja_probe_cpuid
deja_probe_cpuid:
        mov %edi, %eax
        mov %esi, %ecx
        cpuid
        hlt

// Single-step: three one-byte instructions, each a step.
        .globl deja_probe_step
deja_probe_step:
        nop
        nop
        nop
        hlt

// Single-step at CPL3 (user code): three steps, then SYSCALL to deja_probe_halt (LSTAR) at CPL0.
        .globl deja_probe_user_step
deja_probe_user_step:
        nop
        nop
        nop
        syscall

        .globl deja_probe_halt
deja_probe_halt:
        hlt

// Exception stubs, one per vector 0-31, 8 bytes each (the IDT points at them): report the vector on port
// 0xe0 and halt, so a feature the host does not implement is named as "#UD" rather than as a triple fault.
        .p2align 3
        .globl deja_probe_vectors
deja_probe_vectors:
        .irp vector, 0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31
        mov $\vector, %eax
        out %eax, $0xe0
        hlt
        .endr

// Interrupt window: entered with IF clear; the window opens after STI and the one instruction of its shadow.
        .globl deja_probe_window
deja_probe_window:
        sti
        .fill 4096, 1, 0x90
        hlt

// Descriptor accessed bit: IRETQ to the code selector in RSI, whose descriptor's accessed bit is clear, then
// read its access byte (RDI points at it) into EAX: bit 0 set as the SDM says, or left clear (QEMU's TCG).
        .globl deja_probe_accessed
deja_probe_accessed:
        mov %rsp, %rax
        push $0x10
        push %rax
        pushfq
        push %rsi
        lea 1f(%rip), %rax
        push %rax
        iretq
1:      movzbl (%rdi), %eax
        hlt

// FXSAVE's image: RDI points at 512 bytes the VMM filled with 0xaa; FLD1 (FOP 0x1e8) is the last x87
// instruction before FXSAVE64. The VMM reads FOP, FIP, FDP and the reserved bytes of ST0's slot back.
        .globl deja_probe_fxsave
deja_probe_fxsave:
        fninit
        fld1
        fxsave64 (%rdi)
        hlt

// FNSTENV's 28-byte environment: RDI points at bytes the VMM filled with 0xaa; FLD1 is the last x87 instruction.
// The VMM reads the reserved upper half of the control word and FIP back.
        .globl deja_probe_fnstenv
deja_probe_fnstenv:
        fninit
        fld1
        fnstenv (%rdi)
        hlt

        .globl deja_usability_guest_end
deja_usability_guest_end:
        .section .note.GNU-stack, "", @progbits
