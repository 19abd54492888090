// The Linux/x86 boot protocol for a bzImage: setup-header validation and the 64-bit entry, as a boot loader does it.
#include "boot/bzimage.h"

#include <algorithm>
#include <cstring>


namespace deja {
namespace {

using namespace bzimage;

std::string version_text(uint16_t version) { return fmt::format("{}.{:02}", version >> 8, version & 0xff); }

}  // namespace

bool looks_like_bzimage(std::span<const uint8_t> bytes) {
  return bytes.size() >= kHeaderMagic + 4 && get_le(bytes, kBootFlag, 2) == kBootFlagValue &&
         std::memcmp(bytes.data() + kHeaderMagic, "HdrS", 4) == 0;
}

Result<BzImage> parse_bzimage(std::span<const uint8_t> bytes, const std::string& name) {
  if (!looks_like_bzimage(bytes)) {
    return fail(ErrorKind::kBadImage,
                "Linux kernel '{}' is neither a bzImage (no boot flag 0xAA55 at 0x1fe and \"HdrS\" at 0x202) nor an "
                "ELF vmlinux",
                name);
  }
  BzImage image;
  image.version = static_cast<uint16_t>(get_le(bytes, kVersion, 2));
  if (image.version < kMinimumVersion) {
    return fail(ErrorKind::kBadImage,
                "Linux kernel '{}' speaks boot protocol {}, too old: deja needs 2.12 or later (Linux 3.8 and "
                "newer), which says whether the kernel has a 64-bit entry",
                name, version_text(image.version));
  }
  // The header ends where the jump at 0x200 lands: 0x202 + the byte at 0x201.
  const uint64_t header_end = kHeaderMagic + bytes[kJump + 1];
  if (header_end < kInitSize + 4 || header_end > bytes.size()) {
    return fail(ErrorKind::kBadImage,
                "Linux kernel '{}': its setup header (boot protocol {}) claims to end at {:#x}, which is {} the "
                "{}-byte file",
                name, version_text(image.version), header_end,
                header_end > bytes.size() ? "beyond the end of" : "too short for a 2.12 header in", bytes.size());
  }
  image.setup_header = bytes.subspan(kSetupSects, header_end - kSetupSects);
  image.loadflags = bytes[kLoadflags];
  if (!(image.loadflags & kLoadedHigh)) {
    return fail(ErrorKind::kBadImage,
                "Linux kernel '{}' is a zImage (its kernel loads at 0x10000, loadflags bit 0 clear): deja boots only "
                "bzImages",
                name);
  }
  image.xloadflags = static_cast<uint16_t>(get_le(bytes, kXloadflags, 2));
  image.initrd_addr_max = static_cast<uint32_t>(get_le(bytes, kInitrdAddrMax, 4));
  image.kernel_alignment = static_cast<uint32_t>(get_le(bytes, kKernelAlignment, 4));
  image.relocatable = bytes[kRelocatable] != 0;
  image.cmdline_size = static_cast<uint32_t>(get_le(bytes, kCmdlineSize, 4));
  image.pref_address = get_le(bytes, kPrefAddress, 8);
  image.init_size = static_cast<uint32_t>(get_le(bytes, kInitSize, 4));

  const uint64_t setup_sects = bytes[kSetupSects] == 0 ? 4 : bytes[kSetupSects];
  const uint64_t kernel_offset = (setup_sects + 1) * 512;
  const uint64_t syssize = get_le(bytes, kSyssize, 4) * 16;  // in 16-byte paragraphs
  if (kernel_offset > bytes.size() || syssize > bytes.size() - kernel_offset) {
    return fail(ErrorKind::kBadImage,
                "Linux kernel '{}' is truncated: {} setup sectors and a {}-byte protected-mode kernel need {} bytes, "
                "the file has {}",
                name, setup_sects, syssize, kernel_offset + syssize, bytes.size());
  }
  if (syssize == 0) {
    return fail(ErrorKind::kBadImage, "Linux kernel '{}': its setup header gives a protected-mode kernel of 0 bytes",
                name);
  }
  image.kernel = bytes.subspan(kernel_offset, syssize);
  if (const uint64_t pointer = get_le(bytes, kKernelVersion, 2); pointer != 0) {
    for (uint64_t at = kJump + pointer; at < kernel_offset && bytes[at] >= 0x20 && bytes[at] < 0x7f; ++at) {
      image.kernel_version.push_back(char(bytes[at]));
    }
  }
  const uint64_t payload_offset = get_le(bytes, kPayloadOffset, 4);
  const uint64_t payload_length = get_le(bytes, kPayloadLength, 4);
  if (payload_offset > image.kernel.size() || payload_length > image.kernel.size() - payload_offset) {
    return fail(ErrorKind::kBadImage,
                "Linux kernel '{}' is truncated: its compressed payload [{:#x}, +{:#x}) runs past the {}-byte "
                "protected-mode kernel",
                name, payload_offset, payload_length, image.kernel.size());
  }
  image.payload = image.kernel.subspan(payload_offset, payload_length);
  if (image.pref_address == 0 || image.pref_address % kPageSize != 0) {
    return fail(ErrorKind::kBadImage, "Linux kernel '{}': preferred load address {:#x} is not a page-aligned address",
                name, image.pref_address);
  }
  if (image.relocatable && (image.kernel_alignment == 0 || (image.kernel_alignment & (image.kernel_alignment - 1)) ||
                            image.pref_address % image.kernel_alignment != 0)) {
    return fail(ErrorKind::kBadImage,
                "Linux kernel '{}': preferred load address {:#x} does not have the kernel alignment {:#x}", name,
                image.pref_address, image.kernel_alignment);
  }
  if (image.init_size < image.kernel.size()) {
    return fail(ErrorKind::kBadImage, "Linux kernel '{}': init_size {:#x} is smaller than the {}-byte kernel itself",
                name, image.init_size, image.kernel.size());
  }
  return image;
}

Result<LoadedImage> load_bzimage_64bit(GuestMemory& memory, const BzImage& image, const std::string& name,
                                       const LinuxBootOptions& options) {
  using namespace linux_layout;
  if (!(image.xloadflags & kXlfKernel64)) {
    return fail(ErrorKind::kBadImage,
                "Linux kernel '{}' has no 64-bit entry (xloadflags bit 0 clear: a 32-bit kernel); deja boots x86-64 "
                "kernels only",
                name);
  }
  const uint64_t ram_size = memory.size();
  const std::string what = fmt::format("Linux kernel '{}'", name);
  if (options.cmdline.size() > image.cmdline_size) {
    return fail(ErrorKind::kInvalidArgument,
                "{}: the command line is {} bytes, longer than the {} bytes the kernel accepts (cmdline_size): "
                "shorten --append",
                what, options.cmdline.size(), image.cmdline_size);
  }
  if (options.cmdline.size() >= kCmdlineEnd - kCmdline) {
    return fail(ErrorKind::kInvalidArgument, "{}: the command line is {} bytes; deja passes at most {}", what,
                options.cmdline.size(), kCmdlineEnd - kCmdline - 1);
  }
  // The kernel decompresses itself in place: it needs init_size bytes from its load address.
  const uint64_t load = image.pref_address;
  const uint64_t kernel_end = load + image.init_size;
  if (kernel_end > ram_size) {
    return fail(ErrorKind::kBadImage,
                "{} needs RAM up to {:#x} ({} MiB: loaded at {:#x}, it decompresses into {:#x} bytes), but the guest "
                "has {} MiB: raise --mem",
                what, kernel_end, (kernel_end + (1 << 20) - 1) >> 20, load, image.init_size, ram_size >> 20);
  }
  std::vector<Piece> pieces;
  pieces.push_back(Piece{"the protected-mode kernel (with its init_size)", load, image.kernel, image.init_size});

  uint64_t initrd_at = 0;
  if (!options.initrd_name.empty()) {
    const uint64_t limit = std::min<uint64_t>(ram_size, uint64_t{image.initrd_addr_max} + 1);
    auto placed = place_initrd(options.initrd.size(), kernel_end, limit, options.initrd_name,
                               fmt::format("below the kernel's initrd_addr_max {:#x}", image.initrd_addr_max));
    if (!placed) return std::unexpected(placed.error());
    initrd_at = *placed;
    pieces.push_back(Piece{fmt::format("initrd '{}'", options.initrd_name), initrd_at, options.initrd,
                           options.initrd.size()});
  }

  // The zero page: the file's setup header, then what the boot loader fills in.
  std::vector<uint8_t> zero_page(kZeroPageSize, 0);
  std::memcpy(zero_page.data() + kSetupSects, image.setup_header.data(), image.setup_header.size());
  zero_page[kTypeOfLoader] = kLoaderUndefined;
  put_le(zero_page, kVidMode, 0xffff, 2);  // "normal" video mode
  put_le(zero_page, kHeapEndPtr, 0, 2);
  put_le(zero_page, kCmdLinePtr, kCmdline, 4);
  put_le(zero_page, kExtCmdLinePtr, 0, 4);
  put_le(zero_page, kRamdiskImage, initrd_at & 0xffffffff, 4);
  put_le(zero_page, kRamdiskSize, options.initrd.size() & 0xffffffff, 4);
  put_le(zero_page, kExtRamdiskImage, initrd_at >> 32, 4);
  put_le(zero_page, kExtRamdiskSize, uint64_t(options.initrd.size()) >> 32, 4);
  put_le(zero_page, kSetupData, 0, 8);
  put_le(zero_page, kHardwareSubarch, 0, 4);  // a PC
  put_le(zero_page, kAcpiRsdpAddr, 0, 8);
  const auto map = linux_memory_map(ram_size);
  zero_page[kE820Entries] = static_cast<uint8_t>(map.size());
  for (size_t i = 0; i < map.size(); ++i) {
    const uint64_t at = kE820Table + i * kE820EntrySize;
    put_le(zero_page, at, map[i].address, 8);
    put_le(zero_page, at + 8, map[i].size, 8);
    put_le(zero_page, at + 16, map[i].type, 4);
  }
  std::vector<uint8_t> cmdline(options.cmdline.begin(), options.cmdline.end());
  cmdline.push_back(0);
  const auto gdt = linux_gdt();
  const auto tables = build_identity_page_tables(kPageTables, ram_size);
  if (kPageTables + tables.size() > kPageTablesEnd) {
    return fail(ErrorKind::kInvalidArgument, "{}: {} MiB of RAM needs more page tables than deja's boot area holds",
                what, ram_size >> 20);
  }
  std::vector<Piece> structures{
      Piece{"the GDT", kGdtBase, gdt, gdt.size()},
      Piece{"the zero page", kZeroPage, zero_page, zero_page.size()},
      Piece{"the command line", kCmdline, cmdline, cmdline.size()},
      Piece{"the page tables", kPageTables, tables, tables.size()},
  };
  std::vector<Piece> all = pieces;
  all.insert(all.end(), structures.begin(), structures.end());
  if (auto ok = check_pieces(what, all, ram_size, false, {}); !ok) return std::unexpected(ok.error());

  LoadedImage loaded;
  const std::vector<Piece>* groups[] = {&pieces, &structures};
  if (auto r = write_pieces(memory, groups, loaded); !r) return std::unexpected(r.error());
  loaded.format = "linux-64bit";
  loaded.entry = load + kEntry64Offset;

  CpuState& st = loaded.initial_state;
  st.cs = flat_segment(kCode64Selector, 0xb, true);
  st.ds = st.es = st.fs = st.gs = st.ss = flat_segment(kDataSelector, 0x3, false);
  st.tr = SegmentReg{.base = 0, .limit = 0xffff, .selector = 0, .type = 0xb, .present = true};
  st.ldt = SegmentReg{.base = 0, .limit = 0xffff, .selector = 0, .type = 0x2, .present = true};
  st.gdt = TableReg{kGdtBase, static_cast<uint16_t>(gdt.size() - 1)};
  st.idt = TableReg{0, 0};
  st.rflags = 0x2;  // interrupts disabled, as the protocol requires
  st.rip = loaded.entry;
  reset_fpu_state(st);
  st.cr0 = cr0::kPe | cr0::kMp | cr0::kEt | cr0::kNe | cr0::kWp | cr0::kPg;
  st.cr3 = kPageTables;
  st.cr4 = cr4::kPae | cr4::kOsfxsr | cr4::kOsxmmexcpt;
  st.efer = efer::kLme | efer::kLma;
  if (options.cpu_has_nx) st.efer |= efer::kNxe;
  st.gpr[kRsi] = kZeroPage;
  st.gpr[kRsp] = kZeroPage;  // a scratch stack below the zero page; startup_64 sets its own before any call
  return loaded;
}

}  // namespace deja
