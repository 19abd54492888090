// The software CPU's JIT: translated blocks compiled to host code (docs/interp.md, "The fast path").
//
// A block's code calls each operation's handler in turn (the guarded version, which cannot throw),
// with the operation's address as an immediate: no dispatch, every call predicted. Host register use:
// RBX holds the InterpBackend; everything else is scratch between operations.
#include "interp/jit.h"

#include <cpuid.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <Zydis/Zydis.h>

#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <vector>

#include <fmt/format.h>

#include "interp/avx.h"
#include "interp/interp_backend.h"
#include "interp/simd_ops.h"
#include "interp/x64_asm.h"

namespace deja {

namespace interp {

JitBuffer::JitBuffer(size_t bytes) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE | PROT_EXEC, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p != MAP_FAILED) {
    base_ = static_cast<uint8_t*>(p);
    capacity_ = bytes;
    // Huge pages where the host allows them: the buffer fills at tens of MB a second while a guest boots,
    // and a host page fault per 4 KiB of fresh code costs more than compiling into it.
    (void)madvise(p, bytes, MADV_HUGEPAGE);
  }
  if (std::getenv("DEJA_PERF_MAP")) {
    const std::string path = fmt::format("/tmp/perf-{}.map", getpid());
    // Never through a symbolic link: anyone can make one in /tmp.
    perf_map_ = open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0644);
  }
}

JitBuffer::~JitBuffer() {
  if (base_) munmap(base_, capacity_);
  if (perf_map_ >= 0) close(perf_map_);
}

void* JitBuffer::add(std::span<const uint8_t> code) {
  const size_t start = (used_ + 15) & ~size_t{15};
  if (!base_ || start + code.size() > capacity_) return nullptr;
  std::memcpy(base_ + start, code.data(), code.size());
  used_ = start + code.size();
  return base_ + start;
}

void JitBuffer::note_for_perf(const void* start, size_t size, uint64_t guest_rip) {
  if (perf_map_ < 0) return;
  const std::string line = fmt::format("{:x} {:x} deja-block-{:x}\n", reinterpret_cast<uintptr_t>(start), size, guest_rip);
  (void)!write(perf_map_, line.data(), line.size());
}

}  // namespace interp

using interp::Block;
using interp::DecodedInsn;
using interp::Op;
namespace x64 = interp::x64;

namespace {
// Displacement of a member from the object's start, computed at run time (InterpBackend is not
// standard-layout, so offsetof does not apply).
template <typename T>
int32_t member_offset(const InterpBackend* self, const T* member) {
  return int32_t(reinterpret_cast<const char*>(member) - reinterpret_cast<const char*>(self));
}
}  // namespace

// The block compiler. Operations with a template are emitted inline: their fast path (guest registers
// in memory, RAM through the software TLB's fast tags, lazy flags) checks everything it relies on
// before it changes any state, and jumps to an out-of-line call of the operation's handler otherwise,
// which then does the whole instruction. Every other operation is a call of its handler.
struct InterpBackend::Jit {
  using Reg = x64::Reg;
  static constexpr Reg rax = x64::rax, rcx = x64::rcx, rdx = x64::rdx, rbx = x64::rbx, rsi = x64::rsi,
                       rdi = x64::rdi, r8 = x64::r8, r9 = x64::r9;

