// Guest RAM and the vCPUs' registers as a file for crash, gdb and Volatility: an ELF64 core laid out as QEMU's
// dump-guest-memory writes it, or a raw image of physical memory.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

#include "core/cpu_state.h"
#include "core/error.h"
#include "core/guest_memory.h"
#include "logging/output_file.h"

namespace deja {

enum class DumpFormat { kElf, kRaw };
Result<DumpFormat> parse_dump_format(std::string_view text);

struct DumpStats {
  uint64_t file_bytes = 0;  // the file's size
  uint64_t ram_bytes = 0;   // guest RAM in it
  uint64_t hole_bytes = 0;  // RAM that reads as zero, left as a hole in the file
};

// The ELF core (format kElf), as QEMU's dump-guest-memory without paging writes it (dump/dump.c,
// target/i386/arch_dump.c): the ELF header, one PT_NOTE, one PT_LOAD per RAM block (p_paddr its guest-physical
// address, p_vaddr the same, so gdb reads physical addresses), then the notes: an NT_PRSTATUS "CORE" note per vCPU
// (x86-64 elf_prstatus, pr_pid the vCPU number + 1), then a "QEMU" note per vCPU (QEMUCPUState version 1: GPRs,
// segments with their hidden parts, descriptor tables, CR0-CR4, KERNEL_GS_BASE), which crash uses to find the
// kernel's page tables; then RAM, right after them (p_align 0: what crash recognizes as a QEMU/kdump core). kRaw is
// RAM alone, byte for byte from guest-physical 0.
//
// RAM goes from the guest's mapping straight to `out` (no copy of RAM in deja's memory); pages that read as zero are
// left as holes of the file (the memfd's own holes found with lseek SEEK_DATA, without touching them), so the memory
// of a mostly idle guest gives a sparse file quickly.
Result<DumpStats> write_memory_dump(const GuestMemory& ram, std::span<const CpuState> cpus, DumpFormat format,
                                    ProductFile& out);

namespace elf_dump {
// Sizes of the structures the notes carry (x86-64 Linux's elf_prstatus, QEMU's QEMUCPUState v1).
constexpr size_t kPrstatusBytes = 336;
constexpr size_t kPrstatusRegsOffset = 112;
constexpr size_t kQemuCpuStateBytes = 440;
constexpr uint32_t kQemuCpuStateVersion = 1;
}  // namespace elf_dump

}  // namespace deja
