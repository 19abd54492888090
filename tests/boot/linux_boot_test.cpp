// Linux kernel loading: the installed Debian kernel through both entries, crafted bzImages in every compression, and
// every refusal (not a bzImage, old protocol, zImage, truncation, unknown compression, initrd or RAM too small).
#include "boot/linux_boot.h"

#include <bzlib.h>
#include <lz4.h>
#include <lzma.h>
#include <lzo/lzo1x.h>
#include <zlib.h>
#include <zstd.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "boot/bzimage.h"
#include "boot/kernel_decompress.h"
#include "boot/loader.h"
#include "boot/pvh.h"

namespace deja {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

using Bytes = std::vector<uint8_t>;

void put(Bytes& out, uint64_t offset, uint64_t value, unsigned width) {
  if (out.size() < offset + width) out.resize(offset + width);
  for (unsigned i = 0; i < width; ++i) out[offset + i] = static_cast<uint8_t>(value >> (8 * i));
}
uint64_t get(std::span<const uint8_t> b, uint64_t offset, unsigned width) {
  uint64_t v = 0;
  for (unsigned i = 0; i < width; ++i) v |= uint64_t{b[offset + i]} << (8 * i);
  return v;
}

// ---- a tiny x86-64 "vmlinux": one PT_LOAD at 16 MiB and a PT_NOTE with the PVH entry ----

constexpr uint64_t kKernelBase = 0x1000000, kPvhEntryOffset = 0x40;

Bytes tiny_vmlinux(bool with_pvh_note = true, unsigned note_desc_size = 8) {
  Bytes out(64, 0);
  const uint8_t ident[] = {0x7f, 'E', 'L', 'F', 2, 1, 1};
  std::copy(std::begin(ident), std::end(ident), out.begin());
  put(out, 16, 2, 2);   // ET_EXEC
  put(out, 18, 62, 2);  // EM_X86_64
  put(out, 20, 1, 4);
  put(out, 24, 0xffffffff81000000ull, 8);
  put(out, 32, 64, 8);  // phoff
  put(out, 52, 64, 2);
  put(out, 54, 56, 2);
  put(out, 56, 2, 2);  // two program headers
  const uint64_t note_at = 64 + 2 * 56, text_at = 0x200;
  Bytes note;
  put(note, 0, 4, 4);  // "Xen\0"
  put(note, 4, note_desc_size, 4);
  put(note, 8, with_pvh_note ? pvh::kPhys32EntryNote : 7, 4);
  note.resize(16);
  std::memcpy(note.data() + 12, "Xen", 4);
  put(note, 16, kKernelBase + kPvhEntryOffset, note_desc_size);
  // PT_LOAD
  uint64_t ph = 64;
  put(out, ph, 1, 4);
  put(out, ph + 4, 5, 4);
  put(out, ph + 8, text_at, 8);
  put(out, ph + 16, 0xffffffff81000000ull, 8);
  put(out, ph + 24, kKernelBase, 8);
  put(out, ph + 32, 0x100, 8);
  put(out, ph + 40, 0x3000, 8);  // with "bss"
  // PT_NOTE
  ph += 56;
  put(out, ph, 4, 4);
  put(out, ph + 8, note_at, 8);
  put(out, ph + 32, note.size(), 8);
  out.resize(note_at);
  out.insert(out.end(), note.begin(), note.end());
  out.resize(text_at);
  for (int i = 0; i < 0x100; ++i) out.push_back(static_cast<uint8_t>(i * 7 + 1));
  return out;
}

// ---- compressors, each writing what the kernel's build would (compressed stream + 4-byte size) ----

void append_size(Bytes& out, uint64_t size) { put(out, out.size(), size, 4); }

Bytes gzip(const Bytes& in) {
  z_stream z{};
  deflateInit2(&z, 9, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY);
  Bytes out(deflateBound(&z, in.size()) + 64);
  z.next_in = const_cast<Bytef*>(in.data());
  z.avail_in = in.size();
  z.next_out = out.data();
  z.avail_out = out.size();
  deflate(&z, Z_FINISH);
  out.resize(z.total_out);
  deflateEnd(&z);
  return out;  // gzip's trailer already ends with the size
}
Bytes bzip2(const Bytes& in) {
  Bytes out(in.size() + in.size() / 100 + 700);
  unsigned len = out.size();
  BZ2_bzBuffToBuffCompress(reinterpret_cast<char*>(out.data()), &len,
                           const_cast<char*>(reinterpret_cast<const char*>(in.data())), in.size(), 9, 0, 0);
  out.resize(len);
  append_size(out, in.size());
  return out;
}
Bytes xz(const Bytes& in, bool legacy) {
  lzma_stream s = LZMA_STREAM_INIT;
  if (legacy) {
    lzma_options_lzma options;
    lzma_lzma_preset(&options, 6);
    EXPECT_EQ(lzma_alone_encoder(&s, &options), LZMA_OK);
  } else {
    EXPECT_EQ(lzma_easy_encoder(&s, 6, LZMA_CHECK_CRC32), LZMA_OK);
  }
  Bytes out(in.size() * 2 + 4096);
  s.next_in = in.data();
  s.avail_in = in.size();
  s.next_out = out.data();
  s.avail_out = out.size();
  while (lzma_code(&s, LZMA_FINISH) == LZMA_OK) {
  }
  out.resize(out.size() - s.avail_out);
  lzma_end(&s);
  append_size(out, in.size());
  return out;
}
Bytes zstd(const Bytes& in) {
  Bytes out(ZSTD_compressBound(in.size()));
  out.resize(ZSTD_compress(out.data(), out.size(), in.data(), in.size(), 19));
  append_size(out, in.size());
  return out;
}
Bytes lz4_legacy(const Bytes& in) {
  Bytes out;
  put(out, 0, 0x184C2102, 4);
  Bytes block(LZ4_compressBound(in.size()));
  const int n = LZ4_compress_default(reinterpret_cast<const char*>(in.data()), reinterpret_cast<char*>(block.data()),
                                     in.size(), block.size());
  put(out, out.size(), n, 4);
  out.insert(out.end(), block.begin(), block.begin() + n);
  append_size(out, in.size());
  return out;
}
void put_be(Bytes& out, uint32_t v, unsigned width) {
  for (unsigned i = 0; i < width; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * (width - 1 - i))));
}
Bytes lzop(const Bytes& in) {
  lzo_init();
  Bytes out = {0x89, 'L', 'Z', 'O', 0x00, 0x0d, 0x0a, 0x1a, 0x0a};
  put_be(out, 0x1030, 2);  // version
  put_be(out, 0x2080, 2);  // library version
  put_be(out, 0x0940, 2);  // needed to extract
  out.push_back(1);        // method LZO1X-1
  out.push_back(5);        // level
  put_be(out, 0x1, 4);     // flags: adler32 of the decompressed data
  put_be(out, 0x81a4, 4);  // mode
  put_be(out, 0, 4);       // mtime low
  put_be(out, 0, 4);       // mtime high
  out.push_back(0);        // no file name
  put_be(out, 0, 4);       // header checksum (not checked)
  Bytes block(in.size() + in.size() / 16 + 64 + 3);
  std::vector<uint8_t> work(LZO1X_1_MEM_COMPRESS);
  lzo_uint n = block.size();
  lzo1x_1_compress(in.data(), in.size(), block.data(), &n, work.data());
  put_be(out, in.size(), 4);
  put_be(out, n, 4);
  put_be(out, 0, 4);  // adler32 (not checked)
  out.insert(out.end(), block.begin(), block.begin() + n);
  put_be(out, 0, 4);  // end
  append_size(out, in.size());
  return out;
}

