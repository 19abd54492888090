// Random straight-line sequences of non-privileged instructions (encoded with Zydis) plus random starting state.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "tests/interp/diff/machine.h"

namespace deja::difftest {

struct Sequence {
  std::vector<uint8_t> code;              // without the tail
  std::vector<std::string> listing;       // one line per instruction, for failure reports
  std::vector<std::string> classes;       // instruction class of each line (coverage accounting)
  uint64_t undefined_flags = 0;           // arithmetic flags the SDM leaves undefined at the end
  // The x87 instruction and data pointers (FIP/FOP, FDP) are compared once an x87 instruction has set them.
  bool x87_ip_defined = false;
  bool x87_dp_defined = false;
  bool fscale_allowed = true;             // FSCALE's unmasked overflow/underflow differs between vendors
  // FSW bits that differ between vendors since an instruction: C1 after FCOMI & co. (Intel clears it, AMD
  // leaves it). Compared at the end only if defined; never stored by FNSTSW/FNSTENV/FNSAVE while undefined.
  uint16_t x87_undefined_status = 0;
};

// Appends encoded instructions to `seq`: the bytes, and each instruction's line in the listing (Zydis' own
// disassembly of what was encoded) with its class.
void append_instructions(Sequence& seq, const std::vector<uint8_t>& bytes, const std::string& cls);

class Generator {
 public:
  // TZCNT/LZCNT run as BSF/BSR on CPUs without BMI1/LZCNT, so they are generated only when both
  // the host and deja's CPU model have them.
  Generator(uint64_t seed, bool has_tzcnt, bool has_lzcnt);
  Sequence sequence(int length);
  // MOVBE (register from memory and memory from register) among the bit scans and counts: where the host and
  // deja's CPU model both have it.
  bool movbe = false;

  // Known interp defects the CI run steps around until they are fixed (each one is listed in the
  // tester's --help and in docs/interp-alu.md), so that everything else keeps being checked.
  bool avoid_xadd_same_register = false;
  // Keep MXCSR.UM masked: with underflow unmasked, hardware raises #XM for an exact tiny result too,
  // which deja's SSE (run masked on the host) does not (docs/interp-alu.md, "known approximation").
  bool avoid_unmasked_underflow = false;
  RegisterFile registers();
  std::vector<uint8_t> data();

  // The SIMD and x86-64-v2 instruction classes (MMX with its x87 transitions, MMX's SSE additions and the
  // MMX/SSE conversions, SSE3, SSSE3, SSE4.1, SSE4.2, the x86-64-v2 integer instructions) by name.
  static const std::vector<std::string>& simd_class_names();
  // What sequence() draws from: the original mix (empty), or these SIMD classes only; with `mix_original`
  // half of the instructions still come from the original mix.
  std::vector<std::string> simd_classes;
  bool mix_original = false;

 private:
  bool emit_one(Sequence& seq);
  bool emit_x87(Sequence& seq, std::vector<uint8_t>& bytes, uint64_t& reads, uint64_t& defines, const char*& cls);
  bool emit_simd(Sequence& seq, const std::string& name, std::vector<uint8_t>& bytes, uint64_t& reads,
                 uint64_t& defines, const char*& cls);
  void x87_value(uint8_t* slot);
  uint16_t x87_control_ = 0x037f;  // chosen with each sequence, loaded by registers()
  uint64_t interesting(unsigned width);
  std::mt19937_64 rng_;
  bool tzcnt_;
  bool lzcnt_;
};

}  // namespace deja::difftest
