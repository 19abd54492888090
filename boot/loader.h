// Guest image loaders: Multiboot v1 (ELF32, ELF64, a.out kludge), ELF64 direct boot into long mode, and Linux
// kernels (the x86 64-bit boot protocol for a bzImage, PVH for a vmlinux or a bzImage's payload: linux_boot.h).
//
// Guest-physical layout of the loader's own structures. An image segment or module that overlaps
// any structure its format uses is refused (never silently overwritten):
//
//   [0x00500, 0x00600)  GDT: 0x08 64-bit code, 0x10 flat data, 0x18 flat 32-bit code   (all formats)
//   [0x07000, 0x09000)  Multiboot information block, memory map, module list, strings (all formats), unless an
//                       image segment is there: then the lowest page-aligned gap of RAM below 4 GiB that no
//                       segment, module or structure occupies (EBX/RDI at entry say where)
//   [0x10000, 0x60000)  long-mode page tables: PML4, PDPT, up to 64 page directories   (elf64-direct)
//   [0x70000, 0x80000)  boot stack, RSP = 0x80000 at entry                              (elf64-direct)
//
// Boot modules are placed page-aligned above the highest byte of the image, skipping these areas
// and the legacy hole [0x9fc00, 0x100000). Linux kernels have their own layout (linux_boot.h). See
// docs/boot.md for entry states and every rejection.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "boot/boot_plan.h"
#include "core/cpu_state.h"
#include "core/error.h"
#include "core/guest_memory.h"
#include "boot/linux_boot.h"

namespace deja {

namespace boot_layout {
constexpr uint64_t kGdtBase = 0x500, kGdtEnd = 0x600;
constexpr uint64_t kInfoBase = 0x7000, kInfoEnd = 0x9000;
constexpr uint64_t kPageTableBase = 0x10000, kPageTableEnd = 0x60000;
constexpr uint64_t kStackBase = 0x70000, kStackTop = 0x80000;

constexpr uint16_t kCode64Selector = 0x08, kDataSelector = 0x10, kCode32Selector = 0x18;
constexpr uint16_t kGdtLimit = 4 * 8 - 1;
}  // namespace boot_layout

struct BootModule {
  std::string path;
  std::string args;
};

struct LoadOptions {
  std::string cmdline;
  std::vector<BootModule> modules;
  // The image is a Linux kernel (`--kernel`): a bzImage or an ELF vmlinux, booted by linux_boot.h. Boot
  // modules are then refused; the initrd, if any, is `initrd_path`.
  bool linux_kernel = false;
  LinuxEntry linux_entry = LinuxEntry::kAuto;
  std::string initrd_path;  // "" = no initrd
  bool cpu_has_nx = true;  // the CPU model has NX: elf64-direct and the Linux 64-bit entry set EFER.NXE
};

// Reads the image file and every module from disk, validates, writes into `memory`.
Result<LoadedImage> load_guest_image(GuestMemory& memory, const std::string& image_path, const LoadOptions& options);

// Same from bytes already in memory (for tests and for replay, which hashes the bytes it loads).
// `module_bytes[i]` is the content of `options.modules[i]`; `initrd` that of `options.initrd_path`. Nothing is
// written to `memory` unless the whole image, every module and every loader structure fit.
Result<LoadedImage> load_guest_image_bytes(GuestMemory& memory, std::span<const uint8_t> image,
                                           const std::string& name_for_errors, const LoadOptions& options,
                                           std::span<const std::vector<uint8_t>> module_bytes = {},
                                           std::span<const uint8_t> initrd = {});

// At most this many boot modules (the Multiboot information area has room for about as many).
constexpr size_t kMaxBootModules = 64;

// Reads a whole file (image or module) for the loader; `what` names it in errors ("guest image", "boot module").
// Refuses anything but a regular file (directories, devices, FIFOs: opened without blocking, so a FIFO
// never hangs the open), and files larger than `max_size` (nothing larger can be loaded), so a path
// such as /dev/zero fails at once instead of exhausting host memory.
Result<std::vector<uint8_t>> read_boot_file(const std::string& path, const char* what,
                                            uint64_t max_size = uint64_t{1} << 32);
// The same for the guest image, which must also start like one (ELF magic, or a Multiboot header in
// its first 8 KiB): checked on the first bytes, before the rest of a large file is read.
Result<std::vector<uint8_t>> read_guest_image(const std::string& path, uint64_t max_size = uint64_t{1} << 32);

// The guest image and boot modules (or the Linux kernel and its initrd), read whole.
struct GuestInputs {
  std::vector<uint8_t> image;
  std::vector<std::vector<uint8_t>> modules;
  std::vector<uint8_t> initrd;
};
// Nothing larger than `max_bytes` (the guest's RAM) is read: it could not be loaded.
Result<GuestInputs> read_guest_inputs(const std::string& image_path, const LoadOptions& load, uint64_t max_bytes);

}  // namespace deja
