// Random VEX instruction sequences for the differential tester: every encoding Zydis decodes, by class, with random operands.
#include "tests/interp/diff/avx_generator.h"

#include <Zydis/Zydis.h>
#include <fmt/format.h>

#include <cstring>
#include <string>

namespace deja::difftest {
namespace {

constexpr uint64_t kCf = 1, kPf = 4, kAf = 0x10, kZf = 0x40, kSf = 0x80, kOf = 0x800;
constexpr uint64_t kAll = kCf | kPf | kAf | kZf | kSf | kOf;

constexpr std::string_view kClasses[] = {"avx-int", "avx-fp", "fma", "f16c", "bmi1", "bmi2", "gather"};

bool starts_with_any(std::string_view name, std::initializer_list<std::string_view> prefixes) {
  for (std::string_view p : prefixes)
    if (name.starts_with(p)) return true;
  return false;
}

// The class of a decoded VEX instruction, or "" for one the tester leaves out.
std::string_view class_of(const ZydisDecodedInstruction& zi) {
  const std::string_view name = ZydisMnemonicGetString(zi.mnemonic);
  switch (zi.meta.isa_ext) {
    case ZYDIS_ISA_EXT_BMI1: return "bmi1";
    case ZYDIS_ISA_EXT_BMI2: return "bmi2";
    case ZYDIS_ISA_EXT_FMA: return "fma";
    case ZYDIS_ISA_EXT_F16C: return "f16c";
    case ZYDIS_ISA_EXT_AVX:
    case ZYDIS_ISA_EXT_AVX2:
      // Left out: VMASKMOVDQU (it stores through RDI), the reciprocal approximations (vendor-specific bits: tested
      // against their bound in sse_test), PCLMULQDQ (not in the model).
      if (zi.mnemonic == ZYDIS_MNEMONIC_VMASKMOVDQU || zi.mnemonic == ZYDIS_MNEMONIC_VPCLMULQDQ ||
          starts_with_any(name, {"vrcp", "vrsqrt"}))
        return "";
      if (starts_with_any(name, {"vadd", "vsub", "vmul", "vdiv", "vmin", "vmax", "vsqrt", "vhadd", "vhsub", "vcmp",
                                 "vcvt", "vround", "vdpp", "vcomis", "vucomis"}))
        return "avx-fp";
      return "avx-int";
    default:
      return "";
  }
}

// A GPR operand that is the stack pointer or R15 (the base of every memory operand) would break the harness.
bool harness_registers_safe(const ZydisDecodedInstruction& zi, const ZydisDecodedOperand* ops) {
  for (int i = 0; i < zi.operand_count_visible; ++i) {
    if (ops[i].type != ZYDIS_OPERAND_TYPE_REGISTER) continue;
    const ZydisRegister r = ZydisRegisterGetLargestEnclosing(ZYDIS_MACHINE_MODE_LONG_64, ops[i].reg.value);
    if (r == ZYDIS_REGISTER_RSP || r == ZYDIS_REGISTER_R15) return false;
  }
  return true;
}

}  // namespace

std::span<const std::string_view> avx_classes() { return kClasses; }

AvxGenerator::AvxGenerator(uint64_t seed) : rng_(seed), legacy_(seed ^ 0x9e3779b97f4a7c15ull, true, true) {
  // Every VEX encoding that decodes, by class: map, prefix, W, L, opcode and ModRM.reg, with a register and with a
  // memory r/m operand.
  ZydisDecoder decoder;
  ZydisDecoderInit(&decoder, ZYDIS_MACHINE_MODE_LONG_64, ZYDIS_STACK_WIDTH_64);
  for (std::string_view c : kClasses) by_class_.emplace_back(c, std::vector<Encoding>{});
  for (uint8_t map = 1; map <= 3; ++map)
    for (uint8_t pp = 0; pp < 4; ++pp)
      for (uint8_t w = 0; w < 2; ++w)
        for (uint8_t l = 0; l < 2; ++l)
          for (unsigned opcode = 0; opcode < 256; ++opcode)
            for (uint8_t reg = 0; reg < 8; ++reg)
              for (bool memory : {false, true}) {
                // (VEX.vvvv 1111b: no register, as most instructions without a second source need; 0111b: XMM8.)
                for (uint8_t vvvv : {0xf, 0x7}) {
                const uint8_t bytes[] = {0xc4, uint8_t(0xe0 | map), uint8_t(w << 7 | vvvv << 3 | l << 2 | pp),
                                         uint8_t(opcode), uint8_t((memory ? 0x80 : 0xc0) | reg << 3 | (memory ? 7 : 1)),
                                         0, 0, 0, 0, 0, 0, 0};
                ZydisDecodedInstruction zi;
                if (!ZYAN_SUCCESS(ZydisDecoderDecodeInstruction(&decoder, nullptr, bytes, sizeof bytes, &zi))) continue;
                const std::string_view cls = class_of(zi);
                if (cls.empty()) continue;
                encodings(cls).push_back({map, pp, w, l, uint8_t(opcode), reg, memory, uint16_t(zi.mnemonic)});
                break;
                }
              }
}

std::vector<AvxGenerator::Encoding>& AvxGenerator::encodings(std::string_view cls) {
  for (auto& [name, list] : by_class_)
    if (name == cls) return list;
  return by_class_.front().second;
}

RegisterFile AvxGenerator::registers() {
  RegisterFile r = legacy_.registers();
  r.ymm = 1;
  const std::vector<uint8_t> lanes = legacy_.data();
  for (auto& upper : r.ymmh) std::memcpy(upper.data(), &lanes[(rng_() % (kDataSize / 16)) * 16], 16);
  return r;
}

bool AvxGenerator::append(Sequence& seq, const std::vector<uint8_t>& bytes, uint64_t defines, uint64_t undefines,
                          const char* cls) {
  ZydisDisassembledInstruction insn;
  size_t offset = 0;
  while (offset < bytes.size()) {
    if (!ZYAN_SUCCESS(ZydisDisassembleIntel(ZYDIS_MACHINE_MODE_LONG_64, kCodeAddr + seq.code.size() + offset,
                                            bytes.data() + offset, bytes.size() - offset, &insn))) {
      std::string hex = "(invalid)";
      for (size_t i = offset; i < bytes.size(); ++i) hex += fmt::format(" {:02x}", bytes[i]);
      seq.listing.push_back(hex);
      seq.classes.push_back(cls);
      break;
    }
    seq.listing.push_back(insn.text);
    seq.classes.push_back(cls);
    offset += insn.info.length;
  }
  seq.undefined_flags = (seq.undefined_flags & ~defines) | undefines;
  seq.code.insert(seq.code.end(), bytes.begin(), bytes.end());
  return true;
}

bool AvxGenerator::emit(Sequence& seq, std::string_view cls) {
  if (cls == "gather") return emit_gather(seq);
  const auto& list = encodings(cls);
  if (list.empty()) return false;
  const Encoding& e = list[rng_() % list.size()];
  // Registers anywhere in 0-15 (ModRM.reg keeps a group opcode's extension), memory at [r15 + disp32]: aligned to
  // 32 bytes mostly, anywhere now and then (the aligned moves must fault there).
  const uint8_t reg = uint8_t(rng_() % 16), rm = uint8_t(rng_() % 16);
  uint8_t vvvv = uint8_t(rng_() % 16);
  uint32_t disp = uint32_t(rng_() % (0x7c0 / 32)) * 32;
  if (rng_() % 8 == 0) disp = uint32_t(rng_() % 0x7c0);
  std::vector<uint8_t> b = {0xc4,
                            uint8_t((reg & 8 ? 0 : 0x80) | 0x40 | (e.memory ? 0 : (rm & 8 ? 0 : 0x20)) | e.map),
                            uint8_t(e.w << 7 | (~vvvv & 0xf) << 3 | e.l << 2 | e.pp), e.opcode};
  const uint8_t modrm_reg = (rng_() % 2) ? uint8_t(reg & 7) : e.reg;
  if (e.memory) {
    b.push_back(uint8_t(0x80 | modrm_reg << 3 | 7));
    for (int i = 0; i < 4; ++i) b.push_back(uint8_t(disp >> (8 * i)));
  } else {
    b.push_back(uint8_t(0xc0 | modrm_reg << 3 | (rm & 7)));
  }
  // An immediate (or is4) byte in case the instruction has one; cut off below if it has not.
  b.push_back(uint8_t(rng_()));
  ZydisDecoder decoder;
  ZydisDecoderInit(&decoder, ZYDIS_MACHINE_MODE_LONG_64, ZYDIS_STACK_WIDTH_64);
  ZydisDecodedInstruction zi;
  ZydisDecodedOperand ops[ZYDIS_MAX_OPERAND_COUNT];
  if (!ZYAN_SUCCESS(ZydisDecoderDecodeFull(&decoder, b.data(), b.size(), &zi, ops))) {
    // Most instructions without a second source need VEX.vvvv = 1111b (no register); the others are #UD, which
    // one in sixteen keeps to check that both sides agree.
    if (rng_() % 16 == 0) return append(seq, std::vector<uint8_t>(b.begin(), b.end() - 1), 0, 0, "vex-invalid");
    vvvv = 0;
    b[2] = uint8_t((b[2] & 0x87) | 0x78);
    if (!ZYAN_SUCCESS(ZydisDecoderDecodeFull(&decoder, b.data(), b.size(), &zi, ops))) return false;
  }
  if (class_of(zi) != cls || !harness_registers_safe(zi, ops)) return false;
  b.resize(zi.length);
  // Flags: VPTEST/VTESTPS/VTESTPD and the compares into RFLAGS define all six; BMI1 and BZHI define some.
  uint64_t defines = 0, undefines = 0;
  switch (zi.mnemonic) {
    case ZYDIS_MNEMONIC_VPTEST: case ZYDIS_MNEMONIC_VTESTPS: case ZYDIS_MNEMONIC_VTESTPD:
    case ZYDIS_MNEMONIC_VCOMISS: case ZYDIS_MNEMONIC_VCOMISD: case ZYDIS_MNEMONIC_VUCOMISS: case ZYDIS_MNEMONIC_VUCOMISD:
      defines = kAll;
      break;
    case ZYDIS_MNEMONIC_ANDN: case ZYDIS_MNEMONIC_BLSI: case ZYDIS_MNEMONIC_BLSR: case ZYDIS_MNEMONIC_BZHI:
      defines = kCf | kZf | kSf | kOf;
      undefines = kAf | kPf;
      break;
    case ZYDIS_MNEMONIC_BLSMSK:
      defines = kCf | kZf | kSf | kOf;
      undefines = kAf | kPf;
      break;
    case ZYDIS_MNEMONIC_BEXTR:
      defines = kCf | kZf | kOf;
      undefines = kAf | kPf | kSf;
      break;
    default:
      break;
  }
  return append(seq, b, defines, undefines, cls.data());
}

// VGATHER*/VPGATHER*: the index register is first shifted into range (0-127 elements of the scale), so every
// element lands in the data page; the mask is random; now and then two of destination, index and mask are the
// same register (#UD).
bool AvxGenerator::emit_gather(Sequence& seq) {
  const uint8_t opcode = uint8_t(0x90 + rng_() % 4);  // 90 VPGATHERD*, 91 VPGATHERQ*, 92 VGATHERDP*, 93 VGATHERQP*
  const bool w = rng_() % 2, l = rng_() % 2;
  const bool qword_index = opcode & 1;
  uint8_t dst = uint8_t(rng_() % 16), index = uint8_t(rng_() % 16), mask = uint8_t(rng_() % 16);
  if (rng_() % 16 != 0) {
    while (index == dst) index = uint8_t(rng_() % 16);
    while (mask == dst || mask == index) mask = uint8_t(rng_() % 16);
  }
  // The index's width: a qword index, or a dword index of qword elements, under VEX.256 reads only as many
  // elements as the destination has; the shift covers the whole register either way.
  ZydisEncoderRequest request;
  std::memset(&request, 0, sizeof(request));
  request.machine_mode = ZYDIS_MACHINE_MODE_LONG_64;
  request.mnemonic = qword_index ? ZYDIS_MNEMONIC_VPSRLQ : ZYDIS_MNEMONIC_VPSRLD;
  request.operand_count = 3;
  const ZydisRegister index_reg = ZydisRegister(ZYDIS_REGISTER_YMM0 + index);
  request.operands[0].type = request.operands[1].type = ZYDIS_OPERAND_TYPE_REGISTER;
  request.operands[0].reg.value = request.operands[1].reg.value = index_reg;
  request.operands[2].type = ZYDIS_OPERAND_TYPE_IMMEDIATE;
  request.operands[2].imm.u = qword_index ? 57 : 25;
  uint8_t shift[ZYDIS_MAX_INSTRUCTION_LENGTH];
  ZyanUSize shift_length = sizeof(shift);
  if (!ZYAN_SUCCESS(ZydisEncoderEncodeInstruction(&request, shift, &shift_length))) return false;
  if (!append(seq, std::vector<uint8_t>(shift, shift + shift_length), 0, 0, "gather")) return false;
  const uint8_t scale = uint8_t(rng_() % 4);
  const uint8_t disp = uint8_t(rng_() % 16) * 8;  // (a disp8: 0-0x78)
  std::vector<uint8_t> b = {0xc4, uint8_t((dst & 8 ? 0 : 0x80) | (index & 8 ? 0 : 0x40) | 0x02),
                            uint8_t(w << 7 | (~mask & 0xf) << 3 | l << 2 | 1), opcode,
                            uint8_t(0x40 | (dst & 7) << 3 | 4), uint8_t(scale << 6 | (index & 7) << 3 | 7), disp};
  return append(seq, b, 0, 0, "gather");
}

Sequence AvxGenerator::sequence(int length, std::string_view cls) {
  Sequence seq;
  if (rng_() % 4 == 0) seq = legacy_.sequence(1 + int(rng_() % 4));
  const size_t before = seq.listing.size();
  int attempts = 0;
  while (int(seq.listing.size() - before) < length && attempts++ < length * 200) emit(seq, cls);
  return seq;
}

}  // namespace deja::difftest
