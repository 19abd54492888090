// Random instruction sequences for the differential tester: Zydis-encoded, with SDM-undefined flags tracked per instruction.
#include "tests/interp/diff/generator.h"

#include <Zydis/Zydis.h>
#include <fmt/format.h>

#include <bit>
#include <cstring>
#include <initializer_list>
#include <string_view>

namespace deja::difftest {
namespace {

constexpr uint64_t kCf = 1, kPf = 4, kAf = 0x10, kZf = 0x40, kSf = 0x80, kOf = 0x800;
constexpr uint64_t kAll = kCf | kPf | kAf | kZf | kSf | kOf;

// RSP is the stack and R15 the base of every memory operand, so neither is a random operand.
constexpr ZydisRegister kGpr8[] = {ZYDIS_REGISTER_AL, ZYDIS_REGISTER_CL, ZYDIS_REGISTER_DL, ZYDIS_REGISTER_BL,
                                   ZYDIS_REGISTER_BPL, ZYDIS_REGISTER_SIL, ZYDIS_REGISTER_DIL, ZYDIS_REGISTER_R8B,
                                   ZYDIS_REGISTER_R9B, ZYDIS_REGISTER_R10B, ZYDIS_REGISTER_R11B, ZYDIS_REGISTER_R12B,
                                   ZYDIS_REGISTER_R13B, ZYDIS_REGISTER_R14B, ZYDIS_REGISTER_AH, ZYDIS_REGISTER_BH};
constexpr ZydisRegister kGpr16[] = {ZYDIS_REGISTER_AX, ZYDIS_REGISTER_CX, ZYDIS_REGISTER_DX, ZYDIS_REGISTER_BX,
                                    ZYDIS_REGISTER_BP, ZYDIS_REGISTER_SI, ZYDIS_REGISTER_DI, ZYDIS_REGISTER_R8W,
                                    ZYDIS_REGISTER_R9W, ZYDIS_REGISTER_R10W, ZYDIS_REGISTER_R11W, ZYDIS_REGISTER_R12W,
                                    ZYDIS_REGISTER_R13W, ZYDIS_REGISTER_R14W};
constexpr ZydisRegister kGpr32[] = {ZYDIS_REGISTER_EAX, ZYDIS_REGISTER_ECX, ZYDIS_REGISTER_EDX, ZYDIS_REGISTER_EBX,
                                    ZYDIS_REGISTER_EBP, ZYDIS_REGISTER_ESI, ZYDIS_REGISTER_EDI, ZYDIS_REGISTER_R8D,
                                    ZYDIS_REGISTER_R9D, ZYDIS_REGISTER_R10D, ZYDIS_REGISTER_R11D, ZYDIS_REGISTER_R12D,
                                    ZYDIS_REGISTER_R13D, ZYDIS_REGISTER_R14D};
constexpr ZydisRegister kGpr64[] = {ZYDIS_REGISTER_RAX, ZYDIS_REGISTER_RCX, ZYDIS_REGISTER_RDX, ZYDIS_REGISTER_RBX,
                                    ZYDIS_REGISTER_RBP, ZYDIS_REGISTER_RSI, ZYDIS_REGISTER_RDI, ZYDIS_REGISTER_R8,
                                    ZYDIS_REGISTER_R9, ZYDIS_REGISTER_R10, ZYDIS_REGISTER_R11, ZYDIS_REGISTER_R12,
                                    ZYDIS_REGISTER_R13, ZYDIS_REGISTER_R14};

// Flags each condition code (0 = O ... 15 = G) reads.
constexpr uint64_t kCcReads[16] = {kOf, kOf, kCf, kCf, kZf, kZf, kCf | kZf, kCf | kZf,
                                   kSf, kSf, kPf, kPf, kSf | kOf, kSf | kOf, kZf | kSf | kOf, kZf | kSf | kOf};
constexpr ZydisMnemonic kCmov[16] = {ZYDIS_MNEMONIC_CMOVO, ZYDIS_MNEMONIC_CMOVNO, ZYDIS_MNEMONIC_CMOVB, ZYDIS_MNEMONIC_CMOVNB,
                                     ZYDIS_MNEMONIC_CMOVZ, ZYDIS_MNEMONIC_CMOVNZ, ZYDIS_MNEMONIC_CMOVBE, ZYDIS_MNEMONIC_CMOVNBE,
                                     ZYDIS_MNEMONIC_CMOVS, ZYDIS_MNEMONIC_CMOVNS, ZYDIS_MNEMONIC_CMOVP, ZYDIS_MNEMONIC_CMOVNP,
                                     ZYDIS_MNEMONIC_CMOVL, ZYDIS_MNEMONIC_CMOVNL, ZYDIS_MNEMONIC_CMOVLE, ZYDIS_MNEMONIC_CMOVNLE};
constexpr ZydisMnemonic kSetcc[16] = {ZYDIS_MNEMONIC_SETO, ZYDIS_MNEMONIC_SETNO, ZYDIS_MNEMONIC_SETB, ZYDIS_MNEMONIC_SETNB,
                                      ZYDIS_MNEMONIC_SETZ, ZYDIS_MNEMONIC_SETNZ, ZYDIS_MNEMONIC_SETBE, ZYDIS_MNEMONIC_SETNBE,
                                      ZYDIS_MNEMONIC_SETS, ZYDIS_MNEMONIC_SETNS, ZYDIS_MNEMONIC_SETP, ZYDIS_MNEMONIC_SETNP,
                                      ZYDIS_MNEMONIC_SETL, ZYDIS_MNEMONIC_SETNL, ZYDIS_MNEMONIC_SETLE, ZYDIS_MNEMONIC_SETNLE};

struct Opnd {
  enum Kind { kReg, kMem, kImm } kind;
  ZydisRegister reg = ZYDIS_REGISTER_NONE;
  uint16_t size = 0;  // memory operand bytes
  int64_t disp = 0;
  int64_t imm = 0;
};
Opnd reg(ZydisRegister r) { return {Opnd::kReg, r}; }
Opnd imm(int64_t v) { return {Opnd::kImm, ZYDIS_REGISTER_NONE, 0, 0, v}; }

bool encode(ZydisMnemonic mnemonic, std::initializer_list<Opnd> ops, std::vector<uint8_t>& out) {
  ZydisEncoderRequest request;
  std::memset(&request, 0, sizeof(request));
  request.machine_mode = ZYDIS_MACHINE_MODE_LONG_64;
  request.mnemonic = mnemonic;
  request.operand_count = static_cast<ZyanU8>(ops.size());
  int i = 0;
  for (const Opnd& op : ops) {
    ZydisEncoderOperand& o = request.operands[i++];
    switch (op.kind) {
      case Opnd::kReg:
        o.type = ZYDIS_OPERAND_TYPE_REGISTER;
        o.reg.value = op.reg;
        break;
      case Opnd::kMem:
        o.type = ZYDIS_OPERAND_TYPE_MEMORY;
        o.mem.base = ZYDIS_REGISTER_R15;
        o.mem.index = ZYDIS_REGISTER_NONE;
        o.mem.displacement = op.disp;
        o.mem.size = op.size;
        break;
      case Opnd::kImm:
        o.type = ZYDIS_OPERAND_TYPE_IMMEDIATE;
        o.imm.s = op.imm;
        break;
    }
  }
  uint8_t buffer[ZYDIS_MAX_INSTRUCTION_LENGTH];
  ZyanUSize length = sizeof(buffer);
  if (!ZYAN_SUCCESS(ZydisEncoderEncodeInstruction(&request, buffer, &length))) return false;
  out.insert(out.end(), buffer, buffer + length);
  return true;
}

// One generated step: its bytes and what it does to the arithmetic flags.
struct Step {
  std::vector<uint8_t> bytes;
  uint64_t reads = 0;      // flags whose value the step's result depends on
  uint64_t defines = 0;    // flags it writes with SDM-defined values
  uint64_t undefines = 0;  // flags it leaves undefined
  const char* cls = "";
};

}  // namespace

Generator::Generator(uint64_t seed, bool has_tzcnt, bool has_lzcnt) : rng_(seed), tzcnt_(has_tzcnt), lzcnt_(has_lzcnt) {}

uint64_t Generator::interesting(unsigned width) {
  const uint64_t mask = width >= 64 ? ~0ull : (1ull << width) - 1;
  const uint64_t sign = 1ull << (width - 1);
  switch (rng_() % 10) {
    case 0: return 0;
    case 1: return 1;
    case 2: return mask;
    case 3: return sign;
    case 4: return sign - 1;
    case 5: return rng_() % 64;
    default: return rng_() & mask;
  }
}

std::vector<uint8_t> Generator::data() {
  std::vector<uint8_t> bytes(kDataSize);
  for (size_t i = 0; i < bytes.size(); i += 8) {
    uint64_t v = rng_();
    switch (rng_() % 4) {
      case 0: v = std::bit_cast<uint64_t>(static_cast<double>(static_cast<int64_t>(rng_() % 20001) - 10000) / 8.0); break;
      case 1: v = (uint64_t{std::bit_cast<uint32_t>(static_cast<float>(rng_() % 1000) / 3.0f)} << 32) |
                  std::bit_cast<uint32_t>(-static_cast<float>(rng_() % 1000) / 7.0f); break;
      case 2: v = interesting(64); break;
      default: break;
    }
    std::memcpy(&bytes[i], &v, 8);
  }
  return bytes;
}

RegisterFile Generator::registers() {
  RegisterFile r;
  for (auto& g : r.gpr) g = interesting(64);
  r.gpr[4] = kInitialRsp;
  r.gpr[15] = kDataAddr;
  r.rflags = 0x2 | (rng_() & kAll);
  r.mxcsr = 0x1f80;
  if (rng_() % 4 == 0) r.mxcsr |= static_cast<uint32_t>(rng_() & 0xe040);  // RC, FTZ, DAZ
  if (rng_() % 16 == 0) r.mxcsr &= ~static_cast<uint32_t>(rng_() & 0x1f80);  // some exceptions unmasked
  if (avoid_unmasked_underflow) r.mxcsr |= 0x800;
  const std::vector<uint8_t> lanes = data();
  for (int i = 0; i < 16; ++i) std::memcpy(r.xmm[i].data(), &lanes[(rng_() % (kDataSize / 16)) * 16], 16);
  // x87: the sequence's control word, a random TOP, tags, condition codes and (now and then) flags, with ES
  // and B consistent with them, and a register file of interesting values.
  std::memcpy(&r.fx[0], &x87_control_, 2);
  uint16_t status = static_cast<uint16_t>((rng_() % 8) << 11) | static_cast<uint16_t>(rng_() & 0x4700);
  if (rng_() % 8 == 0) status |= static_cast<uint16_t>(rng_() & 0x7f);
  if (status & ~x87_control_ & 0x3f) status |= 0x8080;
  std::memcpy(&r.fx[2], &status, 2);
  r.fx[4] = static_cast<uint8_t>(rng_() % 4 == 0 ? 0 : rng_());
  for (int i = 0; i < 8; ++i) x87_value(&r.fx[32 + 16 * i]);
  std::memcpy(&r.fx[24], &r.mxcsr, 4);
  const uint32_t mxcsr_mask = 0xffff;
  std::memcpy(&r.fx[28], &mxcsr_mask, 4);
  return r;
}

void Generator::x87_value(uint8_t* slot) {
  uint64_t sig = rng_() | (1ull << 63);
  uint16_t exponent = static_cast<uint16_t>(0x3fff + static_cast<int>(rng_() % 140) - 70);
  switch (rng_() % 14) {
    case 0: sig = 0; exponent = 0; break;                                   // zero
    case 1: sig = rng_() >> (1 + rng_() % 63); exponent = 0; break;         // denormal
    case 2: sig = 1ull << 63; exponent = 0x7fff; break;                     // infinity
    case 3: sig |= 1ull << 62; exponent = 0x7fff; break;                    // QNaN
    case 4: sig = (sig & ~(1ull << 62)) | 1; exponent = 0x7fff; break;     // SNaN
    case 5: sig = (rng_() % 1000 + 1) << 54; exponent = 0x3fff + 9; break;  // small integers and halves
    case 6: exponent = static_cast<uint16_t>(rng_() % 2 ? 1 + rng_() % 70 : 0x7ffe - rng_() % 70); break;  // extremes
    case 7:
      if (rng_() % 4 == 0) sig &= ~(1ull << 63);  // now and then an unnormal or a pseudo-denormal
      if (rng_() % 8 == 0) exponent = 0;
      break;
    default: break;
  }
  exponent = static_cast<uint16_t>(exponent | (rng_() % 2 ? 0x8000 : 0));
  std::memcpy(slot, &sig, 8);
  std::memcpy(slot + 8, &exponent, 2);
}

// One x87 instruction (never a transcendental: those are computed in software and differ between Intel and
// AMD), as raw bytes: memory operands are [r15 + disp32].
bool Generator::emit_x87(Sequence& seq, std::vector<uint8_t>& b, uint64_t& reads, uint64_t& defines, const char*& cls) {
  bool uses_memory = false;
  auto memory = [&](uint8_t opcode, unsigned reg, unsigned size) {
    const uint32_t disp = static_cast<uint32_t>(rng_() % ((0x700 - size) / 8)) * 8;
    b.insert(b.end(), {0x41, opcode, static_cast<uint8_t>(0x80 | (reg << 3) | 7)});
    for (int i = 0; i < 4; ++i) b.push_back(static_cast<uint8_t>(disp >> (8 * i)));
    uses_memory = true;
  };
  auto registers = [&](uint8_t opcode, uint8_t modrm) { b.insert(b.end(), {opcode, modrm}); };
  const unsigned sti = static_cast<unsigned>(rng_() % 8);
  bool control = false;
  bool vendor_pointers = false;  // an instruction AMD does not record in FIP/FOP
  bool stores_status = false;    // FNSTSW, FNSTENV, FNSAVE
  cls = "x87";
  switch (rng_() % 16) {
    case 0:  // loads
      switch (rng_() % 7) {
        case 0: memory(0xd9, 0, 4); break;                                // FLD m32fp
        case 1: memory(0xdd, 0, 8); break;                                // FLD m64fp
        case 2: memory(0xdb, 5, 10); break;                               // FLD m80fp
        case 3: registers(0xd9, static_cast<uint8_t>(0xc0 + sti)); break;  // FLD ST(i)
        case 4: memory(rng_() % 2 ? 0xdf : 0xdb, 0, 4); break;           // FILD m16int / m32int
        case 5: memory(0xdf, 5, 8); break;                                // FILD m64int
        default: registers(0xd9, static_cast<uint8_t>(0xe8 + rng_() % 7)); break;  // FLD1 ... FLDZ
      }
      cls = "x87-load";
      break;
    case 1:  // stores
      switch (rng_() % 8) {
        case 0: memory(0xd9, 2 + rng_() % 2, 4); break;  // FST/FSTP m32fp
        case 1: memory(0xdd, 2 + rng_() % 2, 8); break;  // FST/FSTP m64fp
        case 2: memory(0xdb, 7, 10); break;              // FSTP m80fp
        case 3: registers(0xdd, static_cast<uint8_t>((rng_() % 2 ? 0xd0 : 0xd8) + sti)); break;  // FST/FSTP ST(i)
        case 4: memory(0xdf, 2 + rng_() % 2, 2); break;  // FIST/FISTP m16int
        case 5: memory(0xdb, 2 + rng_() % 2, 4); break;  // FIST/FISTP m32int
        case 6: memory(0xdf, 7, 8); break;               // FISTP m64int
        default: memory(0xdf, 6, 10); break;             // FBSTP
      }
      cls = "x87-store";
      break;
    case 2:
    case 3:
    case 4: {  // arithmetic: m32fp, m64fp, m32int, m16int; ST(0) op ST(i); ST(i) op ST(0) with and without pop
      static constexpr unsigned kOps[] = {0, 1, 4, 5, 6, 7};
      const unsigned op = kOps[rng_() % 6];
      switch (rng_() % 7) {
        case 0: memory(0xd8, op, 4); break;
        case 1: memory(0xdc, op, 8); break;
        case 2: memory(0xda, op, 4); break;
        case 3: memory(0xde, op, 2); break;
        case 4: registers(0xd8, static_cast<uint8_t>(0xc0 | (op << 3) | sti)); break;
        case 5: registers(0xdc, static_cast<uint8_t>(0xc0 | (op << 3) | sti)); break;
        default: registers(0xde, static_cast<uint8_t>(0xc0 | (op << 3) | sti)); break;
      }
      cls = "x87-arith";
      break;
    }
    case 5:  // compares into the condition codes
      switch (rng_() % 8) {
        case 0: memory(0xd8, 2 + rng_() % 2, 4); break;                                     // FCOM(P) m32fp
        case 1: memory(0xdc, 2 + rng_() % 2, 8); break;                                     // FCOM(P) m64fp
        case 2: memory(rng_() % 2 ? 0xda : 0xde, 2 + rng_() % 2, rng_() % 2 ? 4 : 2); break;  // FICOM(P)
        case 3: registers(0xd8, static_cast<uint8_t>((rng_() % 2 ? 0xd0 : 0xd8) + sti)); break;  // FCOM(P) ST(i)
        case 4: registers(0xdd, static_cast<uint8_t>((rng_() % 2 ? 0xe0 : 0xe8) + sti)); break;  // FUCOM(P) ST(i)
        case 5: rng_() % 2 ? registers(0xde, 0xd9) : registers(0xda, 0xe9); break;        // FCOMPP, FUCOMPP
        case 6: registers(0xd9, 0xe4); break;                                              // FTST
        default: registers(0xd9, 0xe5); break;                                             // FXAM
      }
      cls = "x87-compare";
      break;
    case 6:  // FCOMI, FCOMIP, FUCOMI, FUCOMIP: ZF PF CF, and OF SF AF cleared
      registers(rng_() % 2 ? 0xdb : 0xdf, static_cast<uint8_t>((rng_() % 2 ? 0xe8 : 0xf0) + sti));
      defines = kAll;
      // Intel clears C1 and points FIP/FOP at these (P6) instructions; AMD does neither.
      seq.x87_undefined_status |= 0x200;
      vendor_pointers = true;
      cls = "x87-comi";
      break;
    case 7: {  // FCMOVcc
      const unsigned cc = static_cast<unsigned>(rng_() % 4);
      registers(rng_() % 2 ? 0xda : 0xdb, static_cast<uint8_t>(0xc0 | (cc << 3) | sti));
      static constexpr uint64_t kReads[] = {kCf, kZf, kCf | kZf, kPf};
      reads = kReads[cc];
      vendor_pointers = true;
      cls = "x87-fcmov";
      break;
    }
    case 8:  // one-operand arithmetic on ST(0)
    case 9: {
      static constexpr uint8_t kOps[] = {0xe0, 0xe1, 0xfa, 0xfc, 0xfd, 0xf4, 0xf5, 0xf8};  // FCHS FABS FSQRT FRNDINT FSCALE FXTRACT FPREM1 FPREM
      const uint8_t modrm = kOps[rng_() % std::size(kOps)];
      if (modrm == 0xfd && !seq.fscale_allowed) return false;
      registers(0xd9, modrm);
      cls = "x87-unary";
      break;
    }
    case 10:  // stack management
      switch (rng_() % 5) {
        case 0: registers(0xd9, static_cast<uint8_t>(0xc8 + sti)); break;  // FXCH
        case 1: registers(0xdd, static_cast<uint8_t>(0xc0 + sti)); break;  // FFREE
        case 2: registers(0xd9, rng_() % 2 ? 0xf6 : 0xf7); break;           // FDECSTP, FINCSTP
        case 3: registers(0xd9, 0xd0); break;                               // FNOP
        default: registers(0xdf, static_cast<uint8_t>(0xc0 + sti)); break;  // FFREEP
      }
      cls = "x87-stack";
      break;
    case 11:  // status and control words
      control = true;
      switch (rng_() % 5) {
        case 0: registers(0xdf, 0xe0); stores_status = true; break;  // FNSTSW AX
        case 1: memory(0xdd, 7, 2); stores_status = true; break;     // FNSTSW m16
        case 2: memory(0xd9, 7, 2); break;     // FNSTCW m16
        case 3: registers(0x9b, 0x90); break;  // FWAIT (then a NOP)
        default: {                             // FLDCW of a known word: RC and PC vary, exceptions stay masked
          const uint16_t word = static_cast<uint16_t>(0x037f | ((rng_() % 4) << 10) | ((rng_() % 4) << 8));
          const uint32_t disp = 0x6f0;
          b.insert(b.end(), {0x66, 0x41, 0xc7, 0x87});  // mov word ptr [r15 + disp32], imm16
          for (int i = 0; i < 4; ++i) b.push_back(static_cast<uint8_t>(disp >> (8 * i)));
          b.push_back(static_cast<uint8_t>(word));
          b.push_back(static_cast<uint8_t>(word >> 8));
          b.insert(b.end(), {0x41, 0xd9, 0xaf});  // fldcw [r15 + disp32]
          for (int i = 0; i < 4; ++i) b.push_back(static_cast<uint8_t>(disp >> (8 * i)));
          break;
        }
      }
      cls = "x87-control";
      break;
    case 12: {  // FNSTENV + FLDENV or FNSAVE + FRSTOR of the same image; the selector fields (FCS, FDS: zero on
                // deja, the real ones on hardware) and the pointers are cleared in between
      const bool save = rng_() % 2;
      const uint32_t disp = 0x500 + static_cast<uint32_t>(rng_() % 8) * 16;
      auto with_disp = [&](std::initializer_list<uint8_t> prefix, uint32_t d) {
        b.insert(b.end(), prefix);
        for (int i = 0; i < 4; ++i) b.push_back(static_cast<uint8_t>(d >> (8 * i)));
      };
      with_disp({0x41, static_cast<uint8_t>(save ? 0xdd : 0xd9), 0xb7}, disp);  // FNSAVE / FNSTENV
      with_disp({0x49, 0xc7, 0x87}, disp + 12);  // mov qword ptr [r15 + disp + 12], 0
      with_disp({}, 0);
      with_disp({0x49, 0xc7, 0x87}, disp + 20);  // mov qword ptr [r15 + disp + 20], 0
      with_disp({}, 0);
      with_disp({0x41, static_cast<uint8_t>(save ? 0xdd : 0xd9), 0xa7}, disp);  // FRSTOR / FLDENV
      control = true;
      stores_status = true;
      seq.x87_ip_defined = seq.x87_dp_defined = false;
      cls = "x87-env";
      break;
    }
    case 13:  // FNCLEX, FNINIT
      registers(0xdb, rng_() % 4 ? 0xe2 : 0xe3);
      control = true;
      if (b.back() == 0xe3) seq.x87_ip_defined = seq.x87_dp_defined = false;
      cls = "x87-control";
      break;
    default: {  // a load followed by arithmetic, so that sequences compute on what they load
      memory(0xdd, 0, 8);
      registers(0xde, static_cast<uint8_t>(0xc1 | (static_cast<unsigned>(rng_() % 2) << 3)));  // FADDP / FMULP
      cls = "x87-arith";
      break;
    }
  }
  if (stores_status && seq.x87_undefined_status) return false;
  if (vendor_pointers) {
    seq.x87_ip_defined = false;
  } else if (!control) {
    seq.x87_ip_defined = true;
    if (uses_memory) seq.x87_dp_defined = true;
  }
  return true;
}

bool Generator::emit_one(Sequence& seq) {
  auto pick = [this](auto const& array) { return array[rng_() % std::size(array)]; };
  auto width_of = [this](bool allow8) {
    static constexpr unsigned kWidths[] = {8, 16, 32, 64};
    return allow8 ? kWidths[rng_() % 4] : kWidths[1 + rng_() % 3];
  };
  auto gpr = [&](unsigned width) {
    switch (width) {
      case 8: return pick(kGpr8);
      case 16: return pick(kGpr16);
      case 32: return pick(kGpr32);
      default: return pick(kGpr64);
    }
  };
  auto mem = [this](unsigned bytes) {
    const int64_t slots = 0x700 / bytes;
    return Opnd{Opnd::kMem, ZYDIS_REGISTER_NONE, static_cast<uint16_t>(bytes), static_cast<int64_t>(rng_() % slots) * bytes};
  };
  auto rm = [&](unsigned width) { return rng_() % 3 == 0 ? mem(width / 8) : reg(gpr(width)); };
  auto xmm = [this]() { return reg(static_cast<ZydisRegister>(ZYDIS_REGISTER_XMM0 + rng_() % 16)); };
  auto xm = [&](unsigned bytes) { return rng_() % 3 == 0 ? mem(bytes) : xmm(); };

  Step step;
  std::vector<uint8_t>& b = step.bytes;
  bool ok = true;
  const bool simd = !simd_classes.empty() && (!mix_original || rng_() % 2);
  const unsigned cls = simd ? 100 : static_cast<unsigned>(rng_() % 26);
  switch (cls) {
    case 100:
      ok = emit_simd(seq, pick(simd_classes), b, step.reads, step.defines, step.cls);
      break;
    case 23:
    case 24:
    case 25: {  // x87
      ok = emit_x87(seq, b, step.reads, step.defines, step.cls);
      break;
    }
    case 0: {  // two-operand ALU
      static constexpr ZydisMnemonic kOps[] = {ZYDIS_MNEMONIC_ADD, ZYDIS_MNEMONIC_OR,  ZYDIS_MNEMONIC_ADC,
                                               ZYDIS_MNEMONIC_SBB, ZYDIS_MNEMONIC_AND, ZYDIS_MNEMONIC_SUB,
                                               ZYDIS_MNEMONIC_XOR, ZYDIS_MNEMONIC_CMP, ZYDIS_MNEMONIC_TEST};
      const ZydisMnemonic m = pick(kOps);
      const unsigned w = width_of(true);
      const Opnd dst = rm(w);
      const unsigned form = static_cast<unsigned>(rng_() % 3);
      const int64_t imm_value = static_cast<int32_t>(interesting(w == 64 ? 32 : w));
      if (form == 0) ok = encode(m, {dst, imm(w == 8 ? static_cast<int8_t>(imm_value) : w == 16 ? static_cast<int16_t>(imm_value) : imm_value)}, b);
      else if (form == 1 || dst.kind == Opnd::kMem || m == ZYDIS_MNEMONIC_TEST) ok = encode(m, {dst, reg(gpr(w))}, b);
      else ok = encode(m, {dst, mem(w / 8)}, b);
      const bool logic = m == ZYDIS_MNEMONIC_OR || m == ZYDIS_MNEMONIC_AND || m == ZYDIS_MNEMONIC_XOR || m == ZYDIS_MNEMONIC_TEST;
      step.reads = (m == ZYDIS_MNEMONIC_ADC || m == ZYDIS_MNEMONIC_SBB) ? kCf : 0;
      step.defines = logic ? kAll & ~kAf : kAll;
      step.undefines = logic ? kAf : 0;
      step.cls = "alu";
      break;
    }
    case 1: {  // INC/DEC/NEG/NOT
      static constexpr ZydisMnemonic kOps[] = {ZYDIS_MNEMONIC_INC, ZYDIS_MNEMONIC_DEC, ZYDIS_MNEMONIC_NEG, ZYDIS_MNEMONIC_NOT};
      const ZydisMnemonic m = pick(kOps);
      ok = encode(m, {rm(width_of(true))}, b);
      step.defines = m == ZYDIS_MNEMONIC_NOT ? 0 : m == ZYDIS_MNEMONIC_NEG ? kAll : kAll & ~kCf;
      step.cls = "incdec";
      break;
    }
    case 2: {  // shifts and rotates, count known at generation time (immediate, or CL loaded just before)
      static constexpr ZydisMnemonic kOps[] = {ZYDIS_MNEMONIC_ROL, ZYDIS_MNEMONIC_ROR, ZYDIS_MNEMONIC_RCL, ZYDIS_MNEMONIC_RCR,
                                               ZYDIS_MNEMONIC_SHL, ZYDIS_MNEMONIC_SHR, ZYDIS_MNEMONIC_SAR};
      const ZydisMnemonic m = pick(kOps);
      const unsigned w = width_of(true);
      const Opnd dst = rm(w);
      const unsigned count = static_cast<unsigned>(rng_() % 4 == 0 ? 1 : rng_() % 4 == 0 ? rng_() % 256 : rng_() % (w + 2));
      if (rng_() % 2 && !(dst.kind == Opnd::kReg && (dst.reg == ZYDIS_REGISTER_CL || dst.reg == ZYDIS_REGISTER_CX ||
                                                     dst.reg == ZYDIS_REGISTER_ECX || dst.reg == ZYDIS_REGISTER_RCX))) {
        ok = encode(ZYDIS_MNEMONIC_MOV, {reg(ZYDIS_REGISTER_CL), imm(static_cast<int8_t>(count))}, b) &&
             encode(m, {dst, reg(ZYDIS_REGISTER_CL)}, b);
      } else {
        ok = encode(m, {dst, imm(static_cast<int8_t>(count))}, b);
      }
      const unsigned masked = count & (w == 64 ? 63 : 31);
      const bool rotate = m == ZYDIS_MNEMONIC_ROL || m == ZYDIS_MNEMONIC_ROR || m == ZYDIS_MNEMONIC_RCL || m == ZYDIS_MNEMONIC_RCR;
      const bool through_carry = m == ZYDIS_MNEMONIC_RCL || m == ZYDIS_MNEMONIC_RCR;
      step.reads = through_carry ? kCf : 0;
      if (masked != 0) {
        step.defines = rotate ? kCf | kOf : kAll & ~kAf;
        step.undefines = rotate ? 0 : kAf;
        if (masked != 1) {
          step.defines &= ~kOf;
          step.undefines |= kOf;
        }
        if ((m == ZYDIS_MNEMONIC_SHL || m == ZYDIS_MNEMONIC_SHR) && masked >= w) {
          step.defines &= ~kCf;
          step.undefines |= kCf;
        }
      }
      step.cls = "shift";
      break;
    }
    case 3: {  // SHLD/SHRD
      const ZydisMnemonic m = rng_() % 2 ? ZYDIS_MNEMONIC_SHLD : ZYDIS_MNEMONIC_SHRD;
      const unsigned w = width_of(false);
      unsigned count = static_cast<unsigned>(rng_() % 3 == 0 ? 1 : rng_() % 64);
      const unsigned masked = count & (w == 64 ? 63 : 31);
      if (masked > w) return false;  // undefined result (16-bit only)
      const Opnd dst = rm(w);
      ZydisRegister src = gpr(w);
      if (rng_() % 2 && !(dst.kind == Opnd::kReg && (dst.reg == ZYDIS_REGISTER_CX || dst.reg == ZYDIS_REGISTER_ECX ||
                                                     dst.reg == ZYDIS_REGISTER_RCX)) &&
          src != ZYDIS_REGISTER_CX && src != ZYDIS_REGISTER_ECX && src != ZYDIS_REGISTER_RCX) {
        ok = encode(ZYDIS_MNEMONIC_MOV, {reg(ZYDIS_REGISTER_CL), imm(static_cast<int8_t>(count))}, b) &&
             encode(m, {dst, reg(src), reg(ZYDIS_REGISTER_CL)}, b);
      } else {
        ok = encode(m, {dst, reg(src), imm(count)}, b);
      }
      if (masked != 0) {
        step.defines = kCf | kSf | kZf | kPf | (masked == 1 ? kOf : 0);
        step.undefines = kAf | (masked == 1 ? 0 : kOf);
      }
      step.cls = "shld/shrd";
      break;
    }
    case 4: {  // MUL/IMUL
      const unsigned form = static_cast<unsigned>(rng_() % 4);
      if (form < 2) {
        ok = encode(form == 0 ? ZYDIS_MNEMONIC_MUL : ZYDIS_MNEMONIC_IMUL, {rm(width_of(true))}, b);
      } else {
        const unsigned w = width_of(false);
        if (form == 2) ok = encode(ZYDIS_MNEMONIC_IMUL, {reg(gpr(w)), rm(w)}, b);
        else ok = encode(ZYDIS_MNEMONIC_IMUL, {reg(gpr(w)), rm(w), imm(w == 16 ? static_cast<int16_t>(interesting(16)) : static_cast<int32_t>(interesting(32)))}, b);
      }
      step.defines = kCf | kOf;
      step.undefines = kSf | kZf | kAf | kPf;
      step.cls = "mul";
      break;
    }
    case 5: {  // DIV/IDIV, usually with the dividend's high half prepared so most do not fault
      const bool is_signed = rng_() % 2;
      const unsigned w = width_of(true);
      if (rng_() % 4 != 0) {
        if (w == 8) ok = is_signed ? encode(ZYDIS_MNEMONIC_CBW, {}, b) : encode(ZYDIS_MNEMONIC_MOVZX, {reg(ZYDIS_REGISTER_AX), reg(ZYDIS_REGISTER_AL)}, b);
        else if (is_signed) ok = encode(w == 16 ? ZYDIS_MNEMONIC_CWD : w == 32 ? ZYDIS_MNEMONIC_CDQ : ZYDIS_MNEMONIC_CQO, {}, b);
        else ok = encode(ZYDIS_MNEMONIC_MOV, {reg(w == 16 ? ZYDIS_REGISTER_DX : w == 32 ? ZYDIS_REGISTER_EDX : ZYDIS_REGISTER_RDX), imm(0)}, b);
      }
      ok = ok && encode(is_signed ? ZYDIS_MNEMONIC_IDIV : ZYDIS_MNEMONIC_DIV, {rm(w)}, b);
      step.undefines = kAll;
      step.cls = "div";
      break;
    }
    case 6: {  // bit scans and counts (TZCNT/LZCNT only where host and deja's CPU model both have them), MOVBE
      const unsigned which = static_cast<unsigned>(rng_() % (movbe ? 6 : 5));
      if ((which == 2 && !tzcnt_) || (which == 4 && !lzcnt_)) return false;
      if (which == 5) {
        const unsigned w = rng_() % 3 == 0 ? 16 : rng_() % 2 ? 32 : 64;
        if (rng_() % 2) ok = encode(ZYDIS_MNEMONIC_MOVBE, {reg(gpr(w)), mem(w / 8)}, b);
        else ok = encode(ZYDIS_MNEMONIC_MOVBE, {mem(w / 8), reg(gpr(w))}, b);
        step.cls = "movbe";
        break;
      }
      static constexpr ZydisMnemonic kOps[] = {ZYDIS_MNEMONIC_BSF, ZYDIS_MNEMONIC_BSR, ZYDIS_MNEMONIC_TZCNT,
                                               ZYDIS_MNEMONIC_POPCNT, ZYDIS_MNEMONIC_LZCNT};
      const unsigned w = width_of(false);
      ok = encode(kOps[which], {reg(gpr(w)), rm(w)}, b);
      if (which < 2) {
        step.defines = kZf;
        step.undefines = kAll & ~kZf;
      } else if (which == 3) {
        step.defines = kAll;
      } else {
        step.defines = kCf | kZf;
        step.undefines = kOf | kSf | kAf | kPf;
      }
      step.cls = "bitscan";
      break;
    }
    case 7: {  // BT/BTS/BTR/BTC (register offsets only on registers: memory bit strings reach outside the data page)
      static constexpr ZydisMnemonic kOps[] = {ZYDIS_MNEMONIC_BT, ZYDIS_MNEMONIC_BTS, ZYDIS_MNEMONIC_BTR, ZYDIS_MNEMONIC_BTC};
      const unsigned w = width_of(false);
      if (rng_() % 2) ok = encode(pick(kOps), {reg(gpr(w)), reg(gpr(w))}, b);
      else ok = encode(pick(kOps), {rm(w), imm(static_cast<int64_t>(rng_() % 256))}, b);
      step.defines = kCf;
      step.undefines = kOf | kSf | kAf | kPf | kZf;  // AMD also leaves ZF undefined
      step.cls = "bittest";
      break;
    }
    case 8: {  // data movement
      const unsigned w = width_of(true);
      switch (rng_() % 9) {
        case 0: ok = encode(ZYDIS_MNEMONIC_MOV, {rm(w), reg(gpr(w))}, b); break;
        case 1: ok = encode(ZYDIS_MNEMONIC_MOV, {reg(gpr(w)), rng_() % 2 ? mem(w / 8) : reg(gpr(w))}, b); break;
        case 2: ok = encode(ZYDIS_MNEMONIC_MOV, {reg(gpr(w)), imm(static_cast<int64_t>(w == 64 ? interesting(64) : interesting(w) ))}, b); break;
        case 3: {
          const unsigned from = rng_() % 2 ? 8 : 16;
          const unsigned to = from == 8 ? width_of(false) : (rng_() % 2 ? 32 : 64);
          ok = encode(rng_() % 2 ? ZYDIS_MNEMONIC_MOVZX : ZYDIS_MNEMONIC_MOVSX, {reg(gpr(to)), rm(from)}, b);
          break;
        }
        case 4: ok = encode(ZYDIS_MNEMONIC_MOVSXD, {reg(gpr(64)), rm(32)}, b); break;
        case 5: ok = encode(ZYDIS_MNEMONIC_XCHG, {rm(w), reg(gpr(w))}, b); break;
        case 6: ok = encode(ZYDIS_MNEMONIC_BSWAP, {reg(gpr(rng_() % 2 ? 32 : 64))}, b); break;
        case 7: {
          static constexpr ZydisMnemonic kOps[] = {ZYDIS_MNEMONIC_CBW, ZYDIS_MNEMONIC_CWDE, ZYDIS_MNEMONIC_CDQE,
                                                   ZYDIS_MNEMONIC_CWD, ZYDIS_MNEMONIC_CDQ, ZYDIS_MNEMONIC_CQO};
          ok = encode(pick(kOps), {}, b);
          break;
        }
        default: {
          // LEA over arbitrary registers: address arithmetic without a memory access.
          ZydisEncoderRequest request;
          std::memset(&request, 0, sizeof(request));
          request.machine_mode = ZYDIS_MACHINE_MODE_LONG_64;
          request.mnemonic = ZYDIS_MNEMONIC_LEA;
          request.operand_count = 2;
          const unsigned lw = width_of(false);
          request.operands[0].type = ZYDIS_OPERAND_TYPE_REGISTER;
          request.operands[0].reg.value = gpr(lw);
          request.operands[1].type = ZYDIS_OPERAND_TYPE_MEMORY;
          request.operands[1].mem.base = gpr(64);
          request.operands[1].mem.index = gpr(64);
          request.operands[1].mem.scale = static_cast<ZyanU8>(1u << (rng_() % 4));
          request.operands[1].mem.displacement = static_cast<int32_t>(interesting(32));
          request.operands[1].mem.size = 0;
          uint8_t buffer[ZYDIS_MAX_INSTRUCTION_LENGTH];
          ZyanUSize length = sizeof(buffer);
          ok = ZYAN_SUCCESS(ZydisEncoderEncodeInstruction(&request, buffer, &length));
          if (ok) b.assign(buffer, buffer + length);
          break;
        }
      }
      step.cls = "mov";
      break;
    }
    case 9: {  // CMOVcc / SETcc
      const unsigned cc = static_cast<unsigned>(rng_() % 16);
      if (rng_() % 2) {
        const unsigned w = width_of(false);
        ok = encode(kCmov[cc], {reg(gpr(w)), rm(w)}, b);
      } else {
        ok = encode(kSetcc[cc], {rm(8)}, b);
      }
      step.reads = kCcReads[cc];
      step.cls = "cmov/setcc";
      break;
    }
    case 10: {  // XADD / CMPXCHG
      const unsigned w = width_of(true);
      const bool xadd = rng_() % 2;
      const Opnd dst = rm(w), src = reg(gpr(w));
      if (xadd && avoid_xadd_same_register && dst.kind == Opnd::kReg && dst.reg == src.reg) return false;
      ok = encode(xadd ? ZYDIS_MNEMONIC_XADD : ZYDIS_MNEMONIC_CMPXCHG, {dst, src}, b);
      step.defines = kAll;
      step.cls = "xadd/cmpxchg";
      break;
    }
    case 11: {  // stack
      if (rng_() % 2) ok = encode(ZYDIS_MNEMONIC_PUSH, {rng_() % 3 ? reg(gpr(64)) : imm(static_cast<int32_t>(interesting(32)))}, b);
      else ok = encode(ZYDIS_MNEMONIC_POP, {reg(gpr(64))}, b);
      step.cls = "push/pop";
      break;
    }
    case 12: {  // SSE2 integer, two operands
      static constexpr ZydisMnemonic kOps[] = {
          ZYDIS_MNEMONIC_PAND, ZYDIS_MNEMONIC_PANDN, ZYDIS_MNEMONIC_POR, ZYDIS_MNEMONIC_PXOR, ZYDIS_MNEMONIC_PADDB,
          ZYDIS_MNEMONIC_PADDW, ZYDIS_MNEMONIC_PADDD, ZYDIS_MNEMONIC_PADDQ, ZYDIS_MNEMONIC_PADDSB, ZYDIS_MNEMONIC_PADDSW,
          ZYDIS_MNEMONIC_PADDUSB, ZYDIS_MNEMONIC_PADDUSW, ZYDIS_MNEMONIC_PSUBB, ZYDIS_MNEMONIC_PSUBW, ZYDIS_MNEMONIC_PSUBD,
          ZYDIS_MNEMONIC_PSUBQ, ZYDIS_MNEMONIC_PSUBSB, ZYDIS_MNEMONIC_PSUBSW, ZYDIS_MNEMONIC_PSUBUSB, ZYDIS_MNEMONIC_PSUBUSW,
          ZYDIS_MNEMONIC_PCMPEQB, ZYDIS_MNEMONIC_PCMPEQW, ZYDIS_MNEMONIC_PCMPEQD, ZYDIS_MNEMONIC_PCMPGTB,
          ZYDIS_MNEMONIC_PCMPGTW, ZYDIS_MNEMONIC_PCMPGTD, ZYDIS_MNEMONIC_PMULLW, ZYDIS_MNEMONIC_PMULHW,
          ZYDIS_MNEMONIC_PMULHUW, ZYDIS_MNEMONIC_PMULUDQ, ZYDIS_MNEMONIC_PMADDWD, ZYDIS_MNEMONIC_PMINUB,
          ZYDIS_MNEMONIC_PMAXUB, ZYDIS_MNEMONIC_PMINSW, ZYDIS_MNEMONIC_PMAXSW, ZYDIS_MNEMONIC_PAVGB, ZYDIS_MNEMONIC_PAVGW,
          ZYDIS_MNEMONIC_PSADBW, ZYDIS_MNEMONIC_PUNPCKLBW, ZYDIS_MNEMONIC_PUNPCKLWD, ZYDIS_MNEMONIC_PUNPCKLDQ,
          ZYDIS_MNEMONIC_PUNPCKLQDQ, ZYDIS_MNEMONIC_PUNPCKHBW, ZYDIS_MNEMONIC_PUNPCKHWD, ZYDIS_MNEMONIC_PUNPCKHDQ,
          ZYDIS_MNEMONIC_PUNPCKHQDQ, ZYDIS_MNEMONIC_PACKSSWB, ZYDIS_MNEMONIC_PACKUSWB, ZYDIS_MNEMONIC_PACKSSDW,
          ZYDIS_MNEMONIC_PSLLW, ZYDIS_MNEMONIC_PSLLD, ZYDIS_MNEMONIC_PSLLQ, ZYDIS_MNEMONIC_PSRLW, ZYDIS_MNEMONIC_PSRLD,
          ZYDIS_MNEMONIC_PSRLQ, ZYDIS_MNEMONIC_PSRAW, ZYDIS_MNEMONIC_PSRAD, ZYDIS_MNEMONIC_UNPCKLPS,
          ZYDIS_MNEMONIC_UNPCKHPS, ZYDIS_MNEMONIC_UNPCKLPD, ZYDIS_MNEMONIC_UNPCKHPD, ZYDIS_MNEMONIC_ANDPS,
          ZYDIS_MNEMONIC_ANDPD, ZYDIS_MNEMONIC_ANDNPS, ZYDIS_MNEMONIC_ANDNPD, ZYDIS_MNEMONIC_ORPS, ZYDIS_MNEMONIC_ORPD,
          ZYDIS_MNEMONIC_XORPS, ZYDIS_MNEMONIC_XORPD};
      ok = encode(pick(kOps), {xmm(), xm(16)}, b);
      step.cls = "sse-int";
      break;
    }
    case 13: {  // SSE2 with an immediate, moves masks and word insert/extract
      static constexpr ZydisMnemonic kShifts[] = {ZYDIS_MNEMONIC_PSLLW, ZYDIS_MNEMONIC_PSLLD, ZYDIS_MNEMONIC_PSLLQ,
                                                  ZYDIS_MNEMONIC_PSRLW, ZYDIS_MNEMONIC_PSRLD, ZYDIS_MNEMONIC_PSRLQ,
                                                  ZYDIS_MNEMONIC_PSRAW, ZYDIS_MNEMONIC_PSRAD, ZYDIS_MNEMONIC_PSLLDQ,
                                                  ZYDIS_MNEMONIC_PSRLDQ};
      static constexpr ZydisMnemonic kShuffles[] = {ZYDIS_MNEMONIC_PSHUFD, ZYDIS_MNEMONIC_PSHUFLW, ZYDIS_MNEMONIC_PSHUFHW,
                                                    ZYDIS_MNEMONIC_SHUFPS, ZYDIS_MNEMONIC_SHUFPD};
      static constexpr ZydisMnemonic kMasks[] = {ZYDIS_MNEMONIC_PMOVMSKB, ZYDIS_MNEMONIC_MOVMSKPS, ZYDIS_MNEMONIC_MOVMSKPD};
      const int64_t imm8 = static_cast<int64_t>(rng_() % 256);
      switch (rng_() % 5) {
        case 0: ok = encode(pick(kShifts), {xmm(), imm(rng_() % 2 ? imm8 % 24 : imm8)}, b); break;
        case 1: ok = encode(pick(kShuffles), {xmm(), xm(16), imm(imm8)}, b); break;
        case 2: ok = encode(pick(kMasks), {reg(gpr(rng_() % 2 ? 32 : 64)), xmm()}, b); break;
        case 3: ok = encode(ZYDIS_MNEMONIC_PEXTRW, {reg(gpr(32)), xmm(), imm(imm8)}, b); break;
        default: ok = encode(ZYDIS_MNEMONIC_PINSRW, {xmm(), rng_() % 2 ? mem(2) : reg(gpr(32)), imm(imm8)}, b); break;
      }
      step.cls = "sse-shuffle";
      break;
    }
    case 14:
    case 15: {  // SSE/SSE2 floating-point arithmetic and compares
      static constexpr ZydisMnemonic kOps[7][4] = {
          {ZYDIS_MNEMONIC_ADDSD, ZYDIS_MNEMONIC_ADDPD, ZYDIS_MNEMONIC_ADDSS, ZYDIS_MNEMONIC_ADDPS},
          {ZYDIS_MNEMONIC_SUBSD, ZYDIS_MNEMONIC_SUBPD, ZYDIS_MNEMONIC_SUBSS, ZYDIS_MNEMONIC_SUBPS},
          {ZYDIS_MNEMONIC_MULSD, ZYDIS_MNEMONIC_MULPD, ZYDIS_MNEMONIC_MULSS, ZYDIS_MNEMONIC_MULPS},
          {ZYDIS_MNEMONIC_DIVSD, ZYDIS_MNEMONIC_DIVPD, ZYDIS_MNEMONIC_DIVSS, ZYDIS_MNEMONIC_DIVPS},
          {ZYDIS_MNEMONIC_MINSD, ZYDIS_MNEMONIC_MINPD, ZYDIS_MNEMONIC_MINSS, ZYDIS_MNEMONIC_MINPS},
          {ZYDIS_MNEMONIC_MAXSD, ZYDIS_MNEMONIC_MAXPD, ZYDIS_MNEMONIC_MAXSS, ZYDIS_MNEMONIC_MAXPS},
          {ZYDIS_MNEMONIC_SQRTSD, ZYDIS_MNEMONIC_SQRTPD, ZYDIS_MNEMONIC_SQRTSS, ZYDIS_MNEMONIC_SQRTPS}};
      static constexpr ZydisMnemonic kCmp[4] = {ZYDIS_MNEMONIC_CMPSD, ZYDIS_MNEMONIC_CMPPD, ZYDIS_MNEMONIC_CMPSS, ZYDIS_MNEMONIC_CMPPS};
      static constexpr unsigned kBytes[4] = {8, 16, 4, 16};
      const unsigned form = static_cast<unsigned>(rng_() % 4);
      if (rng_() % 4 == 0) ok = encode(kCmp[form], {xmm(), xm(kBytes[form]), imm(static_cast<int64_t>(rng_() % 8))}, b);
      else ok = encode(kOps[rng_() % 7][form], {xmm(), xm(kBytes[form])}, b);
      step.cls = "sse-fp";
      break;
    }
    case 16: {  // COMIS/UCOMIS
      static constexpr ZydisMnemonic kOps[] = {ZYDIS_MNEMONIC_COMISD, ZYDIS_MNEMONIC_UCOMISD, ZYDIS_MNEMONIC_COMISS, ZYDIS_MNEMONIC_UCOMISS};
      const unsigned which = static_cast<unsigned>(rng_() % 4);
      ok = encode(kOps[which], {xmm(), xm(which < 2 ? 8 : 4)}, b);
      step.defines = kAll;
      step.cls = "comis";
      break;
    }
    case 17: {  // conversions
      switch (rng_() % 3) {
        case 0: {
          const unsigned w = rng_() % 2 ? 32 : 64;
          ok = encode(rng_() % 2 ? ZYDIS_MNEMONIC_CVTSI2SD : ZYDIS_MNEMONIC_CVTSI2SS, {xmm(), rm(w)}, b);
          break;
        }
        case 1: {
          static constexpr ZydisMnemonic kOps[] = {ZYDIS_MNEMONIC_CVTTSD2SI, ZYDIS_MNEMONIC_CVTSD2SI, ZYDIS_MNEMONIC_CVTTSS2SI, ZYDIS_MNEMONIC_CVTSS2SI};
          const unsigned which = static_cast<unsigned>(rng_() % 4);
          ok = encode(kOps[which], {reg(gpr(rng_() % 2 ? 32 : 64)), xm(which < 2 ? 8 : 4)}, b);
          break;
        }
        default: {
          static constexpr ZydisMnemonic kOps[] = {ZYDIS_MNEMONIC_CVTSD2SS, ZYDIS_MNEMONIC_CVTSS2SD, ZYDIS_MNEMONIC_CVTDQ2PD,
                                                   ZYDIS_MNEMONIC_CVTDQ2PS, ZYDIS_MNEMONIC_CVTPS2DQ, ZYDIS_MNEMONIC_CVTTPS2DQ,
                                                   ZYDIS_MNEMONIC_CVTPD2DQ, ZYDIS_MNEMONIC_CVTTPD2DQ, ZYDIS_MNEMONIC_CVTPD2PS,
                                                   ZYDIS_MNEMONIC_CVTPS2PD};
          static constexpr unsigned kBytes[] = {8, 4, 8, 16, 16, 16, 16, 16, 16, 8};
          const unsigned which = static_cast<unsigned>(rng_() % std::size(kOps));
          ok = encode(kOps[which], {xmm(), xm(kBytes[which])}, b);
          break;
        }
      }
      step.cls = "sse-cvt";
      break;
    }
    case 18: {  // SSE moves
      static constexpr ZydisMnemonic kWhole[] = {ZYDIS_MNEMONIC_MOVAPS, ZYDIS_MNEMONIC_MOVUPS, ZYDIS_MNEMONIC_MOVAPD,
                                                 ZYDIS_MNEMONIC_MOVUPD, ZYDIS_MNEMONIC_MOVDQA, ZYDIS_MNEMONIC_MOVDQU};
      switch (rng_() % 5) {
        case 0: ok = encode(pick(kWhole), {xmm(), xm(16)}, b); break;
        case 1: ok = encode(pick(kWhole), {mem(16), xmm()}, b); break;
        case 2: {
          const bool quad = rng_() % 2;
          const ZydisMnemonic m = quad ? ZYDIS_MNEMONIC_MOVQ : ZYDIS_MNEMONIC_MOVD;
          if (rng_() % 2) ok = encode(m, {xmm(), rm(quad ? 64 : 32)}, b);
          else ok = encode(m, {rm(quad ? 64 : 32), xmm()}, b);
          break;
        }
        case 3: {
          const bool dbl = rng_() % 2;
          const ZydisMnemonic m = dbl ? ZYDIS_MNEMONIC_MOVSD : ZYDIS_MNEMONIC_MOVSS;
          if (rng_() % 2) ok = encode(m, {xmm(), xm(dbl ? 8 : 4)}, b);
          else ok = encode(m, {mem(dbl ? 8 : 4), xmm()}, b);
          break;
        }
        default: ok = encode(ZYDIS_MNEMONIC_MOVQ, {xmm(), xmm()}, b); break;
      }
      step.cls = "sse-mov";
      break;
    }
    case 19: {  // flag instructions
      switch (rng_() % 5) {
        case 0: b = {0xf8}; step.defines = kCf; break;                         // CLC
        case 1: b = {0xf9}; step.defines = kCf; break;                         // STC
        case 2: b = {0xf5}; step.reads = step.defines = kCf; break;            // CMC
        case 3: b = {0x9f}; step.reads = kAll & ~kOf; break;                   // LAHF
        default: b = {0x9e}; step.defines = kAll & ~kOf; break;                // SAHF
      }
      step.cls = "flags";
      break;
    }
    case 20:
    case 21: {  // string instructions, with RSI/RDI/RCX set up inside the data page, forward or backward
      auto lea_disp = [&](uint8_t modrm, uint32_t disp) {
        b.insert(b.end(), {0x49, 0x8d, modrm});
        for (int i = 0; i < 4; ++i) b.push_back(static_cast<uint8_t>(disp >> (8 * i)));
      };
      lea_disp(0xb7, 0x300 + static_cast<uint32_t>(rng_() % 0x200));  // lea rsi, [r15 + disp32]
      lea_disp(0xbf, 0x300 + static_cast<uint32_t>(rng_() % 0x200));  // lea rdi, [r15 + disp32]
      const uint32_t n = static_cast<uint32_t>(rng_() % 40);
      b.push_back(0xb9);  // mov ecx, n
      for (int i = 0; i < 4; ++i) b.push_back(static_cast<uint8_t>(n >> (8 * i)));
      const bool backward = rng_() % 3 == 0;
      if (backward) b.push_back(0xfd);  // STD
      static constexpr uint8_t kOpcodes[] = {0xa4, 0xaa, 0xac, 0xa6, 0xae};  // MOVS, STOS, LODS, CMPS, SCAS (byte forms)
      const unsigned which = static_cast<unsigned>(rng_() % 5);
      const bool compares = which >= 3;
      const unsigned prefix = static_cast<unsigned>(rng_() % 3);  // none, REP/REPE, REPNE (compares only)
      if (prefix == 1 || (prefix == 2 && !compares)) b.push_back(0xf3);
      if (prefix == 2 && compares) b.push_back(0xf2);
      const unsigned size = static_cast<unsigned>(rng_() % 4);  // b, w, d, q
      if (size == 1) b.push_back(0x66);
      if (size == 3) b.push_back(0x48);
      b.push_back(static_cast<uint8_t>(kOpcodes[which] + (size ? 1 : 0)));
      if (backward) b.push_back(0xfc);  // CLD
      // With a REP prefix and RCX = 0 a compare writes no flags, so only a non-empty run defines them.
      if (compares) step.defines = (prefix == 0 || n > 0) ? kAll : 0;
      step.cls = "string";
      break;
    }
    default: {  // Jcc over the next step: both paths must agree, so the next step is generated first
      Sequence inner;
      inner.undefined_flags = seq.undefined_flags;
      inner.x87_undefined_status = seq.x87_undefined_status;
      inner.x87_ip_defined = seq.x87_ip_defined;
      inner.x87_dp_defined = seq.x87_dp_defined;
      inner.fscale_allowed = seq.fscale_allowed;
      if (!emit_one(inner)) return false;
      const unsigned cc = static_cast<unsigned>(rng_() % 16);
      if (kCcReads[cc] & seq.undefined_flags) return false;
      if (inner.code.size() > 127) return false;
      seq.code.push_back(static_cast<uint8_t>(0x70 + cc));
      seq.code.push_back(static_cast<uint8_t>(inner.code.size()));
      // fmt rather than std::string operator+: GCC 12 -O3 reports a false -Wrestrict in the latter.
      seq.listing.push_back(fmt::format("j{} over next (cc {})", cc, cc));
      seq.classes.push_back("jcc");
      for (size_t i = 0; i < inner.code.size(); ++i) seq.code.push_back(inner.code[i]);
      for (auto& line : inner.listing) seq.listing.push_back("  " + line);
      for (auto& c : inner.classes) seq.classes.push_back(c);
      // Taken or not, a flag is reliable only if it is reliable on both paths; so are the x87 status bits and
      // pointers (which the skipped step may have set).
      seq.undefined_flags |= inner.undefined_flags;
      seq.x87_undefined_status |= inner.x87_undefined_status;
      if (inner.x87_ip_defined != seq.x87_ip_defined || inner.x87_dp_defined != seq.x87_dp_defined ||
          std::string_view(inner.classes.empty() ? "" : inner.classes.back()).starts_with("x87")) {
        seq.x87_ip_defined = seq.x87_dp_defined = false;
      }
      return true;
    }
  }
  if (!ok || b.empty()) return false;
  if (step.reads & seq.undefined_flags) return false;  // would depend on an undefined flag
  seq.undefined_flags = (seq.undefined_flags & ~step.defines) | step.undefines;
  append_instructions(seq, b, step.cls);
  return true;
}

void append_instructions(Sequence& seq, const std::vector<uint8_t>& bytes, const std::string& cls) {
  size_t offset = 0;
  while (offset < bytes.size()) {
    ZydisDisassembledInstruction insn;
    if (!ZYAN_SUCCESS(ZydisDisassembleIntel(ZYDIS_MACHINE_MODE_LONG_64, kCodeAddr + seq.code.size() + offset,
                                            bytes.data() + offset, bytes.size() - offset, &insn)))
      break;
    seq.listing.emplace_back(insn.text);
    seq.classes.push_back(cls);
    offset += insn.info.length;
  }
  seq.code.insert(seq.code.end(), bytes.begin(), bytes.end());
}

const std::vector<std::string>& Generator::simd_class_names() {
  static const std::vector<std::string> names = {"mmx", "mmx-sse", "sse3", "ssse3", "sse4.1", "sse4.2", "x86-64-v2"};
  return names;
}

// One instruction (or a short preparation and the instruction) of the SIMD and x86-64-v2 classes: MMX with its
// x87 transitions, SSE's and SSE2's MMX additions and the MMX/SSE conversions, SSE3, SSSE3, SSE4.1, SSE4.2 and
// the integer instructions of x86-64-v2. Memory operands are [r15 + disp]; a sixteenth of the 16-byte ones that
// must be aligned are not (#GP on both sides).
bool Generator::emit_simd(Sequence& seq, const std::string& name, std::vector<uint8_t>& b, uint64_t& reads,
                          uint64_t& defines, const char*& cls) {
  auto pick = [this](auto const& array) { return array[rng_() % std::size(array)]; };
  auto gpr = [&](unsigned width) {
    switch (width) {
      case 8: return pick(kGpr8);
      case 16: return pick(kGpr16);
      case 32: return pick(kGpr32);
      default: return pick(kGpr64);
    }
  };
  auto mem = [this](unsigned bytes) {
    const int64_t slots = 0x700 / bytes;
    return Opnd{Opnd::kMem, ZYDIS_REGISTER_NONE, static_cast<uint16_t>(bytes), static_cast<int64_t>(rng_() % slots) * bytes};
  };
  auto mem16 = [&](bool aligned) {  // an aligned form's operand is misaligned now and then; other forms any offset
    Opnd m = mem(16);
    if (!aligned || rng_() % 16 == 0) m.disp += static_cast<int64_t>(1 + rng_() % 15);
    return m;
  };
  auto xmm = [this]() { return reg(static_cast<ZydisRegister>(ZYDIS_REGISTER_XMM0 + rng_() % 16)); };
  auto mm = [this]() { return reg(static_cast<ZydisRegister>(ZYDIS_REGISTER_MM0 + rng_() % 8)); };
  auto xm = [&](unsigned bytes) { return rng_() % 3 == 0 ? (bytes == 16 ? mem16(true) : mem(bytes)) : xmm(); };
  auto xm_any = [&]() { return rng_() % 3 == 0 ? mem16(false) : xmm(); };
  auto mmm = [&]() { return rng_() % 3 == 0 ? mem(8) : mm(); };
  auto rm = [&](unsigned width) { return rng_() % 3 == 0 ? mem(width / 8) : reg(gpr(width)); };
  auto imm8 = [this]() { return imm(static_cast<int64_t>(rng_() % 256)); };
  bool ok = true;

  if (name == "mmx") {
    cls = "mmx";
    static constexpr ZydisMnemonic kOps[] = {
        ZYDIS_MNEMONIC_PADDB, ZYDIS_MNEMONIC_PADDW, ZYDIS_MNEMONIC_PADDD, ZYDIS_MNEMONIC_PADDSB, ZYDIS_MNEMONIC_PADDSW,
        ZYDIS_MNEMONIC_PADDUSB, ZYDIS_MNEMONIC_PADDUSW, ZYDIS_MNEMONIC_PSUBB, ZYDIS_MNEMONIC_PSUBW, ZYDIS_MNEMONIC_PSUBD,
        ZYDIS_MNEMONIC_PSUBSB, ZYDIS_MNEMONIC_PSUBSW, ZYDIS_MNEMONIC_PSUBUSB, ZYDIS_MNEMONIC_PSUBUSW,
        ZYDIS_MNEMONIC_PCMPEQB, ZYDIS_MNEMONIC_PCMPEQW, ZYDIS_MNEMONIC_PCMPEQD, ZYDIS_MNEMONIC_PCMPGTB,
        ZYDIS_MNEMONIC_PCMPGTW, ZYDIS_MNEMONIC_PCMPGTD, ZYDIS_MNEMONIC_PMULLW, ZYDIS_MNEMONIC_PMULHW,
        ZYDIS_MNEMONIC_PMADDWD, ZYDIS_MNEMONIC_PACKSSWB, ZYDIS_MNEMONIC_PACKSSDW, ZYDIS_MNEMONIC_PACKUSWB,
        ZYDIS_MNEMONIC_PUNPCKLBW, ZYDIS_MNEMONIC_PUNPCKLWD, ZYDIS_MNEMONIC_PUNPCKLDQ, ZYDIS_MNEMONIC_PUNPCKHBW,
        ZYDIS_MNEMONIC_PUNPCKHWD, ZYDIS_MNEMONIC_PUNPCKHDQ, ZYDIS_MNEMONIC_PAND, ZYDIS_MNEMONIC_PANDN,
        ZYDIS_MNEMONIC_POR, ZYDIS_MNEMONIC_PXOR, ZYDIS_MNEMONIC_PSLLW, ZYDIS_MNEMONIC_PSLLD, ZYDIS_MNEMONIC_PSLLQ,
        ZYDIS_MNEMONIC_PSRLW, ZYDIS_MNEMONIC_PSRLD, ZYDIS_MNEMONIC_PSRLQ, ZYDIS_MNEMONIC_PSRAW, ZYDIS_MNEMONIC_PSRAD};
    static constexpr ZydisMnemonic kShifts[] = {ZYDIS_MNEMONIC_PSLLW, ZYDIS_MNEMONIC_PSLLD, ZYDIS_MNEMONIC_PSLLQ,
                                                ZYDIS_MNEMONIC_PSRLW, ZYDIS_MNEMONIC_PSRLD, ZYDIS_MNEMONIC_PSRLQ,
                                                ZYDIS_MNEMONIC_PSRAW, ZYDIS_MNEMONIC_PSRAD};
    switch (rng_() % 10) {
      case 0:  // loads into MM registers
        switch (rng_() % 4) {
          case 0: ok = encode(ZYDIS_MNEMONIC_MOVD, {mm(), rm(32)}, b); break;
          case 1: ok = encode(ZYDIS_MNEMONIC_MOVQ, {mm(), rm(64)}, b); break;
          default: ok = encode(ZYDIS_MNEMONIC_MOVQ, {mm(), mmm()}, b); break;
        }
        break;
      case 1:  // stores from MM registers
        switch (rng_() % 3) {
          case 0: ok = encode(ZYDIS_MNEMONIC_MOVD, {rm(32), mm()}, b); break;
          case 1: ok = encode(ZYDIS_MNEMONIC_MOVQ, {rm(64), mm()}, b); break;
          default: ok = encode(ZYDIS_MNEMONIC_MOVQ, {mem(8), mm()}, b); break;
        }
        break;
      case 2: ok = encode(pick(kShifts), {mm(), imm(static_cast<int64_t>(rng_() % 2 ? rng_() % 70 : rng_() % 256))}, b); break;
      case 3: ok = encode(ZYDIS_MNEMONIC_EMMS, {}, b); break;
      case 4: return emit_x87(seq, b, reads, defines, cls);  // the x87 after MMX, and MMX after the x87
      default: ok = encode(pick(kOps), {mm(), mmm()}, b); break;
    }
    return ok;
  }
  if (name == "mmx-sse") {
    cls = "mmx-sse";
    static constexpr ZydisMnemonic kOps[] = {
        ZYDIS_MNEMONIC_PAVGB, ZYDIS_MNEMONIC_PAVGW, ZYDIS_MNEMONIC_PMINUB, ZYDIS_MNEMONIC_PMAXUB, ZYDIS_MNEMONIC_PMINSW,
        ZYDIS_MNEMONIC_PMAXSW, ZYDIS_MNEMONIC_PSADBW, ZYDIS_MNEMONIC_PMULHUW, ZYDIS_MNEMONIC_PADDQ,
        ZYDIS_MNEMONIC_PSUBQ, ZYDIS_MNEMONIC_PMULUDQ};
    switch (rng_() % 10) {
      case 0: ok = encode(ZYDIS_MNEMONIC_PSHUFW, {mm(), mmm(), imm8()}, b); break;
      case 1:
        switch (rng_() % 3) {
          case 0: ok = encode(ZYDIS_MNEMONIC_PINSRW, {mm(), rng_() % 2 ? mem(2) : reg(gpr(32)), imm8()}, b); break;
          case 1: ok = encode(ZYDIS_MNEMONIC_PEXTRW, {reg(gpr(rng_() % 2 ? 32 : 64)), mm(), imm8()}, b); break;
          default: ok = encode(ZYDIS_MNEMONIC_PMOVMSKB, {reg(gpr(rng_() % 2 ? 32 : 64)), mm()}, b); break;
        }
        break;
      case 2: {  // MASKMOVQ (or MASKMOVDQU) to [rdi] in the data page
        const uint32_t disp = 0x100 + static_cast<uint32_t>(rng_() % 0x500);
        b.insert(b.end(), {0x49, 0x8d, 0xbf});  // lea rdi, [r15 + disp32]
        for (int i = 0; i < 4; ++i) b.push_back(static_cast<uint8_t>(disp >> (8 * i)));
        if (rng_() % 2) ok = encode(ZYDIS_MNEMONIC_MASKMOVQ, {mm(), mm()}, b);
        else ok = encode(ZYDIS_MNEMONIC_MASKMOVDQU, {xmm(), xmm()}, b);  // (SSE2's, on XMM registers)
        break;
      }
      case 3: ok = encode(ZYDIS_MNEMONIC_MOVNTQ, {mem(8), mm()}, b); break;
      case 4:
        switch (rng_() % 6) {
          case 0: ok = encode(ZYDIS_MNEMONIC_CVTPI2PS, {xmm(), mmm()}, b); break;
          case 1: ok = encode(ZYDIS_MNEMONIC_CVTPI2PD, {xmm(), mmm()}, b); break;
          case 2: ok = encode(ZYDIS_MNEMONIC_CVTPS2PI, {mm(), xm(8)}, b); break;
          case 3: ok = encode(ZYDIS_MNEMONIC_CVTTPS2PI, {mm(), xm(8)}, b); break;
          case 4: ok = encode(ZYDIS_MNEMONIC_CVTPD2PI, {mm(), xm(16)}, b); break;
          default: ok = encode(ZYDIS_MNEMONIC_CVTTPD2PI, {mm(), xm(16)}, b); break;
        }
        break;
      case 5:
        if (rng_() % 2) ok = encode(ZYDIS_MNEMONIC_MOVQ2DQ, {xmm(), mm()}, b);
        else ok = encode(ZYDIS_MNEMONIC_MOVDQ2Q, {mm(), xmm()}, b);
        break;
      case 6: return emit_simd(seq, rng_() % 2 ? "mmx" : "ssse3-mm", b, reads, defines, cls);
      default: ok = encode(pick(kOps), {mm(), mmm()}, b); break;
    }
    return ok;
  }
  static constexpr ZydisMnemonic kSsse3[] = {
      ZYDIS_MNEMONIC_PSHUFB, ZYDIS_MNEMONIC_PHADDW, ZYDIS_MNEMONIC_PHADDD, ZYDIS_MNEMONIC_PHADDSW, ZYDIS_MNEMONIC_PHSUBW,
      ZYDIS_MNEMONIC_PHSUBD, ZYDIS_MNEMONIC_PHSUBSW, ZYDIS_MNEMONIC_PMADDUBSW, ZYDIS_MNEMONIC_PMULHRSW,
      ZYDIS_MNEMONIC_PSIGNB, ZYDIS_MNEMONIC_PSIGNW, ZYDIS_MNEMONIC_PSIGND, ZYDIS_MNEMONIC_PABSB, ZYDIS_MNEMONIC_PABSW,
      ZYDIS_MNEMONIC_PABSD};
  if (name == "ssse3-mm") {  // SSSE3 on MMX registers (in "ssse3" and "mmx-sse")
    cls = "ssse3";
    if (rng_() % 5 == 0) return encode(ZYDIS_MNEMONIC_PALIGNR, {mm(), mmm(), imm(static_cast<int64_t>(rng_() % 24))}, b);
    return encode(pick(kSsse3), {mm(), mmm()}, b);
  }
  if (name == "ssse3") {
    cls = "ssse3";
    switch (rng_() % 6) {
      case 0: return emit_simd(seq, "ssse3-mm", b, reads, defines, cls);
      case 1: return encode(ZYDIS_MNEMONIC_PALIGNR, {xmm(), xm(16), imm(static_cast<int64_t>(rng_() % 2 ? rng_() % 40 : rng_() % 256))}, b);
      default: return encode(pick(kSsse3), {xmm(), xm(16)}, b);
    }
  }
  if (name == "sse3") {
    cls = "sse3";
    static constexpr ZydisMnemonic kFp[] = {ZYDIS_MNEMONIC_ADDSUBPS, ZYDIS_MNEMONIC_ADDSUBPD, ZYDIS_MNEMONIC_HADDPS,
                                            ZYDIS_MNEMONIC_HADDPD, ZYDIS_MNEMONIC_HSUBPS, ZYDIS_MNEMONIC_HSUBPD};
    switch (rng_() % 8) {
      case 0: return encode(rng_() % 2 ? ZYDIS_MNEMONIC_MOVSHDUP : ZYDIS_MNEMONIC_MOVSLDUP, {xmm(), xm(16)}, b);
      case 1: return encode(ZYDIS_MNEMONIC_MOVDDUP, {xmm(), xm(8)}, b);
      case 2: return encode(ZYDIS_MNEMONIC_LDDQU, {xmm(), mem16(false)}, b);
      case 3: {  // FISTTP m16int / m32int / m64int (an x87 instruction: it pops)
        static constexpr uint8_t kOpcodes[] = {0xdf, 0xdb, 0xdd};
        static constexpr unsigned kSizes[] = {2, 4, 8};
        const unsigned which = static_cast<unsigned>(rng_() % 3);
        const uint32_t disp = static_cast<uint32_t>(rng_() % ((0x700 - kSizes[which]) / 8)) * 8;
        b.insert(b.end(), {0x41, kOpcodes[which], 0x8f});  // [r15 + disp32], reg field 1
        for (int i = 0; i < 4; ++i) b.push_back(static_cast<uint8_t>(disp >> (8 * i)));
        seq.x87_ip_defined = seq.x87_dp_defined = true;
        return true;
      }
      default: return encode(pick(kFp), {xmm(), xm(16)}, b);
    }
  }
  if (name == "sse4.1") {
    cls = "sse4.1";
    static constexpr ZydisMnemonic kOps[] = {
        ZYDIS_MNEMONIC_PMULLD, ZYDIS_MNEMONIC_PMULDQ, ZYDIS_MNEMONIC_PMINSB, ZYDIS_MNEMONIC_PMINSD, ZYDIS_MNEMONIC_PMINUW,
        ZYDIS_MNEMONIC_PMINUD, ZYDIS_MNEMONIC_PMAXSB, ZYDIS_MNEMONIC_PMAXSD, ZYDIS_MNEMONIC_PMAXUW, ZYDIS_MNEMONIC_PMAXUD,
        ZYDIS_MNEMONIC_PACKUSDW, ZYDIS_MNEMONIC_PCMPEQQ, ZYDIS_MNEMONIC_PHMINPOSUW};
    static constexpr ZydisMnemonic kExtend[] = {
        ZYDIS_MNEMONIC_PMOVSXBW, ZYDIS_MNEMONIC_PMOVSXBD, ZYDIS_MNEMONIC_PMOVSXBQ, ZYDIS_MNEMONIC_PMOVSXWD,
        ZYDIS_MNEMONIC_PMOVSXWQ, ZYDIS_MNEMONIC_PMOVSXDQ, ZYDIS_MNEMONIC_PMOVZXBW, ZYDIS_MNEMONIC_PMOVZXBD,
        ZYDIS_MNEMONIC_PMOVZXBQ, ZYDIS_MNEMONIC_PMOVZXWD, ZYDIS_MNEMONIC_PMOVZXWQ, ZYDIS_MNEMONIC_PMOVZXDQ};
    static constexpr unsigned kExtendBytes[] = {8, 4, 2, 8, 4, 8, 8, 4, 2, 8, 4, 8};
    switch (rng_() % 14) {
      case 0: {
        const unsigned which = static_cast<unsigned>(rng_() % std::size(kExtend));
        return encode(kExtend[which], {xmm(), rng_() % 3 == 0 ? mem(kExtendBytes[which]) : xmm()}, b);
      }
      case 1: {  // the variable blends take their mask from XMM0
        static constexpr ZydisMnemonic kBlendv[] = {ZYDIS_MNEMONIC_PBLENDVB, ZYDIS_MNEMONIC_BLENDVPS, ZYDIS_MNEMONIC_BLENDVPD};
        const ZydisMnemonic m = pick(kBlendv);
        const Opnd dst = xmm(), src = xm(16);
        return encode(m, {dst, src, reg(ZYDIS_REGISTER_XMM0)}, b) || encode(m, {dst, src}, b);
      }
      case 2: {
        static constexpr ZydisMnemonic kBlend[] = {ZYDIS_MNEMONIC_PBLENDW, ZYDIS_MNEMONIC_BLENDPS, ZYDIS_MNEMONIC_BLENDPD};
        return encode(pick(kBlend), {xmm(), xm(16), imm8()}, b);
      }
      case 3:
        switch (rng_() % 3) {
          case 0: return encode(ZYDIS_MNEMONIC_PINSRB, {xmm(), rng_() % 2 ? mem(1) : reg(gpr(32)), imm8()}, b);
          case 1: return encode(ZYDIS_MNEMONIC_PINSRD, {xmm(), rm(32), imm8()}, b);
          default: return encode(ZYDIS_MNEMONIC_PINSRQ, {xmm(), rm(64), imm8()}, b);
        }
      case 4:
        switch (rng_() % 5) {
          case 0: return encode(ZYDIS_MNEMONIC_PEXTRB, {rng_() % 2 ? mem(1) : reg(gpr(rng_() % 2 ? 32 : 64)), xmm(), imm8()}, b);
          case 1: return encode(ZYDIS_MNEMONIC_PEXTRW, {rng_() % 2 ? mem(2) : reg(gpr(32)), xmm(), imm8()}, b);
          case 2: return encode(ZYDIS_MNEMONIC_PEXTRD, {rm(32), xmm(), imm8()}, b);
          case 3: return encode(ZYDIS_MNEMONIC_PEXTRQ, {rm(64), xmm(), imm8()}, b);
          default: return encode(ZYDIS_MNEMONIC_EXTRACTPS, {rng_() % 2 ? mem(4) : reg(gpr(rng_() % 2 ? 32 : 64)), xmm(), imm8()}, b);
        }
      case 5: return encode(ZYDIS_MNEMONIC_INSERTPS, {xmm(), xm(4), imm8()}, b);
      case 6:
        defines = kAll;
        return encode(ZYDIS_MNEMONIC_PTEST, {xmm(), xm(16)}, b);
      case 7: {
        const int64_t mode = static_cast<int64_t>(rng_() % 16);
        switch (rng_() % 4) {
          case 0: return encode(ZYDIS_MNEMONIC_ROUNDPS, {xmm(), xm(16), imm(mode)}, b);
          case 1: return encode(ZYDIS_MNEMONIC_ROUNDPD, {xmm(), xm(16), imm(mode)}, b);
          case 2: return encode(ZYDIS_MNEMONIC_ROUNDSS, {xmm(), xm(4), imm(mode)}, b);
          default: return encode(ZYDIS_MNEMONIC_ROUNDSD, {xmm(), xm(8), imm(mode)}, b);
        }
      }
      case 8: return encode(rng_() % 2 ? ZYDIS_MNEMONIC_DPPS : ZYDIS_MNEMONIC_DPPD, {xmm(), xm(16), imm8()}, b);
      case 9: return encode(ZYDIS_MNEMONIC_MPSADBW, {xmm(), xm(16), imm8()}, b);
      case 10: return encode(ZYDIS_MNEMONIC_MOVNTDQA, {xmm(), mem16(true)}, b);
      default: return encode(pick(kOps), {xmm(), xm(16)}, b);
    }
  }
  if (name == "sse4.2") {
    cls = "sse4.2";
    switch (rng_() % 8) {
      case 0: return encode(ZYDIS_MNEMONIC_PCMPGTQ, {xmm(), xm(16)}, b);
      case 1:
      case 2: {
        const unsigned from = rng_() % 2 ? 8 : rng_() % 2 ? 16 : 32;
        const unsigned to = from == 8 && rng_() % 2 ? 64 : from == 64 ? 64 : 32;
        const unsigned w = rng_() % 4 == 0 ? 64 : from;
        return encode(ZYDIS_MNEMONIC_CRC32, {reg(gpr(w == 64 ? 64 : to)), rm(w)}, b);
      }
      default: {
        // The string compares, on text-like registers now and then: a few letters, zeros among them.
        if (rng_() % 2) {
          const unsigned target = static_cast<unsigned>(rng_() % 16);
          for (int half = 0; half < 2; ++half) {
            uint64_t value = 0;
            for (int i = 0; i < 8; ++i) {
              static constexpr uint8_t kText[] = {'a', 'b', 'c', 'a', 'b', 0, 0x80, 0xff, '0', '9'};
              value |= uint64_t{rng_() % 6 == 0 ? static_cast<uint8_t>(rng_()) : pick(kText)} << (8 * i);
            }
            b.insert(b.end(), {0x48, 0xb8});  // mov rax, imm64
            for (int i = 0; i < 8; ++i) b.push_back(static_cast<uint8_t>(value >> (8 * i)));
            ok = ok && encode(ZYDIS_MNEMONIC_PINSRQ, {reg(static_cast<ZydisRegister>(ZYDIS_REGISTER_XMM0 + target)),
                                                       reg(ZYDIS_REGISTER_RAX), imm(half)}, b);
          }
        }
        static constexpr ZydisMnemonic kOps[] = {ZYDIS_MNEMONIC_PCMPESTRI, ZYDIS_MNEMONIC_PCMPESTRM,
                                                 ZYDIS_MNEMONIC_PCMPISTRI, ZYDIS_MNEMONIC_PCMPISTRM};
        const ZydisMnemonic m = pick(kOps);
        const bool explicit_lengths = m == ZYDIS_MNEMONIC_PCMPESTRI || m == ZYDIS_MNEMONIC_PCMPESTRM;
        if (explicit_lengths) {
          for (ZydisRegister r : {ZYDIS_REGISTER_RAX, ZYDIS_REGISTER_RDX}) {
            const int64_t length = rng_() % 4 == 0 ? static_cast<int64_t>(interesting(64)) : static_cast<int64_t>(rng_() % 41) - 20;
            ok = ok && encode(ZYDIS_MNEMONIC_MOV, {reg(r), imm(length)}, b);
          }
        }
        std::vector<uint8_t> insn;
        ok = ok && encode(m, {xmm(), xm_any(), imm8()}, insn);
        // REX.W (64-bit lengths) now and then: 66 [REX] 0F 3A ...
        if (ok && explicit_lengths && rng_() % 4 == 0) {
          if ((insn[1] & 0xf0) == 0x40) insn[1] |= 0x08;
          else insn.insert(insn.begin() + 1, 0x48);
        }
        b.insert(b.end(), insn.begin(), insn.end());
        defines = kAll;
        return ok;
      }
    }
  }
  if (name == "x86-64-v2") {
    cls = "x86-64-v2";
    switch (rng_() % 4) {
      case 0: {
        const unsigned w = rng_() % 3 == 0 ? 16 : rng_() % 2 ? 32 : 64;
        defines = kAll;
        return encode(ZYDIS_MNEMONIC_POPCNT, {reg(gpr(w)), rm(w)}, b);
      }
      case 1: {  // CMPXCHG16B, RDX:RAX equal to the memory half the time, LOCK half the time, misaligned now and then
        Opnd m = mem(16);
        if (rng_() % 8 == 0) m.disp += 8;
        if (rng_() % 2) {
          ok = encode(ZYDIS_MNEMONIC_MOV, {reg(ZYDIS_REGISTER_RAX), Opnd{Opnd::kMem, ZYDIS_REGISTER_NONE, 8, m.disp}}, b) &&
               encode(ZYDIS_MNEMONIC_MOV, {reg(ZYDIS_REGISTER_RDX), Opnd{Opnd::kMem, ZYDIS_REGISTER_NONE, 8, m.disp + 8}}, b);
        }
        if (rng_() % 2) b.push_back(0xf0);
        defines = kZf;
        return ok && encode(ZYDIS_MNEMONIC_CMPXCHG16B, {m}, b);
      }
      default:
        if (rng_() % 2) {
          b = {0x9f};  // LAHF
          reads = kAll & ~kOf;
        } else {
          b = {0x9e};  // SAHF
          defines = kAll & ~kOf;
        }
        return true;
    }
  }
  return false;
}

Sequence Generator::sequence(int length) {
  Sequence seq;
  // The x87 control word registers() will load: RC and PC vary; #I stays masked (on an unmasked #IA, AMD
  // sets the compare codes where the SDM says they stay); now and then other exceptions are unmasked.
  x87_control_ = static_cast<uint16_t>(0x037f | ((rng_() % 4) << 10) | ((rng_() % 4) << 8));
  if (rng_() % 8 == 0) x87_control_ = static_cast<uint16_t>(x87_control_ & ~(rng_() & 0x3f));
  seq.fscale_allowed = (x87_control_ & 0x18) == 0x18;
  int attempts = 0;
  while (static_cast<int>(seq.listing.size()) < length && attempts++ < length * 20) emit_one(seq);
  return seq;
}

}  // namespace deja::difftest
