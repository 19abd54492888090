// Multiboot v1 (0.6.96): finding and validating an image's header, and building the boot-information block.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/error.h"

namespace deja {

namespace multiboot {
constexpr uint32_t kHeaderMagic = 0x1BADB002;      // in the image
constexpr uint32_t kBootloaderMagic = 0x2BADB002;  // in EAX at entry
constexpr uint64_t kSearchLimit = 8192;            // the header must lie 32-bit aligned in the first 8 KiB

// Header flags. Bits 0-15 are required: a loader must refuse an image that sets one it does not know.
constexpr uint32_t kPageAlignModules = 1u << 0;
constexpr uint32_t kMemoryInfo = 1u << 1;
constexpr uint32_t kVideoMode = 1u << 2;  // honoured by ignoring: deja has no framebuffer
constexpr uint32_t kAoutKludge = 1u << 16;
constexpr uint32_t kSupportedRequired = kPageAlignModules | kMemoryInfo | kVideoMode;

// Boot-information flags (what the info block provides).
constexpr uint32_t kInfoMemory = 1u << 0, kInfoCmdline = 1u << 2, kInfoModules = 1u << 3, kInfoMmap = 1u << 6,
                   kInfoLoaderName = 1u << 9;

// Offsets inside the 120-byte multiboot_info structure.
constexpr uint64_t kInfoFlags = 0, kInfoMemLower = 4, kInfoMemUpper = 8, kInfoCmdlineAddr = 16, kInfoModsCount = 20,
                   kInfoModsAddr = 24, kInfoMmapLength = 44, kInfoMmapAddr = 48, kInfoLoaderNameAddr = 64,
                   kInfoSize = 120;
constexpr uint64_t kModuleEntrySize = 16;  // mod_start, mod_end, string, reserved
constexpr uint64_t kMmapEntrySize = 24;    // size (=20), base_addr, length, type
constexpr uint32_t kMemoryAvailable = 1, kMemoryReserved = 2;

// The PC memory map QEMU reports: conventional memory, then the EBDA/VGA/BIOS hole, then extended memory.
constexpr uint64_t kEbdaStart = 0x9fc00, kHighMemoryStart = 0x100000;
}  // namespace multiboot

struct MultibootHeader {
  uint64_t file_offset = 0;  // where the magic sits in the image
  uint32_t flags = 0;
  // a.out kludge fields, valid when flags has kAoutKludge.
  uint32_t header_addr = 0, load_addr = 0, load_end_addr = 0, bss_end_addr = 0, entry_addr = 0;
};

// Looks for a header with a valid checksum. nullopt when the image has none; an error when the
// only candidates have a wrong checksum, the header is cut off, or it sets a required flag we lack.
Result<std::optional<MultibootHeader>> find_multiboot_header(std::span<const uint8_t> image,
                                                              const std::string& name_for_errors);

struct MultibootModule {
  uint64_t start = 0;  // guest-physical, page aligned
  uint64_t end = 0;    // exclusive
  std::string args;
};

// Builds the boot-information block (info structure, memory map, boot-loader name, module list,
// strings) as it must appear at guest-physical `base`, with every pointer absolute. Fails
// (kInvalidArgument) when it does not fit in `capacity` bytes.
Result<std::vector<uint8_t>> build_multiboot_info(uint64_t base, uint64_t capacity, uint64_t ram_size,
                                                  const std::string& cmdline,
                                                  std::span<const MultibootModule> modules);

}  // namespace deja
