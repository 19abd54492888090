// Guest image loaders: Multiboot and ELF64 direct boot from ELF images built here, every rejection, and mutation fuzzing.
#include "boot/loader.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>

#include "boot/multiboot.h"

namespace deja {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr uint64_t kRam = 16 << 20;
constexpr uint32_t kPtLoad = 1, kPtNote = 4;

// ---- a small ELF writer, so every test states exactly the image it feeds the loader ----

struct TestSegment {
  uint64_t paddr = 0;
  uint64_t vaddr = 0;
  std::vector<uint8_t> data;
  uint64_t mem_size = 0;
  uint32_t type = kPtLoad;
};

struct ElfSpec {
  bool is64 = false;
  uint16_t machine = 3;  // EM_386
  uint64_t entry = 0;
  std::vector<TestSegment> segments;
  bool multiboot = true;
  uint32_t multiboot_flags = 0x3;  // page-align modules, memory info
  bool corrupt_checksum = false;
};

void put(std::vector<uint8_t>& out, uint64_t offset, uint64_t value, unsigned width) {
  if (out.size() < offset + width) out.resize(offset + width);
  for (unsigned i = 0; i < width; ++i) out[offset + i] = static_cast<uint8_t>(value >> (8 * i));
}

constexpr uint64_t kMultibootHeaderOffset = 0x400;

std::vector<uint8_t> build_elf(const ElfSpec& spec) {
  std::vector<uint8_t> out(spec.is64 ? 64 : 52, 0);
  const uint8_t ident[] = {0x7f, 'E', 'L', 'F', uint8_t(spec.is64 ? 2 : 1), 1, 1};
  std::copy(std::begin(ident), std::end(ident), out.begin());
  put(out, 16, 2, 2);  // ET_EXEC
  put(out, 18, spec.machine, 2);
  put(out, 20, 1, 4);
  const uint64_t phoff = spec.is64 ? 64 : 52;
  const uint64_t phentsize = spec.is64 ? 56 : 32;
  if (spec.is64) {
    put(out, 24, spec.entry, 8);
    put(out, 32, phoff, 8);
    put(out, 52, 64, 2);
    put(out, 54, phentsize, 2);
    put(out, 56, spec.segments.size(), 2);
  } else {
    put(out, 24, spec.entry, 4);
    put(out, 28, phoff, 4);
    put(out, 40, 52, 2);
    put(out, 42, phentsize, 2);
    put(out, 44, spec.segments.size(), 2);
  }
  if (spec.multiboot) {
    const uint32_t checksum = -(multiboot::kHeaderMagic + spec.multiboot_flags) + (spec.corrupt_checksum ? 1 : 0);
    put(out, kMultibootHeaderOffset, multiboot::kHeaderMagic, 4);
    put(out, kMultibootHeaderOffset + 4, spec.multiboot_flags, 4);
    put(out, kMultibootHeaderOffset + 8, checksum, 4);
  }
  uint64_t data_offset = std::max<uint64_t>(0x1000, (phoff + spec.segments.size() * phentsize + 0xfff) / 0x1000 * 0x1000);
  for (size_t i = 0; i < spec.segments.size(); ++i) {
    const TestSegment& s = spec.segments[i];
    const uint64_t ph = phoff + i * phentsize;
    const uint64_t mem_size = s.mem_size ? s.mem_size : s.data.size();
    if (spec.is64) {
      put(out, ph, s.type, 4);
      put(out, ph + 4, 7, 4);
      put(out, ph + 8, data_offset, 8);
      put(out, ph + 16, s.vaddr ? s.vaddr : s.paddr, 8);
      put(out, ph + 24, s.paddr, 8);
      put(out, ph + 32, s.data.size(), 8);
      put(out, ph + 40, mem_size, 8);
      put(out, ph + 48, 0x1000, 8);
    } else {
      put(out, ph, s.type, 4);
      put(out, ph + 4, data_offset, 4);
      put(out, ph + 8, s.vaddr ? s.vaddr : s.paddr, 4);
      put(out, ph + 12, s.paddr, 4);
      put(out, ph + 16, s.data.size(), 4);
      put(out, ph + 20, mem_size, 4);
      put(out, ph + 24, 7, 4);
      put(out, ph + 28, 0x1000, 4);
    }
    if (s.data.empty()) continue;  // p_offset points at where data would go; nothing to store
    if (out.size() < data_offset) out.resize(data_offset);
    out.insert(out.begin() + data_offset, s.data.begin(), s.data.end());
    data_offset += (s.data.size() + 0xfff) / 0x1000 * 0x1000 + 0x1000;
  }
  return out;
}

std::vector<uint8_t> pattern(size_t size, uint8_t seed) {
  std::vector<uint8_t> bytes(size);
  for (size_t i = 0; i < size; ++i) bytes[i] = static_cast<uint8_t>(seed + i * 7);
  return bytes;
}

// A typical kernel: text at 1 MiB with a .bss, entry a few bytes in.
ElfSpec kernel32() {
  ElfSpec spec;
  spec.entry = 0x100010;
  spec.segments.push_back({.paddr = 0x100000, .data = pattern(0x1800, 1), .mem_size = 0x3000});
  spec.segments.push_back({.paddr = 0x104000, .data = pattern(0x200, 2), .mem_size = 0x200});
  return spec;
}

ElfSpec kernel64(bool multiboot) {
  ElfSpec spec = kernel32();
  spec.is64 = true;
  spec.machine = 62;
  spec.multiboot = multiboot;
  return spec;
}

GuestMemory make_ram(uint64_t size = kRam) {
  auto memory = GuestMemory::create(size);
  DEJA_ASSERT(memory.has_value());
  return std::move(*memory);
}

uint32_t read32(const GuestMemory& memory, uint64_t gpa) {
  uint32_t value = 0;
  EXPECT_TRUE(memory.read(Gpa{gpa}, std::span(reinterpret_cast<uint8_t*>(&value), 4)));
  return value;
}

uint64_t read64(const GuestMemory& memory, uint64_t gpa) {
  uint64_t value = 0;
  EXPECT_TRUE(memory.read(Gpa{gpa}, std::span(reinterpret_cast<uint8_t*>(&value), 8)));
  return value;
}

std::string read_string(const GuestMemory& memory, uint64_t gpa) {
  std::string text;
  for (uint8_t c; memory.read(Gpa{gpa + text.size()}, std::span(&c, 1)) && c != 0;) text.push_back(char(c));
  return text;
}

std::vector<uint8_t> read_bytes(const GuestMemory& memory, uint64_t gpa, uint64_t size) {
  std::vector<uint8_t> bytes(size);
  EXPECT_TRUE(memory.read(Gpa{gpa}, bytes));
  return bytes;
}

// Decodes the GDT descriptor a selector names, to check the loader's hidden segment state matches
// what a guest reloading the selector would get.
SegmentReg decode_descriptor(const GuestMemory& memory, const CpuState& state, uint16_t selector) {
  const uint64_t d = read64(memory, state.gdt.base + (selector & ~7u));
  SegmentReg s;
  s.selector = selector;
  s.base = ((d >> 16) & 0xffffff) | ((d >> 56) & 0xff) << 24;
  const uint32_t raw_limit = (d & 0xffff) | ((d >> 48) & 0xf) << 16;
  s.type = (d >> 40) & 0xf;
  s.s = (d >> 44) & 1;
  s.dpl = (d >> 45) & 3;
  s.present = (d >> 47) & 1;
  s.avl = (d >> 52) & 1;
  s.l = (d >> 53) & 1;
  s.db = (d >> 54) & 1;
  s.g = (d >> 55) & 1;
  s.limit = s.g ? (raw_limit << 12) | 0xfff : raw_limit;
  return s;
}

Result<LoadedImage> load(GuestMemory& memory, const ElfSpec& spec, const LoadOptions& options = {},
                         std::span<const std::vector<uint8_t>> modules = {}) {
  const auto image = build_elf(spec);
  return load_guest_image_bytes(memory, image, "kernel.elf", options, modules);
}

// ---- Multiboot ----

TEST(LoaderMultiboot, Elf32LoadsAtPhysicalAddressesWithMultibootEntryState) {
  GuestMemory memory = make_ram();
  // Dirty RAM first: .bss must be zeroed by the loader, not by luck.
  auto all = memory.span(Gpa{0}, kRam);
  ASSERT_TRUE(all);
  std::fill(all->begin(), all->end(), 0xcc);
  const ElfSpec spec = kernel32();
  auto loaded = load(memory, spec, {.cmdline = "console=ttyS0 quiet"});
  ASSERT_TRUE(loaded) << loaded.error().message;
  EXPECT_EQ(loaded->format, "multiboot-elf32");
  EXPECT_EQ(loaded->entry, 0x100010u);
  EXPECT_EQ(read_bytes(memory, 0x100000, 0x1800), spec.segments[0].data);
  EXPECT_EQ(read_bytes(memory, 0x101800, 0x1800), std::vector<uint8_t>(0x1800, 0));
  EXPECT_EQ(read_bytes(memory, 0x104000, 0x200), spec.segments[1].data);
  EXPECT_EQ(read_bytes(memory, 0x103000, 0x10), std::vector<uint8_t>(0x10, 0xcc));  // the gap is not touched

  const CpuState& st = loaded->initial_state;
  EXPECT_EQ(st.rip, 0x100010u);
  EXPECT_EQ(st.gpr[kRax], 0x2BADB002u);
  EXPECT_EQ(st.gpr[kRbx], boot_layout::kInfoBase);
  for (int r : {kRcx, kRdx, kRsp, kRbp, kRsi, kRdi}) EXPECT_EQ(st.gpr[r], 0u) << "gpr " << r;
  EXPECT_EQ(st.cr0, cr0::kPe | cr0::kEt);
  EXPECT_EQ(st.cr4, 0u);
  EXPECT_EQ(st.efer, 0u);
  EXPECT_EQ(st.rflags, 0x2u);
  EXPECT_EQ(st.cs.base, 0u);
  EXPECT_EQ(st.cs.limit, 0xffffffffu);
  EXPECT_EQ(st.cs.type, 0xb);
  EXPECT_TRUE(st.cs.db && st.cs.g && st.cs.present && st.cs.s && !st.cs.l);
  // The hidden state equals what reloading each selector from the loader's GDT yields.
  EXPECT_LE(st.cs.selector + 7u, st.gdt.limit);
  EXPECT_EQ(decode_descriptor(memory, st, st.cs.selector), st.cs);
  for (const SegmentReg* seg : {&st.ds, &st.es, &st.fs, &st.gs, &st.ss}) {
    EXPECT_EQ(seg->type, 0x3);
    EXPECT_EQ(decode_descriptor(memory, st, seg->selector), *seg);
  }
}

TEST(LoaderMultiboot, InfoBlockDescribesMemoryCmdlineAndModules) {
  GuestMemory memory = make_ram();
  const std::vector<std::vector<uint8_t>> modules = {pattern(5000, 3), pattern(100, 4)};
  LoadOptions options{.cmdline = "console=ttyS0 quiet",
                      .modules = {{"initrd.img", "initrd root=/dev/ram0"}, {"extra.bin", "extra"}}};
  auto loaded = load(memory, kernel32(), options, modules);
  ASSERT_TRUE(loaded) << loaded.error().message;
  const uint64_t info = loaded->initial_state.gpr[kRbx];
  const uint32_t flags = read32(memory, info);
  for (uint32_t bit : {0, 2, 3, 6, 9}) EXPECT_TRUE(flags & (1u << bit)) << "info flag bit " << bit;
  EXPECT_EQ(read32(memory, info + 4), 640u);
  EXPECT_EQ(read32(memory, info + 8), (kRam - (1 << 20)) / 1024);
  EXPECT_EQ(read_string(memory, read32(memory, info + 16)), "console=ttyS0 quiet");
  EXPECT_EQ(read_string(memory, read32(memory, info + 64)), "deja");

  // Memory map: {size, base, length, type} records, `size` not counting itself.
  const uint32_t mmap_length = read32(memory, info + 44);
  const uint32_t mmap_addr = read32(memory, info + 48);
  struct Entry { uint64_t base, length; uint32_t type; };
  std::vector<Entry> entries;
  for (uint64_t at = mmap_addr; at < mmap_addr + mmap_length; at += read32(memory, at) + 4) {
    entries.push_back({read64(memory, at + 4), read64(memory, at + 12), read32(memory, at + 20)});
  }
  ASSERT_EQ(entries.size(), 3u);
  EXPECT_EQ(entries[0].base, 0u);
  EXPECT_EQ(entries[0].length, 0x9fc00u);
  EXPECT_EQ(entries[0].type, 1u);
  EXPECT_EQ(entries[1].base, 0x9fc00u);
  EXPECT_EQ(entries[1].length, 0x100000u - 0x9fc00u);
  EXPECT_EQ(entries[1].type, 2u);
  EXPECT_EQ(entries[2].base, 0x100000u);
  EXPECT_EQ(entries[2].length, kRam - 0x100000);
  EXPECT_EQ(entries[2].type, 1u);

  ASSERT_EQ(read32(memory, info + 20), 2u);
  const uint32_t mods = read32(memory, info + 24);
  uint64_t previous_end = 0x104200;  // the kernel's highest byte
  for (int i = 0; i < 2; ++i) {
    const uint32_t start = read32(memory, mods + 16 * i), end = read32(memory, mods + 16 * i + 4);
    EXPECT_EQ(start % 4096, 0u);
    EXPECT_GE(start, previous_end);
    EXPECT_EQ(end - start, modules[i].size());
    EXPECT_EQ(read_bytes(memory, start, end - start), modules[i]);
    EXPECT_EQ(read_string(memory, read32(memory, mods + 16 * i + 8)), options.modules[i].args);
    previous_end = end;
  }
  // The loaded ranges cover the segments, both modules and the loader's structures.
  EXPECT_EQ(loaded->loaded_ranges.size(), 2u + 2u + 2u);
}

TEST(LoaderMultiboot, Elf64WithMultibootHeaderEntersProtectedMode) {
  GuestMemory memory = make_ram();
  auto loaded = load(memory, kernel64(/*multiboot=*/true));
  ASSERT_TRUE(loaded) << loaded.error().message;
  EXPECT_EQ(loaded->format, "multiboot-elf64");
  EXPECT_EQ(loaded->initial_state.cr0, cr0::kPe | cr0::kEt);
  EXPECT_EQ(loaded->initial_state.efer, 0u);
  EXPECT_EQ(loaded->initial_state.gpr[kRax], 0x2BADB002u);
  EXPECT_FALSE(loaded->initial_state.cs.l);
  EXPECT_EQ(read_bytes(memory, 0x100000, 0x1800), kernel64(true).segments[0].data);
}

TEST(LoaderMultiboot, HigherHalfEntryIsTranslatedToItsPhysicalAddress) {
  GuestMemory memory = make_ram();
  ElfSpec spec = kernel32();
  spec.segments[0].vaddr = 0xc0100000;
  spec.entry = 0xc0100020;
  auto loaded = load(memory, spec);
  ASSERT_TRUE(loaded) << loaded.error().message;
  EXPECT_EQ(loaded->initial_state.rip, 0x100020u);
}

TEST(LoaderMultiboot, AoutKludgeLoadsTheRangeTheHeaderNames) {
  // A flat binary: header at file offset 0x40, linked so that file offset 0 lands at 0x200000.
  std::vector<uint8_t> image = pattern(0x3000, 9);
  const uint32_t flags = multiboot::kMemoryInfo | multiboot::kAoutKludge;
  put(image, 0x40, multiboot::kHeaderMagic, 4);
  put(image, 0x44, flags, 4);
  put(image, 0x48, uint32_t(-(multiboot::kHeaderMagic + flags)), 4);
  put(image, 0x4c, 0x200040, 4);  // header_addr
  put(image, 0x50, 0x200000, 4);  // load_addr
  put(image, 0x54, 0x202000, 4);  // load_end_addr: the last 0x1000 file bytes are not loaded
  put(image, 0x58, 0x205000, 4);  // bss_end_addr
  put(image, 0x5c, 0x200100, 4);  // entry_addr
  GuestMemory memory = make_ram();
  ASSERT_TRUE(memory.write(Gpa{0x203000}, std::vector<uint8_t>(16, 0xee)));
  auto loaded = load_guest_image_bytes(memory, image, "flat.bin", {});
  ASSERT_TRUE(loaded) << loaded.error().message;
  EXPECT_EQ(loaded->format, "multiboot-aout");
  EXPECT_EQ(loaded->initial_state.rip, 0x200100u);
  EXPECT_EQ(read_bytes(memory, 0x200000, 0x2000), std::vector<uint8_t>(image.begin(), image.begin() + 0x2000));
  EXPECT_EQ(read_bytes(memory, 0x203000, 16), std::vector<uint8_t>(16, 0));  // bss zeroed
}

TEST(LoaderMultiboot, ModulesSkipTheLoaderAreas) {
  // A kernel just below the boot-information area: its module must not land on top of it.
  GuestMemory memory = make_ram();
  ElfSpec spec;
  spec.entry = 0x6000;
  spec.segments.push_back({.paddr = 0x6000, .data = pattern(0x100, 5)});
  const std::vector<std::vector<uint8_t>> modules = {pattern(0x2000, 6)};
  auto loaded = load(memory, spec, {.modules = {{"m", ""}}}, modules);
  ASSERT_TRUE(loaded) << loaded.error().message;
  const uint32_t start = read32(memory, read32(memory, boot_layout::kInfoBase + 24));
  EXPECT_GE(start, boot_layout::kInfoEnd);
  EXPECT_EQ(read_bytes(memory, start, 0x2000), modules[0]);
}

// An image linked at 0x8000 covers the default information area [0x7000, 0x9000): the information goes where
// no segment is (the lowest free page-aligned gap), whole and with every pointer inside it, and the image is intact.
TEST(LoaderMultiboot, ImageOverTheDefaultInfoAreaGetsTheInfoElsewhere) {
  GuestMemory memory = make_ram();
  ElfSpec spec;
  spec.entry = 0x8010;
  spec.segments.push_back({.paddr = 0x8000, .data = pattern(0x2800, 1), .mem_size = 0x3000});
  spec.segments.push_back({.paddr = 0x100000, .data = pattern(0x200, 2)});
  const std::vector<std::vector<uint8_t>> modules = {pattern(3000, 3)};
  auto loaded = load(memory, spec, {.cmdline = "low image", .modules = {{"m", "module args"}}}, modules);
  ASSERT_TRUE(loaded) << loaded.error().message;
  const uint64_t info = loaded->initial_state.gpr[kRbx];
  EXPECT_EQ(info, 0x1000u);  // below the image: the lowest page that nothing else holds
  EXPECT_EQ(read_bytes(memory, 0x8000, 0x2800), spec.segments[0].data);
  EXPECT_EQ(read_bytes(memory, 0xa800, 0x800), std::vector<uint8_t>(0x800, 0));  // its .bss
  EXPECT_EQ(read_string(memory, read32(memory, info + 16)), "low image");
  EXPECT_EQ(read_string(memory, read32(memory, info + 64)), "deja");
  const uint32_t mmap_addr = read32(memory, info + 48), mods = read32(memory, info + 24);
  for (uint32_t pointer : {mmap_addr, mods, read32(memory, info + 16), read32(memory, mods + 8)}) {
    EXPECT_GT(pointer, info);
    EXPECT_LT(pointer, 0x8000u);  // inside the block, which ends before the image
  }
  EXPECT_EQ(read64(memory, mmap_addr + 12), 0x9fc00u);  // the first map entry: conventional memory
  EXPECT_EQ(read_string(memory, read32(memory, mods + 8)), "module args");
  EXPECT_EQ(read_bytes(memory, read32(memory, mods), 3000), modules[0]);
  EXPECT_GE(read32(memory, mods), 0x100200u);  // modules still go above the image
}

// When low memory is all image, the information goes above 1 MiB, past the image and its modules.
TEST(LoaderMultiboot, InfoGoesAboveTheImageWhenLowMemoryIsFull) {
  GuestMemory memory = make_ram();
  ElfSpec spec;
  spec.entry = 0x1000;
  spec.segments.push_back({.paddr = 0x1000, .data = pattern(0x100, 1), .mem_size = 0x9e000});
  spec.segments.push_back({.paddr = 0x100000, .data = pattern(0x200, 2), .mem_size = 0x4000});
  const std::vector<std::vector<uint8_t>> modules = {pattern(0x1800, 3)};
  auto loaded = load(memory, spec, {.cmdline = "x", .modules = {{"m", ""}}}, modules);
  ASSERT_TRUE(loaded) << loaded.error().message;
  const uint64_t info = loaded->initial_state.gpr[kRbx];
  EXPECT_EQ(read32(memory, read32(memory, info + 24)), 0x104000u);  // the module, right above the image
  EXPECT_EQ(info, 0x106000u);                                        // the information, right above the module
  EXPECT_EQ(read_string(memory, read32(memory, info + 16)), "x");
}

// ---- ELF64 direct boot ----

// Walks 4-level paging from CR3 the way the MMU does; nullopt when not present.
std::optional<uint64_t> translate(const GuestMemory& memory, uint64_t cr3, uint64_t linear) {
  uint64_t table = cr3 & ~0xfffull;
  for (int level = 3; level >= 0; --level) {
    const uint64_t entry = read64(memory, table + ((linear >> (12 + 9 * level)) & 511) * 8);
    if (!(entry & 1)) return std::nullopt;
    const uint64_t frame = entry & 0x000ffffffffff000ull;
    if (level == 0) return frame | (linear & 0xfff);
    if (entry & 0x80) {
      if (level == 3) return std::nullopt;  // PS in a PML4E is reserved
      const uint64_t page_mask = (uint64_t{1} << (12 + 9 * level)) - 1;
      return (frame & ~page_mask) | (linear & page_mask);
    }
    table = frame;
  }
  return std::nullopt;
}

TEST(LoaderDirect, Elf64EntersLongModeWithIdentityMap) {
  GuestMemory memory = make_ram();
  auto loaded = load(memory, kernel64(/*multiboot=*/false), {.cmdline = "hello"});
  ASSERT_TRUE(loaded) << loaded.error().message;
  EXPECT_EQ(loaded->format, "elf64-direct");
  const CpuState& st = loaded->initial_state;
  EXPECT_EQ(st.rip, 0x100010u);
  EXPECT_TRUE(st.cr0 & cr0::kPe);
  EXPECT_TRUE(st.cr0 & cr0::kPg);
  EXPECT_TRUE(st.cr0 & cr0::kMp);
  EXPECT_FALSE(st.cr0 & cr0::kEm);
  EXPECT_EQ(st.cr4 & (cr4::kPae | cr4::kOsfxsr | cr4::kOsxmmexcpt), cr4::kPae | cr4::kOsfxsr | cr4::kOsxmmexcpt);
  EXPECT_EQ(st.efer & (efer::kLme | efer::kLma), efer::kLme | efer::kLma);
  EXPECT_TRUE(st.cs.l);
  EXPECT_FALSE(st.cs.db);
  EXPECT_EQ(st.cs.selector, boot_layout::kCode64Selector);
  EXPECT_EQ(st.ss.selector, boot_layout::kDataSelector);
  EXPECT_EQ(decode_descriptor(memory, st, st.cs.selector), st.cs);
  EXPECT_EQ(decode_descriptor(memory, st, st.ss.selector), st.ss);
  EXPECT_EQ(st.rflags, 0x2u);
  EXPECT_EQ(st.gpr[kRsp] % 16, 0u);
  EXPECT_LE(st.gpr[kRsp], 0x80000u);
  EXPECT_EQ(st.gpr[kRsi], 0x2BADB002u);
  EXPECT_EQ(read_string(memory, read32(memory, st.gpr[kRdi] + 16)), "hello");
  uint32_t mxcsr = 0;
  std::memcpy(&mxcsr, st.fxsave.data() + 24, 4);
  EXPECT_EQ(mxcsr, 0x1f80u);

  for (uint64_t address : {uint64_t{0}, uint64_t{0x100010}, uint64_t{0x1234567}, kRam - 1, uint64_t{0xfee00000},
                           uint64_t{0xffffffff}}) {
    auto physical = translate(memory, st.cr3, address);
    ASSERT_TRUE(physical) << std::hex << address;
    EXPECT_EQ(*physical, address);
  }
  EXPECT_FALSE(translate(memory, st.cr3, uint64_t{1} << 32));
  EXPECT_FALSE(translate(memory, st.cr3, uint64_t{1} << 39));
}

TEST(LoaderDirect, ImageOverTheDefaultInfoAreaGetsTheInfoElsewhere) {
  GuestMemory memory = make_ram();
  ElfSpec spec = kernel64(/*multiboot=*/false);
  spec.entry = 0x8000;
  spec.segments = {{.paddr = 0x8000, .data = pattern(0x1000, 1)}};
  auto loaded = load(memory, spec, {.cmdline = "direct"});
  ASSERT_TRUE(loaded) << loaded.error().message;
  EXPECT_EQ(loaded->format, "elf64-direct");
  EXPECT_EQ(loaded->initial_state.gpr[kRdi], 0x1000u);
  EXPECT_EQ(read_string(memory, read32(memory, 0x1000 + 16)), "direct");
  EXPECT_EQ(read_bytes(memory, 0x8000, 0x1000), spec.segments[0].data);
}

TEST(LoaderDirect, IdentityMapCoversRamAbove4GiB) {
  constexpr uint64_t kBig = uint64_t{6} << 30;  // sparse memfd: costs only the pages touched
  GuestMemory memory = make_ram(kBig);
  auto loaded = load(memory, kernel64(false));
  ASSERT_TRUE(loaded) << loaded.error().message;
  auto physical = translate(memory, loaded->initial_state.cr3, kBig - 8);
  ASSERT_TRUE(physical);
  EXPECT_EQ(*physical, kBig - 8);
  // mem_upper is a 32-bit KiB count up to 4 GiB; the memory map carries the whole of RAM.
  const uint64_t info = loaded->initial_state.gpr[kRdi];
  EXPECT_EQ(read32(memory, info + 8), ((uint64_t{1} << 32) - (1 << 20)) / 1024);
  const uint64_t last = read32(memory, info + 48) + 2 * 24;
  EXPECT_EQ(read64(memory, last + 4), 0x100000u);
  EXPECT_EQ(read64(memory, last + 12), kBig - 0x100000);
}

TEST(LoaderDirect, MultibootImageMayUseTheLongModeAreas) {
  // Page tables and the stack are reserved only where they are written.
  ElfSpec spec = kernel32();
  spec.segments[0].paddr = boot_layout::kPageTableBase;
  spec.entry = boot_layout::kPageTableBase;
  GuestMemory memory = make_ram();
  EXPECT_TRUE(load(memory, spec));
  ElfSpec direct = kernel64(false);
  direct.segments[0].paddr = boot_layout::kPageTableBase;
  direct.entry = boot_layout::kPageTableBase;
  auto refused = load(memory, direct);
  ASSERT_FALSE(refused);
  EXPECT_THAT(refused.error().message, AllOf(HasSubstr("kernel.elf"), HasSubstr("segment 0"), HasSubstr("page tables")));
}

// ---- rejections ----

void expect_rejected(const Result<LoadedImage>& result, std::initializer_list<const char*> fragments,
                     const char* name = "kernel.elf") {
  ASSERT_FALSE(result) << "loaded as " << result->format;
  EXPECT_EQ(result.error().kind, ErrorKind::kBadImage);
  EXPECT_THAT(result.error().message, HasSubstr(name));
  for (const char* fragment : fragments) EXPECT_THAT(result.error().message, HasSubstr(fragment));
}

Result<LoadedImage> load_bytes(std::span<const uint8_t> image, uint64_t ram = kRam) {
  GuestMemory memory = make_ram(ram);
  return load_guest_image_bytes(memory, image, "kernel.elf", {});
}

TEST(LoaderRejects, EmptyFile) { expect_rejected(load_bytes({}), {"is empty"}); }

TEST(LoaderRejects, TruncatedElfHeader) {
  auto image = build_elf(kernel64(false));
  image.resize(40);
  expect_rejected(load_bytes(image), {"truncated", "64-byte ELF64 header"});
}

TEST(LoaderRejects, ProgramHeadersBeyondTheFile) {
  auto image = build_elf(kernel32());
  put(image, 28, image.size() - 8, 4);  // e_phoff
  expect_rejected(load_bytes(image), {"truncated", "program headers"});
}

TEST(LoaderRejects, SegmentDataBeyondTheFile) {
  auto image = build_elf(kernel32());
  put(image, 52 + 32 + 4, 0xfffffff0, 4);  // segment 1 p_offset: also checks offset+size does not wrap
  expect_rejected(load_bytes(image), {"truncated", "segment 1"});
  image.resize(0x1800);  // cut inside segment 0's data
  put(image, 52 + 32 + 4, 0x1000, 4);
  expect_rejected(load_bytes(image), {"truncated", "segment 0"});
}

TEST(LoaderRejects, FileSizeLargerThanMemorySize) {
  ElfSpec spec = kernel32();
  spec.segments[1].mem_size = 0x100;
  expect_rejected(load_bytes(build_elf(spec)), {"segment 1", "p_filesz", "p_memsz"});
}

TEST(LoaderRejects, NotElfAndNoMultibootHeader) {
  expect_rejected(load_bytes(pattern(10000, 0)), {"not an ELF file", "no Multiboot header"});
}

TEST(LoaderRejects, MultibootHeaderOnANonElfFileWithoutAoutKludge) {
  std::vector<uint8_t> image = pattern(4096, 0);
  put(image, 8, multiboot::kHeaderMagic, 4);
  put(image, 12, 0, 4);
  put(image, 16, uint32_t(-multiboot::kHeaderMagic), 4);
  expect_rejected(load_bytes(image), {"not an ELF file", "a.out kludge"});
}

TEST(LoaderRejects, WrongClassAndEndianness) {
  auto image = build_elf(kernel32());
  image[4] = 3;
  expect_rejected(load_bytes(image), {"ELF class 3"});
  image[4] = 1;
  image[5] = 2;
  expect_rejected(load_bytes(image), {"not little-endian"});
}

TEST(LoaderRejects, WrongMachine) {
  ElfSpec arm = kernel32();
  arm.machine = 40;
  expect_rejected(load_bytes(build_elf(arm)), {"ARM", "not i386"});
  ElfSpec aarch64 = kernel64(false);
  aarch64.machine = 183;
  expect_rejected(load_bytes(build_elf(aarch64)), {"AArch64", "not x86-64"});
}

TEST(LoaderRejects, ThirtyTwoBitElfWithoutMultibootHeader) {
  ElfSpec spec = kernel32();
  spec.multiboot = false;
  expect_rejected(load_bytes(build_elf(spec)),
                  {"32-bit ELF without a Multiboot header: deja boots 32-bit images only through Multiboot"});
}

TEST(LoaderRejects, NoLoadableSegment) {
  ElfSpec spec = kernel32();
  for (auto& segment : spec.segments) segment.type = kPtNote;
  expect_rejected(load_bytes(build_elf(spec)), {"no PT_LOAD segment"});
}

TEST(LoaderRejects, RelocatableObject) {
  auto image = build_elf(kernel32());
  put(image, 16, 1, 2);
  expect_rejected(load_bytes(image), {"relocatable object", "link it"});
}

TEST(LoaderRejects, EntryPointZeroOrOutsideSegments) {
  ElfSpec spec = kernel32();
  spec.entry = 0;
  expect_rejected(load_bytes(build_elf(spec)), {"entry point is 0"});
  spec.entry = 0x103800;  // in the gap between the two segments
  expect_rejected(load_bytes(build_elf(spec)), {"entry point 0x103800", "not inside any loaded segment"});
}

TEST(LoaderRejects, MultibootEntryAbove4GiB) {
  ElfSpec spec = kernel64(true);
  spec.segments[0].vaddr = 0x100000000;
  spec.entry = 0x100000010;
  spec.segments[0].paddr = 0x100000000;
  auto result = load_bytes(build_elf(spec), uint64_t{5} << 30);
  expect_rejected(result, {"4 GiB"});
}

TEST(LoaderRejects, SegmentOutsideRam) {
  ElfSpec spec = kernel32();
  spec.segments[1].paddr = kRam - 0x100;  // straddles the end of RAM
  expect_rejected(load_bytes(build_elf(spec)), {"segment 1", "outside RAM", "0x1000000", "0xffff00"});
  spec.segments[1].paddr = 0xffffff00;  // would wrap a 32-bit end
  spec.segments[1].mem_size = 0x1000;
  expect_rejected(load_bytes(build_elf(spec)), {"segment 1", "outside RAM"});
}

TEST(LoaderRejects, SegmentOverlappingLoaderStructures) {
  ElfSpec spec = kernel32();
  spec.segments[1].paddr = 0x400;
  expect_rejected(load_bytes(build_elf(spec)), {"segment 1", "GDT"});
  ElfSpec direct = kernel64(false);
  direct.segments[1].paddr = 0x7f000;
  expect_rejected(load_bytes(build_elf(direct)), {"segment 1", "boot stack"});
}

// Still refused, clearly, when RAM has no page-aligned gap for it below 4 GiB.
TEST(LoaderRejects, NoRoomForTheBootInformation) {
  ElfSpec spec;
  spec.entry = 0x1000;
  spec.segments.push_back({.paddr = 0x1000, .data = pattern(0x100, 1), .mem_size = 0x9e000});
  spec.segments.push_back({.paddr = 0x100000, .data = pattern(0x100, 2), .mem_size = 0x100000});
  expect_rejected(load_bytes(build_elf(spec), 2 << 20),
                  {"no room for the Multiboot boot information", "give the guest more memory"});
  spec.segments[1].mem_size = 0xff000;  // one free page at the top of RAM is enough
  GuestMemory memory = make_ram(2 << 20);
  auto loaded = load(memory, spec);
  ASSERT_TRUE(loaded) << loaded.error().message;
  EXPECT_EQ(loaded->initial_state.gpr[kRbx], 0x1ff000u);
}

TEST(LoaderRejects, OverlappingSegments) {
  ElfSpec spec = kernel32();
  spec.segments[1].paddr = 0x102000;  // inside segment 0's .bss
  expect_rejected(load_bytes(build_elf(spec)), {"segment 1", "overlaps segment 0"});
}

TEST(LoaderRejects, MultibootChecksumWrong) {
  ElfSpec spec = kernel32();
  spec.corrupt_checksum = true;
  expect_rejected(load_bytes(build_elf(spec)), {"wrong checksum", "0x400"});
}

TEST(LoaderRejects, UnsupportedRequiredMultibootFlags) {
  ElfSpec spec = kernel32();
  spec.multiboot_flags = 0x3 | (1u << 5);
  expect_rejected(load_bytes(build_elf(spec)), {"requires features", "0x20"});
  spec.multiboot_flags = 0x3 | (1u << 2) | (1u << 20);  // video is ignored; optional bits 17-31 too
  EXPECT_TRUE(load_bytes(build_elf(spec)));
}

TEST(LoaderRejects, ModuleThatDoesNotFit) {
  GuestMemory memory = make_ram(2 << 20);
  auto result = load(memory, kernel32(), {.modules = {{"big.img", ""}}}, std::vector<std::vector<uint8_t>>{std::vector<uint8_t>(1 << 20)});
  expect_rejected(result, {"does not fit", "0x200000"}, "big.img");
}

TEST(LoaderRejects, CommandLineTooLongForTheInfoArea) {
  GuestMemory memory = make_ram();
  auto result = load(memory, kernel32(), {.cmdline = std::string(9000, 'x')});
  ASSERT_FALSE(result);
  EXPECT_EQ(result.error().kind, ErrorKind::kInvalidArgument);
  EXPECT_THAT(result.error().message, AllOf(HasSubstr("command line"), HasSubstr("shorten")));
}

TEST(LoaderRejects, NothingIsWrittenWhenALaterCheckFails) {
  GuestMemory memory = make_ram(2 << 20);
  auto all = memory.span(Gpa{0}, 2 << 20);
  ASSERT_TRUE(all);
  std::fill(all->begin(), all->end(), 0x5a);
  auto result = load(memory, kernel32(), {.modules = {{"big.img", ""}}}, std::vector<std::vector<uint8_t>>{std::vector<uint8_t>(1 << 20)});
  ASSERT_FALSE(result);
  EXPECT_TRUE(std::all_of(all->begin(), all->end(), [](uint8_t b) { return b == 0x5a; }));
  EXPECT_TRUE(memory.take_vmm_dirty_pages().empty());
}

class LoaderFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("deja-loader-test-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string write_file(const std::string& name, const std::vector<uint8_t>& bytes) {
    const auto path = (dir_ / name).string();
    FILE* f = std::fopen(path.c_str(), "wb");
    DEJA_ASSERT(f != nullptr);
    if (!bytes.empty()) std::fwrite(bytes.data(), 1, bytes.size(), f);
    std::fclose(f);
    return path;
  }
  std::filesystem::path dir_;
};

