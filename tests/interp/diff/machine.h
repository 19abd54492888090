// Shared layout of the differential tester and fuzzer: one register file format, run natively on the host or under InterpBackend.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "interp/interp_backend.h"
#include "core/guest_memory.h"

namespace deja::difftest {

// Fixed addresses, identical on the host (mmap'd) and in the guest (identity-paged), so that
// absolute and RIP-relative addresses mean the same thing in both runs.
constexpr uint64_t kCodeAddr = 0x400000;   // the instruction sequence, then the exit tail
constexpr uint64_t kCodeSize = 0x2000;
constexpr uint64_t kDataAddr = 0x500000;   // memory operands ([r15 + disp]) and the stack
constexpr uint64_t kDataSize = 0x1000;
constexpr uint64_t kStateAddr = 0x600000;  // host only: the trampoline's register file
constexpr uint64_t kHandlerAddr = 0x700000;  // guest only: one HLT per exception vector, 16 bytes apart
constexpr uint64_t kInitialRsp = kDataAddr + 0x800;

// The register file the trampoline loads and stores (offsets are hard-coded in its assembly).
struct RegisterFile {
  std::array<uint64_t, 16> gpr{};  // RAX, RCX, RDX, RBX, RSP, RBP, RSI, RDI, R8-R15
  uint64_t rflags = 0x2;
  uint32_t mxcsr = 0x1f80;
  uint32_t pad = 0;
  uint64_t host_rsp = 0;    // trampoline scratch
  uint64_t code_entry = 0;  // trampoline scratch
  uint64_t exit_target = 0;  // trampoline scratch
  uint64_t pad2 = 0;
  std::array<std::array<uint64_t, 2>, 16> xmm{};  // offset 176
  // The x87 state as FXSAVE64 stores it (the MXCSR and XMM parts are unused: the fields above rule): the
  // trampoline loads it with FXRSTOR64 and stores it with FXSAVE64.
  alignas(16) std::array<uint8_t, 512> fx{};  // offset 432
  // FNSTENV's image at exit: the host's FXSAVE64 may omit FIP/FDP/FOP (AMD saves them only with an
  // exception pending), so they are compared from here.
  std::array<uint8_t, 28> env{};  // offset 944
  uint32_t pad3 = 0;
  // With `ymm` set (a host with AVX, a guest with AVX state enabled), the upper halves of YMM0-15 are loaded and
  // stored too.
  uint64_t ymm = 0;                                 // offset 976
  uint64_t pad4 = 0;
  std::array<std::array<uint64_t, 2>, 16> ymmh{};   // offset 992
};
static_assert(offsetof(RegisterFile, rflags) == 128);
static_assert(offsetof(RegisterFile, mxcsr) == 136);
static_assert(offsetof(RegisterFile, host_rsp) == 144);
static_assert(offsetof(RegisterFile, code_entry) == 152);
static_assert(offsetof(RegisterFile, exit_target) == 160);
static_assert(offsetof(RegisterFile, xmm) == 176);
static_assert(offsetof(RegisterFile, fx) == 432);
static_assert(offsetof(RegisterFile, env) == 944);
static_assert(offsetof(RegisterFile, ymm) == 976);
static_assert(offsetof(RegisterFile, ymmh) == 992);
static_assert(sizeof(RegisterFile) < 0xfe0);  // below the trampoline's scratch stack at 0x600ff0

// How a run ended. Exceptions are compared by class, because the host only sees a signal.
// #XM and #MF both reach the host as SIGFPE with the same codes, so they are one class.
enum class Ending : uint8_t { kCompleted, kDivideError, kSimdFault, kInvalidOpcode, kMemoryFault, kOther, kHang };
const char* ending_name(Ending ending);

struct Outcome {
  Ending ending = Ending::kCompleted;
  int detail = 0;  // signal (host) or vector (interp)
  RegisterFile regs;
  std::vector<uint8_t> data;
};

// The bytes that end a sequence: the host jumps back to the trampoline, the guest halts.
std::vector<uint8_t> host_tail();
std::vector<uint8_t> guest_tail();

// Runs `code` natively, in this process (a fault or a hang is caught). Sets up the fixed mappings on first use.
Outcome run_native(const std::vector<uint8_t>& code, const RegisterFile& regs, const std::vector<uint8_t>& data);

// A 64-bit ring-0 guest with identity paging, a GDT, and an IDT whose gates all halt at kHandlerAddr + 16*vector.
class GuestMachine {
 public:
  // `mode`: how the interpreter executes (its default, or the one a differential test compares); `model`: the
  // CPU model (nullptr: the richest the software CPU implements); one with AVX gets CR4.OSXSAVE and XCR0 =
  // x87|SSE|AVX, as Linux sets them.
  static std::unique_ptr<GuestMachine> create(std::optional<InterpMode> mode = std::nullopt,
                                              const CpuModel* model = nullptr);
  // Runs `code` (which should end in guest_tail()) for at most `budget` instructions.
  Outcome run(const std::vector<uint8_t>& code, const RegisterFile& regs, const std::vector<uint8_t>& data,
              uint64_t budget);
  // Loads code, data and registers and points the CPU at the code, without running it.
  bool prepare(const std::vector<uint8_t>& code, const RegisterFile& regs, const std::vector<uint8_t>& data);
  InterpBackend& cpu() { return *cpu_; }
  const CpuModel& model() const { return *model_; }
  GuestMemory& memory() { return *memory_; }

 private:
  std::unique_ptr<GuestMemory> memory_;
  std::unique_ptr<InterpBackend> cpu_;
  const CpuModel* model_ = nullptr;
  CpuState base_;
};

}  // namespace deja::difftest