// ---- a bzImage around a payload, with the 2.15 setup header a real kernel carries ----

struct BzSpec {
  uint16_t version = 0x020f;
  uint8_t loadflags = 0x01;
  uint16_t xloadflags = 0x03;
  uint32_t init_size = 0x400000;
  uint32_t cmdline_size = 2047;
  uint32_t initrd_addr_max = 0x7fffffff;
};

Bytes bzimage(const Bytes& payload, const BzSpec& spec = {}) {
  Bytes out(1024, 0);  // boot sector + one setup sector
  out[bzimage::kSetupSects] = 1;
  put(out, bzimage::kBootFlag, 0xaa55, 2);
  out[bzimage::kJump] = 0xeb;
  out[bzimage::kJump + 1] = 0x6a;  // header ends at 0x26c
  std::memcpy(out.data() + bzimage::kHeaderMagic, "HdrS", 4);
  put(out, bzimage::kVersion, spec.version, 2);
  out[bzimage::kLoadflags] = spec.loadflags;
  put(out, bzimage::kCode32Start, 0x100000, 4);
  put(out, bzimage::kInitrdAddrMax, spec.initrd_addr_max, 4);
  put(out, bzimage::kKernelAlignment, 0x200000, 4);
  out[bzimage::kRelocatable] = 1;
  put(out, bzimage::kXloadflags, spec.xloadflags, 2);
  put(out, bzimage::kCmdlineSize, spec.cmdline_size, 4);
  put(out, bzimage::kPrefAddress, kKernelBase, 8);
  put(out, bzimage::kInitSize, spec.init_size, 4);
  // The protected-mode kernel: 0x300 bytes of "decompressor", then the payload, padded to 16 bytes.
  Bytes kernel(0x300, 0x90);
  put(out, bzimage::kPayloadOffset, kernel.size(), 4);
  put(out, bzimage::kPayloadLength, payload.size(), 4);
  // Reserved first: GCC 12 at -O3 (Release) reports a false -Warray-bounds on the growing insert.
  kernel.reserve(kernel.size() + payload.size() + 16);
  kernel.insert(kernel.end(), payload.begin(), payload.end());
  kernel.resize((kernel.size() + 15) / 16 * 16);
  put(out, bzimage::kSyssize, kernel.size() / 16, 4);
  out.insert(out.end(), kernel.begin(), kernel.end());
  return out;
}

