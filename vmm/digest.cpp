// Digest computation with XXH3 (fast enough to hash all of RAM at every checkpoint).
#include "vmm/digest.h"

#include <xxhash.h>

#include <fmt/format.h>

namespace deja {

uint64_t gpr_digest(const CpuState& s) {
  uint64_t buf[kGprCount + 2];
  for (int i = 0; i < kGprCount; ++i) buf[i] = s.gpr[i];
  buf[kGprCount] = s.rip;
  buf[kGprCount + 1] = s.rflags & ~rflags::kRf;
  return XXH3_64bits(buf, sizeof(buf));
}

std::string Digest::hex() const {
  std::string out;
  for (uint8_t b : bytes) out += fmt::format("{:02x}", b);
  return out;
}

namespace {

XXH3_state_t* start_cpu_ram(const CpuState& s, const GuestMemory& memory) {
  XXH3_state_t* h = XXH3_createState();
  XXH3_128bits_reset(h);
  uint64_t regs[kGprCount + 7];
  for (int i = 0; i < kGprCount; ++i) regs[i] = s.gpr[i];
  regs[kGprCount + 0] = s.rip;
  regs[kGprCount + 1] = s.rflags & ~rflags::kRf;
  regs[kGprCount + 2] = s.cr0;
  regs[kGprCount + 3] = s.cr2;
  regs[kGprCount + 4] = s.cr3;
  regs[kGprCount + 5] = s.cr4;
  regs[kGprCount + 6] = s.efer;
  XXH3_128bits_update(h, regs, sizeof(regs));
  XXH3_128bits_update(h, memory.host_base(), memory.size());
  return h;
}

Digest finish(XXH3_state_t* h) {
  XXH128_hash_t v = XXH3_128bits_digest(h);
  XXH3_freeState(h);
  XXH128_canonical_t canon;
  XXH128_canonicalFromHash(&canon, v);
  Digest d;
  std::copy(std::begin(canon.digest), std::end(canon.digest), d.bytes.begin());
  return d;
}

}  // namespace

Digest cpu_ram_digest(const CpuState& state, const GuestMemory& memory) {
  return finish(start_cpu_ram(state, memory));
}

Digest machine_digest(const CpuState& state, const GuestMemory& memory, std::span<const std::vector<uint8_t>> devices) {
  XXH3_state_t* h = start_cpu_ram(state, memory);
  for (const auto& d : devices) {
    uint64_t size = d.size();
    XXH3_128bits_update(h, &size, sizeof(size));
    XXH3_128bits_update(h, d.data(), d.size());
  }
  return finish(h);
}

}  // namespace deja