TEST_F(LoaderFiles, LoadsImageAndModulesFromDisk) {
  const auto kernel = write_file("kernel.elf", build_elf(kernel32()));
  const auto module = write_file("initrd", pattern(3000, 8));
  GuestMemory memory = make_ram();
  auto loaded = load_guest_image(memory, kernel, {.cmdline = "x", .modules = {{module, "rd"}}});
  ASSERT_TRUE(loaded) << loaded.error().message;
  const uint32_t mods = read32(memory, boot_layout::kInfoBase + 24);
  EXPECT_EQ(read_bytes(memory, read32(memory, mods), 3000), pattern(3000, 8));
}

TEST_F(LoaderFiles, MissingModuleOrImageIsNamed) {
  const auto kernel = write_file("kernel.elf", build_elf(kernel32()));
  GuestMemory memory = make_ram();
  const auto missing = (dir_ / "no-such-initrd").string();
  auto result = load_guest_image(memory, kernel, {.modules = {{missing, ""}}});
  expect_rejected(result, {"boot module", "No such file"}, "no-such-initrd");
  result = load_guest_image(memory, (dir_ / "no-kernel").string(), {});
  expect_rejected(result, {"guest image", "No such file"}, "no-kernel");
  result = load_guest_image(memory, dir_.string(), {});  // a directory opens but cannot be read
  expect_rejected(result, {"guest image", "directory"}, dir_.string().c_str());
  // An endless device must fail at once, not fill host memory.
  result = load_guest_image(memory, kernel, {.modules = {{"/dev/zero", ""}}});
  expect_rejected(result, {"boot module", "not a regular file"}, "/dev/zero");
}

