// What every guest loader shares: pieces of guest RAM to write, their checks, flat segments and identity page tables.
//
// A loader (Multiboot and ELF in loader.cpp, the Linux boot protocol in linux_boot.cpp, PVH in pvh.cpp) first plans
// every byte it will write as Pieces, checks them all against RAM and each other, and only then writes: a refused
// image leaves RAM untouched.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/cpu_state.h"
#include "core/error.h"
#include "core/guest_memory.h"

namespace deja {

constexpr uint64_t kBoot4GiB = uint64_t{1} << 32;

// What a loader produced.
struct LoadedImage {
  CpuState initial_state;  // the vCPU state at the guest's entry
  // "multiboot-elf32", "multiboot-elf64", "multiboot-aout", "elf64-direct", "linux-64bit", "linux-pvh"
  std::string format;
  uint64_t entry = 0;
  std::vector<std::pair<uint64_t, uint64_t>> loaded_ranges;  // [gpa, size) of every segment/module/structure written
};

// One thing to write: `data` at `gpa`, then zeros up to `mem_size` (ELF .bss, a.out bss).
struct Piece {
  std::string what;
  uint64_t gpa = 0;
  std::span<const uint8_t> data;
  uint64_t mem_size = 0;
  uint64_t end() const { return gpa + mem_size; }
};

// A named range of guest-physical memory a loader reserves for its own structures.
struct Region {
  const char* what;
  uint64_t start, end;
};

inline bool ranges_overlap(uint64_t a_start, uint64_t a_end, uint64_t b_start, uint64_t b_end) {
  return a_start < b_end && b_start < a_end;
}
inline uint64_t align_up(uint64_t value, uint64_t alignment) { return (value + alignment - 1) / alignment * alignment; }
inline uint64_t align_down(uint64_t value, uint64_t alignment) { return value / alignment * alignment; }

// Checks that every piece lies in RAM (and below 4 GiB when `below_4g`), clear of every reserved region and of
// every other piece. Errors are kBadImage and name `name` ("guest image 'vmlinux'").
Result<> check_pieces(const std::string& name, const std::vector<Piece>& pieces, uint64_t ram_size, bool below_4g,
                      std::span<const Region> reserved);

// Writes a piece's data then zeros to its mem_size (explicitly: RAM may have been used before).
Result<> write_piece(GuestMemory& memory, const Piece& piece);

// Writes every piece of every group, in order, recording the ranges in `loaded`.
Result<> write_pieces(GuestMemory& memory, std::span<const std::vector<Piece>* const> groups, LoadedImage& loaded);

// Identity map of max(4 GiB, RAM rounded up to 1 GiB) with 2 MiB pages at `base`: PML4, one PDPT, one page
// directory per GiB. Pages at or beyond the end of RAM (the MMIO window) are uncached (PCD|PWT).
std::vector<uint8_t> build_identity_page_tables(uint64_t base, uint64_t ram_size);
// Bytes the tables above occupy for `ram_size`.
uint64_t identity_page_tables_size(uint64_t ram_size);

// A flat (base 0, limit 4 GiB, G = 1) code or data segment as loading `selector` from a GDT entry would set it.
SegmentReg flat_segment(uint16_t selector, uint8_t type, bool code64);

// x87 and SSE as after FNINIT / reset: all exceptions masked, so early SSE code does not fault.
void reset_fpu_state(CpuState& state);

// 8-byte GDT descriptors (accessed bit preset, so the CPU never writes them back).
namespace gdt_entry {
constexpr uint64_t kCode64 = 0x00af9b000000ffffull;  // L = 1, D = 0, present, DPL 0, execute/read
constexpr uint64_t kCode32 = 0x00cf9b000000ffffull;  // D = 1, G = 1, execute/read
constexpr uint64_t kData = 0x00cf93000000ffffull;    // D = 1, G = 1, read/write
}  // namespace gdt_entry

// Little-endian stores into a byte buffer (boot structures are built as bytes, never as host structs).
void put_le(std::vector<uint8_t>& out, uint64_t offset, uint64_t value, unsigned width);
uint64_t get_le(std::span<const uint8_t> bytes, uint64_t offset, unsigned width);

}  // namespace deja
