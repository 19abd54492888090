// Read-only guest page-table walker: guest-virtual to guest-physical for the debugger and queries, the same on every backend.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>

#include "core/cpu_state.h"
#include "core/error.h"
#include "core/guest_memory.h"

namespace deja {

// What the walk found: the physical address and the permissions along the way.
struct Translation {
  uint64_t gpa = 0;
  bool writable = true;
  bool user = true;
  bool executable = true;
  uint64_t page_size = 4096;
};

// Walks the guest's tables in RAM as the CPU would (no paging, 32-bit with PSE, PAE, 4-level long
// mode), without setting accessed or dirty bits and without a TLB: what the debugger sees is what the
// tables say now. Fails (kGuest) for a non-present entry, a reserved bit, a table outside RAM or a
// non-canonical address, naming the level.
Result<Translation> translate_gva(const CpuState& cpu, const GuestMemory& memory, uint64_t gva);

// Reads [gva, gva+out.size()) page by page; returns how many bytes could be read (stops at the first
// unmapped page), so a debugger's partial read gets the mapped prefix.
size_t read_gva(const CpuState& cpu, const GuestMemory& memory, uint64_t gva, std::span<uint8_t> out);

}  // namespace deja
