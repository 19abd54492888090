// CPU model v1: deja's own vendor, brand and topology; exactly the features both backends implement and can save.
#include "vmm/cpu_model.h"

#include <algorithm>
#include <array>
#include <cstring>

namespace deja {
namespace {

constexpr uint32_t bit(int n) { return uint32_t{1} << n; }

// Packs 4 chars little-endian into a register, as CPUID strings are laid out.
constexpr uint32_t chars(const char (&s)[13], int offset) {
  return uint32_t(uint8_t(s[offset])) | uint32_t(uint8_t(s[offset + 1])) << 8 | uint32_t(uint8_t(s[offset + 2])) << 16 |
         uint32_t(uint8_t(s[offset + 3])) << 24;
}

void add_brand(std::vector<CpuidEntry>& entries, const char* brand) {
  std::array<char, 48> text{};
  std::strncpy(text.data(), brand, text.size() - 1);
  for (uint32_t leaf = 0; leaf < 3; ++leaf) {
    uint32_t regs[4];
    std::memcpy(regs, text.data() + leaf * 16, 16);
    entries.push_back({0x80000002 + leaf, 0, false, {regs[0], regs[1], regs[2], regs[3]}});
  }
}

}  // namespace

CpuModel make_cpu_model_v1(bool local_apic) {
  static constexpr char kVendor[13] = "DejaVuReplay";
  CpuModel m;
  m.version_ = 1;
  m.name_ = local_apic ? "deja-v1-apic" : "deja-v1";
  auto& e = m.entries_;

  // Leaf 0: max basic leaf 7, vendor string in EBX, EDX, ECX.
  e.push_back({0, 0, false, {7, chars(kVendor, 0), chars(kVendor, 8), chars(kVendor, 4)}});
  // Leaf 1: family 6, model 1, stepping 0; CLFLUSH line 8 qwords, 1 logical CPU, APIC id 0.
  e.push_back({1, 0, false,
               {0x00000610, (8u << 8) | (1u << 16),
                // ECX: CX16, POPCNT, MOVBE, hypervisor present.
                bit(13) | bit(23) | bit(22) | bit(31),
                // EDX: FPU, TSC, MSR, PAE, CX8, CMOV, PAT, CLFSH, FXSR, SSE, SSE2.
                bit(0) | bit(4) | bit(5) | bit(6) | bit(8) | bit(15) | bit(16) | bit(19) | bit(24) | bit(25) |
                    bit(26)}});
  if (local_apic) {
    // ECX: x2APIC, TSC-deadline; EDX: APIC (the machine's devices/lapic.* model them).
    e.back().result.ecx |= bit(21) | bit(24);
    e.back().result.edx |= bit(9);
  }
  // Leaf 2: no descriptors (0xff: use leaf 4).
  e.push_back({2, 0, false, {0x00ff0001, 0, 0, 0}});
  // Leaf 4: deterministic cache parameters (L1d, L1i, L2, L3), then the null terminator.
  auto cache = [&](uint32_t index, uint32_t type, uint32_t level, uint32_t ways, uint32_t sets) {
    uint32_t eax = type | (level << 5) | bit(8);  // self-initialising
    uint32_t ebx = (63u) | (0u << 12) | ((ways - 1) << 22);
    e.push_back({4, index, true, {eax, ebx, sets - 1, 0}});
  };
  cache(0, 1, 1, 8, 64);      // 32 KiB L1 data
  cache(1, 2, 1, 8, 64);      // 32 KiB L1 instruction
  cache(2, 3, 2, 8, 1024);    // 512 KiB L2
  cache(3, 3, 3, 16, 8192);   // 8 MiB L3
  e.push_back({4, 4, true, {0, 0, 0, 0}});
  // Leaves 5 and 6 (MONITOR/MWAIT, power): nothing.
  e.push_back({5, 0, false, {}});
  e.push_back({6, 0, false, {}});
  // Leaf 7: no structured extended features (no FSGSBASE, BMI, AVX2, RDSEED, SMEP, ...).
  e.push_back({7, 0, true, {0, 0, 0, 0}});

  // Hypervisor leaves.
  static constexpr char kHv[13] = "dejadejadeja";
  e.push_back({0x40000000, 0, false, {0x40000000, chars(kHv, 0), chars(kHv, 4), chars(kHv, 8)}});

  // Extended leaves.
  e.push_back({0x80000000, 0, false, {0x80000008, 0, 0, 0}});
  // ECX: LAHF/SAHF in 64-bit mode, LZCNT (ABM). EDX: SYSCALL, NX, long mode. No RDTSCP.
  e.push_back({0x80000001, 0, false, {0, 0, bit(0) | bit(5), bit(11) | bit(20) | bit(29)}});
  add_brand(e, "deja virtual CPU v1");
  e.push_back({0x80000005, 0, false, {}});
  e.push_back({0x80000006, 0, false, {0, 0, (512u << 16) | (8u << 12) | 64u, 0}});
  e.push_back({0x80000007, 0, false, {0, 0, 0, bit(8)}});  // invariant TSC
  e.push_back({0x80000008, 0, false, {0x00003027, 0, 0, 0}});  // 39 physical, 48 linear address bits
  return m;
}

const CpuModel& CpuModel::current() {
  static const CpuModel model = make_cpu_model_v1(false);
  return model;
}

const CpuModel& CpuModel::with_local_apic() {
  static const CpuModel model = make_cpu_model_v1(true);
  return model;
}

CpuidResult CpuModel::cpuid(uint32_t leaf, uint32_t subleaf) const {
  auto find = [&](uint32_t function, uint32_t index) -> const CpuidEntry* {
    for (const auto& entry : entries_) {
      if (entry.function == function && (!entry.indexed || entry.index == index)) return &entry;
    }
    return nullptr;
  };
  // KVM (arch/x86/kvm/cpuid.c, get_out_of_range_cpuid_entry) for a non-AMD vendor: a leaf past the
  // maximum of its class reads as the highest basic leaf, with the original sub-leaf.
  const CpuidEntry* basic = find(0, 0);
  const CpuidEntry* klass = nullptr;
  if (leaf >= 0x40000000 && leaf <= 0x4fffffff) klass = find(leaf & 0xffffff00, 0);
  else if (leaf >= 0xc0000000) klass = find(0xc0000000, 0);
  else klass = find(leaf & 0x80000000, 0);
  if (!(klass && leaf <= klass->result.eax) && basic) leaf = basic->result.eax;
  const CpuidEntry* entry = find(leaf, subleaf);
  return entry ? entry->result : CpuidResult{};
}

static constexpr std::array<uint32_t, 12> kCpuOwnedMsrs = {
    msr::kSysenterCs, msr::kSysenterEsp, msr::kSysenterEip, msr::kPat,    msr::kEfer,         msr::kStar,
    msr::kLstar,      msr::kCstar,       msr::kSfmask,      msr::kFsBase, msr::kGsBase, msr::kKernelGsBase};

std::span<const uint32_t> CpuModel::cpu_owned_msrs() { return kCpuOwnedMsrs; }

bool CpuModel::cpu_owns_msr(uint32_t index) {
  auto owned = cpu_owned_msrs();
  return std::find(owned.begin(), owned.end(), index) != owned.end();
}

}  // namespace deja