// ---- the installed kernel ----

std::string installed_kernel() {
  std::vector<std::string> kernels;
  if (std::filesystem::is_directory("/boot")) {
    for (const auto& e : std::filesystem::directory_iterator("/boot")) {
      if (e.path().filename().string().starts_with("vmlinuz-")) kernels.push_back(e.path());
    }
  }
  std::sort(kernels.begin(), kernels.end());
  return kernels.empty() ? "" : kernels.back();
}

Bytes read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(in), {});
}

GuestMemory ram(uint64_t size = 256 << 20) { return std::move(*GuestMemory::create(size)); }

Result<LoadedImage> load(GuestMemory& memory, const Bytes& kernel, LinuxEntry entry, const std::string& cmdline = "",
                         const Bytes& initrd = {}) {
  return load_linux_kernel(memory, kernel, "kernel.img",
                           {.cmdline = cmdline, .entry = entry, .initrd = initrd,
                            .initrd_name = initrd.empty() ? "" : "initrd.img"});
}

Bytes read_ram(GuestMemory& memory, uint64_t gpa, uint64_t size) {
  Bytes out(size);
  EXPECT_TRUE(memory.read(Gpa{gpa}, out));
  return out;
}

void expect_refused(const Result<LoadedImage>& result, std::initializer_list<const char*> fragments) {
  ASSERT_FALSE(result) << "loaded as " << result->format;
  for (const char* f : fragments) EXPECT_THAT(result.error().message, HasSubstr(f));
}