  // What an operation's inline code is, if it has one.
  enum class Form : uint8_t {
    kCall,       // the handler
    kMov,        // MOV r/m, r/m/imm
    kExtend,     // MOVZX/MOVSX/MOVSXD r, r/m
    kLea,
    kAlu,        // ADD/OR/AND/SUB/XOR/CMP/TEST
    kIncDec,
    kNegNot,
    kShift,      // SHL/SHR/SAR r/m, imm (32/64-bit)
    kShiftCl,    // SHL/SHR/SAR r/m, CL (32/64-bit)
    kBswap,      // BSWAP r32/r64
    kSignExtendAcc,  // CDQE, CQO
    kTransfer,   // JMP m64, CALL r/m64: the handler, then on to the next block
    kRotate,     // ROL/ROR r, imm (32/64-bit)
    kBitTest,    // BT/BTS/BTR/BTC r, r/imm or m, imm
    kImul,       // IMUL r, r/m[, imm] (32/64-bit)
    kCmov,       // CMOVcc r, r/m
    kSetcc,      // SETcc r/m8
    kPush,       // PUSH r64/imm (64-bit mode)
    kPop,        // POP r64
    kJcc,
    kJmp,        // JMP rel
    kJmpReg,     // JMP r64
    kCallRel,    // CALL rel
    kRet,        // RET [imm16]
    kNop,
    kSse,        // SSE moves, bitwise and packed-integer operations (sse_template)
    kMmx,        // MMX moves, bitwise and packed-integer operations (mmx_template)
    kVex,        // AVX/AVX2 moves, packed-integer and bitwise operations, VZEROUPPER (vex_template)
    kBmi,        // BMI1/BMI2, TZCNT and LZCNT whose flags nothing reads (bmi_template)
    kFallThrough,  // the synthetic block end
  };
  // The SSE instructions with a template: what they are, and the host instruction that does a binary
  // one (the same legacy encoding on XMM0 and XMM1: these are exact integer and bitwise operations).
  struct SseTemplate {
    enum Kind : uint8_t { kNone, kMove, kBinary, kPmovmskb, kMovq, kMovLow } kind = kNone;
    uint8_t prefix = 0, opcode = 0;
    bool aligned = false;  // a 16-byte memory operand must be 16-byte aligned (#GP otherwise)
    unsigned low = 8;      // kMovLow: MOVSD 8 bytes, MOVSS 4
    uint8_t map = 0;       // kBinary: 0 for 0F opcodes, 0x38 or 0x3A for 0F 38 / 0F 3A ones
    enum Extension : uint8_t { kSse2, kSsse3, kSse41, kSse42 } extension = kSse2;  // the CPU model must have it
  };
  // What the host can run of SSSE3 and SSE4 (a template needs the host instruction; the handlers do not).
  static bool host_ssse3() {
    static const bool has = __builtin_cpu_supports("ssse3");
    return has;
  }
  static bool host_sse41() {
    static const bool has = __builtin_cpu_supports("sse4.1");
    return has;
  }
  static bool host_sse42() {
    static const bool has = __builtin_cpu_supports("sse4.2");
    return has;
  }
  static SseTemplate sse_template(const DecodedInsn& i) {
    using T = SseTemplate;
    const interp::Operand &o0 = i.op[0], &o1 = i.op[1];
    const bool x0 = o0.kind == interp::OpKind::kXmm, x1 = o1.kind == interp::OpKind::kXmm;
    if (!(x0 || x1) || i.opcode_map == ZYDIS_OPCODE_MAP_DEFAULT || (x0 && o0.reg >= 16) || (x1 && o1.reg >= 16)) return {};
    if (i.operand_count >= 2 && o1.kind == interp::OpKind::kMmx) return {};
    const bool m0 = o0.kind == interp::OpKind::kMem, m1 = o1.kind == interp::OpKind::kMem;
    // A binary operation run as the host's instruction of the same encoding on XMM0 and XMM1; `with_imm`: it
    // takes the guest instruction's imm8.
    auto binary = [&](uint8_t prefix, uint8_t opcode, uint8_t map = 0, bool with_imm = false,
                      T::Extension extension = T::kSse2) {
      const bool host = extension == T::kSse2 || (extension == T::kSsse3 && host_ssse3()) ||
                        (extension == T::kSse41 && host_sse41()) || (extension == T::kSse42 && host_sse42());
      const bool ok = host && x0 && (x1 || (m1 && o1.size == 16)) && i.operand_count == (with_imm ? 3 : 2) &&
                      (!with_imm || i.op[2].kind == interp::OpKind::kImm);
      T t{T::kBinary, prefix, opcode, true};
      t.map = map;
      t.extension = extension;
      return ok ? t : T{};
    };
    auto ssse3 = [&](uint8_t opcode) { return binary(0x66, opcode, 0x38, false, T::kSsse3); };
    auto sse41 = [&](uint8_t opcode) { return binary(0x66, opcode, 0x38, false, T::kSse41); };
    switch (ZydisMnemonic(i.mnemonic)) {
      case ZYDIS_MNEMONIC_MOVAPS: case ZYDIS_MNEMONIC_MOVAPD: case ZYDIS_MNEMONIC_MOVDQA:
      case ZYDIS_MNEMONIC_MOVNTDQ: case ZYDIS_MNEMONIC_MOVNTPS: case ZYDIS_MNEMONIC_MOVNTPD:
      case ZYDIS_MNEMONIC_MOVUPS: case ZYDIS_MNEMONIC_MOVUPD: case ZYDIS_MNEMONIC_MOVDQU: {
        const bool aligned = i.mnemonic != ZYDIS_MNEMONIC_MOVUPS && i.mnemonic != ZYDIS_MNEMONIC_MOVUPD &&
                             i.mnemonic != ZYDIS_MNEMONIC_MOVDQU;
        if ((x0 && x1) || (x0 && m1 && o1.size == 16) || (m0 && x1 && o0.size == 16)) return T{T::kMove, 0, 0, aligned};
        return {};
      }
      case ZYDIS_MNEMONIC_MOVD: case ZYDIS_MNEMONIC_MOVQ: {
        const unsigned w = x0 ? (x1 ? 8 : o1.size) : o0.size;
        if ((w == 4 || w == 8) && (x0 ? (x1 || is_reg(o1) || m1) : (x1 && (is_reg(o0) || m0)))) return T{T::kMovq};
        return {};
      }
      case ZYDIS_MNEMONIC_MOVSD: case ZYDIS_MNEMONIC_MOVSS: {
        const unsigned w = i.mnemonic == ZYDIS_MNEMONIC_MOVSD ? 8 : 4;
        if ((x0 && x1) || (x0 && m1 && o1.size == w) || (m0 && x1 && o0.size == w)) return T{T::kMovLow, 0, 0, false, w};
        return {};
      }
      case ZYDIS_MNEMONIC_PMOVMSKB:
        return o0.kind == interp::OpKind::kGpr && x1 ? T{T::kPmovmskb} : T{};
      case ZYDIS_MNEMONIC_PXOR: return binary(0x66, 0xef);
      case ZYDIS_MNEMONIC_POR: return binary(0x66, 0xeb);
      case ZYDIS_MNEMONIC_PAND: return binary(0x66, 0xdb);
      case ZYDIS_MNEMONIC_PANDN: return binary(0x66, 0xdf);
      case ZYDIS_MNEMONIC_XORPS: return binary(0, 0x57);
      case ZYDIS_MNEMONIC_XORPD: return binary(0x66, 0x57);
      case ZYDIS_MNEMONIC_ANDPS: return binary(0, 0x54);
      case ZYDIS_MNEMONIC_ANDPD: return binary(0x66, 0x54);
      case ZYDIS_MNEMONIC_ANDNPS: return binary(0, 0x55);
      case ZYDIS_MNEMONIC_ANDNPD: return binary(0x66, 0x55);
      case ZYDIS_MNEMONIC_ORPS: return binary(0, 0x56);
      case ZYDIS_MNEMONIC_ORPD: return binary(0x66, 0x56);
      case ZYDIS_MNEMONIC_PADDB: return binary(0x66, 0xfc);
      case ZYDIS_MNEMONIC_PADDW: return binary(0x66, 0xfd);
      case ZYDIS_MNEMONIC_PADDD: return binary(0x66, 0xfe);
      case ZYDIS_MNEMONIC_PADDQ: return binary(0x66, 0xd4);
      case ZYDIS_MNEMONIC_PSUBB: return binary(0x66, 0xf8);
      case ZYDIS_MNEMONIC_PSUBW: return binary(0x66, 0xf9);
      case ZYDIS_MNEMONIC_PSUBD: return binary(0x66, 0xfa);
      case ZYDIS_MNEMONIC_PSUBQ: return binary(0x66, 0xfb);
      case ZYDIS_MNEMONIC_PSUBUSB: return binary(0x66, 0xd8);
      case ZYDIS_MNEMONIC_PSUBUSW: return binary(0x66, 0xd9);
      case ZYDIS_MNEMONIC_PADDUSB: return binary(0x66, 0xdc);
      case ZYDIS_MNEMONIC_PADDUSW: return binary(0x66, 0xdd);
      case ZYDIS_MNEMONIC_PCMPEQB: return binary(0x66, 0x74);
      case ZYDIS_MNEMONIC_PCMPEQW: return binary(0x66, 0x75);
      case ZYDIS_MNEMONIC_PCMPEQD: return binary(0x66, 0x76);
      case ZYDIS_MNEMONIC_PCMPGTB: return binary(0x66, 0x64);
      case ZYDIS_MNEMONIC_PCMPGTW: return binary(0x66, 0x65);
      case ZYDIS_MNEMONIC_PCMPGTD: return binary(0x66, 0x66);
      case ZYDIS_MNEMONIC_PMINUB: return binary(0x66, 0xda);
      case ZYDIS_MNEMONIC_PMAXUB: return binary(0x66, 0xde);
      case ZYDIS_MNEMONIC_PUNPCKLBW: return binary(0x66, 0x60);
      case ZYDIS_MNEMONIC_PUNPCKLWD: return binary(0x66, 0x61);
      case ZYDIS_MNEMONIC_PUNPCKLDQ: return binary(0x66, 0x62);
      case ZYDIS_MNEMONIC_PUNPCKLQDQ: return binary(0x66, 0x6c);
      case ZYDIS_MNEMONIC_PUNPCKHBW: return binary(0x66, 0x68);
      case ZYDIS_MNEMONIC_PUNPCKHWD: return binary(0x66, 0x69);
      case ZYDIS_MNEMONIC_PUNPCKHDQ: return binary(0x66, 0x6a);
      case ZYDIS_MNEMONIC_PUNPCKHQDQ: return binary(0x66, 0x6d);
      case ZYDIS_MNEMONIC_PSHUFD: return binary(0x66, 0x70, 0, true);
      case ZYDIS_MNEMONIC_PSHUFLW: return binary(0xf2, 0x70, 0, true);
      case ZYDIS_MNEMONIC_PSHUFHW: return binary(0xf3, 0x70, 0, true);
      case ZYDIS_MNEMONIC_PADDSB: return binary(0x66, 0xec);
      case ZYDIS_MNEMONIC_PADDSW: return binary(0x66, 0xed);
      case ZYDIS_MNEMONIC_PSUBSB: return binary(0x66, 0xe8);
      case ZYDIS_MNEMONIC_PSUBSW: return binary(0x66, 0xe9);
      case ZYDIS_MNEMONIC_PMULLW: return binary(0x66, 0xd5);
      case ZYDIS_MNEMONIC_PMULHW: return binary(0x66, 0xe5);
      case ZYDIS_MNEMONIC_PMULHUW: return binary(0x66, 0xe4);
      case ZYDIS_MNEMONIC_PMULUDQ: return binary(0x66, 0xf4);
      case ZYDIS_MNEMONIC_PMADDWD: return binary(0x66, 0xf5);
      case ZYDIS_MNEMONIC_PAVGB: return binary(0x66, 0xe0);
      case ZYDIS_MNEMONIC_PAVGW: return binary(0x66, 0xe3);
      case ZYDIS_MNEMONIC_PSADBW: return binary(0x66, 0xf6);
      case ZYDIS_MNEMONIC_PMINSW: return binary(0x66, 0xea);
      case ZYDIS_MNEMONIC_PMAXSW: return binary(0x66, 0xee);
      case ZYDIS_MNEMONIC_PACKSSWB: return binary(0x66, 0x63);
      case ZYDIS_MNEMONIC_PACKUSWB: return binary(0x66, 0x67);
      case ZYDIS_MNEMONIC_PACKSSDW: return binary(0x66, 0x6b);
      // SSSE3 and SSE4's packed-integer operations (glibc's string functions: PSHUFB, PALIGNR, PMINUB, ...).
      case ZYDIS_MNEMONIC_PSHUFB: return ssse3(0x00);
      case ZYDIS_MNEMONIC_PHADDW: return ssse3(0x01);
      case ZYDIS_MNEMONIC_PHADDD: return ssse3(0x02);
      case ZYDIS_MNEMONIC_PHADDSW: return ssse3(0x03);
      case ZYDIS_MNEMONIC_PMADDUBSW: return ssse3(0x04);
      case ZYDIS_MNEMONIC_PHSUBW: return ssse3(0x05);
      case ZYDIS_MNEMONIC_PHSUBD: return ssse3(0x06);
      case ZYDIS_MNEMONIC_PHSUBSW: return ssse3(0x07);
      case ZYDIS_MNEMONIC_PSIGNB: return ssse3(0x08);
      case ZYDIS_MNEMONIC_PSIGNW: return ssse3(0x09);
      case ZYDIS_MNEMONIC_PSIGND: return ssse3(0x0a);
      case ZYDIS_MNEMONIC_PMULHRSW: return ssse3(0x0b);
      case ZYDIS_MNEMONIC_PABSB: return ssse3(0x1c);
      case ZYDIS_MNEMONIC_PABSW: return ssse3(0x1d);
      case ZYDIS_MNEMONIC_PABSD: return ssse3(0x1e);
      case ZYDIS_MNEMONIC_PALIGNR: return binary(0x66, 0x0f, 0x3a, true, T::kSsse3);
      case ZYDIS_MNEMONIC_PMULDQ: return sse41(0x28);
      case ZYDIS_MNEMONIC_PCMPEQQ: return sse41(0x29);
      case ZYDIS_MNEMONIC_PACKUSDW: return sse41(0x2b);
      case ZYDIS_MNEMONIC_PMINSB: return sse41(0x38);
      case ZYDIS_MNEMONIC_PMINSD: return sse41(0x39);
      case ZYDIS_MNEMONIC_PMINUW: return sse41(0x3a);
      case ZYDIS_MNEMONIC_PMINUD: return sse41(0x3b);
      case ZYDIS_MNEMONIC_PMAXSB: return sse41(0x3c);
      case ZYDIS_MNEMONIC_PMAXSD: return sse41(0x3d);
      case ZYDIS_MNEMONIC_PMAXUW: return sse41(0x3e);
      case ZYDIS_MNEMONIC_PMAXUD: return sse41(0x3f);
      case ZYDIS_MNEMONIC_PMULLD: return sse41(0x40);
      case ZYDIS_MNEMONIC_PHMINPOSUW: return sse41(0x41);
      case ZYDIS_MNEMONIC_BLENDPS: return binary(0x66, 0x0c, 0x3a, true, T::kSse41);
      case ZYDIS_MNEMONIC_BLENDPD: return binary(0x66, 0x0d, 0x3a, true, T::kSse41);
      case ZYDIS_MNEMONIC_PBLENDW: return binary(0x66, 0x0e, 0x3a, true, T::kSse41);
      case ZYDIS_MNEMONIC_MPSADBW: return binary(0x66, 0x42, 0x3a, true, T::kSse41);
      case ZYDIS_MNEMONIC_PCMPGTQ: return binary(0x66, 0x37, 0x38, false, T::kSse42);
      default: return {};
    }
  }
  // The MMX instructions with a template. MMX registers live in s_.fxsave's x87 slots; the operation runs as
  // the SSE2 instruction of the same opcode on the low quadwords of XMM0/XMM1 (the host's own MMX registers
  // would disturb its x87), which is the MMX result for the operations listed.
  struct MmxTemplate {
    enum Kind : uint8_t { kNone, kLoad, kStore, kBinary, kShiftImm } kind = kNone;
    unsigned bytes = 8;  // kLoad, kStore: 4 (MOVD) or 8
  };
  static MmxTemplate mmx_template(const DecodedInsn& i) {
    using T = MmxTemplate;
    const interp::Operand &o0 = i.op[0], &o1 = i.op[1];
    const bool mm0 = o0.kind == interp::OpKind::kMmx, mm1 = o1.kind == interp::OpKind::kMmx;
    if (i.operand_count != 2 || !(mm0 || mm1) || i.opcode_map != ZYDIS_OPCODE_MAP_0F) return {};
    switch (ZydisMnemonic(i.mnemonic)) {
      case ZYDIS_MNEMONIC_MOVD: case ZYDIS_MNEMONIC_MOVQ: case ZYDIS_MNEMONIC_MOVNTQ:
        if (mm0 && (mm1 || is_reg(o1) || is_mem(o1))) return T{T::kLoad, mm1 ? 8u : o1.size};
        if (mm1 && (o0.kind == interp::OpKind::kGpr || is_mem(o0))) return T{T::kStore, o0.size};
        return {};
      case ZYDIS_MNEMONIC_PSLLW: case ZYDIS_MNEMONIC_PSLLD: case ZYDIS_MNEMONIC_PSLLQ: case ZYDIS_MNEMONIC_PSRLW:
      case ZYDIS_MNEMONIC_PSRLD: case ZYDIS_MNEMONIC_PSRLQ: case ZYDIS_MNEMONIC_PSRAW: case ZYDIS_MNEMONIC_PSRAD:
        if (mm0 && is_imm(o1)) return T{T::kShiftImm};
        [[fallthrough]];
      case ZYDIS_MNEMONIC_PADDB: case ZYDIS_MNEMONIC_PADDW: case ZYDIS_MNEMONIC_PADDD: case ZYDIS_MNEMONIC_PADDQ:
      case ZYDIS_MNEMONIC_PADDSB: case ZYDIS_MNEMONIC_PADDSW: case ZYDIS_MNEMONIC_PADDUSB: case ZYDIS_MNEMONIC_PADDUSW:
      case ZYDIS_MNEMONIC_PSUBB: case ZYDIS_MNEMONIC_PSUBW: case ZYDIS_MNEMONIC_PSUBD: case ZYDIS_MNEMONIC_PSUBQ:
      case ZYDIS_MNEMONIC_PSUBSB: case ZYDIS_MNEMONIC_PSUBSW: case ZYDIS_MNEMONIC_PSUBUSB: case ZYDIS_MNEMONIC_PSUBUSW:
      case ZYDIS_MNEMONIC_PCMPEQB: case ZYDIS_MNEMONIC_PCMPEQW: case ZYDIS_MNEMONIC_PCMPEQD: case ZYDIS_MNEMONIC_PCMPGTB:
      case ZYDIS_MNEMONIC_PCMPGTW: case ZYDIS_MNEMONIC_PCMPGTD: case ZYDIS_MNEMONIC_PMULLW: case ZYDIS_MNEMONIC_PMULHW:
      case ZYDIS_MNEMONIC_PMULHUW: case ZYDIS_MNEMONIC_PMULUDQ: case ZYDIS_MNEMONIC_PMADDWD: case ZYDIS_MNEMONIC_PAND:
      case ZYDIS_MNEMONIC_PANDN: case ZYDIS_MNEMONIC_POR: case ZYDIS_MNEMONIC_PXOR: case ZYDIS_MNEMONIC_PAVGB:
      case ZYDIS_MNEMONIC_PAVGW: case ZYDIS_MNEMONIC_PMINUB: case ZYDIS_MNEMONIC_PMAXUB: case ZYDIS_MNEMONIC_PMINSW:
      case ZYDIS_MNEMONIC_PMAXSW: case ZYDIS_MNEMONIC_PSADBW: case ZYDIS_MNEMONIC_PUNPCKLBW:
      case ZYDIS_MNEMONIC_PUNPCKLWD: case ZYDIS_MNEMONIC_PUNPCKLDQ:
        return mm0 && (mm1 || (is_mem(o1) && o1.size == 8)) ? T{T::kBinary} : T{};
      default:
        return {};
    }
  }
  // The VEX instructions with a template: moves (any width, register or memory), PMOVMSKB/MOVMSKPS/MOVMSKPD,
  // MOVD/MOVQ, VZEROUPPER/VZEROALL, and the operations of `kSame`: the host's own instruction of the guest's
  // encoding (map, prefix, W, L, opcode, immediate) with the operands renamed to host registers (ModRM.reg YMM0,
  // VEX.vvvv YMM1, ModRM.rm YMM2 or the guest memory operand, is4 YMM3). kSame is for the integer, bitwise, shuffle
  // and permutation operations the reference computes in software (its interp_diff against this host checks them),
  // never floating point or anything touching RFLAGS or a general register.
  struct VexTemplate {
    enum Kind : uint8_t { kNone, kSame, kMove, kMovemask, kMovq, kZeroUpper, kZeroAll } kind = kNone;
    bool aligned = false;  // kMove: a memory operand must be aligned to its size (#GP otherwise)
  };
  VexTemplate vex_template(const DecodedInsn& i) const {
    using T = VexTemplate;
    if (!(i.flags & interp::insn_flags::kVex) || (i.flags & interp::insn_flags::kVsib) ||
        i.isa == interp::VexIsa::kBmi1 || i.isa == interp::VexIsa::kBmi2 || !c.vex_features_[size_t(i.isa)])
      return {};
    const interp::Operand &o0 = i.op[0], &o1 = i.op[1];
    const bool x0 = o0.kind == interp::OpKind::kXmm, x1 = o1.kind == interp::OpKind::kXmm;
    switch (ZydisMnemonic(i.mnemonic)) {
      case ZYDIS_MNEMONIC_VZEROUPPER: return T{T::kZeroUpper};
      case ZYDIS_MNEMONIC_VZEROALL: return T{T::kZeroAll};
      case ZYDIS_MNEMONIC_VMOVDQU: case ZYDIS_MNEMONIC_VMOVUPS: case ZYDIS_MNEMONIC_VMOVUPD: case ZYDIS_MNEMONIC_VLDDQU:
      case ZYDIS_MNEMONIC_VMOVDQA: case ZYDIS_MNEMONIC_VMOVAPS: case ZYDIS_MNEMONIC_VMOVAPD: case ZYDIS_MNEMONIC_VMOVNTDQ:
      case ZYDIS_MNEMONIC_VMOVNTPS: case ZYDIS_MNEMONIC_VMOVNTPD: case ZYDIS_MNEMONIC_VMOVNTDQA: {
        const bool aligned = i.mnemonic != ZYDIS_MNEMONIC_VMOVDQU && i.mnemonic != ZYDIS_MNEMONIC_VMOVUPS &&
                             i.mnemonic != ZYDIS_MNEMONIC_VMOVUPD && i.mnemonic != ZYDIS_MNEMONIC_VLDDQU;
        if ((x0 || x1) && (x0 || is_mem(o0)) && (x1 || is_mem(o1))) return T{T::kMove, aligned};
        return {};
      }
      case ZYDIS_MNEMONIC_VPMOVMSKB: case ZYDIS_MNEMONIC_VMOVMSKPS: case ZYDIS_MNEMONIC_VMOVMSKPD:
        return o0.kind == interp::OpKind::kGpr && x1 ? T{T::kMovemask} : T{};
      case ZYDIS_MNEMONIC_VMOVD: case ZYDIS_MNEMONIC_VMOVQ: {
        const unsigned w = x0 ? (x1 ? 8 : o1.size) : o0.size;
        if ((w == 4 || w == 8) && (x0 ? (x1 || is_reg(o1) || is_mem(o1)) : (x1 && (is_reg(o0) || is_mem(o0)))))
          return T{T::kMovq};
        return {};
      }
      case ZYDIS_MNEMONIC_VPSHUFD: case ZYDIS_MNEMONIC_VPSHUFHW: case ZYDIS_MNEMONIC_VPSHUFLW: case ZYDIS_MNEMONIC_VPSLLDQ:
      case ZYDIS_MNEMONIC_VPSRLDQ: case ZYDIS_MNEMONIC_VPALIGNR: case ZYDIS_MNEMONIC_VPBLENDD: case ZYDIS_MNEMONIC_VPBLENDW:
      case ZYDIS_MNEMONIC_VBLENDPS: case ZYDIS_MNEMONIC_VBLENDPD: case ZYDIS_MNEMONIC_VPBLENDVB:
      case ZYDIS_MNEMONIC_VBLENDVPS: case ZYDIS_MNEMONIC_VBLENDVPD: case ZYDIS_MNEMONIC_VPERMQ: case ZYDIS_MNEMONIC_VPERMD:
      case ZYDIS_MNEMONIC_VPERMPS: case ZYDIS_MNEMONIC_VPERMPD: case ZYDIS_MNEMONIC_VPERM2I128:
      case ZYDIS_MNEMONIC_VPERM2F128: case ZYDIS_MNEMONIC_VINSERTI128: case ZYDIS_MNEMONIC_VINSERTF128:
      case ZYDIS_MNEMONIC_VPBROADCASTB: case ZYDIS_MNEMONIC_VPBROADCASTW: case ZYDIS_MNEMONIC_VPBROADCASTD:
      case ZYDIS_MNEMONIC_VPBROADCASTQ: case ZYDIS_MNEMONIC_VBROADCASTSS: case ZYDIS_MNEMONIC_VBROADCASTSD:
      case ZYDIS_MNEMONIC_VBROADCASTI128: case ZYDIS_MNEMONIC_VBROADCASTF128: case ZYDIS_MNEMONIC_VPSLLVD:
      case ZYDIS_MNEMONIC_VPSLLVQ: case ZYDIS_MNEMONIC_VPSRLVD: case ZYDIS_MNEMONIC_VPSRLVQ: case ZYDIS_MNEMONIC_VPSRAVD:
      case ZYDIS_MNEMONIC_VSHUFPS: case ZYDIS_MNEMONIC_VSHUFPD: case ZYDIS_MNEMONIC_VPERMILPS: case ZYDIS_MNEMONIC_VPERMILPD:
      case ZYDIS_MNEMONIC_VMOVDDUP: case ZYDIS_MNEMONIC_VMOVSHDUP: case ZYDIS_MNEMONIC_VMOVSLDUP: case ZYDIS_MNEMONIC_VMPSADBW:
        break;
      default: {
        const uint16_t legacy = interp::avx::legacy_mnemonic(i.mnemonic);
        if (!interp::int_op_of(legacy) && !interp::ext_op_of(legacy)) return {};
        break;
      }
    }
    // kSame: an XMM/YMM destination; sources XMM/YMM registers, one memory operand, an immediate.
    if (!x0) return {};
    for (int k = 1; k < i.operand_count; ++k) {
      const interp::Operand& o = i.op[k];
      if (o.kind != interp::OpKind::kXmm && !is_mem(o) && !is_imm(o)) return {};
      if (o.enc == interp::OpEnc::kOther) return {};
    }
    return T{T::kSame};
  }
  // BMI1/BMI2 (VEX-encoded) and TZCNT/LZCNT on general registers: the host's own instruction, when nothing reads
  // the flags of those that set any (the host's undefined flags are not deja's).
  enum class BmiTemplate : uint8_t { kNone, kFlagless, kFlags };
  BmiTemplate bmi_template(const DecodedInsn& i) const {
    const bool vex = i.flags & interp::insn_flags::kVex;
    switch (ZydisMnemonic(i.mnemonic)) {
      case ZYDIS_MNEMONIC_SHLX: case ZYDIS_MNEMONIC_SHRX: case ZYDIS_MNEMONIC_SARX: case ZYDIS_MNEMONIC_RORX:
      case ZYDIS_MNEMONIC_PDEP: case ZYDIS_MNEMONIC_PEXT:
        if (!host_bmi2() || !c.vex_features_[size_t(interp::VexIsa::kBmi2)]) return BmiTemplate::kNone;
        break;
      case ZYDIS_MNEMONIC_BZHI:
        if (!host_bmi2() || !c.vex_features_[size_t(interp::VexIsa::kBmi2)]) return BmiTemplate::kNone;
        break;
      case ZYDIS_MNEMONIC_ANDN: case ZYDIS_MNEMONIC_BLSI: case ZYDIS_MNEMONIC_BLSMSK: case ZYDIS_MNEMONIC_BLSR:
      case ZYDIS_MNEMONIC_BEXTR:
        if (!host_bmi1() || !c.vex_features_[size_t(interp::VexIsa::kBmi1)]) return BmiTemplate::kNone;
        break;
      case ZYDIS_MNEMONIC_TZCNT:  // (without BMI1 in the model it is BSF)
        if (vex || !host_bmi1() || !c.vex_features_[size_t(interp::VexIsa::kBmi1)]) return BmiTemplate::kNone;
        break;
      case ZYDIS_MNEMONIC_LZCNT:  // (without LZCNT in the model it is BSR)
        if (vex || !host_lzcnt() || !c.model_has(0x80000001, 2, 5)) return BmiTemplate::kNone;
        break;
      default:
        return BmiTemplate::kNone;
    }
    if (i.mode != interp::kMode64 || (i.op[0].size != 4 && i.op[0].size != 8) || i.op[0].kind != interp::OpKind::kGpr)
      return BmiTemplate::kNone;
    for (int k = 1; k < i.operand_count; ++k) {
      const interp::Operand& o = i.op[k];
      if (!(o.kind == interp::OpKind::kGpr || is_imm(o) || mem_ok(o, i))) return BmiTemplate::kNone;
    }
    const bool flagless = i.mnemonic == ZYDIS_MNEMONIC_SHLX || i.mnemonic == ZYDIS_MNEMONIC_SHRX ||
                          i.mnemonic == ZYDIS_MNEMONIC_SARX || i.mnemonic == ZYDIS_MNEMONIC_RORX ||
                          i.mnemonic == ZYDIS_MNEMONIC_PDEP || i.mnemonic == ZYDIS_MNEMONIC_PEXT;
    return flagless ? BmiTemplate::kFlagless : BmiTemplate::kFlags;
  }
  static bool host_bmi1() {
    static const bool has = __builtin_cpu_supports("bmi");
    return has;
  }
  static bool host_bmi2() {
    static const bool has = __builtin_cpu_supports("bmi2");
    return has;
  }
  static bool host_lzcnt() {
    // CPUID 0x80000001 ECX bit 5 (LZCNT, AMD's "ABM"): read directly, since GCC and clang name it differently
    // in __builtin_cpu_supports.
    static const bool has = [] {
      unsigned eax, ebx, ecx, edx;
      return __get_cpuid(0x80000001, &eax, &ebx, &ecx, &edx) && (ecx & (1u << 5)) != 0;
    }();
    return has;
  }

  // The flags an operation leaves, for conditions compiled from them and for dropping dead flag stores.
  struct FlagUse {
    bool reads = false;     // needs the flags as they were (conditions, INC/DEC's CF)
    bool writes = false;    // sets all six
    bool can_exit = false;  // may leave the block before writing (a slow path, a handler, the block end)
  };

