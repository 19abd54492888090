// PVH boot (Xen's x86/HVM direct boot ABI, which Linux and QEMU share): an ELF kernel's XEN_ELFNOTE_PHYS32_ENTRY
// note, hvm_start_info with the memory map, command line and modules, and the 32-bit entry state.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>

#include "boot/boot_plan.h"
#include "core/error.h"
#include "core/guest_memory.h"
#include "boot/linux_boot.h"

namespace deja {

namespace pvh {
constexpr uint32_t kPhys32EntryNote = 18;   // XEN_ELFNOTE_PHYS32_ENTRY, owner "Xen"
constexpr uint32_t kStartMagic = 0x336ec578;  // XEN_HVM_START_MAGIC_VALUE
constexpr uint32_t kStartVersion = 1;         // version 1 carries the memory map
// struct hvm_start_info field offsets; the structure is 56 bytes.
constexpr uint64_t kMagic = 0, kVersion = 4, kFlags = 8, kNrModules = 12, kModlistPaddr = 16, kCmdlinePaddr = 24,
                   kRsdpPaddr = 32, kMemmapPaddr = 40, kMemmapEntries = 48, kStartInfoSize = 56;
constexpr uint64_t kModlistEntrySize = 32;  // paddr, size, cmdline_paddr, reserved
constexpr uint64_t kMemmapEntrySize = 24;   // addr, size, type, reserved
}  // namespace pvh

// The physical 32-bit entry named by the image's PVH note; nullopt when it has none. A malformed note (a
// descriptor that is not 4 or 8 bytes, an entry at or above 4 GiB) is an error.
Result<std::optional<uint64_t>> find_pvh_entry(std::span<const uint8_t> elf, const std::string& name);

// Loads an ELF vmlinux for its PVH entry: PT_LOAD segments at their physical addresses, hvm_start_info with the
// memory map, the command line and the initrd as module 0; the vCPU starts in 32-bit protected mode, paging off,
// EBX = hvm_start_info. `name` names the kernel in messages (a bzImage's payload is named after its file).
Result<LoadedImage> load_pvh_kernel(GuestMemory& memory, std::span<const uint8_t> elf, const std::string& name,
                                    const LinuxBootOptions& options);

}  // namespace deja
