// The walker: the paging modes of SDM Vol. 3 chapter 4, read-only.
#include "core/page_walker.h"

#include <algorithm>

namespace deja {
namespace {

constexpr uint64_t kPresent = 1, kWrite = 2, kUser = 4, kLarge = 0x80;
constexpr uint64_t kNx = uint64_t{1} << 63;
constexpr uint64_t kAddr52 = 0x000ffffffffff000ull;

Result<uint64_t> load(const GuestMemory& memory, uint64_t gpa, unsigned size, const char* level, uint64_t gva) {
  uint64_t v = 0;
  if (!memory.contains(Gpa{gpa}, size)) {
    return fail(ErrorKind::kGuest, "{:#x}: the {} entry at guest-physical {:#x} lies outside RAM", gva, level, gpa);
  }
  auto bytes = memory.span(Gpa{gpa}, size);
  for (unsigned i = 0; i < size; ++i) v |= uint64_t((*bytes)[i]) << (8 * i);
  return v;
}

}  // namespace

Result<Translation> translate_gva(const CpuState& cpu, const GuestMemory& memory, uint64_t gva) {
  Translation t;
  if (!(cpu.efer & efer::kLma) && gva > 0xffffffffu) {
    return fail(ErrorKind::kGuest, "{:#x} lies beyond the 32-bit linear address space of the guest's mode", gva);
  }
  if (!(cpu.cr0 & cr0::kPg)) {
    t.gpa = gva;
    return t;
  }
  const bool nxe = cpu.efer & efer::kNxe;
  auto apply = [&](uint64_t entry) {
    t.writable &= (entry & kWrite) != 0;
    t.user &= (entry & kUser) != 0;
    if (nxe && (entry & kNx)) t.executable = false;
  };
  if (!(cpu.cr4 & cr4::kPae)) {
    // 32-bit paging: two levels of 4-byte entries, 4 MiB pages with CR4.PSE.
    const uint64_t va = gva & 0xffffffffu;
    auto pde = load(memory, (cpu.cr3 & 0xfffff000u) + ((va >> 22) * 4), 4, "page-directory", gva);
    if (!pde) return std::unexpected(pde.error());
    if (!(*pde & kPresent)) return fail(ErrorKind::kGuest, "{:#x} is not mapped (page-directory entry not present)", gva);
    apply(*pde);
    if ((*pde & kLarge) && (cpu.cr4 & cr4::kPse)) {
      uint64_t base = (*pde & 0xffc00000u) | ((*pde & 0x1fe000ull) << 19);
      t.gpa = base + (va & 0x3fffff);
      t.page_size = 4u << 20;
      return t;
    }
    auto pte = load(memory, (*pde & 0xfffff000u) + (((va >> 12) & 0x3ff) * 4), 4, "page-table", gva);
    if (!pte) return std::unexpected(pte.error());
    if (!(*pte & kPresent)) return fail(ErrorKind::kGuest, "{:#x} is not mapped (page-table entry not present)", gva);
    apply(*pte);
    t.gpa = (*pte & 0xfffff000u) | (va & 0xfff);
    return t;
  }
  static const char* const kNames[] = {"PML4", "page-directory-pointer", "page-directory", "page-table"};
  uint64_t table;
  int level;  // index into kNames
  uint64_t va = gva;
  if (cpu.efer & efer::kLma) {
    if (uint64_t(int64_t(gva << 16) >> 16) != gva) {
      return fail(ErrorKind::kGuest, "{:#x} is not a canonical address", gva);
    }
    table = cpu.cr3 & kAddr52;
    level = 0;
  } else {
    // PAE: four PDPTEs at CR3 (32-byte aligned), then two levels.
    va = gva & 0xffffffffu;
    auto pdpte = load(memory, (cpu.cr3 & 0xffffffe0u) + ((va >> 30) * 8), 8, kNames[1], gva);
    if (!pdpte) return std::unexpected(pdpte.error());
    if (!(*pdpte & kPresent)) return fail(ErrorKind::kGuest, "{:#x} is not mapped (PDPTE not present)", gva);
    table = *pdpte & kAddr52;
    level = 2;
  }
  for (;; ++level) {
    const int shift = 39 - 9 * level;
    auto entry = load(memory, table + ((va >> shift) & 0x1ff) * 8, 8, kNames[level], gva);
    if (!entry) return std::unexpected(entry.error());
    if (!(*entry & kPresent)) {
      return fail(ErrorKind::kGuest, "{:#x} is not mapped ({} entry not present)", gva, kNames[level]);
    }
    apply(*entry);
    if (level == 3 || ((level == 1 || level == 2) && (*entry & kLarge))) {
      const uint64_t size = uint64_t{1} << shift;
      t.gpa = (*entry & kAddr52 & ~(size - 1)) | (va & (size - 1));
      t.page_size = size;
      return t;
    }
    if (level == 0 && (*entry & kLarge)) {
      return fail(ErrorKind::kGuest, "{:#x}: the PML4 entry has the reserved page-size bit set", gva);
    }
    table = *entry & kAddr52;
  }
}

size_t read_gva(const CpuState& cpu, const GuestMemory& memory, uint64_t gva, std::span<uint8_t> out) {
  size_t done = 0;
  while (done < out.size()) {
    uint64_t at = gva + done;
    auto t = translate_gva(cpu, memory, at);
    if (!t) break;
    size_t chunk = std::min<size_t>(out.size() - done, 4096 - (at & 0xfff));
    if (!memory.contains(Gpa{t->gpa}, chunk)) break;
    auto src = memory.span(Gpa{t->gpa}, chunk);
    std::copy(src->begin(), src->end(), out.begin() + done);
    done += chunk;
  }
  return done;
}

}  // namespace deja
