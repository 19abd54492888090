// State digests: a cheap GPR digest for coordinates, and the full machine digest compared across runs and backends.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "vmm/cpu_state.h"
#include "vmm/guest_memory.h"

namespace deja {

// XXH3-64 of the 16 GPRs, RIP and RFLAGS: part of every coordinate, cheap enough for each event.
uint64_t gpr_digest(const CpuState& state);

// 128-bit digest of what both backends must agree on at the end of a deterministic run: GPRs, RIP,
// RFLAGS (RF masked), CR0, CR2, CR3, CR4, EFER and all of RAM. Device state is added separately
// (machine_digest) because a digest must mean the same on KVM and interp.
struct Digest {
  std::array<uint8_t, 16> bytes{};
  bool operator==(const Digest&) const = default;
  std::string hex() const;
};

Digest cpu_ram_digest(const CpuState& state, const GuestMemory& memory);
// cpu_ram_digest extended with the concatenated device states.
Digest machine_digest(const CpuState& state, const GuestMemory& memory, std::span<const std::vector<uint8_t>> devices);

}  // namespace deja
