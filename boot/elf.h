// ELF32/ELF64 program-header parsing for guest images: every offset and size checked against the file, nothing loaded.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/error.h"

namespace deja {

namespace elf {
constexpr uint8_t kClass32 = 1, kClass64 = 2;
constexpr uint8_t kDataLsb = 1;
constexpr uint16_t kTypeRel = 1, kTypeExec = 2, kTypeDyn = 3, kTypeCore = 4;
constexpr uint16_t kMachine386 = 3, kMachineX86_64 = 62;
constexpr uint32_t kPtLoad = 1, kPtNote = 4;
constexpr uint16_t kPnXnum = 0xffff;  // program-header count lives in section 0: never produced for kernels
}  // namespace elf

// One PT_LOAD program header, with the index it had in the file (error messages name it).
struct ElfSegment {
  unsigned index = 0;
  uint64_t file_offset = 0;
  uint64_t file_size = 0;
  uint64_t vaddr = 0;
  uint64_t paddr = 0;
  uint64_t mem_size = 0;
};

// A PT_NOTE program header's file range (checked to lie inside the file).
struct ElfNoteRange {
  unsigned index = 0;
  uint64_t file_offset = 0;
  uint64_t file_size = 0;
};

struct ElfImage {
  uint8_t elf_class = 0;  // elf::kClass32 or elf::kClass64
  uint16_t machine = 0;
  uint64_t entry = 0;
  std::vector<ElfSegment> segments;  // PT_LOAD segments with p_memsz > 0, in file order
  std::vector<ElfNoteRange> notes;   // PT_NOTE segments, in file order
};

// One ELF note: its owner name (without the NUL), type and descriptor bytes (a view into the file).
struct ElfNote {
  std::string name;
  uint32_t type = 0;
  std::span<const uint8_t> desc;
};

// True when the bytes start with the ELF magic (the file claims to be ELF; parse_elf checks the rest).
bool has_elf_magic(std::span<const uint8_t> bytes);

// Human-readable machine name for messages ("ARM", "x86-64", "machine 183").
std::string elf_machine_name(uint16_t machine);

// Validates the ELF header and program headers of `bytes` (little-endian, ELF32 or ELF64, ET_EXEC or
// ET_DYN) and returns its loadable segments. Does not judge the machine: callers decide which
// machines they boot. Every error is kBadImage and names `name_for_errors`.
Result<ElfImage> parse_elf(std::span<const uint8_t> bytes, const std::string& name_for_errors);

// Every note in the image's PT_NOTE segments (4-byte aligned records, as x86 toolchains write them). A note
// whose name or descriptor runs past its segment is an error.
Result<std::vector<ElfNote>> parse_elf_notes(std::span<const uint8_t> bytes, const ElfImage& image,
                                             const std::string& name_for_errors);

}  // namespace deja