TEST(LinuxBootInstalled, BzImage64BitProtocol) {
  const std::string path = installed_kernel();
  if (path.empty()) GTEST_SKIP() << "no /boot/vmlinuz-* installed";
  const Bytes kernel = read_file(path);
  auto image = parse_bzimage(kernel, path);
  ASSERT_TRUE(image) << image.error().message;
  EXPECT_GE(image->version, 0x020c);
  EXPECT_TRUE(image->xloadflags & bzimage::kXlfKernel64);
  EXPECT_NE(detect_compression(image->payload), KernelCompression::kUnknown);
  // kernel_version: "6.1.0-18-amd64 (debian-kernel@lists.debian.org) #1 SMP ...", the release in the file's name.
  const std::string release = path.substr(path.find("vmlinuz-") + 8);
  EXPECT_EQ(image->kernel_version.substr(0, release.size() + 1), release + " ") << image->kernel_version;

  GuestMemory memory = ram();
  const Bytes initrd(300000, 0x5a);
  auto loaded = load(memory, kernel, LinuxEntry::k64Bit, "console=ttyS0 quiet", initrd);
  ASSERT_TRUE(loaded) << loaded.error().message;
  EXPECT_EQ(loaded->format, "linux-64bit");
  EXPECT_EQ(loaded->entry, image->pref_address + 0x200);
  const CpuState& st = loaded->initial_state;
  EXPECT_EQ(st.rip, loaded->entry);
  EXPECT_EQ(st.gpr[kRsi], linux_layout::kZeroPage);
  EXPECT_EQ(st.cs.selector, 0x10);
  EXPECT_TRUE(st.cs.l);
  EXPECT_EQ(st.ds.selector, 0x18);
  EXPECT_TRUE(st.efer & efer::kLma);
  EXPECT_EQ(st.rflags & rflags::kIf, 0u);
  // The kernel sits at pref_address; the zero page holds the file's header and what a boot loader fills in.
  EXPECT_EQ(read_ram(memory, image->pref_address, 4096), Bytes(image->kernel.begin(), image->kernel.begin() + 4096));
  const Bytes zp = read_ram(memory, linux_layout::kZeroPage, 4096);
  EXPECT_EQ(std::memcmp(zp.data() + 0x202, "HdrS", 4), 0);
  EXPECT_EQ(zp[bzimage::kTypeOfLoader], 0xff);
  EXPECT_EQ(get(zp, bzimage::kCmdLinePtr, 4), linux_layout::kCmdline);
  EXPECT_EQ(read_ram(memory, linux_layout::kCmdline, 20), Bytes({'c', 'o', 'n', 's', 'o', 'l', 'e', '=', 't', 't', 'y',
                                                                  'S', '0', ' ', 'q', 'u', 'i', 'e', 't', 0}));
  const uint64_t initrd_at = get(zp, bzimage::kRamdiskImage, 4);
  EXPECT_EQ(get(zp, bzimage::kRamdiskSize, 4), initrd.size());
  EXPECT_EQ(initrd_at % 4096, 0u);
  EXPECT_GE(initrd_at, image->pref_address + image->init_size);
  EXPECT_LE(initrd_at + initrd.size(), memory.size());
  EXPECT_EQ(read_ram(memory, initrd_at, initrd.size()), initrd);
  ASSERT_EQ(zp[bzimage::kE820Entries], 4);
  EXPECT_EQ(get(zp, bzimage::kE820Table + 3 * 20, 8), 0x100000u);
  EXPECT_EQ(get(zp, bzimage::kE820Table + 3 * 20 + 8, 8), memory.size() - 0x100000);
  EXPECT_EQ(get(zp, bzimage::kE820Table + 3 * 20 + 16, 4), 1u);
}