TEST_F(LoaderFiles, FileLargerThanRamIsRefusedBeforeReading) {
  const auto kernel = write_file("kernel.elf", build_elf(kernel32()));
  const auto huge = (dir_ / "huge.img").string();
  std::filesystem::resize_file(write_file("huge.img", {}), 3 << 20);  // sparse: no disk used
  GuestMemory memory = make_ram(2 << 20);
  auto result = load_guest_image(memory, kernel, {.modules = {{huge, ""}}});
  expect_rejected(result, {"boot module", "larger"}, "huge.img");
}

TEST(LoaderRejects, SixtyThousandSegmentsAreCheckedQuickly) {
  // Overlap checking must not be quadratic in the (attacker-chosen) program-header count.
  ElfSpec spec = kernel64(/*multiboot=*/false);
  spec.segments.clear();
  spec.entry = 0x100000;
  for (int i = 0; i < 60000; ++i) spec.segments.push_back({.paddr = 0x100000 + 16 * uint64_t(i), .mem_size = 16});
  const auto start = std::chrono::steady_clock::now();
  auto image = build_elf(spec);
  auto loaded = load_bytes(image);
  ASSERT_TRUE(loaded) << loaded.error().message;
  EXPECT_EQ(loaded->loaded_ranges.size(), 60000u + 3u);  // + GDT, boot information, page tables
  put(image, 64 + 59999 * 56 + 24, 0x100008, 8);  // the last segment's p_paddr now lands inside segment 0
  expect_rejected(load_bytes(image), {"segment 59999", "overlaps segment 0"});
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
}

