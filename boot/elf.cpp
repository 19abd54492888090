// ELF header and program-header validation for guest images (no trust in any offset, size or count).
#include "boot/elf.h"

#include <cstring>

namespace deja {
namespace {

// Little-endian field read at a known-in-bounds offset (callers check the bounds first).
uint64_t read_le(std::span<const uint8_t> bytes, uint64_t offset, unsigned width) {
  uint64_t value = 0;
  for (unsigned i = 0; i < width; ++i) value |= uint64_t{bytes[offset + i]} << (8 * i);
  return value;
}

constexpr uint64_t kElf32HeaderSize = 52, kElf64HeaderSize = 64;
constexpr uint64_t kElf32PhdrSize = 32, kElf64PhdrSize = 56;

std::string type_name(uint16_t type) {
  switch (type) {
    case elf::kTypeRel: return "a relocatable object file (ET_REL); link it into an executable first";
    case elf::kTypeCore: return "a core dump (ET_CORE)";
    default: return fmt::format("of unknown ELF type {}", type);
  }
}

}  // namespace

bool has_elf_magic(std::span<const uint8_t> bytes) {
  return bytes.size() >= 4 && bytes[0] == 0x7f && bytes[1] == 'E' && bytes[2] == 'L' && bytes[3] == 'F';
}

std::string elf_machine_name(uint16_t machine) {
  switch (machine) {
    case elf::kMachine386: return "i386";
    case elf::kMachineX86_64: return "x86-64";
    case 40: return "ARM";
    case 183: return "AArch64";
    case 243: return "RISC-V";
    case 8: return "MIPS";
    case 20: return "PowerPC";
    case 21: return "PowerPC64";
    default: return fmt::format("machine {}", machine);
  }
}

Result<ElfImage> parse_elf(std::span<const uint8_t> bytes, const std::string& name) {
  if (!has_elf_magic(bytes)) return fail(ErrorKind::kBadImage, "guest image '{}': not an ELF file (bad magic)", name);
  if (bytes.size() < 16) {
    return fail(ErrorKind::kBadImage, "guest image '{}' is truncated: {} bytes, shorter than the ELF identification",
                name, bytes.size());
  }
  ElfImage image;
  image.elf_class = bytes[4];
  if (image.elf_class != elf::kClass32 && image.elf_class != elf::kClass64) {
    return fail(ErrorKind::kBadImage, "guest image '{}': unknown ELF class {} (expected 1 for ELF32 or 2 for ELF64)",
                name, image.elf_class);
  }
  if (bytes[5] != elf::kDataLsb) {
    return fail(ErrorKind::kBadImage,
                "guest image '{}': ELF data encoding {} is not little-endian (x86 images are ELFDATA2LSB)", name,
                bytes[5]);
  }
  if (bytes[6] != 1) {
    return fail(ErrorKind::kBadImage, "guest image '{}': unknown ELF version {} (expected 1)", name, bytes[6]);
  }
  const bool is64 = image.elf_class == elf::kClass64;
  const uint64_t header_size = is64 ? kElf64HeaderSize : kElf32HeaderSize;
  if (bytes.size() < header_size) {
    return fail(ErrorKind::kBadImage, "guest image '{}' is truncated: {} bytes, shorter than the {}-byte ELF{} header",
                name, bytes.size(), header_size, is64 ? 64 : 32);
  }
  const uint16_t type = static_cast<uint16_t>(read_le(bytes, 16, 2));
  image.machine = static_cast<uint16_t>(read_le(bytes, 18, 2));
  if (type != elf::kTypeExec && type != elf::kTypeDyn) {
    return fail(ErrorKind::kBadImage, "guest image '{}' is {}, not an executable", name, type_name(type));
  }
  uint64_t phoff, phentsize, phnum;
  if (is64) {
    image.entry = read_le(bytes, 24, 8);
    phoff = read_le(bytes, 32, 8);
    phentsize = read_le(bytes, 54, 2);
    phnum = read_le(bytes, 56, 2);
  } else {
    image.entry = read_le(bytes, 24, 4);
    phoff = read_le(bytes, 28, 4);
    phentsize = read_le(bytes, 42, 2);
    phnum = read_le(bytes, 44, 2);
  }
  const uint64_t min_phentsize = is64 ? kElf64PhdrSize : kElf32PhdrSize;
  if (phnum == elf::kPnXnum) {
    return fail(ErrorKind::kBadImage, "guest image '{}': extended program-header numbering (PN_XNUM) is not supported",
                name);
  }
  if (phnum == 0) return fail(ErrorKind::kBadImage, "guest image '{}' has no program headers (no PT_LOAD segment)", name);
  if (phentsize < min_phentsize) {
    return fail(ErrorKind::kBadImage, "guest image '{}': program-header entry size {} is smaller than the {} bytes of an ELF{} Phdr",
                name, phentsize, min_phentsize, is64 ? 64 : 32);
  }
  // phnum < 2^16 and phentsize < 2^16, so the product cannot overflow; the sum with phoff can.
  const uint64_t table_size = phentsize * phnum;
  if (phoff > bytes.size() || table_size > bytes.size() - phoff) {
    return fail(ErrorKind::kBadImage,
                "guest image '{}' is truncated: its {} program headers at file offset {:#x} ({} bytes) extend beyond "
                "the end of the {}-byte file",
                name, phnum, phoff, table_size, bytes.size());
  }
  for (unsigned i = 0; i < phnum; ++i) {
    const uint64_t at = phoff + i * phentsize;
    const uint32_t p_type = static_cast<uint32_t>(read_le(bytes, at, 4));
    if (p_type == elf::kPtNote) {
      ElfNoteRange note{i, is64 ? read_le(bytes, at + 8, 8) : read_le(bytes, at + 4, 4),
                        is64 ? read_le(bytes, at + 32, 8) : read_le(bytes, at + 16, 4)};
      if (note.file_offset > bytes.size() || note.file_size > bytes.size() - note.file_offset) {
        return fail(ErrorKind::kBadImage,
                    "guest image '{}' is truncated: note segment {} [{:#x}, +{:#x}) extends beyond the end of the "
                    "{}-byte file",
                    name, i, note.file_offset, note.file_size, bytes.size());
      }
      image.notes.push_back(note);
      continue;
    }
    if (p_type != elf::kPtLoad) continue;
    ElfSegment seg;
    seg.index = i;
    if (is64) {
      seg.file_offset = read_le(bytes, at + 8, 8);
      seg.vaddr = read_le(bytes, at + 16, 8);
      seg.paddr = read_le(bytes, at + 24, 8);
      seg.file_size = read_le(bytes, at + 32, 8);
      seg.mem_size = read_le(bytes, at + 40, 8);
    } else {
      seg.file_offset = read_le(bytes, at + 4, 4);
      seg.vaddr = read_le(bytes, at + 8, 4);
      seg.paddr = read_le(bytes, at + 12, 4);
      seg.file_size = read_le(bytes, at + 16, 4);
      seg.mem_size = read_le(bytes, at + 20, 4);
    }
    if (seg.file_size > seg.mem_size) {
      return fail(ErrorKind::kBadImage,
                  "guest image '{}': segment {} has p_filesz {:#x} larger than p_memsz {:#x}", name, i, seg.file_size,
                  seg.mem_size);
    }
    if (seg.file_size != 0 && (seg.file_offset > bytes.size() || seg.file_size > bytes.size() - seg.file_offset)) {
      return fail(ErrorKind::kBadImage,
                  "guest image '{}' is truncated: segment {} file data [{:#x}, +{:#x}) extends beyond the end of the "
                  "{}-byte file",
                  name, i, seg.file_offset, seg.file_size, bytes.size());
    }
    if (seg.mem_size == 0) continue;  // an empty PT_LOAD loads nothing; linkers emit them for alignment
    image.segments.push_back(seg);
  }
  if (image.segments.empty()) {
    return fail(ErrorKind::kBadImage, "guest image '{}' has no PT_LOAD segment with memory to load", name);
  }
  return image;
}

Result<std::vector<ElfNote>> parse_elf_notes(std::span<const uint8_t> bytes, const ElfImage& image,
                                             const std::string& name) {
  std::vector<ElfNote> notes;
  for (const ElfNoteRange& range : image.notes) {
    const auto segment = bytes.subspan(range.file_offset, range.file_size);
    uint64_t at = 0;
    while (segment.size() - at >= 12) {
      const uint64_t name_size = read_le(segment, at, 4), desc_size = read_le(segment, at + 4, 4);
      const uint32_t type = static_cast<uint32_t>(read_le(segment, at + 8, 4));
      const uint64_t name_at = at + 12;
      const uint64_t desc_at = name_at + ((name_size + 3) & ~uint64_t{3});
      const uint64_t next = desc_at + ((desc_size + 3) & ~uint64_t{3});
      if (desc_at > segment.size() || desc_size > segment.size() - desc_at) {
        return fail(ErrorKind::kBadImage,
                    "guest image '{}': note segment {} holds a note at offset {:#x} (name {} bytes, descriptor {} "
                    "bytes) that runs past the segment's {} bytes",
                    name, range.index, at, name_size, desc_size, segment.size());
      }
      ElfNote note;
      auto name_bytes = segment.subspan(name_at, name_size);
      while (!name_bytes.empty() && name_bytes.back() == 0) name_bytes = name_bytes.first(name_bytes.size() - 1);
      note.name.assign(name_bytes.begin(), name_bytes.end());
      note.type = type;
      note.desc = segment.subspan(desc_at, desc_size);
      notes.push_back(std::move(note));
      at = std::min<uint64_t>(next, segment.size());
    }
  }
  return notes;
}

}  // namespace deja