  InterpBackend& c;
  const Block& block;
  x64::Assembler a;
  x64::Label ended;  // after a handler ended the block: return running_op_
  // What the holder tracks (holder_): the 16 guest registers, then the lazy flags' operands.
  static constexpr int kHeldDst = 16, kHeldSrc1 = 17, kHeldSrc2 = 18, kHeldSlots = 19;
  struct Slow {
    x64::Label entry, resume;
    const Op* op;
    int8_t held[kHeldSlots];  // what the fast path leaves held at `resume`: the slow path loads the same
  };
  std::vector<Slow> slows;
  const bool user;
  const bool paged64;  // 64-bit code with paging: links into other pages are possible (linkable)
  // The address-dependent values emitted (Block::relocs), and whether every one was listed.
  std::vector<interp::Reloc> relocs;
  bool relocatable = true;
  // The lazy-flags producer earlier in this block whose operands are stored, if known.
  bool known = false;
  // Where RCX bit 0 is CF (after ROL/ROR and BT*, which leave the new CF there): the code size and label
  // count right after them; INC/DEC emitted there take the carry they keep from RCX.
  size_t carry_in_rcx_at = SIZE_MAX;
  unsigned carry_in_rcx_binds = 0;
  uint32_t known_kind = 0, known_width = 0;

  Jit(InterpBackend& cpu, const Block& b, std::vector<uint8_t>&& scratch)
      : c(cpu),
        block(b),
        user(((b.key >> 2) & 3) == 3),
        paged64((b.key & kKeyPaging) && (b.key & 3) == interp::kMode64) {
    a.code = std::move(scratch);
    a.reset();
    slows.swap(slow_pool());
    slows.clear();
    slows.reserve(2 * b.ops.size());  // (at most two a template; Slow& stays valid)
  }
  ~Jit() {
    slows.clear();
    slow_pool().swap(slows);
  }
  Jit(const Jit&) = delete;
  Jit& operator=(const Jit&) = delete;
  // The slow-path list's storage, kept from block to block: allocating it afresh for every block was
  // 1.5% of a Linux boot.
  static std::vector<Slow>& slow_pool() {
    static thread_local std::vector<Slow> pool;
    return pool;
  }

  // ---- values that depend on where the block is (Block::relocs) ---------------------------------------
  // mov r64, value: `value` is of `kind`; its encoding (the assembler picks the shortest) is noted with it.
  void mov_reloc(Reg r, uint64_t value, interp::Reloc::Kind kind) {
    const size_t start = a.size();
    a.mov_imm64(r, value);
    const size_t length = a.size() - start;
    const auto form = length == 10 ? interp::Reloc::kImm64 : length == 7 ? interp::Reloc::kImm32Sign : interp::Reloc::kImm32Zero;
    relocs.push_back({uint32_t(a.size() - (form == interp::Reloc::kImm64 ? 8 : 4)), kind, form});
  }
  // The field of `kind` and `form` that ends `from_end` bytes before the end of the code emitted so far.
  void note_reloc(interp::Reloc::Kind kind, interp::Reloc::Form form, size_t from_end = 0) {
    relocs.push_back({uint32_t(a.size() - from_end - 4), kind, form});
  }
  // The software-TLB entry of the block's page, as a disp32 off RBX (a disp8 could not move).
  x64::Mem block_tlb_field(int32_t entry, size_t field_offset) {
    const int32_t disp = entry + int32_t(field_offset);
    if (disp >= -128 && disp <= 127) relocatable = false;
    return x64::at(rbx, disp);
  }

  // ---- offsets into the backend ----------------------------------------------------------------------
  template <typename T>
  int32_t off(const T* member) const {
    return int32_t(reinterpret_cast<const char*>(member) - reinterpret_cast<const char*>(&c));
  }
  x64::Mem gpr(int r, int byte = 0) const { return x64::at(rbx, off(&c.s_.gpr[size_t(r)]) + byte); }
  x64::Mem field(const uint64_t* member) const { return x64::at(rbx, off(member)); }
  x64::Mem lazy_cc() const { return x64::at(rbx, off(&c.lazy_.cc)); }
  x64::Mem lazy_dst() const { return field(&c.lazy_.dst); }
  x64::Mem lazy_src1() const { return field(&c.lazy_.src1); }
  x64::Mem lazy_src2() const { return field(&c.lazy_.src2); }
  x64::Mem tlb(int32_t field_offset, int32_t extra = 0) const {
    return x64::at(rbx, rcx, 1, off(&c.tlb_[0]) + field_offset + extra);
  }

  // ---- classification ---------------------------------------------------------------------------------
  static bool is_reg(const interp::Operand& o) { return o.kind == interp::OpKind::kGpr || o.kind == interp::OpKind::kGprHigh8; }
  static bool is_mem(const interp::Operand& o) { return o.kind == interp::OpKind::kMem; }
  static bool is_imm(const interp::Operand& o) { return o.kind == interp::OpKind::kImm; }
  static bool fits32(int64_t v) { return v >= INT32_MIN && v <= INT32_MAX; }
  static bool mem_ok(const interp::Operand& o, const DecodedInsn& insn) {
    // 64-bit mode addressing with a 32- or 64-bit address size and a 32-bit displacement (or RIP-relative).
    return is_mem(o) && insn.mode == interp::kMode64 && (insn.addrsize == 64 || insn.addrsize == 32) &&
           (o.base == interp::kRipBase || fits32(o.disp)) && (o.index == interp::kNoReg || o.base != interp::kRipBase);
  }

  Form form_of(const Op& op) const {
    if (op.index >= block.count) return Form::kFallThrough;
    const DecodedInsn& i = op.insn;
    if (i.mode != interp::kMode64) return Form::kCall;  // (other modes: segment bases and masks; the handlers do them)
    const interp::Operand &o0 = i.op[0], &o1 = i.op[1];
    const unsigned w = o0.size;
    const bool wide = w == 4 || w == 8;
    auto operand_ok = [&](const interp::Operand& o) { return is_reg(o) || is_imm(o) || mem_ok(o, i); };
    switch (ZydisMnemonic(i.mnemonic)) {
      case ZYDIS_MNEMONIC_MOV:
        if (op.fn == nullptr || !operand_ok(o0) || !operand_ok(o1) || is_imm(o0) || (is_mem(o0) && is_mem(o1))) break;
        if (!is_imm(o1) && o0.size != o1.size) break;
        if (is_imm(o1) && !fits32(o1.disp) && w != 8) break;
        return Form::kMov;
      case ZYDIS_MNEMONIC_MOVZX: case ZYDIS_MNEMONIC_MOVSX: case ZYDIS_MNEMONIC_MOVSXD:
        if (o0.kind == interp::OpKind::kGpr && (is_reg(o1) || mem_ok(o1, i)) && w >= 2) return Form::kExtend;
        break;
      case ZYDIS_MNEMONIC_LEA:
        if (o0.kind == interp::OpKind::kGpr && wide && mem_ok(o1, i) && o1.seg == 3) return Form::kLea;
        break;
      case ZYDIS_MNEMONIC_ADD: case ZYDIS_MNEMONIC_OR: case ZYDIS_MNEMONIC_AND: case ZYDIS_MNEMONIC_SUB:
      case ZYDIS_MNEMONIC_XOR: case ZYDIS_MNEMONIC_CMP: case ZYDIS_MNEMONIC_TEST: case ZYDIS_MNEMONIC_ADC:
      case ZYDIS_MNEMONIC_SBB:
        if (!operand_ok(o0) || is_imm(o0) || !operand_ok(o1) || (is_mem(o0) && is_mem(o1))) break;
        if (is_imm(o1) && !fits32(o1.disp)) break;
        return Form::kAlu;
      case ZYDIS_MNEMONIC_INC: case ZYDIS_MNEMONIC_DEC:
        if (is_reg(o0) || mem_ok(o0, i)) return Form::kIncDec;
        break;
      case ZYDIS_MNEMONIC_NEG: case ZYDIS_MNEMONIC_NOT:
        if (is_reg(o0) || mem_ok(o0, i)) return Form::kNegNot;
        break;
      case ZYDIS_MNEMONIC_SHL: case ZYDIS_MNEMONIC_SHR: case ZYDIS_MNEMONIC_SAR:
        if (wide && (is_reg(o0) || mem_ok(o0, i)) && i.operand_count >= 2 && is_imm(o1) &&
            (uint64_t(o1.disp) & (w == 8 ? 63 : 31)) != 0)
          return Form::kShift;
        if (wide && op.fn != nullptr && (is_reg(o0) || mem_ok(o0, i)) && i.operand_count >= 2 &&
            o1.kind == interp::OpKind::kGpr && o1.reg == kRcx && o1.size == 1)
          return Form::kShiftCl;
        break;
      case ZYDIS_MNEMONIC_BSWAP:
        if (wide && o0.kind == interp::OpKind::kGpr) return Form::kBswap;
        break;
      case ZYDIS_MNEMONIC_CDQE: case ZYDIS_MNEMONIC_CQO:
        return Form::kSignExtendAcc;
      case ZYDIS_MNEMONIC_ROL: case ZYDIS_MNEMONIC_ROR:
        if (wide && o0.kind == interp::OpKind::kGpr && i.operand_count >= 2 && is_imm(o1) &&
            (uint64_t(o1.disp) & (w == 8 ? 63 : 31)) != 0)
          return Form::kRotate;
        break;
      case ZYDIS_MNEMONIC_BT: case ZYDIS_MNEMONIC_BTS: case ZYDIS_MNEMONIC_BTR: case ZYDIS_MNEMONIC_BTC:
        if (w >= 2 && i.operand_count >= 2 &&
            ((o0.kind == interp::OpKind::kGpr && (is_imm(o1) || o1.kind == interp::OpKind::kGpr)) || (mem_ok(o0, i) && is_imm(o1))))
          return Form::kBitTest;
        break;
      case ZYDIS_MNEMONIC_IMUL:
        if (wide && o0.kind == interp::OpKind::kGpr && i.operand_count >= 2 && o1.kind != interp::OpKind::kNone &&
            operand_ok(o1) && !is_imm(o1) && (i.operand_count < 3 || (is_imm(i.op[2]) && fits32(i.op[2].disp))))
          return Form::kImul;
        break;
      case ZYDIS_MNEMONIC_CMOVB: case ZYDIS_MNEMONIC_CMOVBE: case ZYDIS_MNEMONIC_CMOVL: case ZYDIS_MNEMONIC_CMOVLE:
      case ZYDIS_MNEMONIC_CMOVNB: case ZYDIS_MNEMONIC_CMOVNBE: case ZYDIS_MNEMONIC_CMOVNL: case ZYDIS_MNEMONIC_CMOVNLE:
      case ZYDIS_MNEMONIC_CMOVNO: case ZYDIS_MNEMONIC_CMOVNP: case ZYDIS_MNEMONIC_CMOVNS: case ZYDIS_MNEMONIC_CMOVNZ:
      case ZYDIS_MNEMONIC_CMOVO: case ZYDIS_MNEMONIC_CMOVP: case ZYDIS_MNEMONIC_CMOVS: case ZYDIS_MNEMONIC_CMOVZ:
        if (op.fn != nullptr && o0.kind == interp::OpKind::kGpr && w >= 2 && (o1.kind == interp::OpKind::kGpr || mem_ok(o1, i)) &&
            o1.size == w)
          return Form::kCmov;
        break;
      case ZYDIS_MNEMONIC_SETB: case ZYDIS_MNEMONIC_SETBE: case ZYDIS_MNEMONIC_SETL: case ZYDIS_MNEMONIC_SETLE:
      case ZYDIS_MNEMONIC_SETNB: case ZYDIS_MNEMONIC_SETNBE: case ZYDIS_MNEMONIC_SETNL: case ZYDIS_MNEMONIC_SETNLE:
      case ZYDIS_MNEMONIC_SETNO: case ZYDIS_MNEMONIC_SETNP: case ZYDIS_MNEMONIC_SETNS: case ZYDIS_MNEMONIC_SETNZ:
      case ZYDIS_MNEMONIC_SETO: case ZYDIS_MNEMONIC_SETP: case ZYDIS_MNEMONIC_SETS: case ZYDIS_MNEMONIC_SETZ:
        if (w == 1 && (is_reg(o0) || mem_ok(o0, i))) return Form::kSetcc;
        break;
      case ZYDIS_MNEMONIC_PUSH:
        if (i.opsize == 64 && (o0.kind == interp::OpKind::kGpr || (is_imm(o0) && fits32(o0.disp)))) return Form::kPush;
        break;
      case ZYDIS_MNEMONIC_POP:
        if (i.opsize == 64 && o0.kind == interp::OpKind::kGpr) return Form::kPop;
        break;
      case ZYDIS_MNEMONIC_JO: case ZYDIS_MNEMONIC_JNO: case ZYDIS_MNEMONIC_JB: case ZYDIS_MNEMONIC_JNB:
      case ZYDIS_MNEMONIC_JZ: case ZYDIS_MNEMONIC_JNZ: case ZYDIS_MNEMONIC_JBE: case ZYDIS_MNEMONIC_JNBE:
      case ZYDIS_MNEMONIC_JS: case ZYDIS_MNEMONIC_JNS: case ZYDIS_MNEMONIC_JP: case ZYDIS_MNEMONIC_JNP:
      case ZYDIS_MNEMONIC_JL: case ZYDIS_MNEMONIC_JNL: case ZYDIS_MNEMONIC_JLE: case ZYDIS_MNEMONIC_JNLE:
        if (op.target_ok) return Form::kJcc;
        break;
      case ZYDIS_MNEMONIC_JMP:
        if (is_imm(o0) && op.target_ok) return Form::kJmp;
        if (o0.kind == interp::OpKind::kGpr && o0.size == 8) return Form::kJmpReg;
        if (op.fn != nullptr && is_mem(o0) && o0.size == 8 && i.opsize == 64) return Form::kTransfer;
        break;
      case ZYDIS_MNEMONIC_CALL:
        if (is_imm(o0) && op.target_ok && i.opsize == 64) return Form::kCallRel;
        if (op.fn != nullptr && (is_reg(o0) || is_mem(o0)) && o0.size == 8 && i.opsize == 64) return Form::kTransfer;
        break;
      case ZYDIS_MNEMONIC_RET:
        if (i.opsize == 64 && (i.opcode == 0xc3 || i.opcode == 0xc2)) return Form::kRet;
        break;
      case ZYDIS_MNEMONIC_NOP: case ZYDIS_MNEMONIC_ENDBR64: case ZYDIS_MNEMONIC_PAUSE:
        return Form::kNop;
      default:
        break;
    }
    // (A template runs without the handler's check of the CPU model: the model must have the extension.)
    const SseTemplate sse = sse_template(i);
    const bool sse_modelled = sse.extension == SseTemplate::kSse2 || (sse.extension == SseTemplate::kSsse3 && c.simd_.ssse3) ||
                              (sse.extension == SseTemplate::kSse41 && c.simd_.sse41) ||
                              (sse.extension == SseTemplate::kSse42 && c.simd_.sse42);
    if (op.fn != nullptr && sse.kind != SseTemplate::kNone && sse_modelled) {
      for (int k = 0; k < i.operand_count; ++k)
        if (is_mem(i.op[k]) && !mem_ok(i.op[k], i)) return Form::kCall;
      return Form::kSse;
    }
    if (op.fn != nullptr && vex_template(i).kind != VexTemplate::kNone) {
      for (int k = 0; k < i.operand_count; ++k)
        if (is_mem(i.op[k]) && !mem_ok(i.op[k], i)) return Form::kCall;
      return Form::kVex;
    }
    if (op.fn != nullptr && bmi_template(i) != BmiTemplate::kNone) return Form::kBmi;
    if (op.fn != nullptr && c.simd_.mmx && mmx_template(i).kind != MmxTemplate::kNone) {
      for (int k = 0; k < i.operand_count; ++k)
        if (is_mem(i.op[k]) && !mem_ok(i.op[k], i)) return Form::kCall;
      return Form::kMmx;
    }
    return Form::kCall;
  }

  static bool alu_writes_back(const DecodedInsn& i) {
    return i.mnemonic != ZYDIS_MNEMONIC_CMP && i.mnemonic != ZYDIS_MNEMONIC_TEST;
  }
  bool touches_memory(const Op& op) const {
    for (int k = 0; k < op.insn.operand_count; ++k)
      if (is_mem(op.insn.op[k]) && op.insn.mnemonic != ZYDIS_MNEMONIC_LEA) return true;
    return false;
  }

  FlagUse flag_use(const Op& op, Form f) const {
    FlagUse u;
    switch (f) {
      case Form::kMov: case Form::kExtend: case Form::kLea: case Form::kNop:
        u.can_exit = touches_memory(op);
        return u;
      case Form::kAlu: case Form::kNegNot: case Form::kShift: case Form::kImul:
        u.writes = !(f == Form::kNegNot && op.insn.mnemonic == ZYDIS_MNEMONIC_NOT);
        u.reads = op.insn.mnemonic == ZYDIS_MNEMONIC_ADC || op.insn.mnemonic == ZYDIS_MNEMONIC_SBB;  // (CF)
        u.can_exit = touches_memory(op);
        return u;
      case Form::kShiftCl:  // a zero count keeps the flags
        u.reads = true;
        u.can_exit = touches_memory(op);
        return u;
      case Form::kBswap: case Form::kSignExtendAcc:
        return u;
      case Form::kIncDec:
        u.reads = u.writes = true;  // (CF is kept: read)
        u.can_exit = touches_memory(op);
        return u;
      case Form::kPush: case Form::kPop:
        u.can_exit = true;
        return u;
      case Form::kCmov: case Form::kSetcc:
        u.reads = true;
        u.can_exit = touches_memory(op);
        return u;
      case Form::kBmi:  // (flagless, or run as the handler when its flags are read: emit_bmi)
        u.writes = bmi_template(op.insn) == BmiTemplate::kFlags;
        u.can_exit = touches_memory(op);
        return u;
      case Form::kSse: case Form::kMmx: case Form::kVex:  // (the checks of CR0/CR4/XCR0 and the x87 state may leave to the handler)
        u.can_exit = true;
        return u;
      default:  // handlers, transfers, the block's end: anything may follow
        u.reads = u.can_exit = true;
        return u;
    }
  }

