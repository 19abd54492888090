/* The userspace ABI of the kvm-deja module variant (RDTSC/RDTSCP/RDRAND/RDSEED exits to userspace); C and C++, mirrored byte for byte by kvm-deja/patches. */
/*
 * Why a private header instead of <linux/kvm.h>: the module is built out of tree against the
 * distribution's unmodified uapi headers, so neither side may rely on new definitions there. The
 * kernel side (kvm-deja/patches/0001-*.patch adds arch/x86/kvm/kvm_deja_abi.h) carries an identical
 * copy; the CTest `kvm_deja.abi_mirror` fails when the two differ. This header is an interface
 * description, as uapi headers are (Linux-syscall-note), so deja may include it.
 *
 * Protocol (docs/kvm-deja.md):
 *  1. KVM_CHECK_EXTENSION(KVM_CAP_DEJA_EXITS) on /dev/kvm or a VM fd returns the KVM_DEJA_* mask of
 *     instructions this host can exit (hardware and module parameters allow); 0 on stock KVM, which
 *     does not know the number.
 *  2. KVM_ENABLE_CAP on the VM fd with cap = KVM_CAP_DEJA_EXITS, args[0] = the wanted mask (a subset
 *     of 1.), before the first KVM_CREATE_VCPU (EBUSY after: the intercepts are set when a vCPU is
 *     created). A VM that never enables it behaves exactly as on stock KVM.
 *  3. An enabled instruction executed by the guest makes KVM_RUN return with
 *     kvm_run->exit_reason == KVM_EXIT_DEJA and a struct kvm_deja_exit at the start of kvm_run's exit
 *     union (offsetof(struct kvm_run, padding), the place of `io`, `mmio`, `msr`). RIP still points at
 *     the instruction.
 *  4. Userspace fills `value` (and `flags`, `aux`) and calls KVM_RUN again (PAUSE: nothing to fill). Before entering the guest,
 *     KVM writes the result (RDTSC/RDTSCP: EDX:EAX = value, RDTSCP also ECX = (u32)aux;
 *     RDRAND/RDSEED: the destination register = CF ? value : 0 at the operand size, CF = flags & CF,
 *     OF SF ZF AF PF cleared) and advances RIP past the instruction (a guest single-step trap, if
 *     RFLAGS.TF was set, is delivered as for any emulated instruction).
 * Privilege checks the CPU makes before the intercept (CR4.TSD #GP at CPL > 0) stay in the CPU; an
 * instruction the guest's CPUID does not advertise (RDTSCP, RDRAND, RDSEED) raises #UD and never exits.
 */
#ifndef KVM_DEJA_ABI_H
#define KVM_DEJA_ABI_H

#include <linux/types.h>

/* Private numbers far above upstream's (which are small and dense), "DJ" in ASCII. */
#define KVM_CAP_DEJA_EXITS 0x444a0001
#define KVM_EXIT_DEJA 0x444a0001

/* Bits of the capability mask and values of kvm_deja_exit.insn. */
#define KVM_DEJA_RDTSC (1u << 0)
#define KVM_DEJA_RDTSCP (1u << 1)
#define KVM_DEJA_RDRAND (1u << 2)
#define KVM_DEJA_RDSEED (1u << 3)
/* PAUSE exits after it retired: RIP is past it, `value` holds its RIP, and there is nothing to answer. */
#define KVM_DEJA_PAUSE (1u << 4)
#define KVM_DEJA_ALL (KVM_DEJA_RDTSC | KVM_DEJA_RDTSCP | KVM_DEJA_RDRAND | KVM_DEJA_RDSEED | KVM_DEJA_PAUSE)

/* kvm_deja_exit.flags, set by userspace: RDRAND/RDSEED succeeded (the CF the guest sees). */
#define KVM_DEJA_FLAG_CF (1u << 0)
/* kvm_deja_exit.flags, set by the kernel for PAUSE: the host debugger single-steps the vCPU, and the step ended with
 * the PAUSE (KVM_EXIT_DEBUG is not reported separately). */
#define KVM_DEJA_FLAG_STEP (1u << 1)

struct kvm_deja_exit {
	__u32 insn;  /* kernel: one KVM_DEJA_* bit, the instruction that exited */
	__u32 flags; /* userspace: KVM_DEJA_FLAG_CF for RDRAND/RDSEED; kernel: KVM_DEJA_FLAG_STEP for PAUSE, else 0 */
	__u64 value; /* userspace: the TSC (RDTSC/RDTSCP) or the random value (RDRAND/RDSEED); kernel: PAUSE's RIP */
	__u64 aux;   /* RDTSCP: the kernel puts the guest's IA32_TSC_AUX as KVM holds it; ECX gets (u32)aux */
	__u8 reg;    /* kernel, RDRAND/RDSEED: destination GPR number (0 RAX, 1 RCX, ... 15 R15) */
	__u8 size;   /* kernel, RDRAND/RDSEED: operand size in bytes (2, 4 or 8) */
	__u8 pad[6];
};

#endif /* KVM_DEJA_ABI_H */
