// Writes guest RAM and vCPU registers as an ELF64 core in QEMU's dump-guest-memory layout, or as a raw image.
#include "snapshot/memory_dump.h"

#include <elf.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

namespace deja {

Result<DumpFormat> parse_dump_format(std::string_view text) {
  if (text == "elf") return DumpFormat::kElf;
  if (text == "raw") return DumpFormat::kRaw;
  return fail(ErrorKind::kInvalidArgument, "--format '{}': expected elf (a core file for crash, gdb and Volatility) "
              "or raw (physical memory only)", text);
}

namespace {

constexpr uint64_t kPage = 4096;
// RAM goes out in pieces of this size: large enough that the system call costs nothing, small enough that the
// kernel never pins much of it at once.
constexpr uint64_t kWritePiece = 8u << 20;

uint64_t round_up(uint64_t v, uint64_t to) { return (v + to - 1) / to * to; }

class Bytes {
 public:
  template <typename T>
  void put(const T& v) {
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    data_.insert(data_.end(), p, p + sizeof(T));
  }
  void put_zeros(size_t n) { data_.insert(data_.end(), n, 0); }
  void put_bytes(const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    data_.insert(data_.end(), b, b + n);
  }
  size_t size() const { return data_.size(); }
  std::span<const uint8_t> span() const { return data_; }

