// The Linux/x86 boot protocol (Documentation/arch/x86/boot.rst): a bzImage's setup header, and loading it for the
// 64-bit entry as a boot loader would.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "boot/boot_plan.h"
#include "core/error.h"
#include "core/guest_memory.h"
#include "boot/linux_boot.h"

namespace deja {

namespace bzimage {
// Setup header offsets (from the start of the file, which is where the zero page keeps them too).
constexpr uint64_t kSetupSects = 0x1f1, kSyssize = 0x1f4, kVidMode = 0x1fa, kBootFlag = 0x1fe, kJump = 0x200,
                   kHeaderMagic = 0x202, kVersion = 0x206, kKernelVersion = 0x20e, kTypeOfLoader = 0x210,
                   kLoadflags = 0x211,
                   kCode32Start = 0x214, kRamdiskImage = 0x218, kRamdiskSize = 0x21c, kHeapEndPtr = 0x224,
                   kCmdLinePtr = 0x228, kInitrdAddrMax = 0x22c, kKernelAlignment = 0x230, kRelocatable = 0x234,
                   kXloadflags = 0x236, kCmdlineSize = 0x238, kHardwareSubarch = 0x23c, kPayloadOffset = 0x248,
                   kPayloadLength = 0x24c, kSetupData = 0x250, kPrefAddress = 0x258, kInitSize = 0x260;
// Zero-page (struct boot_params) fields outside the setup header.
constexpr uint64_t kAcpiRsdpAddr = 0x070, kExtRamdiskImage = 0x0c0, kExtRamdiskSize = 0x0c4,
                   kExtCmdLinePtr = 0x0c8, kE820Entries = 0x1e8, kSentinel = 0x1ef, kE820Table = 0x2d0;
constexpr uint64_t kE820MaxEntries = 128, kE820EntrySize = 20, kZeroPageSize = 4096;

constexpr uint16_t kBootFlagValue = 0xaa55;
constexpr uint8_t kLoadedHigh = 0x01;
constexpr uint16_t kXlfKernel64 = 0x01;
constexpr uint16_t kMinimumVersion = 0x020c;  // 2.12: xloadflags says whether the 64-bit entry exists
constexpr uint8_t kLoaderUndefined = 0xff;     // type_of_loader for a boot loader with no assigned id
constexpr uint64_t kEntry64Offset = 0x200;     // startup_64 is 512 bytes into the protected-mode kernel
}  // namespace bzimage

// The fields of a bzImage's setup header that a boot loader reads, validated against the file.
struct BzImage {
  uint16_t version = 0;  // 0x020f = 2.15
  uint8_t loadflags = 0;
  uint16_t xloadflags = 0;
  uint32_t initrd_addr_max = 0;
  uint32_t kernel_alignment = 0;
  bool relocatable = false;
  uint32_t cmdline_size = 0;
  uint64_t pref_address = 0;
  uint32_t init_size = 0;
  // The string kernel_version points to (0x200 + the pointer, in the setup code): "6.1.0-18-amd64 (debian-kernel@...)
  // #1 SMP ..."; empty when the pointer is 0 or leads outside the setup sectors.
  std::string kernel_version;
  std::span<const uint8_t> setup_header;  // file bytes [0x1f1, end of header), copied into the zero page
  std::span<const uint8_t> kernel;        // the protected-mode kernel, after the setup sectors
  std::span<const uint8_t> payload;       // the compressed vmlinux inside it (payload_offset/payload_length)
};

// True when the bytes carry the boot sector flag and the "HdrS" magic of the Linux boot protocol.
bool looks_like_bzimage(std::span<const uint8_t> bytes);

// Validates the setup header: a bzImage (not a zImage), boot protocol 2.12 or later, every part inside the file.
Result<BzImage> parse_bzimage(std::span<const uint8_t> bytes, const std::string& name);

// Loads `image` for the 64-bit boot protocol: the protected-mode kernel at pref_address, the zero page, the
// command line, the initrd, page tables and GDT; the vCPU enters startup_64 in long mode with RSI = zero page.
Result<LoadedImage> load_bzimage_64bit(GuestMemory& memory, const BzImage& image, const std::string& name,
                                       const LinuxBootOptions& options);

}  // namespace deja
