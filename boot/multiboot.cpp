// Multiboot v1 header search and boot-information block layout, per the Multiboot 0.6.96 specification.
#include "boot/multiboot.h"

#include <algorithm>
#include <cstring>

namespace deja {
namespace {

uint32_t read_u32(std::span<const uint8_t> bytes, uint64_t offset) {
  return uint32_t{bytes[offset]} | uint32_t{bytes[offset + 1]} << 8 | uint32_t{bytes[offset + 2]} << 16 |
         uint32_t{bytes[offset + 3]} << 24;
}

void put_u32(std::vector<uint8_t>& out, uint64_t offset, uint64_t value) {
  for (int i = 0; i < 4; ++i) out[offset + i] = static_cast<uint8_t>(value >> (8 * i));
}

void put_u64(std::vector<uint8_t>& out, uint64_t offset, uint64_t value) {
  for (int i = 0; i < 8; ++i) out[offset + i] = static_cast<uint8_t>(value >> (8 * i));
}

}  // namespace

Result<std::optional<MultibootHeader>> find_multiboot_header(std::span<const uint8_t> image, const std::string& name) {
  const uint64_t limit = std::min<uint64_t>(image.size(), multiboot::kSearchLimit);
  std::optional<uint64_t> bad_checksum_at;
  uint32_t bad_sum = 0;
  for (uint64_t at = 0; at + 12 <= limit; at += 4) {
    if (read_u32(image, at) != multiboot::kHeaderMagic) continue;
    const uint32_t flags = read_u32(image, at + 4);
    const uint32_t sum = multiboot::kHeaderMagic + flags + read_u32(image, at + 8);
    if (sum != 0) {
      // A stray magic in code or data is possible; only complain if no valid header follows.
      if (!bad_checksum_at) {
        bad_checksum_at = at;
        bad_sum = sum;
      }
      continue;
    }
    MultibootHeader header;
    header.file_offset = at;
    header.flags = flags;
    const uint32_t unknown = flags & 0xffffu & ~multiboot::kSupportedRequired;
    if (unknown != 0) {
      return fail(ErrorKind::kBadImage,
                  "guest image '{}': its Multiboot header (file offset {:#x}) requires features deja does not "
                  "provide (flags bits {:#x}; supported required bits are 0 page-aligned modules, 1 memory "
                  "information and 2 video mode)",
                  name, at, unknown);
    }
    if (flags & multiboot::kAoutKludge) {
      if (at + 32 > image.size()) {
        return fail(ErrorKind::kBadImage,
                    "guest image '{}' is truncated: its Multiboot header at file offset {:#x} sets the a.out kludge "
                    "flag (bit 16) but the address fields end beyond the {}-byte file",
                    name, at, image.size());
      }
      header.header_addr = read_u32(image, at + 12);
      header.load_addr = read_u32(image, at + 16);
      header.load_end_addr = read_u32(image, at + 20);
      header.bss_end_addr = read_u32(image, at + 24);
      header.entry_addr = read_u32(image, at + 28);
    }
    return header;
  }
  if (bad_checksum_at) {
    return fail(ErrorKind::kBadImage,
                "guest image '{}': Multiboot header at file offset {:#x} has a wrong checksum (magic + flags + "
                "checksum = {:#x}, must be 0)",
                name, *bad_checksum_at, bad_sum);
  }
  return std::optional<MultibootHeader>{};
}

Result<std::vector<uint8_t>> build_multiboot_info(uint64_t base, uint64_t capacity, uint64_t ram_size,
                                                  const std::string& cmdline,
                                                  std::span<const MultibootModule> modules) {
  using namespace multiboot;
  struct Range {
    uint64_t start, end;
    uint32_t type;
  };
  std::vector<Range> map;
  map.push_back({0, std::min(ram_size, kEbdaStart), kMemoryAvailable});
  map.push_back({kEbdaStart, kHighMemoryStart, kMemoryReserved});
  if (ram_size > kHighMemoryStart) map.push_back({kHighMemoryStart, ram_size, kMemoryAvailable});

  static constexpr char kLoaderName[] = "deja";
  uint64_t args_bytes = 0;
  for (const auto& module : modules) args_bytes += module.args.size() + 1;
  const uint64_t mmap_offset = kInfoSize;
  const uint64_t mods_offset = mmap_offset + map.size() * kMmapEntrySize;
  const uint64_t name_offset = mods_offset + modules.size() * kModuleEntrySize;
  const uint64_t cmdline_offset = name_offset + sizeof(kLoaderName);
  const uint64_t args_offset = cmdline_offset + cmdline.size() + 1;
  const uint64_t total = args_offset + args_bytes;
  if (total > capacity) {
    return fail(ErrorKind::kInvalidArgument,
                "the command line ({} bytes) and {} boot module argument strings ({} bytes) need a {}-byte boot "
                "information block, but its area holds {} bytes: shorten them",
                cmdline.size(), modules.size(), args_bytes, total, capacity);
  }
  if (base + total > (uint64_t{1} << 32)) {
    return fail(ErrorKind::kInvalidArgument, "boot information at {:#x} must lie below 4 GiB", base);
  }

  std::vector<uint8_t> out(total, 0);
  put_u32(out, kInfoFlags, kInfoMemory | kInfoCmdline | kInfoModules | kInfoMmap | kInfoLoaderName);
  // mem_lower/mem_upper in KiB; mem_upper ends at the first hole, and the field is 32-bit.
  put_u32(out, kInfoMemLower, 640);  // as QEMU and PC firmware report it (RAM is at least 1 MiB)
  const uint64_t below_4g = std::min(ram_size, uint64_t{1} << 32);
  put_u32(out, kInfoMemUpper, below_4g > kHighMemoryStart ? (below_4g - kHighMemoryStart) / 1024 : 0);
  put_u32(out, kInfoCmdlineAddr, base + cmdline_offset);
  put_u32(out, kInfoModsCount, modules.size());
  put_u32(out, kInfoModsAddr, base + mods_offset);
  put_u32(out, kInfoMmapLength, map.size() * kMmapEntrySize);
  put_u32(out, kInfoMmapAddr, base + mmap_offset);
  put_u32(out, kInfoLoaderNameAddr, base + name_offset);

  for (size_t i = 0; i < map.size(); ++i) {
    const uint64_t at = mmap_offset + i * kMmapEntrySize;
    put_u32(out, at, kMmapEntrySize - 4);  // `size` excludes itself
    put_u64(out, at + 4, map[i].start);
    put_u64(out, at + 12, map[i].end - map[i].start);
    put_u32(out, at + 20, map[i].type);
  }
  std::memcpy(out.data() + name_offset, kLoaderName, sizeof(kLoaderName));
  std::memcpy(out.data() + cmdline_offset, cmdline.data(), cmdline.size());
  uint64_t string_at = args_offset;
  for (size_t i = 0; i < modules.size(); ++i) {
    const uint64_t at = mods_offset + i * kModuleEntrySize;
    put_u32(out, at, modules[i].start);
    put_u32(out, at + 4, modules[i].end);
    put_u32(out, at + 8, base + string_at);
    std::memcpy(out.data() + string_at, modules[i].args.data(), modules[i].args.size());
    string_at += modules[i].args.size() + 1;
  }
  return out;
}

}  // namespace deja
