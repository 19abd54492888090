// Memory images (query --dump): the ELF core's layout as QEMU's dump-guest-memory writes it, the notes' contents, RAM
// at its offset with zero pages as holes, the raw image, and what a failed dump leaves.
#include <elf.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include <gtest/gtest.h>

#include "snapshot/memory_dump.h"

namespace deja {
namespace {

struct Dir {
  std::filesystem::path path = std::filesystem::temp_directory_path() / ("deja-dump-" + std::to_string(::getpid()));
  Dir() { std::filesystem::create_directories(path); }
  ~Dir() { std::filesystem::remove_all(path); }
  std::string file(const char* name) const { return (path / name).string(); }
};

std::vector<uint8_t> read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), {}};
}

template <typename T>
T at(const std::vector<uint8_t>& b, size_t offset) {
  T v;
  std::memcpy(&v, b.data() + offset, sizeof v);
  return v;
}

TEST(MemoryDump, ElfCoreAsQemuWritesIt) {
  Dir dir;
  auto ram = GuestMemory::create(2 << 20);
  ASSERT_TRUE(ram);
  std::memcpy(ram->host_base() + 0x100000, "deja!", 5);
  ram->host_base()[(2 << 20) - 1] = 0x7e;  // the last byte: the file's size comes from RAM, not from a hole
  CpuState cpu;
  cpu.gpr[kRax] = 0x1111;
  cpu.gpr[kRsp] = 0x2222;
  cpu.rip = 0xffffffff81000000;
  cpu.cr3 = 0x630e000;
  cpu.cs.selector = 0x10;
  cpu.cs.type = 0xb;
  cpu.cs.s = cpu.cs.present = cpu.cs.l = true;
  cpu.idt.base = 0xfffffe0000000000;
  cpu.msrs.kernel_gs_base = 0x4242;
  auto file = ProductFile::create_replacing(dir.file("core.elf"), "memory dump", ProductFile::Unfinished::kRemove);
  ASSERT_TRUE(file);
  auto stats = write_memory_dump(*ram, std::span(&cpu, 1), DumpFormat::kElf, **file);
  ASSERT_TRUE(stats) << stats.error().message;
  ASSERT_TRUE((*file)->commit());
  const auto b = read_all(dir.file("core.elf"));
  EXPECT_EQ(stats->file_bytes, b.size());
  EXPECT_GT(stats->hole_bytes, (2u << 20) - 3 * 4096);

  const auto eh = at<Elf64_Ehdr>(b, 0);
  EXPECT_EQ(std::memcmp(eh.e_ident, ELFMAG, SELFMAG), 0);
  EXPECT_EQ(eh.e_ident[EI_CLASS], ELFCLASS64);
  EXPECT_EQ(eh.e_type, ET_CORE);
  EXPECT_EQ(eh.e_machine, EM_X86_64);
  ASSERT_EQ(eh.e_phnum, 2);
  const auto note = at<Elf64_Phdr>(b, eh.e_phoff);
  const auto load = at<Elf64_Phdr>(b, eh.e_phoff + sizeof(Elf64_Phdr));
  EXPECT_EQ(note.p_type, PT_NOTE);
  EXPECT_EQ(load.p_type, PT_LOAD);
  EXPECT_EQ(load.p_paddr, 0u);
  EXPECT_EQ(load.p_filesz, 2u << 20);
  EXPECT_EQ(load.p_align, 0u);  // packed after the notes, as QEMU does: crash reads it as a QEMU core
  EXPECT_EQ(load.p_offset, note.p_offset + note.p_filesz);
  EXPECT_EQ(b.size(), load.p_offset + (2u << 20));
  EXPECT_EQ(std::memcmp(b.data() + load.p_offset + 0x100000, "deja!", 5), 0);
  EXPECT_EQ(b.back(), 0x7e);

  // NT_PRSTATUS "CORE": pr_pid 1, the registers where gdb and crash read them.
  size_t n = note.p_offset;
  const auto prstatus = at<Elf64_Nhdr>(b, n);
  EXPECT_EQ(prstatus.n_type, uint32_t(NT_PRSTATUS));
  EXPECT_EQ(prstatus.n_descsz, elf_dump::kPrstatusBytes);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(b.data() + n + 12)), "CORE");
  const size_t desc = n + 12 + 8;
  EXPECT_EQ(at<uint32_t>(b, desc + 32), 1u);
  const size_t regs = desc + elf_dump::kPrstatusRegsOffset;
  EXPECT_EQ(at<uint64_t>(b, regs + 10 * 8), 0x1111u);               // rax
  EXPECT_EQ(at<uint64_t>(b, regs + 16 * 8), 0xffffffff81000000u);   // rip
  EXPECT_EQ(at<uint64_t>(b, regs + 17 * 8), 0x10u);                 // cs
  EXPECT_EQ(at<uint64_t>(b, regs + 19 * 8), 0x2222u);               // rsp
  // The "QEMU" note: QEMUCPUState version 1, 440 bytes.
  n = desc + elf_dump::kPrstatusBytes;
  const auto qemu = at<Elf64_Nhdr>(b, n);
  EXPECT_EQ(qemu.n_type, 0u);
  EXPECT_EQ(qemu.n_descsz, elf_dump::kQemuCpuStateBytes);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(b.data() + n + 12)), "QEMU");
  const size_t state = n + 12 + 8;
  EXPECT_EQ(at<uint32_t>(b, state), 1u);
  EXPECT_EQ(at<uint32_t>(b, state + 4), elf_dump::kQemuCpuStateBytes);
  EXPECT_EQ(at<uint64_t>(b, state + 8), 0x1111u);  // rax first
  const size_t cs = state + 8 + 18 * 8;
  EXPECT_EQ(at<uint32_t>(b, cs), 0x10u);
  EXPECT_EQ(at<uint32_t>(b, cs + 8), 0xbu << 8 | 1u << 12 | 1u << 15 | 1u << 21);  // type, S, P, L
  const size_t idt = cs + 9 * 24;
  EXPECT_EQ(at<uint64_t>(b, idt + 16), 0xfffffe0000000000u);
  const size_t cr = idt + 24;
  EXPECT_EQ(at<uint64_t>(b, cr + 3 * 8), 0x630e000u);
  EXPECT_EQ(at<uint64_t>(b, cr + 5 * 8), 0x4242u);  // kernel_gs_base
  EXPECT_EQ(note.p_filesz, qemu.n_descsz + 20 + (n - note.p_offset));

  // A mostly empty guest's core is a sparse file.
  struct stat st {};
  ASSERT_EQ(::stat(dir.file("core.elf").c_str(), &st), 0);
  EXPECT_LT(uint64_t(st.st_blocks) * 512, 1u << 20);
}