  // ---- pieces ------------------------------------------------------------------------------------------
  // RAX = the operation's handler (its guarded form) called on it.
  void call_op(const Op& op) {
    a.mov(8, rdi, rbx);
    mov_reloc(rsi, reinterpret_cast<uint64_t>(&op), interp::Reloc::kOp);
    a.call_abs(reinterpret_cast<uint64_t>(op.jit_fn));
  }
  void call_handler(const Op& op) {
    call_op(op);
    a.test(8, rax, rax);
    a.jcc(x64::kE, ended);
  }
  Slow& slow_path(const Op& op) {
    slows.emplace_back();
    slows.back().op = &op;
    return slows.back();
  }
  void end_block(const Op& op) {  // a transfer done inline: return the operation
    mov_reloc(rax, reinterpret_cast<uint64_t>(&op), interp::Reloc::kOp);
    a.pop(rbx);
    a.ret();
  }
  // After a transfer done inline (RIP set, its branch counted): on to the block linked in `slot` through
  // one of its chain entries (emit_chain_entries), which checks what the runner would before entering it
  // (the step limit, the counter, a kick, chaining allowed, its page's mapping); a block not linked goes
  // through next_body, which looks it up and links it. `target`: the RIP set (nullopt: it varies, as for
  // RET and JMP r64, and the linked block must start at RIP). `counted`: the exit counted a conditional
  // branch. Only then can the counter have reached its limit: every block is entered below it, and only
  // a block's last instruction counts a branch.
  void chain_exit(const Op& op, int slot, std::optional<uint64_t> target, bool counted = false) {
    static const Block probe;
    const auto boff = [](const auto* member) {
      return int32_t(reinterpret_cast<const char*>(member) - reinterpret_cast<const char*>(&probe));
    };
    const bool dynamic = !target;
    // A block of another page (always possible for a varying target) must find its page mapped as when it
    // was translated: the entry that checks the software TLB.
    const bool other_page = paged64 && (dynamic || (*target >> 12) != (block.linear >> 12));
    const int entry = (counted ? 2 : 0) | (other_page ? 1 : 0);
    x64::Label out;
    a.mov_imm64(rcx, block.count);
    mov_reloc(rdx, reinterpret_cast<uint64_t>(&op), interp::Reloc::kOp);
    if (!dynamic && exit_at[slot] == SIZE_MAX) {
      // A direct jump to the linked block's entry, which BlockCache::link writes; unlinked, it jumps to the
      // next instruction, the lookup. (A Jcc to the next instruction has both exits in slot 1: the second
      // reads the link.)
      a.u8(0xe9);
      exit_at[slot] = a.size();
      exit_entry[slot] = uint8_t(entry);
      a.u32(0);
    } else {
      // The link, if it names the block for RIP (a varying target), else (paged 64-bit code, a varying
      // target) the jump cache's entry for RIP if it has the same RIP and key.
      const bool use_cache = dynamic && paged64;
      x64::Label try_cache, found;
      x64::Label& miss = use_cache ? try_cache : out;
      mov_reloc(rax, reinterpret_cast<uint64_t>(&block.link[slot]), interp::Reloc::kBlock);
      a.load(8, rax, x64::at(rax));
      a.test(8, rax, rax);
      a.jcc(x64::kE, miss);
      if (dynamic) {
        a.load(8, r8, x64::at(rax, boff(&probe.rip)));
        a.alu(8, x64::kCmp, r8, field(&c.s_.rip));
        a.jcc(x64::kNe, miss);
      }
      if (use_cache) {
        a.jmp(found);
        a.bind(try_cache);
        const int32_t jc = off(&c.jump_cache_[0]);
        a.load(8, r8, field(&c.s_.rip));
        a.mov(8, r9, r8);
        a.shift_imm(8, x64::kShr, r9, 12);
        a.alu(8, x64::kXor, r9, r8);
        a.alu_imm(4, x64::kAnd, r9, int32_t(kJumpCacheSize - 1));
        a.shift_imm(4, x64::kShl, r9, 5);
        a.alu(8, x64::kCmp, r8, x64::at(rbx, r9, 1, jc + int32_t(offsetof(JumpEntry, rip))));
        a.jcc(x64::kNe, out);
        a.load(8, rax, x64::at(rbx, r9, 1, jc + int32_t(offsetof(JumpEntry, block))));
        a.alu_imm(4, x64::kCmp, x64::at(rax, boff(&probe.key)), int32_t(block.key));
        a.jcc(x64::kNe, out);
        a.bind(found);
      }
      a.jmp_mem(x64::at(rax, boff(&probe.chain_entry[entry])));
    }
    a.bind(out);
    // Not linked (another page, another target): the cache may have the block all the same. A Jcc's two
    // exits share this code, each with its slot in RDX.
    a.mov_imm64(rdx, uint64_t(slot));
    if (lookup_op == &op) {
      a.jmp(lookup);
      return;
    }
    lookup_op = &op;
    a.bind(lookup);
    x64::Label back;
    a.mov_imm64(rsi, block.count);
    go_through_next_body(back);
    a.bind(back);
    end_block(op);
  }
  // Calls next_body (RSI retired, RDX slot) and jumps to the body it returns; `none` when it returns none.
  void go_through_next_body(x64::Label& none) {
    a.mov(8, rdi, rbx);
    a.call_abs(reinterpret_cast<uint64_t>(&next_body));
    a.test(8, rax, rax);
    a.jcc(x64::kE, none);
    a.jmp_reg(rax);
  }
  // The block at RIP, when the runner would go on into it now and it is translated already: its body,
  // with this block's steps counted and it the running block; else nullptr (the runner takes over).
  // Looks things up, walking the page tables as the runner would: no translation, nothing freed.
  // Links the block found into `slot` of the running one (linkable; kNoLink: none): the link is then taken
  // inline next time.
  static constexpr uint64_t kNoLink = 2;  // next_body's `slot` when it is to link nothing
  static const void* next_body(InterpBackend* cpu, uint64_t retired, uint64_t slot) noexcept {
    InterpBackend& c = *cpu;
    const uint64_t steps = c.steps_ + retired;
    if (!c.chain_ok_ || steps >= c.fast_step_limit_ || c.branches_ >= c.branch_limit_ ||
        c.kicked_.load(std::memory_order_relaxed))
      return nullptr;
    const uint32_t key = c.running_block_->key;
    const uint64_t linear = (key & 3) == interp::kMode64 ? c.s_.rip : ((c.s_.cs.base + c.s_.rip) & 0xffffffffu);
    uint64_t phys;
    if (c.s_.cr0 & cr0::kPg) {
      const TlbEntry& e = c.tlb_entry(linear);
      if (e.tag == (linear >> 12)) {
        // The reference's fetch translation on a TLB hit (which has no side effects).
        if ((((key >> 2) & 3) == 3 && !e.user) || e.nx) return nullptr;
        phys = e.phys | (linear & 0xfff);
      } else {
        // A miss: the page walk the runner's lookup_block would make now, for the fetch the reference
        // makes next (the checks above are the runner's, so it would go on). A walk that faults leaves
        // no trace but CR2, put back: step() raises the fault then.
        if ((key & 3) == interp::kMode64 && !is_canonical(linear)) return nullptr;
        const uint64_t cr2 = c.s_.cr2;
        try {
          phys = c.translate(linear, Access::kExec, ((key >> 2) & 3) == 3);
        } catch (const GuestException&) {
          c.s_.cr2 = cr2;
          return nullptr;
        }
        // (Its accessed bits can rewrite code, this block's too: then the runner takes over.)
        if (c.end_block_after_op_) return nullptr;
      }
    } else {
      phys = c.long_mode() ? linear : (linear & 0xffffffffu);
    }
    Block* next = c.blocks_.find(phys, c.s_.rip, key);
    if (!next || !next->body || steps + next->count > c.fast_step_limit_) return nullptr;
    Block* from = c.running_block_;
    if ((key & kKeyPaging) && (key & 3) == interp::kMode64)
      c.jump_cache_[jump_index(c.s_.rip)] = JumpEntry{c.s_.rip, next};
    if (slot != kNoLink && linkable(*from, *next)) {
      c.blocks_.link(*from, int(slot), next);
    }
    c.steps_ = steps;
    c.running_block_ = next;
    ++c.fast_stats_.chained;
    return next->body;
  }
  int slot_for(const Op& op, uint64_t target) const { return target == op.next_rip ? 1 : 0; }
  void set_rip(uint64_t rip) {
    if (fits32(int64_t(rip))) {  // (a kernel's RIPs too: sign-extended)
      a.store_imm(8, field(&c.s_.rip), int32_t(rip));
      note_reloc(interp::Reloc::kRip, interp::Reloc::kStoreImm32);
      return;
    }
    mov_reloc(rax, rip, interp::Reloc::kRip);
    a.store(8, field(&c.s_.rip), rax);
  }

  // ---- guest registers held in host registers ------------------------------------------------------------
  // Guest registers live in memory (s_.gpr), which stays current: every store is emitted. A load of a guest
  // register a host register still holds becomes a register move instead (a store-to-load round trip is
  // ~5 cycles on a dependency chain, which is what integer code mostly is). What is held is known only
  // while nothing but these accessors has been emitted since they last ran and no label has been bound
  // since (code after a label can be reached from elsewhere): any other code may change any host register.
  int8_t holder_[kHeldSlots];       // slot -> the host register holding all 64 bits of it, or -1
  // holder_[kHeldSrc2] when src2 is an immediate, held_src2_immediate_ (sign-extended): no register needed.
  static constexpr int8_t kHeldImmediate = -2;
  int32_t held_src2_immediate_ = 0;
  size_t held_at_ = SIZE_MAX;       // the code size when that was last true
  unsigned held_binds_ = 0;
  void held_begin() {
    if (a.size() != held_at_ || a.binds != held_binds_) std::memset(holder_, -1, sizeof(holder_));
  }
  void held_end() {
    held_at_ = a.size();
    held_binds_ = a.binds;
  }
  void held_clobber(Reg r) {
    for (int8_t& h : holder_)
      if (h == int8_t(r)) h = -1;
  }
  // For code a template emits between accessors that writes the given host registers only and binds no
  // label: held_mark() before it, held_after() after it, and what the other registers hold stays known.
  size_t held_mark() const { return held_now() ? held_at_ : SIZE_MAX - 1; }
  void held_after(size_t mark, std::initializer_list<Reg> written) {
    if (mark != held_at_ || a.binds != held_binds_) return;
    for (Reg r : written) held_clobber(r);
    held_end();
  }
  bool held_now() const { return a.size() == held_at_ && a.binds == held_binds_; }
  // Emits `emit`, code that writes the host registers `written` only (no label bound, no store into what the
  // holder tracks), keeping what the others hold known.
  template <typename F>
  void raw(std::initializer_list<Reg> written, F&& emit) {
    const size_t mark = held_mark();
    emit();
    held_after(mark, written);
  }
  x64::Mem slot_mem(int slot) const {
    return slot < 16 ? gpr(slot) : slot == kHeldDst ? lazy_dst() : slot == kHeldSrc1 ? lazy_src1() : lazy_src2();
  }
  // The host register holding slot `slot`: the one that already does, else `scratch` loaded with it.
  Reg slot_reg(int slot, Reg scratch) {
    held_begin();
    const int8_t h = holder_[slot];
    if (h < 0) {
      a.load(8, scratch, slot_mem(slot));
      held_clobber(scratch);
      holder_[slot] = int8_t(scratch);
    }
    held_end();
    return h < 0 ? scratch : Reg(h);
  }
  // Binds slow path `s`'s resume point. What the fast path leaves held there stays known: the slow path
  // loads the same host registers before it jumps back (the handler it ran has stored everything).
  void bind_resume(Slow& s) {
    const bool known_here = held_now();
    // (An immediate src2 is the fast path's: the handler on the slow path stores its own representation.)
    if (holder_[kHeldSrc2] == kHeldImmediate) holder_[kHeldSrc2] = -1;
    if (known_here) std::memcpy(s.held, holder_, sizeof holder_);
    else std::memset(s.held, -1, sizeof s.held);
    a.bind(s.resume);
    if (known_here) held_end();
  }
  // Host `r` = guest register `g` (all 64 bits).
  void load_gpr(Reg r, int g) {
    held_begin();
    const int8_t h = holder_[g];
    if (h != int8_t(r)) {
      if (h < 0) a.load(8, r, gpr(g));
      else a.mov(8, r, Reg(h));
      held_clobber(r);
      holder_[g] = int8_t(r);
    }
    held_end();
  }
  // Guest register `g` = host `r` (all 64 bits).
  void store_gpr(int g, Reg r) {
    held_begin();
    a.store(8, gpr(g), r);
    holder_[g] = int8_t(r);
    held_end();
  }
  // Loads guest register operand `o` (w bytes, zero-extended) into host `r`.
  void load_reg(Reg r, const interp::Operand& o, unsigned w) {
    if (w == 8) return load_gpr(r, o.reg);
    held_begin();
    const int8_t h = holder_[o.reg];
    const bool high8 = o.kind == interp::OpKind::kGprHigh8;
    if (w == 4 && h >= 0) a.mov(4, r, Reg(h));
    else if (w == 4) a.load(4, r, gpr(o.reg));
    else if (h >= 0 && !high8) a.movzx(r, w, Reg(h));
    else a.movzx(r, w, gpr(o.reg, high8 ? 1 : 0));
    held_clobber(r);
    held_end();
  }
  // Stores host `r` into guest register operand `o` with the width's merge rules: 4 bytes zero-extend
  // (r's upper half is clear: every 32-bit host operation leaves it so), 1 and 2 bytes merge.
  void store_reg(const interp::Operand& o, Reg r, unsigned w) {
    if (w >= 4) return store_gpr(o.reg, r);
    held_begin();
    a.store(w, gpr(o.reg, o.kind == interp::OpKind::kGprHigh8 ? 1 : 0), r);
    holder_[o.reg] = -1;
    held_end();
  }
  void mask_to(Reg r, unsigned w) {
    if (w == 4) a.mov(4, r, r);
    else if (w < 4) a.movzx(r, w, r);
  }

  // Linear address of memory operand `o` into RSI (64-bit mode).
  void address(const Op& op, const interp::Operand& o) {
    if (o.base == interp::kRipBase) {
      uint64_t linear = op.next_rip + uint64_t(o.disp);
      if (op.insn.addrsize == 32) {
        linear &= 0xffffffffu;
        relocatable = false;  // (the mask does not move with the block)
      }
      raw({rsi}, [&] { mov_reloc(rsi, linear, interp::Reloc::kRip); });
    } else {
      if (o.base != interp::kNoReg) load_gpr(rsi, o.base);
      else raw({rsi}, [&] { a.mov_imm64(rsi, 0); });
      if (o.index != interp::kNoReg) {
        load_gpr(rdx, o.index);
        raw({rsi}, [&] { a.lea(rsi, x64::at(rsi, rdx, o.scale, int32_t(o.disp))); });
      } else if (o.disp != 0) {
        raw({rsi}, [&] { a.lea(rsi, x64::at(rsi, int32_t(o.disp))); });
      }
      if (op.insn.addrsize == 32) raw({rsi}, [&] { a.mov(4, rsi, rsi); });
    }
    if (o.seg == 4 || o.seg == 5)
      raw({rsi}, [&] { a.alu(8, x64::kAdd, rsi, x64::at(rbx, off(o.seg == 4 ? &c.s_.fs.base : &c.s_.gs.base))); });
  }
  // RSI = linear address of an n-byte access: jumps to `miss` unless its page has the fast tag (read
  // or write, at the block's privilege); else RSI becomes the host address. Clobbers RCX, RDX.
  void translate(unsigned n, bool write, x64::Label& miss) {
    raw({rsi, rcx, rdx}, [&] { translate_raw(n, write, miss); });
  }
  void translate_raw(unsigned n, bool write, x64::Label& miss) {
    a.lea(rdx, x64::at(rsi, int32_t(n - 1)));
    a.shift_imm(8, x64::kShr, rdx, 12);
    a.mov(4, rcx, rsi);
    a.shift_imm(4, x64::kShr, rcx, 12);
    a.alu_imm(4, x64::kAnd, rcx, int32_t(c.tlb_mask_));
    a.shift_imm(4, x64::kShl, rcx, 6);
    const int32_t tag = write ? int32_t(offsetof(TlbEntry, write_tag)) : int32_t(offsetof(TlbEntry, read_tag));
    a.alu(8, x64::kCmp, rdx, tlb(tag, user ? 8 : 0));
    a.jcc(x64::kNe, miss);
    a.alu(8, x64::kAdd, rsi, tlb(int32_t(offsetof(TlbEntry, addend))));
  }
  void load_host(Reg r, unsigned w) {
    raw({r}, [&] {
      if (w >= 4) a.load(w, r, x64::at(rsi));
      else a.movzx(r, w, x64::at(rsi));
    });
  }