 private:
  std::vector<uint8_t> data_;
};

// One ELF note: header, name padded to 4 bytes, descriptor padded to 4 bytes.
void put_note(Bytes& b, const char* name, uint32_t type, std::span<const uint8_t> desc) {
  const uint32_t name_size = uint32_t(std::strlen(name) + 1);
  b.put(Elf64_Nhdr{name_size, uint32_t(desc.size()), type});
  b.put_bytes(name, name_size);
  b.put_zeros(round_up(name_size, 4) - name_size);
  b.put_bytes(desc.data(), desc.size());
  b.put_zeros(round_up(desc.size(), 4) - desc.size());
}

// x86-64 Linux's struct elf_prstatus with its user_regs_struct, as gdb and crash read NT_PRSTATUS.
std::vector<uint8_t> prstatus(const CpuState& s, uint32_t pid) {
  std::vector<uint8_t> d(elf_dump::kPrstatusBytes, 0);
  std::memcpy(d.data() + 32, &pid, 4);  // pr_pid
  const uint64_t regs[27] = {
      s.gpr[kR15], s.gpr[kR14], s.gpr[kR13], s.gpr[kR12], s.gpr[kRbp], s.gpr[kRbx], s.gpr[kR11], s.gpr[kR10],
      s.gpr[kR9],  s.gpr[kR8],  s.gpr[kRax], s.gpr[kRcx], s.gpr[kRdx], s.gpr[kRsi], s.gpr[kRdi],
      0,  // orig_rax
      s.rip,       s.cs.selector, s.rflags, s.gpr[kRsp], s.ss.selector, s.fs.base, s.gs.base,
      s.ds.selector, s.es.selector, s.fs.selector, s.gs.selector};
  static_assert(sizeof regs == 216 && elf_dump::kPrstatusRegsOffset + sizeof regs + 8 == elf_dump::kPrstatusBytes);
  std::memcpy(d.data() + elf_dump::kPrstatusRegsOffset, regs, sizeof regs);
  return d;
}

// QEMU's SegmentCache flags: the descriptor's second dword bits 8-23 where they are (type, S, DPL, P, AVL, L, D/B, G).
uint32_t segment_flags(const SegmentReg& r) {
  return uint32_t(r.type & 0xf) << 8 | uint32_t(r.s) << 12 | uint32_t(r.dpl & 3) << 13 |
         uint32_t(r.present && !r.unusable) << 15 | uint32_t(r.avl) << 20 | uint32_t(r.l) << 21 |
         uint32_t(r.db) << 22 | uint32_t(r.g) << 23;
}

void put_segment(Bytes& b, uint32_t selector, uint32_t limit, uint32_t flags, uint64_t base) {
  b.put(selector);
  b.put(limit);
  b.put(flags);
  b.put(uint32_t{0});
  b.put(base);
}

// QEMU's QEMUCPUState, version 1, as x86-64 QEMU writes it (target/i386/arch_dump.c), kernel_gs_base included.
std::vector<uint8_t> qemu_cpu_state(const CpuState& s) {
  Bytes b;
  b.put(elf_dump::kQemuCpuStateVersion);
  b.put(uint32_t(elf_dump::kQemuCpuStateBytes));
  for (int r : {kRax, kRbx, kRcx, kRdx, kRsi, kRdi, kRsp, kRbp, kR8, kR9, kR10, kR11, kR12, kR13, kR14, kR15})
    b.put(s.gpr[r]);
  b.put(s.rip);
  b.put(s.rflags);
  for (const SegmentReg* r : {&s.cs, &s.ds, &s.es, &s.fs, &s.gs, &s.ss, &s.ldt, &s.tr})
    put_segment(b, r->selector, r->limit, segment_flags(*r), r->base);
  put_segment(b, 0, s.gdt.limit, 0, s.gdt.base);
  put_segment(b, 0, s.idt.limit, 0, s.idt.base);
  for (uint64_t cr : {s.cr0, uint64_t{0}, s.cr2, s.cr3, s.cr4}) b.put(cr);
  b.put(s.msrs.kernel_gs_base);  // x86-64 QEMU (7.2 and later) ends the state with it; crash reads it
  DEJA_ASSERT(b.size() == elf_dump::kQemuCpuStateBytes, "QEMUCPUState is {} bytes", b.size());
  return {b.span().begin(), b.span().end()};
}

// Everything before RAM: ELF header, program headers, notes. RAM follows the notes at once, with p_align 0, as QEMU
// writes it: crash takes a core whose first PT_LOAD is page-aligned for an old netdump vmcore, and reads it wrongly.
Bytes elf_prefix(uint64_t ram_bytes, std::span<const CpuState> cpus) {
  Bytes notes;
  for (size_t i = 0; i < cpus.size(); ++i) put_note(notes, "CORE", NT_PRSTATUS, prstatus(cpus[i], uint32_t(i + 1)));
  for (const CpuState& s : cpus) put_note(notes, "QEMU", 0, qemu_cpu_state(s));

  constexpr uint16_t kPhdrs = 2;  // the notes, and RAM (one block from guest-physical 0)
  const uint64_t notes_offset = sizeof(Elf64_Ehdr) + kPhdrs * sizeof(Elf64_Phdr);
  const uint64_t ram_offset = notes_offset + notes.size();

  Elf64_Ehdr eh{};
  std::memcpy(eh.e_ident, ELFMAG, SELFMAG);
  eh.e_ident[EI_CLASS] = ELFCLASS64;
  eh.e_ident[EI_DATA] = ELFDATA2LSB;
  eh.e_ident[EI_VERSION] = EV_CURRENT;
  eh.e_type = ET_CORE;
  eh.e_machine = EM_X86_64;
  eh.e_version = EV_CURRENT;
  eh.e_phoff = sizeof(Elf64_Ehdr);
  eh.e_ehsize = sizeof(Elf64_Ehdr);
  eh.e_phentsize = sizeof(Elf64_Phdr);
  eh.e_phnum = kPhdrs;

  Elf64_Phdr note{};
  note.p_type = PT_NOTE;
  note.p_offset = notes_offset;
  note.p_filesz = note.p_memsz = notes.size();

  Elf64_Phdr load{};
  load.p_type = PT_LOAD;
  load.p_flags = PF_R | PF_W | PF_X;
  load.p_offset = ram_offset;
  load.p_paddr = 0;
  load.p_vaddr = 0;  // QEMU without paging: the physical address (gdb then reads guest-physical memory)
  load.p_filesz = load.p_memsz = ram_bytes;
  load.p_align = 0;

  Bytes b;
  b.put(eh);
  b.put(note);
  b.put(load);
  b.put_bytes(notes.span().data(), notes.size());
  return b;
}

// A page of data usually shows it in its first cache line: look a line at a time.
bool zero_page(const uint8_t* p) {
  const auto* w = reinterpret_cast<const uint64_t*>(p);
  for (size_t i = 0; i < kPage / 8; i += 8) {
    if (w[i] | w[i + 1] | w[i + 2] | w[i + 3] | w[i + 4] | w[i + 5] | w[i + 6] | w[i + 7]) return false;
  }
  return true;
}

// RAM from the guest's mapping into `out`, in runs: pages that read as zero (never written: a hole of the memfd,
// found with SEEK_DATA without touching it; or written with zeros) are skipped as holes of the file, the rest is
// written straight from the mapping. Returns the bytes skipped.
Result<uint64_t> write_ram(const GuestMemory& ram, ProductFile& out) {
  const uint64_t size = ram.size();
  uint64_t holes = 0;
  auto skip = [&](uint64_t n) -> Result<> {
    holes += n;
    return n ? out.skip(n) : Result<>{};
  };
  for (uint64_t at = 0; at < size;) {
    off_t data = ::lseek(ram.fd(), off_t(at), SEEK_DATA);
    if (data < 0 && errno == ENXIO) data = off_t(size);  // only a hole is left
    if (data < 0) data = off_t(at);                      // no extent information: look at every page
    off_t extent_end = uint64_t(data) < size ? ::lseek(ram.fd(), data, SEEK_HOLE) : off_t(size);
    if (extent_end < 0 || uint64_t(extent_end) > size) extent_end = off_t(size);
    if (auto r = skip(std::min<uint64_t>(uint64_t(data), size) - at); !r) return std::unexpected(r.error());
    at = std::min<uint64_t>(uint64_t(data), size);
    while (at < uint64_t(extent_end)) {
      const uint8_t* base = ram.host_base();
      uint64_t run = at;
      const bool zero = zero_page(base + at);
      while (run < uint64_t(extent_end) && run - at < kWritePiece && zero_page(base + run) == zero) run += kPage;
      Result<> r = zero ? skip(run - at) : out.write(std::span<const uint8_t>(base + at, run - at));
      if (!r) return std::unexpected(r.error());
      at = run;
    }
  }
  return holes;
}

}  // namespace

Result<DumpStats> write_memory_dump(const GuestMemory& ram, std::span<const CpuState> cpus, DumpFormat format,
                                    ProductFile& out) {
  DumpStats stats;
  if (format == DumpFormat::kElf) {
    Bytes prefix = elf_prefix(ram.size(), cpus);
    if (auto r = out.write(prefix.span()); !r) return std::unexpected(r.error());
  }
  auto holes = write_ram(ram, out);
  if (!holes) return std::unexpected(holes.error());
  stats.ram_bytes = ram.size();
  stats.hole_bytes = *holes;
  stats.file_bytes = out.bytes_written();
  return stats;
}

}  // namespace deja