TEST(LinuxBootInstalled, BzImagePvhDecompressesThePayload) {
  const std::string path = installed_kernel();
  if (path.empty()) GTEST_SKIP() << "no /boot/vmlinuz-* installed";
  const Bytes kernel = read_file(path);
  GuestMemory memory = ram();
  const Bytes initrd(5000, 0xa5);
  auto loaded = load(memory, kernel, LinuxEntry::kAuto, "console=ttyS0", initrd);
  ASSERT_TRUE(loaded) << loaded.error().message;
  EXPECT_EQ(loaded->format, "linux-pvh");  // Debian builds with CONFIG_PVH
  const CpuState& st = loaded->initial_state;
  EXPECT_EQ(st.rip, loaded->entry);
  EXPECT_LT(loaded->entry, 1ull << 32);
  EXPECT_EQ(st.gpr[kRbx], linux_layout::kZeroPage);
  EXPECT_FALSE(st.cs.l);
  EXPECT_TRUE(st.cs.db);
  EXPECT_EQ(st.cr0 & cr0::kPg, 0u);
  EXPECT_EQ(st.tr.limit, 0x67u);
  const Bytes info = read_ram(memory, linux_layout::kZeroPage, 256);
  EXPECT_EQ(get(info, pvh::kMagic, 4), pvh::kStartMagic);
  EXPECT_EQ(get(info, pvh::kVersion, 4), 1u);
  EXPECT_EQ(get(info, pvh::kNrModules, 4), 1u);
  EXPECT_EQ(get(info, pvh::kCmdlinePaddr, 8), linux_layout::kCmdline);
  EXPECT_EQ(get(info, pvh::kMemmapEntries, 4), 4u);
  const uint64_t modlist = get(info, pvh::kModlistPaddr, 8);
  const Bytes module = read_ram(memory, modlist, 16);
  EXPECT_EQ(get(module, 8, 8), initrd.size());
  EXPECT_EQ(read_ram(memory, get(module, 0, 8), initrd.size()), initrd);
  // The same entry as an explicit --boot-protocol pvh.
  GuestMemory again = ram();
  auto explicit_pvh = load(again, kernel, LinuxEntry::kPvh);
  ASSERT_TRUE(explicit_pvh) << explicit_pvh.error().message;
  EXPECT_EQ(explicit_pvh->entry, loaded->entry);
}

TEST(LinuxBootInstalled, TooLittleRamForTheDecompressor) {
  const std::string path = installed_kernel();
  if (path.empty()) GTEST_SKIP() << "no /boot/vmlinuz-* installed";
  GuestMemory memory = ram(32 << 20);
  expect_refused(load(memory, read_file(path), LinuxEntry::k64Bit), {"needs RAM up to", "raise --mem"});
}

// ---- every compression ----

class LinuxBootCompression : public ::testing::TestWithParam<const char*> {};

Bytes compress(const std::string& kind, const Bytes& in) {
  if (kind == "gzip") return gzip(in);
  if (kind == "bzip2") return bzip2(in);
  if (kind == "lzma") return xz(in, true);
  if (kind == "xz") return xz(in, false);
  if (kind == "lzo") return lzop(in);
  if (kind == "lz4") return lz4_legacy(in);
  return zstd(in);
}

TEST_P(LinuxBootCompression, PvhBootOfTheDecompressedPayload) {
  const Bytes vmlinux = tiny_vmlinux();
  const Bytes payload = compress(GetParam(), vmlinux);
  EXPECT_EQ(compression_name(detect_compression(payload)), GetParam());
  auto out = decompress_kernel_payload(payload, "k", 1 << 20);
  ASSERT_TRUE(out) << out.error().message;
  EXPECT_EQ(*out, vmlinux);

  GuestMemory memory = ram(64 << 20);
  auto loaded = load(memory, bzimage(payload), LinuxEntry::kAuto, "quiet");
  ASSERT_TRUE(loaded) << loaded.error().message;
  EXPECT_EQ(loaded->format, "linux-pvh");
  EXPECT_EQ(loaded->entry, kKernelBase + kPvhEntryOffset);
  EXPECT_EQ(read_ram(memory, kKernelBase, 0x100), Bytes(vmlinux.begin() + 0x200, vmlinux.end()));
  EXPECT_EQ(read_ram(memory, kKernelBase + 0x100, 0x2f00), Bytes(0x2f00, 0));  // bss zeroed
}