  // `src2_imm`: src2 is this immediate (sign-extended), not a register.
  void store_flags(interp::CcKind kind, unsigned w, Reg dst, Reg src1, Reg src2,
                   std::optional<int32_t> src2_imm = std::nullopt) {
    const size_t mark = held_mark();  // (stores only)
    a.store_imm(4, lazy_cc(), int32_t(interp::cc_code(kind, w)));
    a.store(8, lazy_dst(), dst);
    if (kind == interp::kCcLogic) {  // (nothing reads them: its flags are dst's)
      src1 = src2 = x64::kNoReg;
      src2_imm.reset();
    }
    if (src1 != x64::kNoReg) a.store(8, lazy_src1(), src1);
    if (src2 != x64::kNoReg) a.store(8, lazy_src2(), src2);
    if (src2_imm) a.store_imm(8, lazy_src2(), *src2_imm);
    held_after(mark, {});
    if (held_now()) {
      holder_[kHeldDst] = int8_t(dst);
      if (src1 != x64::kNoReg) holder_[kHeldSrc1] = int8_t(src1);
      if (src2 != x64::kNoReg) holder_[kHeldSrc2] = int8_t(src2);
      if (src2_imm) {
        holder_[kHeldSrc2] = kHeldImmediate;
        held_src2_immediate_ = *src2_imm;
      }
    }
  }
  void now_known(interp::CcKind kind, unsigned w) {
    known = true;
    known_kind = kind;
    known_width = w;
  }

  // Jumps to `taken` when guest condition `cc` holds.
  void condition_jump(unsigned cc, x64::Label& taken) { a.jcc(condition_flags(cc), taken); }
  // Sets the host's flags so that the host condition returned holds when guest condition `cc` does.
  // Clobbers RAX (and, when the producer is not known here, every caller-saved register: a helper call).
  // The lazy operands come from the host registers still holding them where they do.
  x64::Cond condition_flags(unsigned cc) {
    const unsigned pair = (cc >> 1) & 7;
    const bool uses_cf = pair == 1 || pair == 3;
    const bool szp_only = pair == 2 || pair == 4 || pair == 5;
    const unsigned w = known_width;
    // The host's flags of src1 `op` src2 (a kCmp leaves src1 where it is; a kAdd goes to RAX).
    const auto on_operands = [&](x64::Alu op) {
      Reg x = slot_reg(kHeldSrc1, rax);
      if (op != x64::kCmp && x != rax) {
        raw({rax}, [&] { a.mov(8, rax, x); });
        x = rax;
      }
      held_begin();
      const int8_t y = holder_[kHeldSrc2];
      const auto emit = [&] {
        if (y >= 0) a.alu(w, op, x, Reg(y));
        else if (y == kHeldImmediate) a.alu_imm(w, op, x, held_src2_immediate_);
        else a.alu(w, op, x, lazy_src2());
      };
      if (op == x64::kCmp) raw({}, emit);
      else raw({rax}, emit);
    };
    const auto test_result = [&] {
      const Reg x = slot_reg(kHeldDst, rax);
      raw({}, [&] { a.test(w, x, x); });
    };
    if (known && known_kind == interp::kCcSub) {
      on_operands(x64::kCmp);
    } else if (known && known_kind == interp::kCcAdd) {
      on_operands(x64::kAdd);
    } else if (known && known_kind == interp::kCcLogic) {
      test_result();
    } else if (known && (known_kind == interp::kCcInc || known_kind == interp::kCcDec) && !uses_cf) {
      const Reg x = slot_reg(kHeldSrc1, rax);
      raw({rax}, [&] {
        if (x != rax) a.mov(8, rax, x);
        a.alu_imm(w, known_kind == interp::kCcInc ? x64::kAdd : x64::kSub, rax, 1);
      });
    } else if (known && known_kind == interp::kCcSzp && szp_only) {
      test_result();
    } else {
      a.mov(8, rdi, rbx);
      a.mov_imm64(rsi, cc);
      a.call_abs(reinterpret_cast<uint64_t>(&condition_helper));
      a.test(1, rax, rax);
      return x64::kNe;
    }
    return x64::Cond(cc);
  }
  void carry_in_rcx() {
    carry_in_rcx_at = a.size();
    carry_in_rcx_binds = a.binds;
  }
  // RAX = CF (0 or 1) of the flags as they are now.
  void carry_to_rax() {
    if (a.size() == carry_in_rcx_at && a.binds == carry_in_rcx_binds) {
      a.mov(4, rax, rcx);
      a.alu_imm(4, x64::kAnd, rax, 1);
    } else if (known && known_kind == interp::kCcLogic) {
      a.mov_imm64(rax, 0);
    } else if (known && known_kind == interp::kCcSub) {
      a.load(8, rax, lazy_src1());
      a.alu(8, x64::kCmp, rax, lazy_src2());  // (stored masked: the full-width compare is the width's)
      a.setcc(x64::kB, rax);
      a.movzx(rax, 1, rax);
    } else if (known && (known_kind == interp::kCcInc || known_kind == interp::kCcDec || known_kind == interp::kCcSzp)) {
      a.load(8, rax, lazy_src2());
      a.alu_imm(4, x64::kAnd, rax, 1);
    } else {
      a.mov(8, rdi, rbx);
      a.call_abs(reinterpret_cast<uint64_t>(&carry_helper));
    }
  }
  static bool condition_helper(InterpBackend* cpu, uint64_t cc) noexcept {
    return interp::cc_condition(cpu->lazy_, unsigned(cc), cpu->s_.rflags);
  }
  static uint64_t carry_helper(InterpBackend* cpu) noexcept { return interp::cc_carry(cpu->lazy_, cpu->s_.rflags) ? 1 : 0; }

  // ---- templates -----------------------------------------------------------------------------------------
  void emit_mov(const Op& op) {
    const interp::Operand &o0 = op.insn.op[0], &o1 = op.insn.op[1];
    const unsigned w = o0.size;
    if (is_mem(o0)) {
      Slow& s = slow_path(op);
      address(op, o0);
      translate(w, true, s.entry);
      if (is_imm(o1)) {
        if (w == 8 && !fits32(o1.disp)) {
          a.mov_imm64(rax, uint64_t(o1.disp));
          a.store(8, x64::at(rsi), rax);
        } else {
          a.store_imm(w, x64::at(rsi), int32_t(o1.disp));
        }
      } else {
        load_reg(rax, o1, w);
        a.store(w, x64::at(rsi), rax);
      }
      bind_resume(s);
      return;
    }
    if (is_mem(o1)) {
      Slow& s = slow_path(op);
      address(op, o1);
      translate(w, false, s.entry);
      load_host(rax, w);
      store_reg(o0, rax, w);
      bind_resume(s);
      return;
    }
    if (is_imm(o1)) a.mov_imm64(rax, uint64_t(o1.disp) & (w >= 8 ? ~0ull : (1ull << (8 * w)) - 1));
    else load_reg(rax, o1, w);
    store_reg(o0, rax, w);
  }

  // Operand `o` (w bytes, zero-extended) into host `dst`: a register, or memory through the software TLB
  // (RSI keeps its host address for a store back; a miss jumps to the slow path returned). nullptr: a register.
  Slow* load_operand(const Op& op, const interp::Operand& o, unsigned w, bool write, Reg dst) {
    if (!is_mem(o)) {
      load_reg(dst, o, w);
      return nullptr;
    }
    Slow* s = &slow_path(op);
    address(op, o);
    translate(w, write, s->entry);
    load_host(dst, w);
    return s;
  }
  // Stores host `r` back into the operand load_operand read.
  void store_operand(const interp::Operand& o, Reg r, unsigned w) {
    if (is_mem(o)) a.store(w, x64::at(rsi), r);
    else store_reg(o, r, w);
  }

  void emit_extend(const Op& op) {
    const interp::Operand &o0 = op.insn.op[0], &o1 = op.insn.op[1];
    const unsigned w = o0.size, sw = o1.size;
    const bool sign = op.insn.mnemonic != ZYDIS_MNEMONIC_MOVZX;
    Slow* s = load_operand(op, o1, sw, false, rax);
    if (sign) a.movsx(w == 8 ? 8 : 4, rax, sw, rax);  // 32-bit form for narrower destinations: upper half clear
    else if (sw == 4) a.mov(4, rax, rax);
    if (w == 2) a.movzx(rax, 2, rax);
    store_reg(o0, rax, w);
    if (s) bind_resume(*s);
  }

  void emit_lea(const Op& op) {
    const unsigned w = op.insn.op[0].size;
    address(op, op.insn.op[1]);
    if (w == 4) a.mov(4, rsi, rsi);
    store_gpr(op.insn.op[0].reg, rsi);
  }

  void emit_alu(const Op& op, bool store) {
    const DecodedInsn& i = op.insn;
    const interp::Operand &o0 = i.op[0], &o1 = i.op[1];
    const unsigned w = o0.size;
    const bool writes = alu_writes_back(i);
    const bool with_carry = i.mnemonic == ZYDIS_MNEMONIC_ADC || i.mnemonic == ZYDIS_MNEMONIC_SBB;
    if (with_carry) {
      carry_to_rax();  // CF, before anything else (a helper call may come first)
      a.mov(8, r8, rax);
    }
    // a -> RAX, b -> RCX (after the TLB check, which uses RCX and RDX), result -> RDX. (At most one is memory.)
    Slow* s = load_operand(op, o0, w, writes, rax);
    // An immediate the host instruction and the lazy store can take as a sign-extended imm32 needs no register.
    const uint64_t imm = is_imm(o1) ? uint64_t(o1.disp) & (w >= 8 ? ~0ull : (1ull << (8 * w)) - 1) : 0;
    const bool imm_inline = is_imm(o1) && !with_carry && fits32(int64_t(imm));
    if (is_imm(o1) && !imm_inline) {
      raw({rcx}, [&] { a.mov_imm64(rcx, imm); });
    } else if (is_imm(o1)) {
    } else if (is_reg(o0) && o1.kind == o0.kind && o1.reg == o0.reg) {  // TEST r, r and the like
      raw({rcx}, [&] { a.mov(8, rcx, rax); });
    } else if (Slow* s1 = load_operand(op, o1, w, false, rcx)) s = s1;
    const size_t mark = held_mark();
    a.mov(8, rdx, rax);
    x64::Alu op_code = x64::kAdd;
    interp::CcKind kind = interp::kCcLogic;
    switch (ZydisMnemonic(i.mnemonic)) {
      case ZYDIS_MNEMONIC_ADD: op_code = x64::kAdd; kind = interp::kCcAdd; break;
      case ZYDIS_MNEMONIC_OR: op_code = x64::kOr; break;
      case ZYDIS_MNEMONIC_AND: case ZYDIS_MNEMONIC_TEST: op_code = x64::kAnd; break;
      case ZYDIS_MNEMONIC_XOR: op_code = x64::kXor; break;
      case ZYDIS_MNEMONIC_ADC: op_code = x64::kAdc; kind = interp::kCcAdc; break;
      case ZYDIS_MNEMONIC_SBB: op_code = x64::kSbb; kind = interp::kCcSbb; break;
      default: op_code = x64::kSub; kind = interp::kCcSub; break;  // SUB, CMP
    }
    if (with_carry) a.alu_imm(1, x64::kAdd, r8, -1);  // the host's CF = the guest's (R8 is 0 or 1)
    // Operands are zero-extended: the low w bytes are the result.
    if (imm_inline) a.alu_imm(w == 8 ? 8 : 4, op_code, rdx, int32_t(imm));
    else a.alu(w == 8 ? 8 : 4, op_code, rdx, rcx);
    mask_to(rdx, w);
    held_after(mark, {rdx, r8});
    if (writes) {
      store_operand(o0, rdx, w);
    }
    if (store && imm_inline) store_flags(kind, w, rdx, rax, x64::kNoReg, int32_t(imm));
    else if (store) store_flags(kind, w, rdx, rax, rcx);
    now_known(kind, w);
    if (s) bind_resume(*s);
  }

  void emit_incdec_negnot(const Op& op, bool store) {
    const DecodedInsn& i = op.insn;
    const interp::Operand& o0 = i.op[0];
    const unsigned w = o0.size;
    const ZydisMnemonic m = ZydisMnemonic(i.mnemonic);
    const bool incdec = m == ZYDIS_MNEMONIC_INC || m == ZYDIS_MNEMONIC_DEC;
    if (incdec) {
      carry_to_rax();  // CF is kept: what it is now (a helper call may come first: before anything else)
      a.mov(8, r8, rax);
    }
    Slow* s = load_operand(op, o0, w, true, rax);
    a.mov(8, rdx, rax);
    switch (m) {
      case ZYDIS_MNEMONIC_INC: a.alu_imm(8, x64::kAdd, rdx, 1); break;
      case ZYDIS_MNEMONIC_DEC: a.alu_imm(8, x64::kSub, rdx, 1); break;
      case ZYDIS_MNEMONIC_NEG: a.neg(8, rdx); break;
      default: a.not_(8, rdx); break;
    }
    mask_to(rdx, w);
    store_operand(o0, rdx, w);
    if (m == ZYDIS_MNEMONIC_INC || m == ZYDIS_MNEMONIC_DEC) {
      const interp::CcKind kind = m == ZYDIS_MNEMONIC_INC ? interp::kCcInc : interp::kCcDec;
      if (store) store_flags(kind, w, rdx, rax, r8);  // src2 = the kept CF (kCf is bit 0)
      now_known(kind, w);
    } else if (m == ZYDIS_MNEMONIC_NEG) {
      if (store) {
        a.store_imm(4, lazy_cc(), int32_t(interp::cc_code(interp::kCcSub, w)));
        a.store(8, lazy_dst(), rdx);
        a.store_imm(8, lazy_src1(), 0);
        a.store(8, lazy_src2(), rax);
      }
      now_known(interp::kCcSub, w);
    }
    if (s) bind_resume(*s);
  }

  void emit_shift(const Op& op, bool store) {
    const DecodedInsn& i = op.insn;
    const interp::Operand& o0 = i.op[0];
    const unsigned w = o0.size;
    const uint8_t count = uint8_t(uint64_t(i.op[1].disp) & (w == 8 ? 63 : 31));
    Slow* s = load_operand(op, o0, w, true, rax);
    const size_t mark = held_mark();
    a.mov(8, rdx, rax);
    const ZydisMnemonic m = ZydisMnemonic(i.mnemonic);
    a.shift_imm(w, m == ZYDIS_MNEMONIC_SHL ? x64::kShl : m == ZYDIS_MNEMONIC_SHR ? x64::kShr : x64::kSar, rdx, count);
    if (store) {
      shift_flags(m, w, rcx);
    }
    held_after(mark, {rdx, rcx, r9});
    store_operand(o0, rdx, w);
    if (store) store_flags(interp::kCcSzp, w, rdx, x64::kNoReg, rcx);
    now_known(interp::kCcSzp, w);
    if (s) bind_resume(*s);
  }

  // After a host SHL/SHR/SAR of RAX (the operand) into RDX (the result) by a non-zero count: `out` = CF | OF
  // as the lazy kCcSzp state takes them. CF is the host's (the last bit out); OF as docs/interp-alu.md fixes
  // it for every count. Clobbers R9.
  void shift_flags(ZydisMnemonic m, unsigned w, Reg out) {
    a.setcc(x64::kB, out);
    a.movzx(out, 1, out);
    if (m == ZYDIS_MNEMONIC_SHL) {
      a.mov(8, r9, rdx);
      a.shift_imm(8, x64::kShr, r9, uint8_t(w * 8 - 1));
      a.alu_imm(4, x64::kAnd, r9, 1);
      a.alu(4, x64::kXor, r9, out);
    } else if (m == ZYDIS_MNEMONIC_SHR) {
      a.mov(8, r9, rax);
      a.shift_imm(8, x64::kShr, r9, uint8_t(w * 8 - 1));
      a.alu_imm(4, x64::kAnd, r9, 1);
    } else {
      a.mov_imm64(r9, 0);
    }
    a.shift_imm(4, x64::kShl, r9, 11);
    a.alu(4, x64::kOr, out, r9);
  }
  // SHL/SHR/SAR by CL: a count of zero (after masking) writes the operand back unchanged and keeps the flags;
  // otherwise the flags are those of the immediate form.
  void emit_shift_cl(const Op& op, bool store) {
    const DecodedInsn& i = op.insn;
    const interp::Operand& o0 = i.op[0];
    const unsigned w = o0.size;
    const ZydisMnemonic m = ZydisMnemonic(i.mnemonic);
    Slow* s = load_operand(op, o0, w, true, rax);
    x64::Label zero;
    a.movzx(rcx, 1, gpr(kRcx));
    a.alu_imm(4, x64::kAnd, rcx, w == 8 ? 63 : 31);
    a.jcc(x64::kE, zero);
    a.mov(8, rdx, rax);
    a.shift_cl(w, m == ZYDIS_MNEMONIC_SHL ? x64::kShl : m == ZYDIS_MNEMONIC_SHR ? x64::kShr : x64::kSar, rdx);
    if (store) {
      shift_flags(m, w, x64::r10);
      store_flags(interp::kCcSzp, w, rdx, x64::kNoReg, x64::r10);
    }
    a.mov(8, rax, rdx);
    a.bind(zero);
    store_operand(o0, rax, w);
    if (s) bind_resume(*s);
  }
  void emit_bswap(const Op& op) {
    const interp::Operand& o0 = op.insn.op[0];
    load_reg(rax, o0, o0.size);
    a.bswap(o0.size, rax);
    store_reg(o0, rax, o0.size);
  }
  void emit_sign_extend_acc(const Op& op) {
    load_gpr(rax, kRax);
    if (op.insn.mnemonic == ZYDIS_MNEMONIC_CDQE) {
      a.movsx(8, rax, 4, rax);
      store_gpr(kRax, rax);
    } else {  // CQO
      a.shift_imm(8, x64::kSar, rax, 63);
      store_gpr(kRdx, rax);
    }
  }
  // An indirect JMP or CALL its handler does (the target from memory, the push): then, unless it faulted,
  // exited or ended the run, straight into the target's block as chain_exit's slow path would.
  // The handler, then on to the target's block as a RET goes: through the link if it names the block for RIP,
  // else the jump cache, else next_body (a PLT stub's JMP [GOT] runs at every call into a shared library).
  void emit_transfer(const Op& op) {
    call_op(op);
    a.mov(8, rdi, rbx);
    a.call_abs(reinterpret_cast<uint64_t>(&transfer_ends));
    a.test(8, rax, rax);
    a.jcc(x64::kNe, ended);
    chain_exit(op, 0, std::nullopt);
  }
  // The handler faulted or exited, stored into this block or hit a watchpoint: the runner takes over.
  static uint64_t transfer_ends(InterpBackend* cpu) noexcept {
    return cpu->jit_trap_ || cpu->end_block_after_op_ || cpu->watch_hit_;
  }

