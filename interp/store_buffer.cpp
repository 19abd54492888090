// One vCPU's x86-TSO store buffer: the FIFO, forwarding, the seeded drain, its saved state; which instructions drain it.
#include "interp/store_buffer.h"

#include <Zydis/Zydis.h>

#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include "devices/state_codec.h"
#include "interp/decoded_insn.h"

namespace deja::interp {

StoreBuffer::StoreBuffer(const StoreBufferPlan& plan, uint32_t vcpu)
    : plan_(plan), random_(seeded_hash(plan.seed, 0x7450'0000ull + vcpu)) {}

void StoreBuffer::push(uint64_t gpa, const void* data, unsigned size) {
  Entry& e = entries_.emplace_back();
  e.gpa = gpa;
  e.due = retired_ + 1 + random_.below(2 * uint64_t(plan_.drain_mean));
  e.size = uint8_t(size);
  std::memcpy(e.bytes.data(), data, size);
  pages_ |= page_bit(gpa) | page_bit(gpa + size - 1);
}

void StoreBuffer::forward(uint64_t gpa, uint8_t* out, unsigned size) const {
  if (!may_touch(gpa, size)) return;
  for (const Entry& e : entries_) {
    const uint64_t begin = std::max(gpa, e.gpa), end = std::min(gpa + size, e.gpa + e.size);
    if (begin < end) std::memcpy(out + (begin - gpa), e.bytes.data() + (begin - e.gpa), end - begin);
  }
}

bool StoreBuffer::overlaps(uint64_t gpa, unsigned size) const {
  return may_touch(gpa, size) && std::any_of(entries_.begin(), entries_.end(),
                     [&](const Entry& e) { return e.gpa < gpa + size && gpa < e.gpa + e.size; });
}

StoreBuffer::Entry StoreBuffer::pop() {
  Entry oldest = entries_.front();
  entries_.pop_front();
  pages_ = 0;
  for (const Entry& e : entries_) pages_ |= page_bit(e.gpa) | page_bit(e.gpa + e.size - 1);
  return oldest;
}

std::vector<uint8_t> StoreBuffer::save() const {
  StateWriter w("TSOB", 1);
  w.u64(random_.state());
  w.u64(retired_);
  w.u32(uint32_t(entries_.size()));
  for (const Entry& e : entries_) {
    w.u64(e.gpa);
    w.u64(e.due);
    w.u8(e.size);
    w.bytes(std::span(e.bytes.data(), e.size));
  }
  return w.take();
}

Result<> StoreBuffer::restore(std::span<const uint8_t> state) {
  StateReader r(state, "TSOB", 1);
  const uint64_t random = r.u64(), retired = r.u64();
  const uint32_t count = r.u32();
  if (count > plan_.capacity) r.invalid(fmt::format("{} buffered stores, more than its {}", count, plan_.capacity));
  std::deque<Entry> entries;
  for (uint32_t i = 0; r.ok() && i < count; ++i) {
    Entry& e = entries.emplace_back();
    e.gpa = r.u64();
    e.due = r.u64();
    e.size = r.u8();
    if (e.size == 0 || e.size > kMaxStoreBytes) r.invalid(fmt::format("a buffered store of {} bytes", e.size));
    else r.bytes(std::span(e.bytes.data(), e.size));
  }
  if (auto done = r.finish(); !done) return done;
  random_.set_state(random);
  retired_ = retired;
  entries_ = std::move(entries);
  pages_ = 0;
  for (const Entry& e : entries_) pages_ |= page_bit(e.gpa) | page_bit(e.gpa + e.size - 1);
  return {};
}

bool is_locked(const DecodedInsn& insn) {
  return (insn.flags & insn_flags::kLock) ||
         (insn.mnemonic == ZYDIS_MNEMONIC_XCHG && (insn.op[0].kind == OpKind::kMem || insn.op[1].kind == OpKind::kMem));
}

bool orders_memory(const DecodedInsn& insn) {
  if (is_locked(insn)) return true;
  switch (insn.mnemonic) {
    case ZYDIS_MNEMONIC_MOV:  // to a control or debug register: serializing
      return insn.op[0].kind == OpKind::kCr || insn.op[0].kind == OpKind::kDr;
    case ZYDIS_MNEMONIC_MFENCE:
    case ZYDIS_MNEMONIC_CPUID: case ZYDIS_MNEMONIC_IRET: case ZYDIS_MNEMONIC_IRETD: case ZYDIS_MNEMONIC_IRETQ:
    case ZYDIS_MNEMONIC_WRMSR: case ZYDIS_MNEMONIC_INVD: case ZYDIS_MNEMONIC_WBINVD: case ZYDIS_MNEMONIC_INVLPG:
    case ZYDIS_MNEMONIC_LGDT: case ZYDIS_MNEMONIC_LIDT: case ZYDIS_MNEMONIC_LLDT: case ZYDIS_MNEMONIC_LTR:
    case ZYDIS_MNEMONIC_XSETBV: case ZYDIS_MNEMONIC_LMSW: case ZYDIS_MNEMONIC_CLTS:
    // A halted processor's buffer empties (nothing else would drain it while it waits, and a waiter on its stores
    // would wait for ever); devices see the stores before the access (program order).
    case ZYDIS_MNEMONIC_HLT:
    case ZYDIS_MNEMONIC_IN: case ZYDIS_MNEMONIC_OUT: case ZYDIS_MNEMONIC_INSB: case ZYDIS_MNEMONIC_INSW:
    case ZYDIS_MNEMONIC_INSD: case ZYDIS_MNEMONIC_OUTSB: case ZYDIS_MNEMONIC_OUTSW: case ZYDIS_MNEMONIC_OUTSD:
      return true;
    default:
      return false;
  }
}

}  // namespace deja::interp
