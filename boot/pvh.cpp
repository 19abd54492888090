// PVH boot of an ELF kernel: find the PHYS32 entry note, lay out hvm_start_info, enter in 32-bit protected mode.
#include "boot/pvh.h"

#include <algorithm>
#include <cstring>

#include "boot/elf.h"

namespace deja {

Result<std::optional<uint64_t>> find_pvh_entry(std::span<const uint8_t> bytes, const std::string& name) {
  auto elf = parse_elf(bytes, name);
  if (!elf) return std::unexpected(elf.error());
  auto notes = parse_elf_notes(bytes, *elf, name);
  if (!notes) return std::unexpected(notes.error());
  for (const ElfNote& note : *notes) {
    if (note.name != "Xen" || note.type != pvh::kPhys32EntryNote) continue;
    if (note.desc.size() != 4 && note.desc.size() != 8) {
      return fail(ErrorKind::kBadImage,
                  "guest image '{}': its PVH entry note (Xen, XEN_ELFNOTE_PHYS32_ENTRY) has a {}-byte descriptor, "
                  "not a 4- or 8-byte address",
                  name, note.desc.size());
    }
    const uint64_t entry = get_le(note.desc, 0, static_cast<unsigned>(note.desc.size()));
    if (entry == 0 || entry >= kBoot4GiB) {
      return fail(ErrorKind::kBadImage, "guest image '{}': its PVH entry {:#x} is not a 32-bit physical address", name,
                  entry);
    }
    return std::optional<uint64_t>(entry);
  }
  return std::optional<uint64_t>{};
}

Result<LoadedImage> load_pvh_kernel(GuestMemory& memory, std::span<const uint8_t> bytes, const std::string& name,
                                    const LinuxBootOptions& options) {
  using namespace linux_layout;
  auto entry = find_pvh_entry(bytes, name);
  if (!entry) return std::unexpected(entry.error());
  if (!*entry) {
    return fail(ErrorKind::kBadImage,
                "Linux kernel '{}' has no PVH entry (no Xen XEN_ELFNOTE_PHYS32_ENTRY note: a kernel built without "
                "CONFIG_PVH); boot its bzImage with --boot-protocol 64bit",
                name);
  }
  auto elf = parse_elf(bytes, name);
  if (!elf) return std::unexpected(elf.error());
  if (elf->elf_class != elf::kClass64 || elf->machine != elf::kMachineX86_64) {
    return fail(ErrorKind::kBadImage, "Linux kernel '{}' is an ELF{} image for {}, not an x86-64 vmlinux", name,
                elf->elf_class == elf::kClass64 ? 64 : 32, elf_machine_name(elf->machine));
  }
  const std::string what = fmt::format("Linux kernel '{}'", name);
  const uint64_t ram_size = memory.size();
  std::vector<Piece> pieces;
  bool entry_inside = false;
  uint64_t kernel_end = 0;
  for (const auto& segment : elf->segments) {
    pieces.push_back(Piece{fmt::format("segment {}", segment.index), segment.paddr,
                           segment.file_size ? bytes.subspan(segment.file_offset, segment.file_size)
                                             : std::span<const uint8_t>{},
                           segment.mem_size});
    if (**entry >= segment.paddr && **entry - segment.paddr < segment.mem_size) entry_inside = true;
    kernel_end = std::max(kernel_end, segment.paddr + segment.mem_size);
  }
  if (!entry_inside) {
    return fail(ErrorKind::kBadImage, "{}: its PVH entry {:#x} is not inside any loaded segment", what, **entry);
  }
  if (options.cmdline.size() >= kCmdlineEnd - kCmdline) {
    return fail(ErrorKind::kInvalidArgument, "{}: the command line is {} bytes; deja passes at most {}", what,
                options.cmdline.size(), kCmdlineEnd - kCmdline - 1);
  }
  const Region reserved[] = {{"the loader's GDT", kGdtBase, kGdtEnd},
                             {"the PVH start information", kZeroPage, kZeroPageEnd},
                             {"the kernel command line", kCmdline, kCmdlineEnd}};
  if (auto ok = check_pieces(what, pieces, ram_size, true, reserved); !ok) return std::unexpected(ok.error());

  uint64_t initrd_at = 0;
  std::vector<Piece> modules;
  if (!options.initrd_name.empty()) {
    auto placed = place_initrd(options.initrd.size(), std::max(kernel_end, kCmdlineEnd), std::min(ram_size, kBoot4GiB),
                               options.initrd_name,
                               "below 4 GiB (the PVH initrd address Linux reads is 32-bit)");
    if (!placed) return std::unexpected(placed.error());
    initrd_at = *placed;
    modules.push_back(Piece{fmt::format("initrd '{}'", options.initrd_name), initrd_at, options.initrd,
                            options.initrd.size()});
  }

  // hvm_start_info, then the memory map, then the module list, all in the start-information page.
  const auto map = linux_memory_map(ram_size);
  const uint64_t memmap_offset = pvh::kStartInfoSize + 8;  // 8-byte aligned
  const uint64_t modlist_offset = memmap_offset + map.size() * pvh::kMemmapEntrySize;
  std::vector<uint8_t> info(modlist_offset + modules.size() * pvh::kModlistEntrySize, 0);
  put_le(info, pvh::kMagic, pvh::kStartMagic, 4);
  put_le(info, pvh::kVersion, pvh::kStartVersion, 4);
  put_le(info, pvh::kFlags, 0, 4);
  put_le(info, pvh::kNrModules, modules.size(), 4);
  put_le(info, pvh::kModlistPaddr, modules.empty() ? 0 : kZeroPage + modlist_offset, 8);
  put_le(info, pvh::kCmdlinePaddr, kCmdline, 8);
  put_le(info, pvh::kRsdpPaddr, 0, 8);  // no ACPI
  put_le(info, pvh::kMemmapPaddr, kZeroPage + memmap_offset, 8);
  put_le(info, pvh::kMemmapEntries, map.size(), 4);
  for (size_t i = 0; i < map.size(); ++i) {
    const uint64_t at = memmap_offset + i * pvh::kMemmapEntrySize;
    put_le(info, at, map[i].address, 8);
    put_le(info, at + 8, map[i].size, 8);
    put_le(info, at + 16, map[i].type, 4);
  }
  if (!modules.empty()) {
    put_le(info, modlist_offset, initrd_at, 8);
    put_le(info, modlist_offset + 8, options.initrd.size(), 8);
  }
  std::vector<uint8_t> cmdline(options.cmdline.begin(), options.cmdline.end());
  cmdline.push_back(0);
  const auto gdt = linux_gdt();
  std::vector<Piece> structures{
      Piece{"the GDT", kGdtBase, gdt, gdt.size()},
      Piece{"the PVH start information", kZeroPage, info, info.size()},
      Piece{"the command line", kCmdline, cmdline, cmdline.size()},
  };

  std::vector<Piece> all = pieces;
  all.insert(all.end(), modules.begin(), modules.end());
  all.insert(all.end(), structures.begin(), structures.end());
  if (auto ok = check_pieces(what, all, ram_size, true, {}); !ok) return std::unexpected(ok.error());

  LoadedImage loaded;
  const std::vector<Piece>* groups[] = {&pieces, &modules, &structures};
  if (auto r = write_pieces(memory, groups, loaded); !r) return std::unexpected(r.error());
  loaded.format = "linux-pvh";
  loaded.entry = **entry;

  // The PVH entry state: 32-bit protected mode, paging off, flat CS/DS/ES/SS, a 32-bit busy TSS of limit 0x67.
  CpuState& st = loaded.initial_state;
  st.cs = flat_segment(kCode32Selector, 0xb, false);
  st.ds = st.es = st.fs = st.gs = st.ss = flat_segment(kDataSelector, 0x3, false);
  st.tr = SegmentReg{.base = 0, .limit = 0x67, .selector = 0, .type = 0xb, .present = true};
  st.ldt = SegmentReg{.base = 0, .limit = 0xffff, .selector = 0, .type = 0x2, .present = true};
  st.gdt = TableReg{kGdtBase, static_cast<uint16_t>(gdt.size() - 1)};
  st.idt = TableReg{0, 0};
  st.rflags = 0x2;
  st.rip = loaded.entry;
  reset_fpu_state(st);
  st.cr0 = cr0::kPe | cr0::kEt;
  st.gpr[kRbx] = kZeroPage;
  return loaded;
}

}  // namespace deja