TEST(LoaderRejects, InconsistentAoutKludge) {
  auto image_with = [](uint32_t header_addr, uint32_t load_addr, uint32_t load_end, uint32_t bss_end, uint32_t entry) {
    std::vector<uint8_t> image = pattern(0x2000, 9);
    const uint32_t flags = multiboot::kAoutKludge;
    put(image, 0x40, multiboot::kHeaderMagic, 4);
    put(image, 0x44, flags, 4);
    put(image, 0x48, uint32_t(-(multiboot::kHeaderMagic + flags)), 4);
    for (uint32_t i = 0, v[] = {header_addr, load_addr, load_end, bss_end, entry}; i < 5; ++i) put(image, 0x4c + 4 * i, v[i], 4);
    return image;
  };
  expect_rejected(load_bytes(image_with(0x200040, 0x300000, 0, 0, 0x200100)), {"load_addr 0x300000", "header_addr"});
  expect_rejected(load_bytes(image_with(0x201000, 0x200000, 0, 0, 0x200100)), {"before the header"});
  expect_rejected(load_bytes(image_with(0x200040, 0x200000, 0x210000, 0, 0x200100)), {"truncated", "a.out kludge"});
  expect_rejected(load_bytes(image_with(0x200040, 0x200000, 0x201000, 0x200800, 0x200100)), {"bss_end_addr"});
  expect_rejected(load_bytes(image_with(0x200040, 0x200000, 0, 0, 0x300000)), {"entry point 0x300000"});
  auto cut = image_with(0x200040, 0x200000, 0, 0, 0x200100);
  cut.resize(0x54);  // the address fields are cut off
  expect_rejected(load_bytes(cut), {"truncated", "bit 16"});
}

