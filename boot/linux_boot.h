// Booting a Linux kernel: which entry (the x86 64-bit boot protocol or PVH), the guest-physical layout both share.
//
//   [0x00500, 0x00600)  GDT: 0x08 flat 32-bit code (PVH), 0x10 64-bit code (__BOOT_CS), 0x18 flat data (__BOOT_DS)
//   [0x07000, 0x08000)  boot_params, the "zero page" (64-bit protocol), or hvm_start_info + memory map + module
//                       list (PVH)
//   [0x08000, 0x10000)  the kernel command line, NUL terminated
//   [0x10000, 0x60000)  identity-mapped long-mode page tables (64-bit protocol)
//   the kernel          64-bit: its protected-mode part at pref_address, reserving init_size bytes; PVH: the
//                       vmlinux's PT_LOAD segments at their physical addresses
//   the initrd          page aligned at the highest address that fits below the end of RAM, initrd_addr_max
//                       (64-bit) or 4 GiB (PVH), above the kernel
// See docs/boot.md for the entry states, the memory map handed to the kernel and every rejection.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "boot/boot_plan.h"
#include "core/error.h"
#include "core/guest_memory.h"

namespace deja {

// How to enter a Linux kernel.
enum class LinuxEntry {
  kAuto,   // an ELF vmlinux: PVH; a bzImage: PVH when its payload carries the PVH note, else the 64-bit protocol
  k64Bit,  // the bzImage's 64-bit entry (startup_64 at load address + 0x200); its own decompressor runs in the guest
  kPvh,    // the PVH entry (XEN_ELFNOTE_PHYS32_ENTRY) of a vmlinux, or of the vmlinux inside a bzImage
};
std::string_view linux_entry_name(LinuxEntry entry);  // "auto", "64bit", "pvh"
Result<LinuxEntry> parse_linux_entry(std::string_view text);

struct LinuxBootOptions {
  std::string cmdline;
  LinuxEntry entry = LinuxEntry::kAuto;
  std::span<const uint8_t> initrd;  // empty = none (an empty initrd file is refused by the caller's reader)
  std::string initrd_name;          // for messages; "" = no initrd
  bool cpu_has_nx = true;           // the CPU model has NX: the 64-bit entry sets EFER.NXE
};

namespace linux_layout {
constexpr uint64_t kGdtBase = 0x500, kGdtEnd = 0x600;
constexpr uint16_t kCode32Selector = 0x08, kCode64Selector = 0x10, kDataSelector = 0x18;
constexpr uint64_t kZeroPage = 0x7000, kZeroPageEnd = 0x8000;
constexpr uint64_t kCmdline = 0x8000, kCmdlineEnd = 0x10000;
constexpr uint64_t kPageTables = 0x10000, kPageTablesEnd = 0x60000;
// The memory map both protocols report: RAM below the EBDA, the EBDA and the BIOS area reserved, RAM above 1 MiB.
constexpr uint64_t kEbda = 0x9fc00, kVgaHole = 0xa0000, kBiosArea = 0xf0000, kHighMemory = 0x100000;
}  // namespace linux_layout

// One memory-map entry as E820 and PVH both describe it (type 1 RAM, 2 reserved).
struct MemoryMapEntry {
  uint64_t address = 0, size = 0;
  uint32_t type = 0;
};
std::vector<MemoryMapEntry> linux_memory_map(uint64_t ram_size);

// The Linux GDT above, as bytes.
std::vector<uint8_t> linux_gdt();

// Loads a Linux kernel (bzImage or ELF vmlinux) with its command line and initrd; nothing is written unless
// everything fits. `name` is the kernel's path, for messages.
Result<LoadedImage> load_linux_kernel(GuestMemory& memory, std::span<const uint8_t> kernel, const std::string& name,
                                      const LinuxBootOptions& options);

// Where the initrd goes: the highest page-aligned address at which `size` bytes end at or below `limit` (the
// exclusive end: RAM end, initrd_addr_max + 1 or 4 GiB, whichever is lowest) and start at or above `floor`.
Result<uint64_t> place_initrd(uint64_t size, uint64_t floor, uint64_t limit, const std::string& initrd_name,
                              const std::string& why_limit);

}  // namespace deja