TEST_P(LinuxBootCompression, TruncatedPayloadIsRefused) {
  Bytes vmlinux = tiny_vmlinux();
  vmlinux.resize(64 * 1024, 0x33);  // long enough that a cut stream cannot be complete
  for (size_t i = 0x300; i < vmlinux.size(); ++i) vmlinux[i] = static_cast<uint8_t>(i * 2654435761u >> 13);
  Bytes payload = compress(GetParam(), vmlinux);
  Bytes cut(payload.begin(), payload.begin() + payload.size() / 2);
  append_size(cut, vmlinux.size());
  auto out = decompress_kernel_payload(cut, "k.img", 1 << 20);
  ASSERT_FALSE(out);
  EXPECT_THAT(out.error().message, AllOf(HasSubstr("k.img"), HasSubstr(GetParam())));
  EXPECT_THAT(out.error().message, testing::AnyOf(HasSubstr("truncated"), HasSubstr("corrupt")));
  // A payload that claims more than fits is refused before anything is allocated.
  auto huge = decompress_kernel_payload(payload, "k.img", 1024);
  ASSERT_FALSE(huge);
  EXPECT_THAT(huge.error().message, HasSubstr("more than fits"));
}

INSTANTIATE_TEST_SUITE_P(All, LinuxBootCompression,
                         ::testing::Values("gzip", "bzip2", "lzma", "xz", "lzo", "lz4", "zstd"));

// ---- the crafted bzImage through the 64-bit protocol, and refusals ----

TEST(LinuxBoot, CraftedBzImage64Bit) {
  GuestMemory memory = ram(64 << 20);
  const Bytes image = bzimage(xz(tiny_vmlinux(), false));
  auto loaded = load(memory, image, LinuxEntry::k64Bit, "root=/dev/vda", Bytes(10000, 1));
  ASSERT_TRUE(loaded) << loaded.error().message;
  EXPECT_EQ(loaded->format, "linux-64bit");
  EXPECT_EQ(loaded->entry, kKernelBase + 0x200);
  EXPECT_EQ(read_ram(memory, kKernelBase, 16), Bytes(16, 0x90));
  const Bytes zp = read_ram(memory, linux_layout::kZeroPage, 4096);
  EXPECT_EQ(get(zp, bzimage::kRamdiskImage, 4) + 10000 <= memory.size(), true);
  EXPECT_EQ(get(zp, bzimage::kRamdiskImage, 4) % 4096, 0u);
}

TEST(LinuxBoot, RefusesWhatIsNotABzImage) {
  GuestMemory memory = ram(64 << 20);
  expect_refused(load(memory, Bytes(8192, 0x41), LinuxEntry::kAuto), {"kernel.img", "neither a bzImage"});
  expect_refused(load(memory, {}, LinuxEntry::kAuto), {"is empty"});
}

TEST(LinuxBoot, RefusesOldProtocolsAndZImages) {
  GuestMemory memory = ram(64 << 20);
  const Bytes payload = gzip(tiny_vmlinux());
  expect_refused(load(memory, bzimage(payload, {.version = 0x0206}), LinuxEntry::k64Bit),
                 {"boot protocol 2.06", "too old", "2.12"});
  expect_refused(load(memory, bzimage(payload, {.loadflags = 0}), LinuxEntry::k64Bit), {"zImage"});
  expect_refused(load(memory, bzimage(payload, {.xloadflags = 0}), LinuxEntry::k64Bit), {"no 64-bit entry"});
}

TEST(LinuxBoot, RefusesTruncatedImages) {
  GuestMemory memory = ram(64 << 20);
  Bytes image = bzimage(gzip(tiny_vmlinux()));
  Bytes cut(image.begin(), image.begin() + image.size() - 64);
  expect_refused(load(memory, cut, LinuxEntry::k64Bit), {"truncated"});
  Bytes header_only(image.begin(), image.begin() + 0x250);
  expect_refused(load(memory, header_only, LinuxEntry::kAuto), {"setup header"});
  Bytes bad_payload = image;
  put(bad_payload, bzimage::kPayloadLength, 0x100000, 4);
  expect_refused(load(memory, bad_payload, LinuxEntry::kPvh), {"truncated", "payload"});
}

