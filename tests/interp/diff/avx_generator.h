// Random VEX instruction sequences for the differential tester (AVX, AVX2, FMA, F16C, BMI1/2, gathers), drawn from every encoding Zydis accepts.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <string_view>
#include <vector>

#include "tests/interp/diff/generator.h"

namespace deja::difftest {

// The instruction classes of the VEX tester, each drawn from the encodings (map, prefix, W, L, opcode) that decode
// to it: random registers, [r15 + disp] memory operands (now and then misaligned), random immediates.
std::span<const std::string_view> avx_classes();

class AvxGenerator {
 public:
  explicit AvxGenerator(uint64_t seed);
  // A sequence of `length` VEX instructions of class `cls`, after a few legacy instructions (SSE among them, which
  // must leave the upper halves of the YMM registers alone) now and then.
  Sequence sequence(int length, std::string_view cls);
  RegisterFile registers();  // Generator::registers() with the YMM upper halves random too
  std::vector<uint8_t> data() { return legacy_.data(); }
  // The generator of the legacy instructions and the starting state (its avoid_* switches apply here too).
  Generator& legacy() { return legacy_; }

 private:
  struct Encoding {
    uint8_t map, pp, w, l, opcode, reg;  // reg: ModRM.reg for the group opcodes (8: any)
    bool memory;                         // the r/m operand is memory (else a register)
    uint16_t mnemonic;
  };
  bool emit(Sequence& seq, std::string_view cls);
  bool emit_gather(Sequence& seq);
  bool append(Sequence& seq, const std::vector<uint8_t>& bytes, uint64_t defines, uint64_t undefines, const char* cls);
  std::vector<Encoding>& encodings(std::string_view cls);

  std::mt19937_64 rng_;
  Generator legacy_;
  std::vector<std::pair<std::string_view, std::vector<Encoding>>> by_class_;
};

}  // namespace deja::difftest
