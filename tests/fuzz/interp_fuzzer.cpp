// libFuzzer target: any bytes as code (and register values) for the software CPU's decoder and executor: every run ends in an exit.
#include <cstring>
#include <memory>

#include "interp/decoded_insn.h"
#include "tests/interp/diff/machine.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace deja::difftest;
  // The decoder alone, in every mode, at every offset.
  for (uint8_t mode : {deja::interp::kMode16, deja::interp::kMode32, deja::interp::kMode64}) {
    for (size_t at = 0; at < size && at < 64; ++at) {
      deja::interp::DecodedInsn insn;
      (void)deja::interp::decode_bytes(data + at, size - at, mode, insn);
    }
  }
  // Then as code: the first 128 bytes give registers, the rest is the instruction stream (plus a HLT).
  static std::unique_ptr<GuestMachine> machine;
  static int runs = 0;
  if (!machine || ++runs % 64 == 0) machine = GuestMachine::create();
  if (!machine) return 0;
  RegisterFile regs;
  const size_t reg_bytes = std::min<size_t>(size, sizeof(regs.gpr));
  std::memcpy(regs.gpr.data(), data, reg_bytes);
  if (size > reg_bytes && data[reg_bytes] & 1) regs.gpr[4] = kInitialRsp;
  std::vector<uint8_t> code(data + reg_bytes, data + std::min<size_t>(size, reg_bytes + kCodeSize / 2));
  code.push_back(0xf4);
  std::vector<uint8_t> memory(kDataSize, 0);
  const Outcome out = machine->run(code, regs, memory, 2000);
  if (out.ending == Ending::kOther) machine.reset();
  return 0;
}
