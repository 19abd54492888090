// Digest computation with XXH3 (fast enough to hash all of RAM at every checkpoint).
#include "replay/digest.h"

#include <unistd.h>
#include <xxhash.h>

#include <cstring>
#include <optional>

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

bool all_zero(const uint8_t* page) {
  static const uint8_t kZero[kPageSize] = {};
  return std::memcmp(page, kZero, kPageSize) == 0;
}

// RAM is hashed as the sequence of (page number, contents) of its non-zero pages. Zero pages add
// nothing, so the digest does not depend on which pages happen to be materialised, and the memfd's
// holes (never-touched RAM) are skipped with SEEK_DATA without faulting them in: reading all of a
// 256 MiB guest would cost seconds under nested virtualization. With `regions`, each region's
// non-zero pages are hashed on their own as well (a region without any stays 0).
void hash_ram(XXH3_state_t* h, const GuestMemory& memory, std::vector<uint64_t>* regions) {
  const off_t size = off_t(memory.size());
  XXH3_state_t* region = nullptr;  // pages come in ascending order: each region is hashed in one go
  std::optional<uint64_t> open;    // the region being hashed
  if (regions) {
    regions->assign((uint64_t(size) + DigestParts::kRamRegionBytes - 1) / DigestParts::kRamRegionBytes, 0);
    region = XXH3_createState();
  }
  off_t data = 0;
  while (data < size) {
    data = lseek(memory.fd(), data, SEEK_DATA);
    if (data < 0) break;  // no data beyond: the rest is a hole
    off_t hole = lseek(memory.fd(), data, SEEK_HOLE);
    if (hole < 0 || hole > size) hole = size;
    for (off_t page = data & ~off_t(kPageSize - 1); page < hole; page += off_t(kPageSize)) {
      const uint8_t* bytes = memory.host_base() + page;
      if (all_zero(bytes)) continue;
      uint64_t number = uint64_t(page) / kPageSize;
      XXH3_128bits_update(h, &number, sizeof(number));
      XXH3_128bits_update(h, bytes, kPageSize);
      if (!region) continue;
      if (const uint64_t index = uint64_t(page) / DigestParts::kRamRegionBytes; open != index) {
        if (open) (*regions)[*open] = XXH3_64bits_digest(region);
        XXH3_64bits_reset(region);
        open = index;
      }
      XXH3_64bits_update(region, &number, sizeof(number));
      XXH3_64bits_update(region, bytes, kPageSize);
    }
    data = hole;
  }
  if (region) {
    if (open) (*regions)[*open] = XXH3_64bits_digest(region);
    XXH3_freeState(region);
  }
}

void hash_registers(XXH3_state_t* h, const CpuState& s, DigestParts* parts) {
  uint64_t regs[DigestParts::kRegisterCount];
  for (int i = 0; i < kGprCount; ++i) regs[i] = s.gpr[i];
  regs[kGprCount + 0] = s.rip;
  regs[kGprCount + 1] = s.rflags & ~rflags::kRf;
  regs[kGprCount + 2] = s.cr0;
  regs[kGprCount + 3] = s.cr2;
  regs[kGprCount + 4] = s.cr3;
  regs[kGprCount + 5] = s.cr4;
  regs[kGprCount + 6] = s.efer;
  XXH3_128bits_update(h, regs, sizeof(regs));
  if (parts) parts->registers.insert(parts->registers.end(), std::begin(regs), std::end(regs));
  // XCR0 only once XSETBV moved it from its reset value, so that the digests of traces from before it existed
  // (whose guests could not execute XSETBV) stay what they were.
  const bool with_xcr0 = s.xcr0 != xcr0::kX87;
  if (with_xcr0) {
    XXH3_128bits_update(h, &s.xcr0, sizeof(s.xcr0));
    if (parts) parts->registers.push_back(s.xcr0);
  }
  if (parts) parts->with_xcr0.push_back(with_xcr0);
}

XXH3_state_t* start_cpu_ram(const CpuState& s, const GuestMemory& memory, DigestParts* parts) {
  XXH3_state_t* h = XXH3_createState();
  XXH3_128bits_reset(h);
  if (parts) {
    parts->registers.clear();
    parts->with_xcr0.clear();
  }
  hash_registers(h, s, parts);
  hash_ram(h, memory, parts ? &parts->ram_regions : nullptr);
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

std::string DigestParts::register_name(size_t index) const {
  static constexpr std::string_view kNames[kRegisterCount + 1] = {
      "rax", "rcx", "rdx", "rbx", "rsp", "rbp", "rsi", "rdi", "r8",  "r9",  "r10", "r11",
      "r12", "r13", "r14", "r15", "rip", "rflags", "cr0", "cr2", "cr3", "cr4", "efer", "xcr0"};
  for (size_t vcpu = 0; vcpu < with_xcr0.size(); ++vcpu) {
    const size_t count = kRegisterCount + (with_xcr0[vcpu] ? 1 : 0);
    if (index < count) return vcpu == 0 ? std::string(kNames[index]) : fmt::format("vcpu{} {}", vcpu, kNames[index]);
    index -= count;
  }
  return "?";
}

Digest cpu_ram_digest(const CpuState& state, const GuestMemory& memory) {
  return finish(start_cpu_ram(state, memory, nullptr));
}

namespace {
XXH3_state_t* start_machine(const CpuState& state, const GuestMemory& memory,
                            std::span<const std::vector<uint8_t>> devices, DigestParts* parts) {
  XXH3_state_t* h = start_cpu_ram(state, memory, parts);
  if (parts) parts->devices.clear();
  for (const auto& d : devices) {
    uint64_t size = d.size();
    XXH3_128bits_update(h, &size, sizeof(size));
    XXH3_128bits_update(h, d.data(), d.size());
    if (parts) parts->devices.push_back(XXH3_64bits(d.data(), d.size()));
  }
  return h;
}
}  // namespace

Digest machine_digest(const CpuState& state, const GuestMemory& memory, std::span<const std::vector<uint8_t>> devices,
                      DigestParts* parts) {
  return finish(start_machine(state, memory, devices, parts));
}

Digest machine_digest(std::span<const CpuState> states, const GuestMemory& memory,
                      std::span<const std::vector<uint8_t>> devices, DigestParts* parts) {
  XXH3_state_t* h = start_machine(states.empty() ? CpuState{} : states.front(), memory, devices, parts);
  for (size_t i = 1; i < states.size(); ++i) hash_registers(h, states[i], parts);
  return finish(h);
}

}  // namespace deja
