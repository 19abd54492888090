// The interpreter's MMU: segmentation (flat fast path), 32-bit/PAE/4-level paging with a software TLB, RAM vs MMIO.
#include <cstring>

#include "interp/interp_backend.h"

namespace deja {
namespace {

constexpr uint64_t kPresent = 1, kWritable = 2, kUser = 4, kAccessed = 1u << 5, kDirty = 1u << 6, kLarge = 1u << 7,
                   kGlobal = 1u << 8, kNx = 1ull << 63;
constexpr uint64_t kAddrMask = 0x000ffffffffff000ull;
constexpr uint8_t kPageFault = 14;

}  // namespace

uint64_t InterpBackend::segment_base(int seg_index) const {
  switch (seg_index) {
    case 0: return s_.es.base;
    case 1: return s_.cs.base;
    case 2: return s_.ss.base;
    case 3: return s_.ds.base;
    case 4: return s_.fs.base;
    default: return s_.gs.base;
  }
}


void InterpBackend::flush_tlb(bool include_global) {
  invalidate_fetch();
  const bool keep_global = !include_global && (s_.cr4 & cr4::kPge);
  size_t kept = 0;
  for (const uint16_t index : tlb_live_) {
    TlbEntry& entry = tlb_[index];
    if (keep_global && entry.global) tlb_live_[kept++] = index;
    else entry = TlbEntry{};
  }
  tlb_live_.resize(kept);
}

void InterpBackend::fill_fast_tags(TlbEntry& entry) {
  entry.read_tag[0] = entry.read_tag[1] = entry.write_tag[0] = entry.write_tag[1] = ~0ull;
  // MMIO: every access exits; with a store buffer every access takes read_phys/write_phys, which know it.
  if (entry.tag == ~0ull || entry.phys >= ram_size_ || store_buffer_) return;
  if (!debug_.watchpoints.empty()) {
    const uint64_t page = entry.tag << 12;
    for (const Watchpoint& w : debug_.watchpoints)
      if (w.address < page + 4096 && page < w.address + w.length) return;  // every access is checked
  }
  entry.addend = uint64_t(ram_ + entry.phys) - (entry.tag << 12);
  entry.read_tag[0] = entry.tag;
  if (entry.user) entry.read_tag[1] = entry.tag;
  // Writes: the dirty bit already set (else the walk must set it), allowed, no decoded code to drop, and
  // the page already marked in the checkpoint dirty bitmap (so the fast store needs not mark it; the
  // first store after GuestMemory::take_dirty_pages() takes the slow path, which marks it).
  const uint64_t pfn = entry.phys >> 12;
  if (entry.dirty && !is_code_page(pfn) && (dirty_bits_[pfn >> 6] >> (pfn & 63)) & 1) {
    if (entry.writable || !(s_.cr0 & cr0::kWp)) entry.write_tag[0] = entry.tag;
    if (entry.writable && entry.user) entry.write_tag[1] = entry.tag;
  }
}

void InterpBackend::revoke_fast_writes(uint64_t pfn) {
  for (const uint16_t index : tlb_live_) {
    TlbEntry& entry = tlb_[index];
    if (entry.tag != ~0ull && (entry.phys >> 12) == pfn) entry.write_tag[0] = entry.write_tag[1] = ~0ull;
  }
}

void InterpBackend::refresh_fast_entry(uint64_t linear) {
  if (!(s_.cr0 & cr0::kPg)) {
    // Without paging the reference never looks at the TLB: an identity entry serves the fast path
    // alone (flush_tlb() clears it when paging comes on).
    TlbEntry& entry = tlb_fill(linear >> 12);
    entry.phys = linear & ~0xfffull;
    entry.writable = entry.user = entry.dirty = true;
    fill_fast_tags(entry);
  } else if (TlbEntry& entry = tlb_entry(linear); entry.tag == (linear >> 12)) {
    fill_fast_tags(entry);
  }
}

uint8_t* InterpBackend::fast_host_range(int seg, uint64_t offset, uint64_t n, bool write) {
  if (decode_mode() != interp::kMode64 || n == 0) return nullptr;
  const uint64_t linear = seg >= 4 ? offset + segment_base(seg) : offset;
  const TlbEntry& entry = tlb_entry(linear);
  const bool user = s_.cs.dpl == 3;
  // (A non-canonical address never matches a tag: its page numbers are not those of an entry.)
  if (((linear + n - 1) >> 12) != (linear >> 12) || (write ? entry.write_tag : entry.read_tag)[user] != (linear >> 12))
    return nullptr;
  return reinterpret_cast<uint8_t*>(linear + entry.addend);
}

uint64_t InterpBackend::translate_slow(uint64_t linear, Access access, bool user) {
  if (!(s_.cr0 & cr0::kPg)) return long_mode() ? linear : (linear & 0xffffffffu);
  uint64_t vpn = linear >> 12;
  TlbEntry& entry = tlb_[vpn & tlb_mask_];
  if (entry.tag == vpn) [[likely]] {
    bool ok = true;
    if (user && !entry.user) ok = false;
    if (access == Access::kWrite && (!entry.dirty || (!entry.writable && (user || (s_.cr0 & cr0::kWp))))) ok = false;
    if (access == Access::kExec && entry.nx) ok = false;
    if (ok) return entry.phys | (linear & 0xfff);
  }
  return walk(linear, access, user);
}

uint64_t InterpBackend::walk(uint64_t linear, Access access, bool user) {
  const bool nxe = s_.efer & efer::kNxe;
  auto fault = [&](bool present, bool reserved) {
    uint32_t code = (present ? 1u : 0u) | (access == Access::kWrite ? 2u : 0u) | (user ? 4u : 0u) |
                    (reserved ? 8u : 0u) | (access == Access::kExec && nxe ? 16u : 0u);
    s_.cr2 = linear;
    raise(kPageFault, code, true);
  };
  auto load = [&](uint64_t gpa, bool wide) -> uint64_t {
    if (!memory_.contains(Gpa{gpa}, wide ? 8 : 4)) fault(false, false);
    uint64_t value = 0;
    std::memcpy(&value, ram_ + gpa, wide ? 8 : 4);
    return value;
  };
  auto store = [&](uint64_t gpa, uint64_t value, bool wide) {
    std::memcpy(ram_ + gpa, &value, wide ? 8 : 4);
    dirty_bits_[gpa >> 18] |= uint64_t{1} << ((gpa >> 12) & 63);
    note_code_write(gpa, wide ? 8 : 4);
  };

  bool writable = true, user_ok = true, nx = false, global = false;
  uint64_t phys_page = 0;
  struct Level { uint64_t gpa; uint64_t value; };
  Level levels[4];
  int depth = 0;
  bool wide = true;

  if (s_.cr4 & cr4::kPae) {
    uint64_t table = 0;
    int top_shift = 39;
    if (long_mode()) {
      table = s_.cr3 & kAddrMask;
    } else {
      // PAE without long mode: CR3 points at four PDPTEs.
      uint64_t pdpte_gpa = (s_.cr3 & 0xffffffe0u) + ((linear >> 30) & 3) * 8;
      uint64_t pdpte = load(pdpte_gpa, true);
      if (!(pdpte & kPresent)) fault(false, false);
      table = pdpte & kAddrMask;
      top_shift = 21;
    }
    for (int shift = top_shift; shift >= 12; shift -= 9) {
      uint64_t gpa = table + ((linear >> shift) & 511) * 8;
      uint64_t value = load(gpa, true);
      if (!(value & kPresent)) fault(false, false);
      if ((value & kNx) && !nxe) fault(true, true);
      levels[depth++] = {gpa, value};
      writable &= bool(value & kWritable);
      user_ok &= bool(value & kUser);
      nx |= bool(value & kNx);
      bool leaf = shift == 12 || (value & kLarge);
      if (leaf && shift == 39) fault(true, true);
      if (leaf) {
        uint64_t page_mask = (1ull << shift) - 1;
        phys_page = ((value & kAddrMask & ~page_mask) | (linear & page_mask)) & ~0xfffull;
        global = value & kGlobal;
        break;
      }
      table = value & kAddrMask;
    }
  } else {
    wide = false;
    uint64_t pde_gpa = (s_.cr3 & 0xfffff000u) + ((linear >> 22) & 1023) * 4;
    uint64_t pde = load(pde_gpa, false);
    if (!(pde & kPresent)) fault(false, false);
    levels[depth++] = {pde_gpa, pde};
    writable = pde & kWritable;
    user_ok = pde & kUser;
    if ((pde & kLarge) && (s_.cr4 & cr4::kPse)) {
      phys_page = ((pde & 0xffc00000u) | (linear & 0x3ff000u));
      global = pde & kGlobal;
    } else {
      uint64_t pte_gpa = (pde & 0xfffff000u) + ((linear >> 12) & 1023) * 4;
      uint64_t pte = load(pte_gpa, false);
      if (!(pte & kPresent)) fault(false, false);
      levels[depth++] = {pte_gpa, pte};
      writable &= bool(pte & kWritable);
      user_ok &= bool(pte & kUser);
      phys_page = pte & 0xfffff000u;
      global = pte & kGlobal;
    }
  }

  if (user && !user_ok) fault(true, false);
  if (access == Access::kWrite && !writable && (user || (s_.cr0 & cr0::kWp))) fault(true, false);
  if (access == Access::kExec && nx && nxe) fault(true, false);

  // Accessed bits on every level, dirty on the leaf for writes (SDM 4.8).
  for (int i = 0; i < depth; ++i) {
    uint64_t value = levels[i].value | kAccessed;
    if (i == depth - 1 && access == Access::kWrite) value |= kDirty;
    if (value != levels[i].value) store(levels[i].gpa, value, wide);
  }
  bool dirty = access == Access::kWrite || (levels[depth - 1].value & kDirty);
  TlbEntry& entry = tlb_fill(linear >> 12);
  entry.phys = phys_page;
  entry.writable = writable;
  entry.user = user_ok;
  entry.nx = nx && nxe;
  entry.global = global;
  entry.dirty = dirty;
  fill_fast_tags(entry);
  return phys_page | (linear & 0xfff);
}

void InterpBackend::note_code_write(uint64_t gpa, unsigned size) {
  drop_own_code(gpa, size);
  if (!peers_) return;
  // Another vCPU's code written here goes too; the page stays marked while any vCPU still has code in it.
  const uint64_t pfn = gpa >> 12;
  bool still_code = own_code_page(pfn);
  for (InterpBackend* cpu : peers_->vcpus) {
    if (cpu == this || !cpu->own_code_page(pfn)) continue;
    cpu->drop_own_code(gpa, size);
    still_code |= cpu->own_code_page(pfn);
  }
  if (!still_code && pfn < peers_->code.size()) peers_->code[pfn] = 0;
}

void InterpBackend::drop_own_code(uint64_t gpa, unsigned size) {
  // Callers pass ranges within one page, except page-table updates (4 or 8 aligned bytes).
  if (cache_.has_code(gpa >> 12)) cache_.invalidate_range(gpa, size);
  if (blocks_.has_code(gpa >> 12) && blocks_.invalidate_range(gpa, size) && running_block_ && running_block_->dead) {
    // The store rewrote code of the block being run: it ends after this instruction, and the next
    // instruction is translated again from the new bytes (a store over the next instruction takes
    // effect at once, as in the reference executor).
    end_block_after_op_ = true;
  }
}

void InterpBackend::probe_write(int seg_index, uint64_t offset, unsigned size) {
  uint64_t linear = data_linear(seg_index, offset);
  if (mode64()) canonical_check(linear + size - 1, seg_index == 2);
  translate(linear, Access::kWrite, is_user());
  translate(linear + size - 1, Access::kWrite, is_user());
}

void InterpBackend::read_phys(uint64_t gpa, void* out, unsigned size) {
  if (gpa < ram_size_ && size <= ram_size_ - gpa) [[likely]] {
    std::memcpy(out, ram_ + gpa, size);
    if (store_buffer_) [[unlikely]] store_buffer_->forward(gpa, static_cast<uint8_t*>(out), size);
    return;
  }
  if (store_buffer_) [[unlikely]] drain_store_buffer();  // a device sees this vCPU's stores in program order
  uint64_t value = 0;
  if (!take_response(ExitKind::kMmioRead, gpa, value)) {
    exit_ = VcpuExit{};
    exit_.kind = ExitKind::kMmioRead;
    exit_.address = gpa;
    exit_.size = uint8_t(size);
    request_exit();
  }
  std::memcpy(out, &value, size);
}

void InterpBackend::write_phys(uint64_t gpa, const void* data, unsigned size) {
  if (gpa < ram_size_ && size <= ram_size_ - gpa) [[likely]] {
    if (store_buffer_ && buffer_store(gpa, data, size)) [[unlikely]] return;
    write_ram(gpa, data, size);
    return;
  }
  if (store_buffer_) [[unlikely]] drain_store_buffer();
  uint64_t ignored = 0;
  if (take_response(ExitKind::kMmioWrite, gpa, ignored)) return;
  exit_ = VcpuExit{};
  exit_.kind = ExitKind::kMmioWrite;
  exit_.address = gpa;
  exit_.size = uint8_t(size);
  std::memcpy(&exit_.value, data, size);
  // The exit names the instruction after the write, as KVM does (it completes an MMIO write before
  // exiting), so that exit-synchronous coordinates agree across backends (core/backend.h).
  request_exit(next_rip_);
}

void InterpBackend::enable_store_buffer(const StoreBufferPlan& plan, uint32_t vcpu) {
  store_buffer_ = std::make_unique<interp::StoreBuffer>(plan, vcpu);
  set_mode(InterpMode::kReference);
  for (const uint16_t index : tlb_live_) fill_fast_tags(tlb_[index]);  // (none: every access takes read/write_phys)
}

bool InterpBackend::buffer_store(uint64_t gpa, const void* data, unsigned size) {
  // Straight to memory after the buffered stores: the stores of an instruction that orders memory, and stores wider
  // than an entry. (Not by whether the page holds decoded code: that depends on the decode cache's history, which a
  // checkpoint's restore does not bring back; step() drains a buffer holding the bytes it fetches instead.)
  if (store_through_ || size > interp::StoreBuffer::kMaxStoreBytes) {
    drain_store_buffer();
    return false;
  }
  while (store_buffer_->full()) commit_oldest_store();
  store_buffer_->push(gpa, data, size);
  return true;
}

bool InterpBackend::fetch_sees_buffered_store(const interp::DecodedInsn& insn) const {
  const uint64_t linear = current_linear_rip(), offset = linear & 0xfff;
  // (An instruction crossing a page drains the buffer whatever it holds: rare, and its second page's translation is
  // not at hand.)
  if (offset + insn.length > 4096 || fetch_page_ != (linear >> 12)) return true;
  return store_buffer_->overlaps(fetch_phys_ | offset, insn.length);
}

void InterpBackend::commit_oldest_store() {
  const interp::StoreBuffer::Entry oldest = store_buffer_->pop();
  write_ram(oldest.gpa, oldest.bytes.data(), oldest.size);
}

void InterpBackend::drain_store_buffer() {
  while (!store_buffer_->empty()) commit_oldest_store();
}

void InterpBackend::read_linear(uint64_t linear, void* out, unsigned size, Access access) {
  if (!debug_.watchpoints.empty()) [[unlikely]] check_watch(linear, size, false);
  bool user = is_user();
  unsigned offset = linear & 0xfff;
  if (offset + size <= 4096) [[likely]] {
    read_phys(translate(linear, access, user), out, size);
    return;
  }
  unsigned first = 4096 - offset;
  uint64_t phys_a = translate(linear, access, user);
  uint64_t phys_b = translate(linear + first, access, user);
  read_phys(phys_a, out, first);
  read_phys(phys_b, static_cast<uint8_t*>(out) + first, size - first);
}

void InterpBackend::write_linear(uint64_t linear, const void* data, unsigned size) {
  if (!debug_.watchpoints.empty()) [[unlikely]] check_watch(linear, size, true);
  bool user = is_user();
  unsigned offset = linear & 0xfff;
  if (offset + size <= 4096) [[likely]] {
    write_phys(translate(linear, Access::kWrite, user), data, size);
    return;
  }
  // Both pages are translated first so that a fault on the second leaves memory untouched.
  unsigned first = 4096 - offset;
  uint64_t phys_a = translate(linear, Access::kWrite, user);
  uint64_t phys_b = translate(linear + first, Access::kWrite, user);
  write_phys(phys_a, data, first);
  write_phys(phys_b, static_cast<const uint8_t*>(data) + first, size - first);
}

uint64_t InterpBackend::read_mem(int seg_index, uint64_t offset, unsigned size) {
  uint64_t value = 0;
  read_linear(data_linear(seg_index, offset), &value, size);
  return value;
}

void InterpBackend::write_mem(int seg_index, uint64_t offset, unsigned size, uint64_t value) {
  write_linear(data_linear(seg_index, offset), &value, size);
}

uint64_t InterpBackend::read_sys(uint64_t linear, unsigned size) {
  uint64_t value = 0;
  uint64_t phys = translate(linear, Access::kRead, false);
  if ((linear & 0xfff) + size <= 4096) {
    read_phys(phys, &value, size);
  } else {
    for (unsigned i = 0; i < size; ++i) {
      uint8_t byte = 0;
      read_phys(translate(linear + i, Access::kRead, false), &byte, 1);
      value |= uint64_t(byte) << (8 * i);
    }
  }
  return value;
}

void InterpBackend::write_sys(uint64_t linear, unsigned size, uint64_t value) {
  for (unsigned i = 0; i < size; ++i) {
    uint8_t byte = uint8_t(value >> (8 * i));
    write_phys(translate(linear + i, Access::kWrite, false), &byte, 1);
  }
}

unsigned InterpBackend::stack_addr_size() const {
  if (mode64()) return 8;
  return s_.ss.db ? 4 : 2;
}

void InterpBackend::push(uint64_t value, unsigned size) {
  unsigned width = stack_addr_size();
  uint64_t rsp = s_.gpr[kRsp] - size;
  if (width == 4) rsp &= 0xffffffffu;
  if (width == 2) rsp &= 0xffffu;
  write_mem(2, rsp, size, value);
  if (width == 8) s_.gpr[kRsp] = rsp;
  else if (width == 4) s_.gpr[kRsp] = rsp;  // 32-bit stack writes zero-extend, as a 32-bit ESP write does
  else s_.gpr[kRsp] = (s_.gpr[kRsp] & ~0xffffull) | rsp;
}

uint64_t InterpBackend::pop(unsigned size) {
  unsigned width = stack_addr_size();
  uint64_t rsp = s_.gpr[kRsp];
  if (width == 4) rsp &= 0xffffffffu;
  if (width == 2) rsp &= 0xffffu;
  uint64_t value = read_mem(2, rsp, size);
  rsp += size;
  if (width == 8) s_.gpr[kRsp] = rsp;
  else if (width == 4) s_.gpr[kRsp] = rsp & 0xffffffffu;
  else s_.gpr[kRsp] = (s_.gpr[kRsp] & ~0xffffull) | (rsp & 0xffff);
  return value;
}

}  // namespace deja
