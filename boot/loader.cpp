// Guest image loading: plan every byte (image, modules, GDT, boot info, page tables), validate it all, then write.
#include "boot/loader.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>

#include "boot/elf.h"
#include "boot/multiboot.h"

namespace deja {
namespace {

using namespace boot_layout;

constexpr uint64_t k4GiB = kBoot4GiB;

constexpr Region kGdtRegion{"the loader's GDT", kGdtBase, kGdtEnd};
constexpr Region kInfoRegion{"the Multiboot information area", kInfoBase, kInfoEnd};
constexpr Region kPageTableRegion{"the long-mode page tables", kPageTableBase, kPageTableEnd};
constexpr Region kStackRegion{"the boot stack", kStackBase, kStackTop};
constexpr Region kLegacyHole{"the legacy EBDA/VGA/BIOS hole", multiboot::kEbdaStart, multiboot::kHighMemoryStart};

struct Plan {
  std::string format;
  uint64_t entry = 0;
  bool long_mode = false;
  std::vector<Piece> image_pieces;
};

// The loader's fixed structures for a format (the boot information moves: place_boot_info).
std::vector<Region> reserved_regions(bool long_mode) {
  std::vector<Region> regions{kGdtRegion};
  if (long_mode) {
    regions.push_back(kPageTableRegion);
    regions.push_back(kStackRegion);
  }
  return regions;
}

// Checks that every image piece lies in RAM (and below 4 GiB for a 32-bit entry), clear of the
// loader's fixed structures and of every other piece.
Result<> check_image_pieces(const std::string& name, const std::vector<Piece>& pieces, uint64_t ram_size,
                            bool long_mode) {
  return check_pieces(fmt::format("guest image '{}'", name), pieces, ram_size, !long_mode, reserved_regions(long_mode));
}

// Where the boot information goes: at kInfoBase when no image segment or module is there (every image that
// loaded before keeps its layout, so its traces replay), else in the lowest page-aligned gap of RAM below 4 GiB
// that no segment, module, fixed structure or the legacy hole occupies. QEMU too puts it where the image is not,
// so images linked at 0x8000 boot.
Result<uint64_t> place_boot_info(const std::string& name, uint64_t size, const std::vector<Piece>& image,
                                 const std::vector<Piece>& modules, uint64_t ram_size, bool long_mode) {
  std::vector<std::pair<uint64_t, uint64_t>> taken;  // [start, end)
  for (const auto* group : {&image, &modules}) {
    for (const Piece& piece : *group) {
      if (piece.mem_size != 0) taken.emplace_back(piece.gpa, piece.end());
    }
  }
  const bool default_free = std::none_of(taken.begin(), taken.end(), [](const auto& range) {
    return ranges_overlap(range.first, range.second, kInfoBase, kInfoEnd);
  });
  if (default_free) return kInfoBase;
  for (const Region& region : reserved_regions(long_mode)) taken.emplace_back(region.start, region.end);
  taken.emplace_back(kLegacyHole.start, kLegacyHole.end);
  std::sort(taken.begin(), taken.end());
  const uint64_t limit = std::min(ram_size, k4GiB);
  uint64_t cursor = kPageSize;  // page 0 holds the real-mode IVT and BIOS data area on a PC
  for (const auto& [start, end] : taken) {
    if (cursor + size <= start) break;
    cursor = std::max(cursor, align_up(end, kPageSize));
  }
  if (cursor > limit || size > limit - cursor) {
    return fail(ErrorKind::kBadImage,
                "guest image '{}': no room for the Multiboot boot information ({} bytes): every page-aligned range "
                "of RAM below {:#x} holds an image segment, a boot module or a loader structure; give the guest "
                "more memory",
                name, size, limit);
  }
  return cursor;
}

std::string segment_name(const ElfSegment& segment) { return fmt::format("segment {}", segment.index); }

// The physical entry address: e_entry inside a segment's physical range, or inside its virtual
// range (a higher-half kernel), translated the way GRUB does.
Result<uint64_t> resolve_elf_entry(const std::string& name, const ElfImage& elf) {
  if (elf.entry == 0) return fail(ErrorKind::kBadImage, "guest image '{}': entry point is 0", name);
  for (const auto& segment : elf.segments) {
    if (elf.entry >= segment.paddr && elf.entry - segment.paddr < segment.mem_size) return elf.entry;
  }
  for (const auto& segment : elf.segments) {
    if (elf.entry >= segment.vaddr && elf.entry - segment.vaddr < segment.mem_size) {
      return elf.entry - segment.vaddr + segment.paddr;
    }
  }
  return fail(ErrorKind::kBadImage, "guest image '{}': entry point {:#x} is not inside any loaded segment", name,
              elf.entry);
}

Result<Plan> plan_elf(const std::string& name, std::span<const uint8_t> image, bool multiboot) {
  auto elf = parse_elf(image, name);
  if (!elf) return std::unexpected(elf.error());
  Plan plan;
  const bool is64 = elf->elf_class == elf::kClass64;
  const uint16_t wanted = is64 ? elf::kMachineX86_64 : elf::kMachine386;
  if (!multiboot && !is64 && elf->machine == elf::kMachine386) {
    return fail(ErrorKind::kBadImage,
                "guest image '{}': 32-bit ELF without a Multiboot header: deja boots 32-bit images only through "
                "Multiboot",
                name);
  }
  if (elf->machine != wanted) {
    return fail(ErrorKind::kBadImage, "guest image '{}' is an ELF{} image for {}, not {}", name, is64 ? 64 : 32,
                elf_machine_name(elf->machine), elf_machine_name(wanted));
  }
  for (const auto& segment : elf->segments) {
    plan.image_pieces.push_back(
        Piece{segment_name(segment), segment.paddr, segment.file_size ? image.subspan(segment.file_offset, segment.file_size) : std::span<const uint8_t>{},
              segment.mem_size});
  }
  auto entry = resolve_elf_entry(name, *elf);
  if (!entry) return std::unexpected(entry.error());
  plan.entry = *entry;
  if (multiboot) {
    plan.format = is64 ? "multiboot-elf64" : "multiboot-elf32";
    if (plan.entry >= k4GiB) {
      return fail(ErrorKind::kBadImage,
                  "guest image '{}': entry point {:#x} is above 4 GiB, unreachable from the 32-bit Multiboot entry",
                  name, plan.entry);
    }
  } else {
    plan.format = "elf64-direct";
    plan.long_mode = true;
  }
  return plan;
}

// Multiboot header bit 16: the header itself says which file bytes go where (no ELF parsing).
Result<Plan> plan_aout_kludge(const std::string& name, std::span<const uint8_t> image, const MultibootHeader& h) {
  if (h.load_addr > h.header_addr) {
    return fail(ErrorKind::kBadImage,
                "guest image '{}': Multiboot a.out kludge load_addr {:#x} is above header_addr {:#x}", name,
                h.load_addr, h.header_addr);
  }
  const uint64_t header_distance = h.header_addr - h.load_addr;
  if (header_distance > h.file_offset) {
    return fail(ErrorKind::kBadImage,
                "guest image '{}': Multiboot a.out kludge places the load start {:#x} bytes before the header, but "
                "the header is only {:#x} bytes into the file",
                name, header_distance, h.file_offset);
  }
  const uint64_t load_offset = h.file_offset - header_distance;
  uint64_t load_size = image.size() - load_offset;
  if (h.load_end_addr != 0) {
    if (h.load_end_addr < h.load_addr) {
      return fail(ErrorKind::kBadImage, "guest image '{}': Multiboot a.out kludge load_end_addr {:#x} is below load_addr {:#x}",
                  name, h.load_end_addr, h.load_addr);
    }
    load_size = h.load_end_addr - h.load_addr;
    if (load_size > image.size() - load_offset) {
      return fail(ErrorKind::kBadImage,
                  "guest image '{}' is truncated: the Multiboot a.out kludge loads {:#x} bytes from file offset {:#x}, "
                  "beyond the end of the {}-byte file",
                  name, load_size, load_offset, image.size());
    }
  }
  uint64_t mem_size = load_size;
  if (h.bss_end_addr != 0) {
    if (h.bss_end_addr < h.load_addr + load_size) {
      return fail(ErrorKind::kBadImage, "guest image '{}': Multiboot a.out kludge bss_end_addr {:#x} is below the load end {:#x}",
                  name, h.bss_end_addr, h.load_addr + load_size);
    }
    mem_size = h.bss_end_addr - h.load_addr;
  }
  if (mem_size == 0) {
    return fail(ErrorKind::kBadImage, "guest image '{}': the Multiboot a.out kludge loads nothing", name);
  }
  Plan plan;
  plan.format = "multiboot-aout";
  plan.image_pieces.push_back(Piece{"the a.out kludge load range", h.load_addr, image.subspan(load_offset, load_size), mem_size});
  if (h.entry_addr == 0) return fail(ErrorKind::kBadImage, "guest image '{}': entry point is 0", name);
  if (h.entry_addr < h.load_addr || h.entry_addr - h.load_addr >= mem_size) {
    return fail(ErrorKind::kBadImage, "guest image '{}': entry point {:#x} is not inside the loaded range [{:#x}, {:#x})",
                name, h.entry_addr, h.load_addr, h.load_addr + mem_size);
  }
  plan.entry = h.entry_addr;
  return plan;
}

// Refuses bytes that start like no image deja loads: no ELF magic and no Multiboot header where one
// must be. `image` may be only the first bytes of the file (at least the Multiboot search window).
Result<> check_image_magic(const std::string& name, std::span<const uint8_t> image) {
  if (image.empty()) return fail(ErrorKind::kBadImage, "guest image '{}' is empty", name);
  auto header = find_multiboot_header(image, name);
  if (header && *header) return {};
  if (!header && !has_elf_magic(image)) return std::unexpected(header.error());
  if (!has_elf_magic(image)) {
    // A Linux bzImage carries "HdrS" at 0x202: say so, since it is the most likely wrong file.
    const bool bzimage = image.size() >= 0x206 && std::memcmp(image.data() + 0x202, "HdrS", 4) == 0;
    return fail(ErrorKind::kBadImage,
                "guest image '{}' is not an ELF file (bad magic) and has no Multiboot header in its first {} bytes{}",
                name, multiboot::kSearchLimit,
                bzimage ? " (it is a Linux bzImage: boot it with --kernel)" : "");
  }
  return {};
}

Result<Plan> plan_image(const std::string& name, std::span<const uint8_t> image) {
  if (image.empty()) return fail(ErrorKind::kBadImage, "guest image '{}' is empty", name);
  auto header = find_multiboot_header(image, name);
  if (!header) return std::unexpected(header.error());
  if (*header) {
    if ((*header)->flags & multiboot::kAoutKludge) return plan_aout_kludge(name, image, **header);
    if (!has_elf_magic(image)) {
      return fail(ErrorKind::kBadImage,
                  "guest image '{}' has a Multiboot header but is not an ELF file, and the header does not set the "
                  "a.out kludge flag (bit 16) that would say where to load it",
                  name);
    }
    return plan_elf(name, image, /*multiboot=*/true);
  }
  if (auto ok = check_image_magic(name, image); !ok) return std::unexpected(ok.error());
  return plan_elf(name, image, /*multiboot=*/false);
}

// Places modules page-aligned above the image, stepping over the loader's areas (the default boot-information
// area too) and the legacy hole.
Result<std::vector<Piece>> place_modules(const LoadOptions& options, std::span<const std::vector<uint8_t>> module_bytes,
                                         uint64_t image_end, uint64_t ram_size, bool long_mode) {
  auto avoid = reserved_regions(long_mode);
  avoid.push_back(kInfoRegion);  // where the boot information goes unless the image is there
  avoid.push_back(kLegacyHole);
  std::vector<Piece> pieces;
  uint64_t cursor = align_up(image_end, kPageSize);
  for (size_t i = 0; i < module_bytes.size(); ++i) {
    const uint64_t size = module_bytes[i].size();
    for (bool moved = true; moved;) {
      moved = false;
      for (const Region& region : avoid) {
        if (cursor < region.end && ranges_overlap(cursor, cursor + std::max<uint64_t>(size, 1), region.start, region.end)) {
          cursor = align_up(region.end, kPageSize);
          moved = true;
        }
      }
    }
    const std::string& path = options.modules[i].path;
    if (cursor > ram_size || size > ram_size - cursor) {
      return fail(ErrorKind::kBadImage,
                  "boot module '{}' ({} bytes) does not fit: it would occupy [{:#x}, {:#x}) but RAM ends at {:#x}; "
                  "give the guest more memory",
                  path, size, cursor, cursor + size, ram_size);
    }
    if (cursor + size > k4GiB) {
      return fail(ErrorKind::kBadImage,
                  "boot module '{}' would end at {:#x}, above 4 GiB, which the 32-bit Multiboot module list cannot "
                  "describe",
                  path, cursor + size);
    }
    pieces.push_back(Piece{fmt::format("boot module '{}'", path), cursor, module_bytes[i], size});
    cursor = align_up(cursor + size, kPageSize);
  }
  return pieces;
}

// GDT entries (accessed bit preset, so the CPU never writes them back): null, 64-bit code,
// flat data, flat 32-bit code.
std::vector<uint8_t> build_gdt() {
  constexpr uint64_t kEntries[] = {0, gdt_entry::kCode64, gdt_entry::kData, gdt_entry::kCode32};
  std::vector<uint8_t> bytes(sizeof(kEntries));
  std::memcpy(bytes.data(), kEntries, sizeof(kEntries));
  return bytes;
}

CpuState entry_state(const Plan& plan, const LoadOptions& options, uint64_t info_base) {
  CpuState st;
  const bool long_mode = plan.long_mode;
  st.cs = flat_segment(long_mode ? kCode64Selector : kCode32Selector, 0xb, long_mode);
  st.ds = st.es = st.fs = st.gs = st.ss = flat_segment(kDataSelector, 0x3, false);
  // TR and LDTR as after reset: VM entry needs a busy TSS type and a present LDT descriptor.
  st.tr = SegmentReg{.base = 0, .limit = 0xffff, .selector = 0, .type = 0xb, .present = true};
  st.ldt = SegmentReg{.base = 0, .limit = 0xffff, .selector = 0, .type = 0x2, .present = true};
  st.gdt = TableReg{kGdtBase, kGdtLimit};
  st.idt = TableReg{0, 0};  // no IDT: an exception before the guest sets one up triple-faults visibly
  st.rflags = 0x2;
  st.rip = plan.entry;
  reset_fpu_state(st);
  if (long_mode) {
    st.cr0 = cr0::kPe | cr0::kMp | cr0::kEt | cr0::kNe | cr0::kWp | cr0::kPg;
    st.cr3 = kPageTableBase;
    st.cr4 = cr4::kPae | cr4::kOsfxsr | cr4::kOsxmmexcpt;
    st.efer = efer::kLme | efer::kLma | efer::kSce;
    // NXE only where the CPU model has NX, or setting it would be a reserved-bit violation.
    if (options.cpu_has_nx) st.efer |= efer::kNxe;
    st.gpr[kRsp] = kStackTop;
    st.gpr[kRdi] = info_base;
    st.gpr[kRsi] = multiboot::kBootloaderMagic;
  } else {
    st.cr0 = cr0::kPe | cr0::kEt;
    st.gpr[kRax] = multiboot::kBootloaderMagic;
    st.gpr[kRbx] = info_base;
  }
  return st;
}

}  // namespace

Result<LoadedImage> load_guest_image_bytes(GuestMemory& memory, std::span<const uint8_t> image,
                                           const std::string& name, const LoadOptions& options,
                                           std::span<const std::vector<uint8_t>> module_bytes,
                                           std::span<const uint8_t> initrd) {
  if (options.linux_kernel) {
    if (!options.modules.empty()) {
      return fail(ErrorKind::kInvalidArgument,
                  "Linux kernel '{}': Multiboot boot modules (--module) cannot be passed to a Linux kernel; use "
                  "--initrd",
                  name);
    }
    return load_linux_kernel(memory, image, name,
                             LinuxBootOptions{.cmdline = options.cmdline,
                                              .entry = options.linux_entry,
                                              .initrd = initrd,
                                              .initrd_name = options.initrd_path,
                                              .cpu_has_nx = options.cpu_has_nx});
  }
  if (!options.initrd_path.empty()) {
    return fail(ErrorKind::kInvalidArgument, "guest image '{}': an initrd is only for a Linux kernel (--kernel)", name);
  }
  if (module_bytes.size() != options.modules.size()) {
    return fail(ErrorKind::kInvalidArgument, "guest image '{}': {} boot modules named but {} module contents given",
                name, options.modules.size(), module_bytes.size());
  }
  auto plan = plan_image(name, image);
  if (!plan) return std::unexpected(plan.error());
  const uint64_t ram_size = memory.size();
  if (auto ok = check_image_pieces(name, plan->image_pieces, ram_size, plan->long_mode); !ok) {
    return std::unexpected(ok.error());
  }
  uint64_t image_end = 0;
  for (const auto& piece : plan->image_pieces) image_end = std::max(image_end, piece.end());
  auto modules = place_modules(options, module_bytes, image_end, ram_size, plan->long_mode);
  if (!modules) return std::unexpected(modules.error());

  std::vector<MultibootModule> module_list;
  for (size_t i = 0; i < modules->size(); ++i) {
    module_list.push_back({(*modules)[i].gpa, (*modules)[i].end(), options.modules[i].args});
  }
  // The block's size does not depend on where it goes: build it once to size it, then where it fits.
  auto info = build_multiboot_info(0, kInfoEnd - kInfoBase, ram_size, options.cmdline, module_list);
  if (!info) return std::unexpected(info.error());
  auto info_base = place_boot_info(name, align_up(info->size(), kPageSize), plan->image_pieces, *modules, ram_size,
                                   plan->long_mode);
  if (!info_base) return std::unexpected(info_base.error());
  info = build_multiboot_info(*info_base, kInfoEnd - kInfoBase, ram_size, options.cmdline, module_list);
  if (!info) return std::unexpected(info.error());

  std::vector<Piece> structures;
  const auto gdt = build_gdt();
  structures.push_back(Piece{"GDT", kGdtBase, gdt, gdt.size()});
  structures.push_back(Piece{"boot information", *info_base, *info, info->size()});
  std::vector<uint8_t> page_tables;
  if (plan->long_mode) {
    page_tables = build_identity_page_tables(kPageTableBase, ram_size);
    structures.push_back(Piece{"page tables", kPageTableBase, page_tables, page_tables.size()});
  }

  // Everything is validated; from here on only a host failure can stop the load.
  LoadedImage loaded;
  const std::vector<Piece>* groups[] = {&plan->image_pieces, &*modules, &structures};
  if (auto r = write_pieces(memory, groups, loaded); !r) return std::unexpected(r.error());
  loaded.format = plan->format;
  loaded.entry = plan->entry;
  loaded.initial_state = entry_state(*plan, options, *info_base);
  return loaded;
}

namespace {

Result<std::vector<uint8_t>> read_regular_file(const std::string& path, const char* what, uint64_t max_size,
                                               bool image) {
  // O_NONBLOCK: opening a FIFO must not wait for a writer; fstat then refuses it.
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) return fail(ErrorKind::kBadImage, "cannot open {} '{}': {}", what, path, std::strerror(errno));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat info {};
  if (fstat(fd, &info) != 0) {
    return fail(ErrorKind::kBadImage, "cannot read {} '{}': {}", what, path, std::strerror(errno));
  }
  if (S_ISDIR(info.st_mode)) return fail(ErrorKind::kBadImage, "cannot read {} '{}': it is a directory", what, path);
  if (!S_ISREG(info.st_mode)) {
    return fail(ErrorKind::kBadImage, "cannot read {} '{}': not a regular file (a {}); deja loads only regular files",
                what, path, S_ISFIFO(info.st_mode) ? "FIFO" : S_ISCHR(info.st_mode) || S_ISBLK(info.st_mode) ? "device" : "socket");
  }
  const uint64_t size = uint64_t(info.st_size);
  if (size > max_size) {
    return fail(ErrorKind::kBadImage, "{} '{}' is larger ({} bytes) than anything deja can load here ({} bytes)", what,
                path, size, max_size);
  }
  if (image && size == 0) return fail(ErrorKind::kBadImage, "guest image '{}' is empty", path);
  auto read_into = [&](uint8_t* out, size_t want) -> Result<> {
    for (size_t done = 0; done < want;) {
      const ssize_t n = ::read(fd, out + done, want - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        return fail(ErrorKind::kBadImage, "cannot read {} '{}': {}", what, path,
                    n < 0 ? std::strerror(errno) : "the file shrank while being read");
      }
      done += size_t(n);
    }
    return {};
  };
  // An image is checked on its first bytes before memory for the rest is even allocated.
  uint8_t head[multiboot::kSearchLimit + 16];
  const size_t prefix = image ? std::min<size_t>(size, sizeof head) : 0;
  if (auto r = read_into(head, prefix); !r) return std::unexpected(r.error());
  if (image) {
    if (auto ok = check_image_magic(path, std::span(head, prefix)); !ok) return std::unexpected(ok.error());
  }
  std::vector<uint8_t> bytes(size);
  std::memcpy(bytes.data(), head, prefix);
  if (auto r = read_into(bytes.data() + prefix, size - prefix); !r) return std::unexpected(r.error());
  return bytes;
}

}  // namespace