TEST(LoaderRejects, LinuxBzImageIsRecognised) {
  std::vector<uint8_t> image = pattern(0x1000, 0);
  std::memcpy(image.data() + 0x202, "HdrS", 4);
  expect_rejected(load_bytes(image), {"not an ELF file", "bzImage"});
}

// The project's own guests (guest-tests/, built by the same CMake tree) are real toolchain output:
// they must load byte-exact. Skipped when the guests have not been built yet.
TEST(LoaderRealImages, ProjectGuestsLoadAsMultibootElf32) {
  int checked = 0;
  for (const char* guest : {"hello", "cpuid", "exceptions", "paging", "timer", "memory", "boot64-shim"}) {
    const std::string path = std::string(DEJA_GUEST_IMAGE_DIR) + "/" + guest + ".elf";
    auto file = read_boot_file(path, "guest image");
    if (!file) continue;
    GuestMemory memory = make_ram(64 << 20);
    auto loaded = load_guest_image(memory, path, {.cmdline = "real"});
    ASSERT_TRUE(loaded) << loaded.error().message;
    EXPECT_EQ(loaded->format, "multiboot-elf32") << path;
    const std::span<const uint8_t> bytes = *file;
    uint32_t entry, phoff, paddr, offset, filesz;
    uint16_t phnum;
    std::memcpy(&entry, &bytes[24], 4);
    std::memcpy(&phoff, &bytes[28], 4);
    std::memcpy(&phnum, &bytes[44], 2);
    EXPECT_EQ(loaded->initial_state.rip, entry) << path;
    for (uint16_t i = 0; i < phnum; ++i) {
      uint32_t type;
      std::memcpy(&type, &bytes[phoff + 32 * i], 4);
      if (type != kPtLoad) continue;
      std::memcpy(&offset, &bytes[phoff + 32 * i + 4], 4);
      std::memcpy(&paddr, &bytes[phoff + 32 * i + 12], 4);
      std::memcpy(&filesz, &bytes[phoff + 32 * i + 16], 4);
      EXPECT_TRUE(std::ranges::equal(read_bytes(memory, paddr, filesz), bytes.subspan(offset, filesz)))
          << path << " segment " << i;
    }
    ++checked;
  }
  if (checked == 0) GTEST_SKIP() << "no guest images in " << DEJA_GUEST_IMAGE_DIR << " (build the `guests` target)";
}