  // Operations that change some of CF and OF only (ROL/ROR, BT*: interp/alu.cpp's values) keep the other
  // flags as the last producer made them. Their new bits are merged into a lazy state that can take them in
  // place (flags already in RFLAGS, a logic operation, kCcSzp); any other state is first made RFLAGS by a
  // helper (what the handlers do too: materializing changes nothing the guest can see). The helper call
  // comes before the operation loads anything (it clobbers the caller-saved registers).
  void partial_flags_prepare() {
    if (known && (known_kind == interp::kCcSub || known_kind == interp::kCcAdd)) {
      // The producer is known here: its CF, OF and AF computed inline (cc_compute's formulas) make the state
      // kCcSzp, which takes the new bits in place, instead of a helper call materializing everything.
      const unsigned bits = known_width * 8;
      const bool sub = known_kind == interp::kCcSub;
      a.load(8, rax, lazy_src1());
      a.load(8, rcx, lazy_src2());
      a.load(8, rdx, lazy_dst());
      if (sub) a.alu(8, x64::kCmp, rax, rcx);  // a < b: the borrow (operands are stored masked)
      else a.alu(8, x64::kCmp, rdx, rax);      // r < a: the carry
      a.setcc(x64::kB, r8);
      a.movzx(r8, 1, r8);                      // CF (bit 0)
      a.mov(8, x64::r9, rax);
      a.alu(8, x64::kXor, x64::r9, rcx);
      a.alu(8, x64::kXor, x64::r9, rdx);
      a.alu_imm(4, x64::kAnd, x64::r9, int32_t(interp::kAf));
      a.alu(8, x64::kOr, r8, x64::r9);         // AF
      // OF: sub: (a ^ b) & (a ^ r); add: (a ^ r) & (b ^ r); its sign bit.
      a.mov(8, x64::r9, sub ? rax : rcx);
      a.alu(8, x64::kXor, x64::r9, sub ? rcx : rdx);
      a.mov(8, x64::r10, rax);
      a.alu(8, x64::kXor, x64::r10, rdx);
      a.alu(8, x64::kAnd, x64::r9, x64::r10);
      a.shift_imm(8, x64::kShr, x64::r9, uint8_t(bits - 1));
      a.alu_imm(4, x64::kAnd, x64::r9, 1);
      a.shift_imm(4, x64::kShl, x64::r9, 11);
      a.alu(8, x64::kOr, r8, x64::r9);         // OF
      a.store(8, lazy_src2(), r8);
      a.store_imm(4, lazy_cc(), int32_t(interp::cc_code(interp::kCcSzp, known_width)));
      now_known(interp::kCcSzp, known_width);
      return;
    }
    x64::Label ok;
    a.load(4, rax, lazy_cc());
    a.shift_imm(4, x64::kShr, rax, 2);
    a.alu_imm(4, x64::kCmp, rax, int32_t(interp::kCcLogic));
    a.jcc(x64::kE, ok);
    a.alu_imm(4, x64::kCmp, rax, int32_t(interp::kCcSzp));
    a.jcc(x64::kE, ok);
    a.test(4, rax, rax);
    a.jcc(x64::kE, ok);
    a.mov(8, rdi, rbx);
    a.call_abs(reinterpret_cast<uint64_t>(&materialize_helper));
    a.bind(ok);
  }
  static void materialize_helper(InterpBackend* cpu) noexcept { cpu->materialize_flags(); }
  // Merges RCX (the new values of the bits in `mask`, nothing else) into the flags, whose lazy state is
  // one partial_flags_prepare left. Clobbers R8, R10, R11.
  void partial_flags_merge(int32_t mask) {
    x64::Label none, logic, done;
    a.load(4, r8, lazy_cc());
    a.test(4, r8, r8);
    a.jcc(x64::kE, none);
    a.mov(4, x64::r10, r8);
    a.shift_imm(4, x64::kShr, x64::r10, 2);
    a.alu_imm(4, x64::kCmp, x64::r10, int32_t(interp::kCcLogic));
    a.jcc(x64::kE, logic);
    // kCcSzp: the bits of src2 replaced, the others (AF, the other one of CF/OF) kept.
    a.load(8, x64::r11, lazy_src2());
    a.alu_imm(8, x64::kAnd, x64::r11, ~mask);
    a.alu(8, x64::kOr, x64::r11, rcx);
    a.store(8, lazy_src2(), x64::r11);
    a.jmp(done);
    // A logic operation (CF = OF = AF = 0): the same SF, ZF, PF from its result as kCcSzp, of its width.
    a.bind(logic);
    a.alu_imm(4, x64::kAnd, r8, 3);
    a.alu_imm(4, x64::kOr, r8, int32_t(interp::cc_code(interp::kCcSzp, 1)));
    a.store(4, lazy_cc(), r8);
    a.store(8, lazy_src2(), rcx);
    a.jmp(done);
    // The flags are in RFLAGS.
    a.bind(none);
    a.load(8, x64::r11, field(&c.s_.rflags));
    a.alu_imm(8, x64::kAnd, x64::r11, ~mask);
    a.alu(8, x64::kOr, x64::r11, rcx);
    a.store(8, field(&c.s_.rflags), x64::r11);
    a.bind(done);
  }

  void emit_rotate(const Op& op) {
    const interp::Operand& o0 = op.insn.op[0];
    const unsigned w = o0.size, bits = w * 8;
    const bool rol = op.insn.mnemonic == ZYDIS_MNEMONIC_ROL;
    const uint8_t count = uint8_t(uint64_t(op.insn.op[1].disp) & (w == 8 ? 63 : 31));
    partial_flags_prepare();
    // The result (a 32-bit rotate clears the upper half) and the new bits: RCX = CF | OF.
    load_reg(rdx, o0, w);
    a.shift_imm(w, rol ? x64::kRol : x64::kRor, rdx, count);
    store_reg(o0, rdx, w);
    a.mov(8, rcx, rdx);
    a.mov(8, r9, rdx);
    if (rol) {  // CF = LSB, OF = MSB ^ CF
      a.alu_imm(4, x64::kAnd, rcx, 1);
      a.shift_imm(8, x64::kShr, r9, uint8_t(bits - 1));
    } else {    // CF = MSB, OF = MSB ^ the bit below it
      a.shift_imm(8, x64::kShr, rcx, uint8_t(bits - 1));
      a.shift_imm(8, x64::kShr, r9, uint8_t(bits - 2));
    }
    a.alu_imm(4, x64::kAnd, r9, 1);
    a.alu(4, x64::kXor, r9, rcx);
    a.shift_imm(4, x64::kShl, r9, 11);
    a.alu(4, x64::kOr, rcx, r9);
    partial_flags_merge(int32_t(interp::kCf | interp::kOf));
    carry_in_rcx();
  }

  // BT/BTS/BTR/BTC on a register, or on memory with an immediate bit offset (a register offset can
  // address memory beyond the operand: the handler does those): CF = the bit; the host's instruction of
  // the same width takes the offset modulo the width as the guest's does.
  void emit_bit_test(const Op& op) {
    const interp::Operand &o0 = op.insn.op[0], &o1 = op.insn.op[1];
    const unsigned w = o0.size;
    const ZydisMnemonic m = ZydisMnemonic(op.insn.mnemonic);
    const bool writes = m != ZYDIS_MNEMONIC_BT;
    partial_flags_prepare();
    Slow* s = load_operand(op, o0, w, writes, rax);
    const unsigned digit = m == ZYDIS_MNEMONIC_BT ? 4 : m == ZYDIS_MNEMONIC_BTS ? 5 : m == ZYDIS_MNEMONIC_BTR ? 6 : 7;
    if (is_imm(o1)) {
      a.prefix_rr(w, 0, rax);
      a.u8(0x0f);
      a.u8(0xba);
      a.modrm_rr(digit, rax);
      a.u8(uint8_t(uint64_t(o1.disp) & (w * 8 - 1)));
    } else {
      load_reg(rdx, o1, w);
      a.op2_rr(w, uint8_t(0xa3 + (digit - 4) * 8), rdx, rax);
    }
    a.setcc(x64::kB, rcx);
    a.movzx(rcx, 1, rcx);
    if (writes) store_operand(o0, rax, w);
    partial_flags_merge(int32_t(interp::kCf));
    if (s) bind_resume(*s);
    else carry_in_rcx();
  }

  void emit_imul(const Op& op, bool store) {
    const DecodedInsn& i = op.insn;
    const interp::Operand &o0 = i.op[0], &o1 = i.op[1];
    const unsigned w = o0.size;
    const bool three = i.operand_count >= 3;
    // a = op1 (three operands) or op0; b = imm or op1
    Slow* s = load_operand(op, o1, w, false, three ? rax : rcx);
    if (three) a.mov_imm64(rcx, uint64_t(i.op[2].disp));
    else load_reg(rax, o0, w);
    a.mov(8, rdx, rax);
    a.imul(w, rdx, rcx);
    a.setcc(x64::kO, rcx);
    a.movzx(rcx, 1, rcx);
    a.neg(4, rcx);  // 0 or all ones
    a.alu_imm(4, x64::kAnd, rcx, int32_t(interp::kCf | interp::kOf));
    mask_to(rdx, w);
    store_reg(o0, rdx, w);
    if (store) store_flags(interp::kCcSzp, w, rdx, x64::kNoReg, rcx);
    now_known(interp::kCcSzp, w);
    if (s) bind_resume(*s);
  }

  // CMOVcc and SETcc read the flags only: the condition is computed first (it has no side effects, and a
  // helper call for it would clobber the operands), then the operand accesses as the handler makes them.
  // A CMOV reads its source whatever the condition, and a 32-bit one writes its destination either way.
  void setcc_r8(unsigned cc) {
    const x64::Cond cond = condition_flags(cc);
    raw({r8}, [&] { a.setcc(cond, r8); });
  }
  void emit_cmov(const Op& op) {
    const interp::Operand &o0 = op.insn.op[0], &o1 = op.insn.op[1];
    const unsigned w = o0.size;
    setcc_r8(op.cond);
    Slow* s = load_operand(op, o1, w, false, rcx);
    load_reg(rax, o0, w);
    a.test(1, r8, r8);
    a.cmov(8, x64::kNe, rax, rcx);
    store_reg(o0, rax, w);
    if (s) bind_resume(*s);
  }
  void emit_setcc(const Op& op) {
    const interp::Operand& o0 = op.insn.op[0];
    setcc_r8(op.cond);
    if (is_mem(o0)) {
      Slow& s = slow_path(op);
      address(op, o0);
      translate(1, true, s.entry);
      a.store(1, x64::at(rsi), r8);
      bind_resume(s);
      return;
    }
    store_reg(o0, r8, 1);
  }

  void emit_push(const Op& op) {
    Slow& s = slow_path(op);
    load_gpr(r8, kRsp);
    raw({rsi, r8}, [&] {
      a.lea(rsi, x64::at(r8, -8));
      a.mov(8, r8, rsi);
    });
    translate(8, true, s.entry);
    const interp::Operand& o0 = op.insn.op[0];
    if (is_imm(o0)) raw({rax}, [&] { a.mov_imm64(rax, uint64_t(o0.disp)); });
    else load_gpr(rax, o0.reg);  // (RSP's old value: R8 no longer holds RSP)
    raw({}, [&] { a.store(8, x64::at(rsi), rax); });
    store_gpr(kRsp, r8);
    bind_resume(s);
  }
  // RAX = the 8 bytes at the guest's RSP, through the software TLB (a miss jumps to `s`); R8 = that RSP.
  void load_stack_top(Slow& s) {
    load_gpr(rsi, kRsp);
    raw({r8}, [&] { a.mov(8, r8, rsi); });
    translate(8, false, s.entry);
    load_host(rax, 8);
  }
  void emit_pop(const Op& op) {
    Slow& s = slow_path(op);
    load_stack_top(s);
    raw({r8}, [&] { a.alu_imm(8, x64::kAdd, r8, 8); });
    store_gpr(kRsp, r8);
    store_gpr(op.insn.op[0].reg, rax);
    bind_resume(s);
  }

  void count_branch() { a.inc_mem64(field(&c.branches_)); }

  void emit_jcc(const Op& op) {
    x64::Label taken;
    condition_jump(op.cond, taken);
    set_rip(op.next_rip);
    count_branch();
    chain_exit(op, 1, op.next_rip, true);
    a.bind(taken);
    set_rip(op.target);
    count_branch();
    chain_exit(op, slot_for(op, op.target), op.target, true);
  }
  // 64-bit targets from registers or the stack: #GP when not canonical, which the handler raises.
  void canonical_or(Reg r, x64::Label& bad) {
    a.mov(8, rcx, r);
    a.shift_imm(8, x64::kShl, rcx, 16);
    a.shift_imm(8, x64::kSar, rcx, 16);
    a.alu(8, x64::kCmp, rcx, r);
    a.jcc(x64::kNe, bad);
  }
  void emit_jmp_reg(const Op& op) {
    Slow& s = slow_path(op);
    a.load(8, rax, gpr(op.insn.op[0].reg));
    canonical_or(rax, s.entry);
    a.store(8, field(&c.s_.rip), rax);
    chain_exit(op, 0, std::nullopt);
    bind_resume(s);  // (the handler ended the block: its slow path goes to `ended`)
  }
  void emit_call(const Op& op) {
    Slow& s = slow_path(op);
    load_gpr(r8, kRsp);
    a.lea(rsi, x64::at(r8, -8));
    a.mov(8, r8, rsi);
    translate(8, true, s.entry);
    mov_reloc(rax, op.next_rip, interp::Reloc::kRip);
    a.store(8, x64::at(rsi), rax);
    store_gpr(kRsp, r8);
    set_rip(op.target);
    chain_exit(op, slot_for(op, op.target), op.target);
    bind_resume(s);
  }
  void emit_ret(const Op& op) {
    Slow& s = slow_path(op);
    load_stack_top(s);
    canonical_or(rax, s.entry);
    const uint16_t extra = op.insn.operand_count >= 1 && is_imm(op.insn.op[0]) ? uint16_t(op.insn.op[0].disp) : 0;
    a.alu_imm(8, x64::kAdd, r8, 8 + extra);
    store_gpr(kRsp, r8);
    a.store(8, field(&c.s_.rip), rax);
    chain_exit(op, 0, std::nullopt);
    bind_resume(s);
  }