Result<std::vector<uint8_t>> read_boot_file(const std::string& path, const char* what, uint64_t max_size) {
  return read_regular_file(path, what, max_size, false);
}

Result<std::vector<uint8_t>> read_guest_image(const std::string& path, uint64_t max_size) {
  return read_regular_file(path, "guest image", max_size, true);
}

Result<LoadedImage> load_guest_image(GuestMemory& memory, const std::string& image_path, const LoadOptions& options) {
  const uint64_t loadable = std::min(memory.size(), k4GiB);  // nothing larger fits, even for elf64-direct
  auto image = options.linux_kernel ? read_boot_file(image_path, "Linux kernel", loadable)
                                    : read_guest_image(image_path, loadable);
  if (!image) return std::unexpected(image.error());
  std::vector<std::vector<uint8_t>> module_bytes;
  for (const auto& module : options.modules) {
    auto bytes = read_boot_file(module.path, "boot module", loadable);
    if (!bytes) return std::unexpected(bytes.error());
    module_bytes.push_back(std::move(*bytes));
  }
  std::vector<uint8_t> initrd;
  if (!options.initrd_path.empty()) {
    auto bytes = read_boot_file(options.initrd_path, "initrd", loadable);
    if (!bytes) return std::unexpected(bytes.error());
    initrd = std::move(*bytes);
  }
  return load_guest_image_bytes(memory, *image, image_path, options, module_bytes, initrd);
}

Result<GuestInputs> read_guest_inputs(const std::string& image_path, const LoadOptions& load, uint64_t max_bytes) {
  GuestInputs p;
  if (load.modules.size() > kMaxBootModules) {
    return fail(ErrorKind::kInvalidArgument, "{} boot modules: deja boots at most {}", load.modules.size(),
                kMaxBootModules);
  }
  auto image = load.linux_kernel ? read_boot_file(image_path, "Linux kernel", max_bytes)
                                 : read_guest_image(image_path, max_bytes);
  if (!image) return std::unexpected(image.error());
  p.image = std::move(*image);
  for (const auto& m : load.modules) {
    auto bytes = read_boot_file(m.path, "boot module", max_bytes);
    if (!bytes) return std::unexpected(bytes.error());
    p.modules.push_back(std::move(*bytes));
  }
  if (!load.initrd_path.empty()) {
    auto bytes = read_boot_file(load.initrd_path, "initrd", max_bytes);
    if (!bytes) return std::unexpected(bytes.error());
    p.initrd = std::move(*bytes);
  }
  return p;
}

}  // namespace deja
