// Test fixture for the software CPU: assembles snippets with binutils and runs them in a flat 64-bit (or 32-bit) guest.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "interp/interp_backend.h"
#include "core/guest_memory.h"

namespace deja::test {

// Assembles Intel-syntax `source` at origin `origin` (`bits` 64 or 32) with `as` and returns the bytes.
std::vector<uint8_t> assemble(const std::string& source, uint64_t origin, int bits = 64);

// Guest-physical layout every test uses.
constexpr uint64_t kPml4 = 0x1000, kPdpt = 0x2000, kPd = 0x3000, kIdt = 0x4000, kGdt = 0x5000, kTss = 0x6000;
constexpr uint64_t kPt = 0x7000;     // a 4K page table for the first 2 MiB, so tests can change single pages
constexpr uint64_t kCode = 0x100000;  // 1 MiB
constexpr uint64_t kStackTop = 0x80000;
constexpr uint16_t kCode64 = 0x08, kData = 0x10, kCode32 = 0x18, kUserData = 0x23, kUserCode64 = 0x2b, kTssSel = 0x30;

struct TestVm {
  std::unique_ptr<GuestMemory> memory;  // heap-held so the backend's reference survives moves
  std::unique_ptr<InterpBackend> cpu;

  // RAM of `ram` bytes with identity-mapped 4-level paging (first 1 GiB; the first 2 MiB in 4K pages),
  // a GDT, a 64-bit TSS and an empty IDT; the CPU in 64-bit ring 0 at kCode.
  static TestVm long_mode(uint64_t ram = 16 << 20, const CpuModel& model = CpuModel::deja_v1());
  // The same tables, but the CPU in 32-bit protected mode with paging off (the Multiboot entry state).
  static TestVm protected_mode(uint64_t ram = 16 << 20);

  void load(uint64_t gpa, const std::vector<uint8_t>& bytes);
  // Assembles and loads `source` at kCode.
  void code(const std::string& source, int bits = 64);
  // Installs a 64-bit interrupt gate for `vector` pointing at `handler` (type 0xe, or 0xf for a trap gate).
  void idt_gate(uint8_t vector, uint64_t handler, uint8_t ist = 0, uint8_t dpl = 0, uint8_t type = 0xe);
  void write64(uint64_t gpa, uint64_t value);
  uint64_t read64(uint64_t gpa);
  CpuState state();
  void set_state(const CpuState& state);
  // Runs until an exit that is not an OUT to port 0xe9 (which the tests use as a debug channel).
  VcpuExit run();
};

}  // namespace deja::test