  // SSE templates (sse_template): XMM registers stay in s_.fxsave, XMM0/XMM1 of the host are scratch.
  // The CR0.EM/TS and CR4.OSFXSR checks every SSE instruction makes are made once, by the block's first SSE
  // template: nothing a block runs can change CR0 or CR4 (their writes end blocks).
  bool sse_checked = false;
  x64::Mem xmm(unsigned n, int32_t byte = 0) const {
    return x64::at(rbx, off(&c.s_.fxsave[0]) + 160 + int32_t(16 * n) + byte);
  }
  // The XINUSE bits the instruction sets, or VZEROUPPER/VZEROALL clear, once its template has completed (the slow
  // path's handler does the same through the reference executor).
  void mark_xinuse(const DecodedInsn& i) {
    const x64::Mem xinuse = x64::at(rbx, off(&c.s_.xinuse));
    if (i.xinuse) a.alu_imm(1, x64::kOr, xinuse, i.xinuse);
    if (i.mnemonic == ZYDIS_MNEMONIC_VZEROUPPER) a.alu_imm(1, x64::kAnd, xinuse, int32_t(uint8_t(~xcr0::kAvx)));
    if (i.mnemonic == ZYDIS_MNEMONIC_VZEROALL) a.alu_imm(1, x64::kAnd, xinuse, int32_t(uint8_t(~(xcr0::kSse | xcr0::kAvx))));
  }
  void emit_sse(const Op& op) {
    const DecodedInsn& i = op.insn;
    const SseTemplate t = sse_template(i);
    const interp::Operand &o0 = i.op[0], &o1 = i.op[1];
    Slow& s = slow_path(op);
    if (!sse_checked) {
      sse_checked = true;
      a.load(8, rax, field(&c.s_.cr0));
      a.alu_imm(4, x64::kAnd, rax, int32_t(cr0::kEm | cr0::kTs));
      a.jcc(x64::kNe, s.entry);
      a.load(8, rax, field(&c.s_.cr4));
      a.alu_imm(4, x64::kAnd, rax, int32_t(cr4::kOsfxsr));
      a.jcc(x64::kE, s.entry);
    }
    // The host address of memory operand `o` (n bytes, 16 of them aligned where the instruction needs it).
    auto memory = [&](const interp::Operand& o, unsigned n, bool write) {
      address(op, o);
      if (t.aligned && n == 16) {
        a.mov(4, rax, rsi);
        a.alu_imm(4, x64::kAnd, rax, 15);
        a.jcc(x64::kNe, s.entry);
      }
      translate(n, write, s.entry);
      return x64::at(rsi);
    };
    switch (t.kind) {
      case SseTemplate::kMove:
        if (is_mem(o0)) {
          const x64::Mem m = memory(o0, 16, true);
          a.movdqu_load(0, xmm(o1.reg));
          a.movdqu_store(m, 0);
        } else {
          a.movdqu_load(0, is_mem(o1) ? memory(o1, 16, false) : xmm(o1.reg));
          a.movdqu_store(xmm(o0.reg), 0);
        }
        break;
      case SseTemplate::kBinary:
        a.movdqu_load(1, is_mem(o1) ? memory(o1, 16, false) : xmm(o1.reg));
        a.movdqu_load(0, xmm(o0.reg));
        if (t.map) a.sse_rr3(t.prefix, t.map, t.opcode, 0, 1);
        else a.sse_rr(t.prefix, t.opcode, 0, 1);
        if (i.operand_count == 3) a.u8(uint8_t(i.op[2].disp));
        a.movdqu_store(xmm(o0.reg), 0);
        break;
      case SseTemplate::kPmovmskb:
        a.movdqu_load(0, xmm(o1.reg));
        a.sse_rr(0x66, 0xd7, rax, 0);
        store_reg(o0, rax, 4);
        break;
      case SseTemplate::kMovq:  // to XMM: the low 4 or 8 bytes, the rest cleared; from XMM: its low bytes
        if (o0.kind == interp::OpKind::kXmm) {
          const unsigned w = o1.kind == interp::OpKind::kXmm ? 8 : o1.size;
          if (o1.kind == interp::OpKind::kXmm) a.load(8, rax, xmm(o1.reg));
          else if (is_mem(o1)) a.load(w, rax, memory(o1, w, false));
          else load_reg(rax, o1, w);
          a.store(8, xmm(o0.reg), rax);
          a.store_imm(8, xmm(o0.reg, 8), 0);
        } else {
          const unsigned w = o0.size;
          a.load(w, rax, xmm(o1.reg));
          if (is_mem(o0)) {
            const x64::Mem m = memory(o0, w, true);
            a.store(w, m, rax);
          } else {
            store_reg(o0, rax, w);
          }
        }
        break;
      case SseTemplate::kMovLow:  // XMM to XMM: the low bytes, the rest kept; a load clears the rest
        if (o0.kind == interp::OpKind::kXmm && o1.kind == interp::OpKind::kXmm) {
          a.load(t.low, rax, xmm(o1.reg));
          a.store(t.low, xmm(o0.reg), rax);
        } else if (o0.kind == interp::OpKind::kXmm) {
          a.load(t.low, rax, memory(o1, t.low, false));
          a.store(8, xmm(o0.reg), rax);
          a.store_imm(8, xmm(o0.reg, 8), 0);
        } else {
          const x64::Mem m = memory(o0, t.low, true);
          a.load(t.low, rcx, xmm(o1.reg));
          a.store(t.low, m, rcx);
        }
        break;
      case SseTemplate::kNone:
        break;
    }
    mark_xinuse(i);
    bind_resume(s);
  }

  // MMX templates (mmx_template): MMn in its x87 slot of s_.fxsave (TOP is 0 whenever a template runs), XMM0
  // and XMM1 of the host as scratch. The CR0.EM/TS check is made once a block, as for SSE; the x87 state is
  // checked every time (EMMS and FXRSTOR run in blocks): with TOP = 0, every register valid and no x87
  // exception pending, the transition changes nothing, and only the written register's exponent is set.
  bool mmx_checked = false;
  x64::Mem mm_slot(unsigned n, int32_t byte = 0) const {
    return x64::at(rbx, off(&c.s_.fxsave[0]) + 32 + int32_t(16 * n) + byte);
  }
  void emit_mmx(const Op& op) {
    const DecodedInsn& i = op.insn;
    const MmxTemplate t = mmx_template(i);
    const interp::Operand &o0 = i.op[0], &o1 = i.op[1];
    Slow& s = slow_path(op);
    if (!mmx_checked) {
      mmx_checked = true;
      a.load(8, rax, field(&c.s_.cr0));
      a.alu_imm(4, x64::kAnd, rax, int32_t(cr0::kEm | cr0::kTs));
      a.jcc(x64::kNe, s.entry);
    }
    // FSW (TOP, ES) and the abridged tag word, as one dword from FSW's offset: FSW & 0x3880 = 0, FTW = 0xff.
    a.load(4, rax, x64::at(rbx, off(&c.s_.fxsave[0]) + 2));
    a.alu_imm(4, x64::kAnd, rax, 0x00ff3880);
    a.alu_imm(4, x64::kCmp, rax, 0x00ff0000);
    a.jcc(x64::kNe, s.entry);
    auto memory = [&](const interp::Operand& o, unsigned n, bool write) {
      address(op, o);
      translate(n, write, s.entry);
      return x64::at(rsi);
    };
    auto written = [&](unsigned n) { a.store_imm(8, mm_slot(n, 8), 0xffff); };  // exponent and sign all ones
    switch (t.kind) {
      case MmxTemplate::kLoad:
        if (o1.kind == interp::OpKind::kMmx) a.load(8, rax, mm_slot(o1.reg));
        else if (is_mem(o1)) a.load(t.bytes, rax, memory(o1, t.bytes, false));
        else load_reg(rax, o1, t.bytes);
        a.store(8, mm_slot(o0.reg), rax);
        written(o0.reg);
        break;
      case MmxTemplate::kStore:
        a.load(t.bytes, rax, mm_slot(o1.reg));
        if (is_mem(o0)) {
          const x64::Mem m = memory(o0, t.bytes, true);
          a.store(t.bytes, m, rax);
        } else {
          store_reg(o0, rax, t.bytes);
        }
        break;
      case MmxTemplate::kBinary:
        a.movq_load(1, is_mem(o1) ? memory(o1, 8, false) : mm_slot(o1.reg));
        a.movq_load(0, mm_slot(o0.reg));
        a.sse_rr(0x66, i.opcode, 0, 1);
        a.movq_store(mm_slot(o0.reg), 0);
        written(o0.reg);
        break;
      case MmxTemplate::kShiftImm:
        a.movq_load(0, mm_slot(o0.reg));
        a.sse_rr(0x66, i.opcode, (i.modrm >> 3) & 7, 0);
        a.u8(uint8_t(o1.disp));
        a.movq_store(mm_slot(o0.reg), 0);
        written(o0.reg);
        break;
      case MmxTemplate::kNone:
        break;
    }
    mark_xinuse(i);
    bind_resume(s);
  }

  // VEX templates (vex_template): the XMM halves in s_.fxsave, the upper ones in s_.ymmh, YMM0-3 of the host
  // scratch. The #UD and #NM checks of VEX (CR4.OSXSAVE, XCR0's SSE and AVX state, CR0.TS) are made once a block,
  // by its first VEX template: XSETBV and writes of CR0 and CR4 end blocks.
  bool avx_checked = false;
  x64::Mem ymmh(unsigned n, int32_t byte = 0) const {
    return x64::at(rbx, off(&c.s_.ymmh[0]) + int32_t(16 * n) + byte);
  }
  // Host vector register `h` = guest register `n` (its upper half too when `wide`).
  void vec_load(unsigned h, unsigned n, bool wide) {
    a.vmovdqu_load(h, xmm(n));
    if (wide) a.vinserti128_high(h, ymmh(n));
  }
  // Guest register `n` = host vector register `h` (bits 128-255 zero unless `wide`).
  void vec_store(unsigned n, unsigned h, bool wide) {
    a.vmovdqu_store(xmm(n), h);
    if (wide) {
      a.vextracti128_high(ymmh(n), h);
    } else {
      a.store_imm(8, ymmh(n), 0);
      a.store_imm(8, ymmh(n, 8), 0);
    }
  }
  void emit_vex(const Op& op) {
    const DecodedInsn& i = op.insn;
    const VexTemplate t = vex_template(i);
    const interp::Operand &o0 = i.op[0], &o1 = i.op[1];
    Slow& s = slow_path(op);
    if (!avx_checked) {
      avx_checked = true;
      a.load(8, rax, field(&c.s_.cr4));
      a.alu_imm(4, x64::kAnd, rax, int32_t(cr4::kOsxsave));
      a.jcc(x64::kE, s.entry);
      a.load(8, rax, field(&c.s_.xcr0));
      a.alu_imm(4, x64::kAnd, rax, int32_t(xcr0::kSse | xcr0::kAvx));
      a.alu_imm(4, x64::kCmp, rax, int32_t(xcr0::kSse | xcr0::kAvx));
      a.jcc(x64::kNe, s.entry);
      a.load(8, rax, field(&c.s_.cr0));
      a.alu_imm(4, x64::kAnd, rax, int32_t(cr0::kTs));
      a.jcc(x64::kNe, s.entry);
    }
    // The host address of memory operand `o` (n bytes, aligned to n where the instruction needs it).
    auto memory = [&](const interp::Operand& o, unsigned n, bool write) {
      address(op, o);
      if (t.aligned) {
        a.mov(4, rax, rsi);
        a.alu_imm(4, x64::kAnd, rax, int32_t(n - 1));
        a.jcc(x64::kNe, s.entry);
      }
      translate(n, write, s.entry);
      return x64::at(rsi);
    };
    const bool wide = i.flags & interp::insn_flags::kVexL;
    switch (t.kind) {
      case VexTemplate::kMove: {  // 16 or 32 bytes through XMM0, a half at a time
        const unsigned n = o0.kind == interp::OpKind::kXmm ? o0.size : o1.size;
        if (is_mem(o0)) {
          const x64::Mem m = memory(o0, n, true);
          a.vmovdqu_load(0, xmm(o1.reg));
          a.vmovdqu_store(m, 0);
          if (n == 32) {
            a.vmovdqu_load(0, ymmh(o1.reg));
            a.vmovdqu_store(x64::at(rsi, 16), 0);
          }
          break;
        }
        const x64::Mem from = is_mem(o1) ? memory(o1, n, false) : xmm(o1.reg);
        a.vmovdqu_load(0, from);
        a.vmovdqu_store(xmm(o0.reg), 0);
        if (n == 32) {
          a.vmovdqu_load(0, is_mem(o1) ? x64::at(rsi, 16) : ymmh(o1.reg));
          a.vmovdqu_store(ymmh(o0.reg), 0);
        } else {
          a.store_imm(8, ymmh(o0.reg), 0);
          a.store_imm(8, ymmh(o0.reg, 8), 0);
        }
        break;
      }
      case VexTemplate::kSame: {
        // Sources into the host registers of their fields; the guest's encoding with those; the destination back.
        // (Without a ModRM.reg operand, that field is the opcode's extension: the shifts by an immediate.)
        std::optional<x64::Mem> m;
        int imm = -1;
        bool vvvv = false, is4 = false, reg = false;
        auto host_of = [](interp::OpEnc e) { return e == interp::OpEnc::kModrmReg ? 0u : e == interp::OpEnc::kVvvv ? 1u
                                                   : e == interp::OpEnc::kModrmRm ? 2u : 3u; };
        for (int k = 0; k < i.operand_count; ++k) {
          const interp::Operand& o = i.op[k];
          vvvv = vvvv || o.enc == interp::OpEnc::kVvvv;
          is4 = is4 || o.enc == interp::OpEnc::kIs4;
          reg = reg || o.enc == interp::OpEnc::kModrmReg;
          if (is_imm(o)) imm = uint8_t(o.disp);
          else if (is_mem(o)) m = memory(o, o.size, false);
          else if (k > 0) vec_load(host_of(o.enc), o.reg, o.size == 32);
        }
        const bool w = i.flags & interp::insn_flags::kRexW;
        const unsigned reg_field = reg ? 0 : (i.modrm >> 3) & 7;
        if (m) a.vex_rm(i.opcode_map, i.vex_pp, wide, w, i.opcode, reg_field, vvvv ? 1 : 0, *m);
        else a.vex_rr(i.opcode_map, i.vex_pp, wide, w, i.opcode, reg_field, vvvv ? 1 : 0, 2);
        if (is4) a.u8(3 << 4);
        else if (imm >= 0) a.u8(uint8_t(imm));
        vec_store(o0.reg, host_of(o0.enc), o0.size == 32);
        break;
      }
      case VexTemplate::kMovemask:  // VPMOVMSKB/VMOVMSKPS/VMOVMSKPD r32, xmm/ymm
        vec_load(2, o1.reg, wide);
        a.vex_rr(i.opcode_map, i.vex_pp, wide, false, i.opcode, rax, 0, 2);
        store_reg(o0, rax, o0.size >= 4 ? o0.size : 4);
        break;
      case VexTemplate::kMovq:  // to XMM: the low 4 or 8 bytes, bits 32/64-255 cleared; from XMM: its low bytes
        if (o0.kind == interp::OpKind::kXmm) {
          const unsigned w = o1.kind == interp::OpKind::kXmm ? 8 : o1.size;
          if (o1.kind == interp::OpKind::kXmm) a.load(8, rax, xmm(o1.reg));
          else if (is_mem(o1)) a.load(w, rax, memory(o1, w, false));
          else load_reg(rax, o1, w);
          a.store(8, xmm(o0.reg), rax);
          a.store_imm(8, xmm(o0.reg, 8), 0);
          a.store_imm(8, ymmh(o0.reg), 0);
          a.store_imm(8, ymmh(o0.reg, 8), 0);
        } else {
          const unsigned w = o0.size;
          a.load(w, rax, xmm(o1.reg));
          if (is_mem(o0)) {
            const x64::Mem m = memory(o0, w, true);
            a.store(w, m, rax);
          } else {
            store_reg(o0, rax, w);
          }
        }
        break;
      case VexTemplate::kZeroUpper:
      case VexTemplate::kZeroAll:
        a.vpxor_zero(0);
        for (int32_t at = 0; at < 256; at += 32) a.vmovdqu_store(ymmh(0, at), 0, true);
        if (t.kind == VexTemplate::kZeroAll)
          for (int32_t at = 0; at < 256; at += 32) a.vmovdqu_store(xmm(0, at), 0, true);
        break;
      case VexTemplate::kNone:
        break;
    }
    mark_xinuse(i);
    bind_resume(s);
  }

  // BMI templates (bmi_template): the host's instruction of the guest's encoding with the registers renamed by
  // field: ModRM.reg RAX (or the opcode's extension: BLSI/BLSMSK/BLSR), VEX.vvvv RCX, ModRM.rm RDX or the memory
  // operand; the destination is whichever of them it is.
  void emit_bmi(const Op& op) {
    const DecodedInsn& i = op.insn;
    const interp::Operand& o0 = i.op[0];
    const unsigned w = o0.size;
    Slow& s = slow_path(op);
    std::optional<x64::Mem> m;
    int imm = -1;
    bool vvvv = false, reg = false;
    auto host_of = [](interp::OpEnc e) { return e == interp::OpEnc::kVvvv ? rcx : e == interp::OpEnc::kModrmRm ? rdx : rax; };
    for (int k = 0; k < i.operand_count; ++k) {  // the memory operand first (its translation uses RCX and RDX)
      const interp::Operand& o = i.op[k];
      vvvv = vvvv || o.enc == interp::OpEnc::kVvvv;
      reg = reg || o.enc == interp::OpEnc::kModrmReg;
      if (is_imm(o)) imm = uint8_t(o.disp);
      if (is_mem(o)) {
        address(op, o);
        translate(w, false, s.entry);
        m = x64::at(rsi);
      }
    }
    for (int k = 1; k < i.operand_count; ++k)
      if (i.op[k].kind == interp::OpKind::kGpr) load_reg(host_of(i.op[k].enc), i.op[k], w);
    const Reg dst = host_of(o0.enc);
    raw({rax, rcx, rdx}, [&] {
      if (i.flags & interp::insn_flags::kVex) {
        const unsigned reg_field = reg ? unsigned(rax) : (i.modrm >> 3) & 7u;
        if (m) a.vex_rm(i.opcode_map, i.vex_pp, false, w == 8, i.opcode, reg_field, vvvv ? rcx : 0, *m);
        else a.vex_rr(i.opcode_map, i.vex_pp, false, w == 8, i.opcode, reg_field, vvvv ? rcx : 0, rdx);
      } else {  // TZCNT/LZCNT: F3 [REX.W] 0F BC/BD
        a.u8(0xf3);
        if (m) a.op2_rm(w, i.opcode, rax, *m);
        else a.op2_rr(w, i.opcode, rax, rdx);
      }
      if (imm >= 0) a.u8(uint8_t(imm));
    });
    store_reg(o0, dst, w);
    bind_resume(s);
  }

