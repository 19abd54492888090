// Linux kernel loading: tell a bzImage from a vmlinux, pick the entry, and the memory map both protocols report.
#include "boot/linux_boot.h"

#include "boot/bzimage.h"
#include "boot/elf.h"
#include "boot/kernel_decompress.h"
#include "boot/pvh.h"

namespace deja {

std::string_view linux_entry_name(LinuxEntry entry) {
  switch (entry) {
    case LinuxEntry::kAuto: return "auto";
    case LinuxEntry::k64Bit: return "64bit";
    case LinuxEntry::kPvh: return "pvh";
  }
  return "auto";
}

Result<LinuxEntry> parse_linux_entry(std::string_view text) {
  if (text == "auto" || text.empty()) return LinuxEntry::kAuto;
  if (text == "64bit") return LinuxEntry::k64Bit;
  if (text == "pvh") return LinuxEntry::kPvh;
  return fail(ErrorKind::kInvalidArgument, "unknown boot protocol '{}' (use auto, 64bit or pvh)", text);
}

std::vector<MemoryMapEntry> linux_memory_map(uint64_t ram_size) {
  using namespace linux_layout;
  constexpr uint32_t kRam = 1, kReserved = 2;
  return {{0, kEbda, kRam},
          {kEbda, kVgaHole - kEbda, kReserved},
          {kBiosArea, kHighMemory - kBiosArea, kReserved},
          {kHighMemory, ram_size - kHighMemory, kRam}};
}

std::vector<uint8_t> linux_gdt() {
  std::vector<uint8_t> bytes(4 * 8, 0);
  put_le(bytes, linux_layout::kCode32Selector, gdt_entry::kCode32, 8);
  put_le(bytes, linux_layout::kCode64Selector, gdt_entry::kCode64, 8);
  put_le(bytes, linux_layout::kDataSelector, gdt_entry::kData, 8);
  return bytes;
}

Result<uint64_t> place_initrd(uint64_t size, uint64_t floor, uint64_t limit, const std::string& initrd_name,
                              const std::string& why_limit) {
  if (size == 0) return fail(ErrorKind::kBadImage, "initrd '{}' is empty", initrd_name);
  const uint64_t lowest = align_up(floor, kPageSize);
  if (size > limit || align_down(limit - size, kPageSize) < lowest) {
    return fail(ErrorKind::kBadImage,
                "initrd '{}' ({} bytes) does not fit: it must lie above the kernel (which ends at {:#x}) and end {} "
                "(at {:#x}), leaving {} bytes; raise --mem or use a smaller initrd",
                initrd_name, size, floor, why_limit, limit, limit > lowest ? limit - lowest : 0);
  }
  return align_down(limit - size, kPageSize);
}

Result<LoadedImage> load_linux_kernel(GuestMemory& memory, std::span<const uint8_t> kernel, const std::string& name,
                                      const LinuxBootOptions& options) {
  if (kernel.empty()) return fail(ErrorKind::kBadImage, "Linux kernel '{}' is empty", name);
  if (memory.size() <= linux_layout::kHighMemory) {
    return fail(ErrorKind::kBadImage, "Linux kernel '{}' needs more than 1 MiB of RAM", name);
  }
  if (has_elf_magic(kernel)) {
    if (options.entry == LinuxEntry::k64Bit) {
      return fail(ErrorKind::kBadImage,
                  "Linux kernel '{}' is an ELF vmlinux: the 64-bit boot protocol needs its bzImage (or boot this with "
                  "--boot-protocol pvh)",
                  name);
    }
    return load_pvh_kernel(memory, kernel, name, options);
  }
  auto image = parse_bzimage(kernel, name);
  if (!image) return std::unexpected(image.error());
  if (options.entry == LinuxEntry::k64Bit) return load_bzimage_64bit(memory, *image, name, options);

  // PVH of a bzImage: the vmlinux inside it, decompressed here instead of by the guest.
  auto vmlinux = decompress_kernel_payload(image->payload, name, memory.size());
  if (!vmlinux) return std::unexpected(vmlinux.error());
  const std::string inner = fmt::format("the vmlinux inside {}", name);
  if (!has_elf_magic(*vmlinux)) {
    return fail(ErrorKind::kBadImage, "Linux kernel '{}': its decompressed payload is not an ELF vmlinux", name);
  }
  if (options.entry == LinuxEntry::kAuto) {
    auto entry = find_pvh_entry(*vmlinux, inner);
    if (!entry) return std::unexpected(entry.error());
    if (!*entry) return load_bzimage_64bit(memory, *image, name, options);  // built without CONFIG_PVH
  }
  return load_pvh_kernel(memory, *vmlinux, inner, options);
}

}  // namespace deja