TEST(LinuxBoot, RefusesUnknownCompression) {
  GuestMemory memory = ram(64 << 20);
  Bytes payload(200, 0);
  std::memcpy(payload.data(), "ABCDEFGH", 8);
  expect_refused(load(memory, bzimage(payload), LinuxEntry::kPvh), {"magic of no compression", "41 42 43"});
}

TEST(LinuxBoot, InitrdThatDoesNotFit) {
  GuestMemory memory = ram(32 << 20);
  const Bytes image = bzimage(gzip(tiny_vmlinux()));
  // 64-bit: the kernel reserves [16 MiB, 20 MiB); 13 MiB does not fit below 32 MiB above it.
  expect_refused(load(memory, image, LinuxEntry::k64Bit, "", Bytes(13 << 20, 1)), {"initrd.img", "does not fit"});
  // ... nor below a small initrd_addr_max.
  expect_refused(load(memory, bzimage(gzip(tiny_vmlinux()), {.initrd_addr_max = 0x17fffff}), LinuxEntry::k64Bit, "",
                      Bytes(8 << 20, 1)),
                 {"does not fit", "initrd_addr_max 0x17fffff"});
  // PVH: above the vmlinux's last segment.
  expect_refused(load(memory, image, LinuxEntry::kPvh, "", Bytes(17 << 20, 1)), {"does not fit"});
  // A refused load writes nothing.
  EXPECT_EQ(read_ram(memory, kKernelBase, 16), Bytes(16, 0));
}

TEST(LinuxBoot, CommandLineLongerThanTheKernelTakes) {
  GuestMemory memory = ram(64 << 20);
  const Bytes image = bzimage(gzip(tiny_vmlinux()), {.cmdline_size = 16});
  expect_refused(load(memory, image, LinuxEntry::k64Bit, std::string(17, 'x')), {"cmdline_size", "--append"});
  EXPECT_TRUE(load(memory, image, LinuxEntry::k64Bit, std::string(16, 'x')));
}

TEST(LinuxBoot, VmlinuxThroughPvh) {
  GuestMemory memory = ram(64 << 20);
  auto loaded = load(memory, tiny_vmlinux(true, 4), LinuxEntry::kAuto, "console=ttyS0", Bytes(4096, 7));
  ASSERT_TRUE(loaded) << loaded.error().message;
  EXPECT_EQ(loaded->format, "linux-pvh");
  EXPECT_EQ(loaded->entry, kKernelBase + kPvhEntryOffset);
  // Without the note, or through the 64-bit protocol, an ELF is refused.
  expect_refused(load(memory, tiny_vmlinux(false), LinuxEntry::kAuto), {"no PVH entry", "XEN_ELFNOTE_PHYS32_ENTRY"});
  expect_refused(load(memory, tiny_vmlinux(), LinuxEntry::k64Bit), {"ELF vmlinux", "bzImage"});
  expect_refused(load(memory, tiny_vmlinux(true, 2), LinuxEntry::kAuto), {"2-byte descriptor"});
}

TEST(LinuxBoot, LoaderDispatchAndModulesRefused) {
  GuestMemory memory = ram(64 << 20);
  const Bytes image = bzimage(gzip(tiny_vmlinux()));
  LoadOptions options{.linux_kernel = true};
  auto loaded = load_guest_image_bytes(memory, image, "bz", options);
  ASSERT_TRUE(loaded) << loaded.error().message;
  EXPECT_EQ(loaded->format, "linux-pvh");
  options.modules = {{"m", ""}};
  std::vector<Bytes> modules{Bytes(10, 1)};
  auto refused = load_guest_image_bytes(memory, image, "bz", options, modules);
  ASSERT_FALSE(refused);
  EXPECT_THAT(refused.error().message, HasSubstr("--initrd"));
  // Without --kernel a bzImage is pointed at it.
  auto plain = load_guest_image_bytes(memory, image, "bz", {});
  ASSERT_FALSE(plain);
  EXPECT_THAT(plain.error().message, HasSubstr("--kernel"));
}

}  // namespace
}  // namespace deja