  // ---- the block -------------------------------------------------------------------------------------------
  size_t body_offset = 0;
  // Where a linked block's exit (chain_exit) comes in, with RBX set and RBX's push on the stack, RAX this
  // block, RCX the instructions the block before retired, RDX its operation and RIP this block's. Each
  // entry checks what the runner would before entering this block (counted: the counter's limit; other
  // page: this page still mapped as when it was translated, executable at this privilege; all: the step
  // limit, a kick, chaining allowed), then counts the block before and makes this one the running block.
  // A refusal hands the block before's operation back to the runner (`refused`), as its own exit would.
  // The checks live here, once, rather than at each of the many exits that lead here.
  size_t entry_offset[4] = {};  // indexed like Block::chain_entry
  // Each slot's direct exit (Block::exit_jump): where its rel32 is (SIZE_MAX: none) and the entry it takes.
  size_t exit_at[2] = {SIZE_MAX, SIZE_MAX};
  uint8_t exit_entry[2] = {0, 0};
  // chain_exit's call of next_body for the operation `lookup_op` (a Jcc has two exits).
  const Op* lookup_op = nullptr;
  x64::Label lookup;
  x64::Label refused, refused_unmapped;
  void emit_chain_entries() {
    const auto counter_check = [&] {
      a.load(8, r8, field(&c.branches_));
      a.alu(8, x64::kCmp, r8, field(&c.branch_limit_));
      a.jcc(x64::kAe, refused);
    };
    x64::Label checks;
    if (paged64) {
      entry_offset[3] = a.size();
      counter_check();
      entry_offset[1] = a.size();
      const uint64_t vpn = block.linear >> 12;
      const int32_t entry = off(&c.tlb_[vpn & c.tlb_mask_]);
      mov_reloc(r8, vpn, interp::Reloc::kVpn);
      a.alu(8, x64::kCmp, r8, block_tlb_field(entry, offsetof(TlbEntry, tag)));
      note_reloc(interp::Reloc::kTlbDisp, interp::Reloc::kDisp32);
      a.jcc(x64::kNe, refused_unmapped);
      a.mov_imm64(r8, block.phys & ~0xfffull);
      a.alu(8, x64::kCmp, r8, block_tlb_field(entry, offsetof(TlbEntry, phys)));
      note_reloc(interp::Reloc::kTlbDisp, interp::Reloc::kDisp32);
      a.jcc(x64::kNe, refused_unmapped);
      a.alu_imm(1, x64::kCmp, block_tlb_field(entry, offsetof(TlbEntry, nx)), 0);
      note_reloc(interp::Reloc::kTlbDisp, interp::Reloc::kDisp32, 1);  // (before the imm8)
      a.jcc(x64::kNe, refused_unmapped);
      if (user) {
        a.alu_imm(1, x64::kCmp, block_tlb_field(entry, offsetof(TlbEntry, user)), 0);
        note_reloc(interp::Reloc::kTlbDisp, interp::Reloc::kDisp32, 1);
        a.jcc(x64::kE, refused_unmapped);
      }
      a.jmp(checks);
    }
    entry_offset[2] = a.size();
    counter_check();
    a.bind(checks);
    entry_offset[0] = a.size();
    if (!paged64) {
      entry_offset[1] = entry_offset[0];
      entry_offset[3] = entry_offset[2];
    }
    a.alu(8, x64::kAdd, rcx, field(&c.steps_));  // the steps once the block before has retired
    a.lea(r8, x64::at(rcx, int32_t(block.count)));
    a.alu(8, x64::kCmp, r8, field(&c.fast_step_limit_));
    a.jcc(x64::kA, refused);
    // chain_ok_ and kicked_ as one word: chaining allowed and no kick.
    a.alu_imm(2, x64::kCmp, x64::at(rbx, off(&c.chain_ok_)), 1);
    a.jcc(x64::kNe, refused);
    a.store(8, field(&c.steps_), rcx);
    mov_reloc(rax, reinterpret_cast<uint64_t>(&block), interp::Reloc::kBlock);  // (a direct exit does not say which block it enters)
    a.store(8, x64::at(rbx, off(&c.running_block_)), rax);
  }

  void compile() {
    a.push(rbx);  // also aligns the stack for calls
    a.mov(8, rbx, rdi);
    x64::Label body;
    a.jmp(body);
    emit_chain_entries();
    a.bind(body);
    body_offset = a.size();  // next_body's chains come in here, with RBX set and RBX's push on the stack
    const size_t n = block.ops.size();
    std::vector<Form> forms(n);
    std::vector<bool> keep_flags(n, true);
    for (size_t k = 0; k < n; ++k) forms[k] = form_of(block.ops[k]);
    // Flag stores nothing can see are dropped: a producer's flags are needed when, before the next
    // operation that sets all of them, something reads them or the block may be left.
    bool needed = true;
    for (size_t k = n; k-- > 0;) {
      const FlagUse u = flag_use(block.ops[k], forms[k]);
      keep_flags[k] = needed;
      if (u.reads || u.can_exit) needed = true;
      else if (u.writes) needed = false;
    }
    for (size_t k = 0; k < n; ++k) {
      const Op& op = block.ops[k];
      switch (forms[k]) {
        case Form::kMov: emit_mov(op); break;
        case Form::kExtend: emit_extend(op); break;
        case Form::kLea: emit_lea(op); break;
        case Form::kAlu: emit_alu(op, keep_flags[k]); break;
        case Form::kIncDec: case Form::kNegNot: emit_incdec_negnot(op, keep_flags[k]); break;
        case Form::kShift: emit_shift(op, keep_flags[k]); break;
        case Form::kShiftCl: emit_shift_cl(op, keep_flags[k]); known = false; break;
        case Form::kBswap: emit_bswap(op); break;
        case Form::kSignExtendAcc: emit_sign_extend_acc(op); break;
        case Form::kTransfer: emit_transfer(op); break;
        case Form::kRotate: emit_rotate(op); known = false; break;
        case Form::kBitTest: emit_bit_test(op); known = false; break;
        case Form::kImul: emit_imul(op, keep_flags[k]); break;
        case Form::kCmov: emit_cmov(op); break;
        case Form::kSetcc: emit_setcc(op); break;
        case Form::kPush: emit_push(op); break;
        case Form::kPop: emit_pop(op); break;
        case Form::kJcc: emit_jcc(op); break;
        case Form::kJmp: set_rip(op.target); chain_exit(op, slot_for(op, op.target), op.target); break;
        case Form::kJmpReg: emit_jmp_reg(op); break;
        case Form::kCallRel: emit_call(op); break;
        case Form::kRet: emit_ret(op); break;
        case Form::kNop: break;
        case Form::kSse: emit_sse(op); break;
        case Form::kMmx: emit_mmx(op); break;
        case Form::kVex: emit_vex(op); break;
        case Form::kBmi:
          if (bmi_template(op.insn) == BmiTemplate::kFlags && keep_flags[k]) {
            call_handler(op);  // (its flags are read: the handler's, deja's undefined flags included)
            known = false;
          } else {
            emit_bmi(op);
          }
          break;
        case Form::kFallThrough: set_rip(op.rip); chain_exit(op, 1, op.rip); break;
        default:
          call_handler(op);
          // What the handler left in the flags is not known here (unless it cannot touch them).
          if (!(op.insn.mnemonic == ZYDIS_MNEMONIC_MOV || op.insn.mnemonic == ZYDIS_MNEMONIC_LEA ||
                op.insn.mnemonic == ZYDIS_MNEMONIC_PUSH || op.insn.mnemonic == ZYDIS_MNEMONIC_POP ||
                op.insn.mnemonic == ZYDIS_MNEMONIC_MOVZX || op.insn.mnemonic == ZYDIS_MNEMONIC_MOVSX ||
                op.insn.mnemonic == ZYDIS_MNEMONIC_MOVSXD || op.insn.mnemonic == ZYDIS_MNEMONIC_XCHG))
            known = false;
          break;
      }
    }
    // The handlers' out-of-line calls: the whole instruction, then on with the block (or out of it).
    for (auto& s : slows) {
      a.bind(s.entry);
      call_handler(*s.op);
      for (int slot = 0; slot < kHeldSlots; ++slot)
        if (s.held[slot] >= 0) a.load(8, Reg(s.held[slot]), slot_mem(slot));
      a.jmp(s.resume);
    }
    a.bind(ended);
    a.load(8, rax, x64::at(rbx, off(&c.running_op_)));
    a.pop(rbx);
    a.ret();
    // This page's TLB entry is not the one it was translated with (flushed by a CR3 load, or evicted from
    // the direct-mapped TLB): next_body makes the walk the runner's lookup would, and goes on to whatever
    // block RIP now maps to, without a round trip through the runner (900,000 a Linux boot).
    if (paged64) {
      x64::Label gone;
      a.bind(refused_unmapped);
      a.store(8, x64::at(rbx, off(&c.chain_op_)), rdx);
      a.mov(8, rsi, rcx);
      a.mov_imm64(rdx, kNoLink);
      go_through_next_body(gone);
      a.bind(gone);
      a.load(8, rdx, x64::at(rbx, off(&c.chain_op_)));
    }
    a.bind(refused);
    a.mov(8, rax, rdx);
    a.pop(rbx);
    a.ret();
  }
};

bool InterpBackend::compile_block(Block& block) {
  if (!jit_) jit_ = std::make_unique<interp::JitBuffer>(interp::BlockCache::capacity_for(ram_size_));
  if (!jit_->ok()) return false;
  static_assert(sizeof(TlbEntry) == 64, "the JIT indexes the software TLB by shifting");
  static_assert(sizeof(JumpEntry) == 32, "the JIT indexes the jump cache by shifting");
  static_assert(sizeof(kicked_) == 1, "chain entries read chain_ok_ and kicked_ as one word");
  DEJA_ASSERT(member_offset(this, &kicked_) == member_offset(this, &chain_ok_) + 1,
              "chain entries read chain_ok_ and kicked_ as one word");
  Jit jit(*this, block, std::move(jit_->scratch));
  jit.compile();
  struct GiveBack {  // the scratch buffer goes back, capacity and all, whatever happens below
    interp::JitBuffer& buffer;
    std::vector<uint8_t>& code;
    ~GiveBack() { buffer.scratch = std::move(code); }
  } give_back{*jit_, jit.a.code};
  // Room first: a full buffer drops every block (their code with it) before this one joins the cache.
  if (jit_->used() + jit.a.size() + 16 > jit_->capacity()) {
    blocks_.clear();
    jit_->reset();
  }
  void* code = jit_->add({jit.a.code.data(), jit.a.size()});
  if (!code) return false;
  block.code = reinterpret_cast<Block::Code>(code);
  block.body = static_cast<const uint8_t*>(code) + jit.body_offset;
  for (int k = 0; k < 4; ++k) block.chain_entry[k] = static_cast<const uint8_t*>(code) + jit.entry_offset[k];
  for (int slot = 0; slot < 2; ++slot) {
    if (jit.exit_at[slot] == SIZE_MAX) continue;
    block.exit_jump[slot] = static_cast<uint8_t*>(code) + jit.exit_at[slot];
    block.exit_unlinked[slot] = block.exit_jump[slot] + 4;
    block.exit_entry[slot] = jit.exit_entry[slot];
  }
  block.code_bytes = uint32_t(jit.a.size());
  block.relocs = std::move(jit.relocs);
  block.relocatable = jit.relocatable;
  jit_->note_for_perf(code, jit.a.size(), block.rip);
  if (const char* dir = std::getenv("DEJA_JIT_DUMP")) {
    // For reading the generated code: objdump -D -b binary -mi386:x86-64 DIR/block-RIP.bin
    const std::string path = fmt::format("{}/block-{:x}.bin", dir, block.rip);
    const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd >= 0) {
      (void)!write(fd, jit.a.code.data(), jit.a.size());
      close(fd);
    }
  }
  return true;
}


bool InterpBackend::relocate_code(Block& to, const Block& from, void* room) {
  if (!from.code || !from.relocatable || !jit_) return false;
  // Room first, as compile_block: a full buffer is left to it (it drops every block, `from` included).
  if (!room && jit_->used() + from.code_bytes + 16 > jit_->capacity()) return false;
  std::vector<uint8_t>& code = jit_->scratch;
  const auto* source = reinterpret_cast<const uint8_t*>(from.code);
  code.assign(source, source + from.code_bytes);
  const uint64_t delta = to.rip - from.rip;
  const auto tlb_disp = [&](uint64_t linear) { return int64_t((linear >> 12) & tlb_mask_) * int64_t(sizeof(TlbEntry)); };
  for (const interp::Reloc& r : from.relocs) {
    uint8_t* field = code.data() + r.at;
    const unsigned width = r.form == interp::Reloc::kImm64 ? 8 : 4;
    uint64_t value = 0;
    std::memcpy(&value, field, width);
    if (width == 4) value = r.form == interp::Reloc::kImm32Zero ? uint32_t(value) : uint64_t(int64_t(int32_t(value)));
    switch (r.kind) {
      case interp::Reloc::kRip: value += delta; break;
      case interp::Reloc::kVpn: value = to.linear >> 12; break;
      case interp::Reloc::kTlbDisp: value += tlb_disp(to.linear) - tlb_disp(from.linear); break;
      case interp::Reloc::kOp:
        value += reinterpret_cast<uintptr_t>(to.ops.data()) - reinterpret_cast<uintptr_t>(from.ops.data());
        break;
      case interp::Reloc::kBlock: value += reinterpret_cast<uintptr_t>(&to) - reinterpret_cast<uintptr_t>(&from); break;
    }
    // The moved value must keep its encoding (the code's length and layout are the source's).
    const int64_t sv = int64_t(value);
    const bool int32 = sv >= INT32_MIN && sv <= INT32_MAX;
    bool keeps = false;
    switch (r.form) {
      case interp::Reloc::kImm64: keeps = value > 0xffffffffu && !int32; break;
      case interp::Reloc::kImm32Zero: keeps = value <= 0xffffffffu; break;
      case interp::Reloc::kImm32Sign: keeps = int32 && sv < 0; break;
      case interp::Reloc::kStoreImm32: keeps = int32; break;
      case interp::Reloc::kDisp32: keeps = int32 && (sv < -128 || sv > 127); break;
    }
    if (!keeps) return false;
    std::memcpy(field, &value, width);
  }
  void* placed = room ? std::memcpy(room, code.data(), code.size()) : jit_->add({code.data(), code.size()});
  if (!placed) return false;
  const auto moved = [&](const void* p) {
    return static_cast<const uint8_t*>(placed) + (static_cast<const uint8_t*>(p) - source);
  };
  to.code = reinterpret_cast<Block::Code>(placed);
  to.body = moved(from.body);
  for (int k = 0; k < 4; ++k) to.chain_entry[k] = moved(from.chain_entry[k]);
  for (int slot = 0; slot < 2; ++slot) {
    if (!from.exit_jump[slot]) continue;
    to.exit_jump[slot] = const_cast<uint8_t*>(moved(from.exit_jump[slot]));
    to.exit_unlinked[slot] = moved(from.exit_unlinked[slot]);
    to.exit_entry[slot] = from.exit_entry[slot];
    interp::BlockCache::unlink_exit(to, slot);  // (the copy jumps where the source's link went)
  }
  to.code_bytes = from.code_bytes;
  to.relocs = from.relocs;
  to.relocatable = true;
  if (check_clones_) {
    // The copy must be what compiling the moved operations gives, byte for byte, the direct exits' jumps aside.
    Jit jit(*this, to, std::move(jit_->scratch));
    jit.compile();
    std::vector<uint8_t> fresh = std::move(jit.a.code);
    fresh.resize(jit.a.size());
    jit_->scratch = std::move(fresh);
    const auto* copy = reinterpret_cast<const uint8_t*>(placed);
    size_t differs = jit_->scratch.size() == to.code_bytes ? SIZE_MAX : 0;
    for (size_t i = 0; differs == SIZE_MAX && i < to.code_bytes; ++i) {
      const bool exit_jump = (to.exit_jump[0] && copy + i >= to.exit_jump[0] && copy + i < to.exit_jump[0] + 4) ||
                             (to.exit_jump[1] && copy + i >= to.exit_jump[1] && copy + i < to.exit_jump[1] + 4);
      if (!exit_jump && copy[i] != jit_->scratch[i]) differs = i;
    }
    DEJA_ASSERT(differs == SIZE_MAX,
                "JIT: the code of the block at {:#x} relocated from {:#x} differs from its compilation at byte {} "
                "(sizes {} and {})",
                to.rip, from.rip, differs, to.code_bytes, jit_->scratch.size());
  }
  jit_->note_for_perf(placed, to.code_bytes, to.rip);
  return true;
}

const Op* InterpBackend::run_block(const Block& block) {
  if (block.code) {
    const Op* last = block.code(this);
    if (jit_trap_) [[unlikely]] {
      const uint8_t trap = jit_trap_;
      jit_trap_ = 0;
      if (trap == kJitFault) throw jit_fault_;
      throw ExitRequest{};
    }
    return last;
  }
  const Op* op = block.ops.data();
  do {
    running_op_ = op;
    op = op->fn(*this, op);
  } while (op);
  return running_op_;
}

}  // namespace deja
