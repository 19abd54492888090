// The architectural state of one vCPU, in one backend-neutral form (used for digests, diagnostics, checkpoints).
#pragma once

#include <array>
#include <cstdint>
#include <string>

namespace deja {

enum Gpr : int {
  kRax, kRcx, kRdx, kRbx, kRsp, kRbp, kRsi, kRdi,
  kR8, kR9, kR10, kR11, kR12, kR13, kR14, kR15,
  kGprCount
};

// A loaded segment register, hidden part included (as KVM's kvm_segment holds it).
struct SegmentReg {
  uint64_t base = 0;
  uint32_t limit = 0;
  uint16_t selector = 0;
  uint8_t type = 0;  // descriptor type field (4 bits)
  uint8_t dpl = 0;
  bool present = false;
  bool s = false;    // code/data (1) or system (0)
  bool db = false;   // default operation size (32-bit)
  bool l = false;    // 64-bit code segment
  bool g = false;    // limit granularity 4K
  bool avl = false;
  bool unusable = false;
  bool operator==(const SegmentReg&) const = default;
};

struct TableReg {
  uint64_t base = 0;
  uint16_t limit = 0;
  bool operator==(const TableReg&) const = default;
};

// Architectural MSRs whose state lives in the CPU (both backends save and restore these).
struct MsrState {
  uint64_t star = 0, lstar = 0, cstar = 0, sfmask = 0, kernel_gs_base = 0;
  uint64_t sysenter_cs = 0, sysenter_esp = 0, sysenter_eip = 0;
  uint64_t pat = 0x0007040600070406ull;
  uint64_t tsc_aux = 0;
  bool operator==(const MsrState&) const = default;
};

struct CpuState {
  std::array<uint64_t, kGprCount> gpr{};
  uint64_t rip = 0;
  uint64_t rflags = 0x2;

  SegmentReg cs, ds, es, fs, gs, ss, tr, ldt;
  TableReg gdt, idt;
  uint64_t cr0 = 0, cr2 = 0, cr3 = 0, cr4 = 0, cr8 = 0;
  uint64_t efer = 0;
  uint64_t xcr0 = 1;  // XSETBV's XCR0 (xcr0:: bits); 1 (x87 only) is its reset value
  MsrState msrs;

  // x87/SSE state in FXSAVE layout (512 bytes): FCW, FSW, ..., MXCSR, ST0-7, XMM0-15.
  std::array<uint8_t, 512> fxsave{};
  // The upper halves (bits 128-255) of YMM0-15: XSAVE state component 2 (AVX), in its XSAVE layout (16 bytes a
  // register). The lower halves are the XMM registers in `fxsave`.
  std::array<uint8_t, 256> ymmh{};
  // XINUSE (SDM Vol. 1, 13.6): the xcr0:: components that may be out of their initial configuration, as the
  // software CPU tracks them (docs/cpu-models.md, "XINUSE"): what XSAVE writes into XSTATE_BV. After reset x87 and
  // SSE, as a KVM vCPU has it after deja loads its reset state.
  uint64_t xinuse = 0x3;

  // Interrupt shadow (STI / MOV SS) in effect for the next instruction.
  bool interrupt_shadow = false;
  bool halted = false;

  bool operator==(const CpuState&) const = default;
};

// RFLAGS bits.
namespace rflags {
constexpr uint64_t kCf = 1u << 0, kPf = 1u << 2, kAf = 1u << 4, kZf = 1u << 6, kSf = 1u << 7, kTf = 1u << 8,
                   kIf = 1u << 9, kDf = 1u << 10, kOf = 1u << 11, kIopl = 3u << 12, kNt = 1u << 14, kRf = 1u << 16,
                   kVm = 1u << 17, kAc = 1u << 18, kVif = 1u << 19, kVip = 1u << 20, kId = 1u << 21;
}

namespace cr0 {
constexpr uint64_t kPe = 1u << 0, kMp = 1u << 1, kEm = 1u << 2, kTs = 1u << 3, kEt = 1u << 4, kNe = 1u << 5,
                   kWp = 1u << 16, kAm = 1u << 18, kNw = 1u << 29, kCd = 1u << 30, kPg = 1u << 31;
}
namespace cr4 {
constexpr uint64_t kPse = 1u << 4, kPae = 1u << 5, kPge = 1u << 7, kOsfxsr = 1u << 9, kOsxmmexcpt = 1u << 10,
                   kFsgsbase = 1u << 16, kOsxsave = 1u << 18;
}
namespace xcr0 {
constexpr uint64_t kX87 = 1u << 0, kSse = 1u << 1, kAvx = 1u << 2;
}
namespace efer {
constexpr uint64_t kSce = 1u << 0, kLme = 1u << 8, kLma = 1u << 10, kNxe = 1u << 11;
}

// Human-readable register dump for diagnostics (triple fault, failed entry, divergence reports).
std::string format_cpu_state(const CpuState& state);

// A processor after INIT (Intel SDM vol. 3, table 9-1, "Following INIT"; x87 and SSE as at power-up): real
// mode at F000:FFF0, EDX = the CPUID.1 signature `signature`.
CpuState cpu_state_after_init(uint32_t signature);
// An application processor started by a STARTUP message with `vector` (SDM 8.4.4.1, 10.6.1): as after INIT,
// in real mode at CS = vector << 8, IP = 0.
CpuState cpu_state_at_startup(uint8_t vector, uint32_t signature);

}  // namespace deja