TEST(LoaderRealImages, ProjectHello64BootsDirectIntoLongMode) {
  const std::string path = std::string(DEJA_GUEST_IMAGE_DIR) + "/hello64.elf";
  auto file = read_boot_file(path, "guest image");
  if (!file) GTEST_SKIP() << path << " not built (build the `guests` target)";
  GuestMemory memory = make_ram(64 << 20);
  auto loaded = load_guest_image(memory, path, {});
  ASSERT_TRUE(loaded) << loaded.error().message;
  EXPECT_EQ(loaded->format, "elf64-direct");
  uint64_t entry;
  std::memcpy(&entry, file->data() + 24, 8);
  EXPECT_EQ(loaded->initial_state.rip, entry);
  EXPECT_TRUE(loaded->initial_state.cs.l);
}

// ---- fuzzing: any mutation yields an image or a clean error, never a crash ----

void fuzz(const std::vector<uint8_t>& valid, uint32_t seed, int iterations) {
  GuestMemory memory = make_ram(4 << 20);
  std::mt19937 rng(seed);
  int loaded = 0, rejected = 0;
  const std::vector<std::vector<uint8_t>> modules = {pattern(100, 1)};
  const LoadOptions options{.cmdline = "fuzz", .modules = {{"m", "a"}}};
  for (int i = 0; i < iterations; ++i) {
    std::vector<uint8_t> image = valid;
    const int mutations = 1 + rng() % 8;
    for (int m = 0; m < mutations; ++m) {
      switch (rng() % 6) {
        case 0: image.resize(rng() % (image.size() + 1)); break;
        case 1: if (!image.empty()) image[rng() % std::min<size_t>(image.size(), 0x100)] = rng(); break;  // headers
        case 2: if (!image.empty()) image[rng() % image.size()] = rng(); break;
        case 3:  // a whole 32-bit field set to an extreme value
          if (image.size() >= 0x104) put(image, (rng() % 0x100) & ~3u, (rng() & 1) ? 0xffffffffu : rng() % 0x2000000, 4);
          break;
        case 4: if (image.size() > kMultibootHeaderOffset + 12) image[kMultibootHeaderOffset + rng() % 12] ^= 1u << (rng() % 8); break;
        default: image.push_back(rng()); break;
      }
    }
    auto result = load_guest_image_bytes(memory, image, "fuzz.elf", options, modules);
    memory.take_vmm_dirty_pages();
    if (result) {
      ++loaded;
      EXPECT_LT(result->entry, memory.size());
      for (auto [gpa, size] : result->loaded_ranges) EXPECT_TRUE(memory.contains(Gpa{gpa}, size));
    } else {
      ++rejected;
      EXPECT_FALSE(result.error().message.empty());
    }
  }
  // Both outcomes must occur, or the mutations are not exercising the parser.
  std::printf("fuzz seed %u: %d loaded, %d rejected\n", seed, loaded, rejected);
  EXPECT_GT(loaded, 0);
  EXPECT_GT(rejected, 0);
}

TEST(LoaderFuzz, MutatedMultibootElf32) { fuzz(build_elf(kernel32()), 1, 3000); }
TEST(LoaderFuzz, MutatedMultibootElf64) { fuzz(build_elf(kernel64(true)), 2, 2000); }
TEST(LoaderFuzz, MutatedDirectElf64) { fuzz(build_elf(kernel64(false)), 3, 2000); }

}  // namespace
}  // namespace deja
