// State digests: a cheap GPR digest for coordinates, and the full machine digest compared across runs and backends.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/cpu_state.h"
#include "core/guest_memory.h"

namespace deja {

// XXH3-64 of the 16 GPRs, RIP and RFLAGS: part of every coordinate, cheap enough for each event.
uint64_t gpr_digest(const CpuState& state);

// 128-bit digest of what both backends must agree on at the end of a deterministic run: GPRs, RIP,
// RFLAGS (RF masked), CR0, CR2, CR3, CR4, EFER, XCR0 when it is not its reset value (1), and all of RAM. The x87,
// XMM and YMM registers are not in it (their effects reach RAM or the GPRs soon enough). Device state is added separately
// (machine_digest) because a digest must mean the same on KVM and interp.
struct Digest {
  std::array<uint8_t, 16> bytes{};
  bool operator==(const Digest&) const = default;
  std::string hex() const;
};

// What a machine digest covers, in parts, so that a replay whose digest differs can say which part: the registers
// as hashed (their values: few enough to keep), an XXH3-64 of each RAM region's non-zero pages, and one of each
// device's state.
struct DigestParts {
  static constexpr uint64_t kRamRegionBytes = 4ull << 20;
  static constexpr int kRegisterCount = kGprCount + 7;  // GPRs, RIP, RFLAGS (RF masked), CR0, CR2, CR3, CR4, EFER
  // Per vCPU (vCPU 0's first): kRegisterCount of them, then XCR0 when it is in the digest (see with_xcr0).
  std::vector<uint64_t> registers;
  std::vector<bool> with_xcr0;        // per vCPU: whether its XCR0 follows its registers
  std::vector<uint64_t> ram_regions;  // region i covers [i * kRamRegionBytes, (i + 1) * kRamRegionBytes)
  std::vector<uint64_t> devices;      // in Machine::device_states() order
  // registers[index]'s name: "rax", ..., "xcr0"; past the first vCPU's "vcpu1 rax", ...
  std::string register_name(size_t index) const;
};

Digest cpu_ram_digest(const CpuState& state, const GuestMemory& memory);
// cpu_ram_digest extended with the concatenated device states; fills `parts` too when given (same single pass).
Digest machine_digest(const CpuState& state, const GuestMemory& memory, std::span<const std::vector<uint8_t>> devices,
                      DigestParts* parts = nullptr);
// Every vCPU's state (vCPU 0's first): the same digest as above for one, the others' registers hashed after the devices.
Digest machine_digest(std::span<const CpuState> states, const GuestMemory& memory,
                      std::span<const std::vector<uint8_t>> devices, DigestParts* parts = nullptr);

}  // namespace deja