TEST(MemoryDump, RawIsRamAlone) {
  Dir dir;
  auto ram = GuestMemory::create(1 << 20);
  ASSERT_TRUE(ram);
  for (size_t i = 0; i < (1 << 20); i += 4096) ram->host_base()[i + 7] = uint8_t(i >> 12);
  auto file = ProductFile::create_replacing(dir.file("ram.raw"), "memory dump", ProductFile::Unfinished::kRemove);
  ASSERT_TRUE(file);
  CpuState cpu;
  ASSERT_TRUE(write_memory_dump(*ram, std::span(&cpu, 1), DumpFormat::kRaw, **file));
  ASSERT_TRUE((*file)->commit());
  const auto b = read_all(dir.file("ram.raw"));
  ASSERT_EQ(b.size(), 1u << 20);
  EXPECT_EQ(std::memcmp(b.data(), ram->host_base(), b.size()), 0);
}

TEST(MemoryDump, AnUncommittedDumpLeavesNothing) {
  Dir dir;
  auto ram = GuestMemory::create(1 << 20);
  ASSERT_TRUE(ram);
  {
    std::ofstream(dir.file("old.elf")) << "earlier";
    auto file = ProductFile::create_replacing(dir.file("old.elf"), "memory dump", ProductFile::Unfinished::kRemove);
    ASSERT_TRUE(file);
    CpuState cpu;
    ASSERT_TRUE(write_memory_dump(*ram, std::span(&cpu, 1), DumpFormat::kElf, **file));
  }  // destroyed without commit()
  EXPECT_FALSE(std::filesystem::exists(dir.file("old.elf.partial")));
  EXPECT_EQ(read_all(dir.file("old.elf")).size(), 7u);
  EXPECT_FALSE(parse_dump_format("vmcore"));
  EXPECT_EQ(parse_dump_format("raw").value_or(DumpFormat::kElf), DumpFormat::kRaw);
}

}  // namespace
}  // namespace deja
