// CPU models: deja's own vendor, brand and topology, with exactly the feature flags both backends implement and can save.
#include "core/cpu_model.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>

#include <fmt/format.h>

#include "core/error.h"

namespace deja {
namespace {

constexpr uint32_t bit(int n) { return uint32_t{1} << n; }

using R = CpuidRegister;
constexpr CpuFeature kFeatures[] = {
    {1, 0, R::kEcx, 0, "SSE3"},        {1, 0, R::kEcx, 1, "PCLMULQDQ"},  {1, 0, R::kEcx, 9, "SSSE3"},
    {1, 0, R::kEcx, 13, "CX16"},       {1, 0, R::kEcx, 19, "SSE4.1"},    {1, 0, R::kEcx, 20, "SSE4.2"},
    {1, 0, R::kEcx, 21, "X2APIC", false}, {1, 0, R::kEcx, 24, "TSC_DEADLINE", false},
    {1, 0, R::kEcx, 22, "MOVBE"},      {1, 0, R::kEcx, 23, "POPCNT"},    {1, 0, R::kEcx, 26, "XSAVE"},
    {1, 0, R::kEcx, 28, "AVX"},        {1, 0, R::kEcx, 30, "RDRAND"},    {1, 0, R::kEcx, 31, "HYPERVISOR", false},
    {1, 0, R::kEdx, 0, "FPU"},         {1, 0, R::kEdx, 3, "PSE"},        {1, 0, R::kEdx, 4, "TSC"},
    {1, 0, R::kEdx, 5, "MSR"},         {1, 0, R::kEdx, 6, "PAE"},        {1, 0, R::kEdx, 8, "CX8"},
    {1, 0, R::kEdx, 9, "APIC", false}, {1, 0, R::kEdx, 11, "SEP"},       {1, 0, R::kEdx, 13, "PGE"},
    {1, 0, R::kEdx, 15, "CMOV"},       {1, 0, R::kEdx, 16, "PAT"},       {1, 0, R::kEdx, 19, "CLFSH"},
    {1, 0, R::kEdx, 23, "MMX"},        {1, 0, R::kEdx, 24, "FXSR"},      {1, 0, R::kEdx, 25, "SSE"},
    {1, 0, R::kEdx, 26, "SSE2"},       {7, 0, R::kEbx, 0, "FSGSBASE"},   {7, 0, R::kEbx, 3, "BMI1"},
    {7, 0, R::kEbx, 5, "AVX2"},        {7, 0, R::kEbx, 7, "SMEP"},       {7, 0, R::kEbx, 8, "BMI2"},
    {7, 0, R::kEbx, 10, "INVPCID"},    {7, 0, R::kEbx, 18, "RDSEED"},    {7, 0, R::kEbx, 20, "SMAP"},
    {7, 0, R::kEcx, 22, "RDPID"},      {0x80000001, 0, R::kEcx, 0, "LAHF_LM"}, {0x80000001, 0, R::kEcx, 5, "ABM/LZCNT"},
    {0x80000001, 0, R::kEdx, 11, "SYSCALL"}, {0x80000001, 0, R::kEdx, 20, "NX"},
    {0x80000001, 0, R::kEdx, 26, "PDPE1GB"}, {0x80000001, 0, R::kEdx, 27, "RDTSCP"},
    {0x80000001, 0, R::kEdx, 29, "LM"},      {0x80000007, 0, R::kEdx, 8, "INVARIANT_TSC", false},
};

// Packs 4 chars little-endian into a register, as CPUID strings are laid out.
constexpr uint32_t chars(const char (&s)[13], int offset) {
  return uint32_t(uint8_t(s[offset])) | uint32_t(uint8_t(s[offset + 1])) << 8 | uint32_t(uint8_t(s[offset + 2])) << 16 |
         uint32_t(uint8_t(s[offset + 3])) << 24;
}

uint32_t* register_of(CpuidResult& r, CpuidRegister reg) {
  switch (reg) {
    case R::kEax: return &r.eax;
    case R::kEbx: return &r.ebx;
    case R::kEcx: return &r.ecx;
    case R::kEdx: return &r.edx;
  }
  return &r.edx;
}

}  // namespace

uint32_t cpuid_register(const CpuidResult& r, CpuidRegister reg) {
  return *register_of(const_cast<CpuidResult&>(r), reg);
}

std::string CpuFeature::label() const {
  static constexpr const char* kRegs[] = {"EAX", "EBX", "ECX", "EDX"};
  return fmt::format("{} (CPUID.{:02X}H:{}[{}])", name, leaf, kRegs[static_cast<int>(reg)], bit);
}

std::span<const CpuFeature> cpu_features() { return kFeatures; }

const CpuFeature& feature(std::string_view name) {
  for (const auto& f : kFeatures) {
    if (f.name == name) return f;
  }
  DEJA_ASSERT(false, "no CPU feature named '{}'", name);
}

// Every model shares deja's identity (vendor, family, caches, brand prefix, address sizes); they differ in
// their feature flags and brand.
struct CpuModelBuilder {
  static CpuModel make(std::string_view name, uint32_t version, const char* brand,
                       std::initializer_list<std::string_view> features) {
    static constexpr char kVendor[13] = "DejaVuReplay";
    CpuModel m;
    m.version_ = version;
    m.name_ = name;
    auto& e = m.entries_;
    // Leaf 0: max basic leaf 7, vendor string in EBX, EDX, ECX.
    e.push_back({0, 0, false, {7, chars(kVendor, 0), chars(kVendor, 8), chars(kVendor, 4)}});
    // Leaf 1: family 6, model 1, stepping 0; CLFLUSH line 8 qwords, 1 logical CPU, APIC id 0. Flags below.
    e.push_back({1, 0, false, {0x00000610, (8u << 8) | (1u << 16), 0, 0}});
    // Leaf 2: no descriptors (0xff: use leaf 4).
    e.push_back({2, 0, false, {0x00ff0001, 0, 0, 0}});
    // Leaf 4: deterministic cache parameters (L1d, L1i, L2, L3), then the null terminator.
    auto cache = [&](uint32_t index, uint32_t type, uint32_t level, uint32_t ways, uint32_t sets) {
      uint32_t eax = type | (level << 5) | bit(8);  // self-initialising
      uint32_t ebx = (63u) | (0u << 12) | ((ways - 1) << 22);
      e.push_back({4, index, true, {eax, ebx, sets - 1, 0}});
    };
    cache(0, 1, 1, 8, 64);     // 32 KiB L1 data
    cache(1, 2, 1, 8, 64);     // 32 KiB L1 instruction
    cache(2, 3, 2, 8, 1024);   // 512 KiB L2
    cache(3, 3, 3, 16, 8192);  // 8 MiB L3
    e.push_back({4, 4, true, {0, 0, 0, 0}});
    // Leaves 5 and 6 (MONITOR/MWAIT, power): nothing.
    e.push_back({5, 0, false, {}});
    e.push_back({6, 0, false, {}});
    // Leaf 7: structured extended features (flags below).
    e.push_back({7, 0, true, {0, 0, 0, 0}});
    // Hypervisor leaves.
    static constexpr char kHv[13] = "dejadejadeja";
    e.push_back({0x40000000, 0, false, {0x40000000, chars(kHv, 0), chars(kHv, 4), chars(kHv, 8)}});
    // Extended leaves.
    e.push_back({0x80000000, 0, false, {0x80000008, 0, 0, 0}});
    e.push_back({0x80000001, 0, false, {0, 0, 0, 0}});
    std::array<char, 48> text{};
    std::strncpy(text.data(), brand, text.size() - 1);
    for (uint32_t leaf = 0; leaf < 3; ++leaf) {
      uint32_t regs[4];
      std::memcpy(regs, text.data() + leaf * 16, 16);
      e.push_back({0x80000002 + leaf, 0, false, {regs[0], regs[1], regs[2], regs[3]}});
    }
    e.push_back({0x80000005, 0, false, {}});
    e.push_back({0x80000006, 0, false, {0, 0, (512u << 16) | (8u << 12) | 64u, 0}});
    e.push_back({0x80000007, 0, false, {0, 0, 0, 0}});
    e.push_back({0x80000008, 0, false, {0x00003027, 0, 0, 0}});  // 39 physical, 48 linear address bits

    for (std::string_view f : features) {
      const CpuFeature& flag = feature(f);
      auto entry = std::find_if(e.begin(), e.end(), [&](const CpuidEntry& x) {
        return x.function == flag.leaf && (!x.indexed || x.index == flag.subleaf);
      });
      DEJA_ASSERT(entry != e.end(), "feature {} has no leaf in model {}", f, name);
      *register_of(entry->result, flag.reg) |= bit(flag.bit);
    }
    return m;
  }
};

const CpuModel& CpuModel::deja_v1() {
  // Exactly the table of the first traces; do not change a bit (its traces must keep replaying).
  static const CpuModel model = CpuModelBuilder::make(
      "deja-v1", 1, "deja virtual CPU v1",
      {"CX16", "POPCNT", "MOVBE", "HYPERVISOR", "FPU", "TSC", "MSR", "PAE", "CX8", "CMOV", "PAT", "CLFSH", "FXSR",
       "SSE", "SSE2", "LAHF_LM", "ABM/LZCNT", "SYSCALL", "NX", "LM", "INVARIANT_TSC"});
  return model;
}

const CpuModel& CpuModel::x86_64_v1() {
  // The x86-64 psABI baseline (CMOV, CX8, FPU, FXSR, SSE, SSE2, SYSCALL; MMX left out: neither backend's
  // software CPU implements it) plus what a Linux x86-64 kernel requires (PSE, PAE, PGE, MSR, TSC) and PAT,
  // CLFLUSH, NX. Nothing that kvm-pvm-like or feature-hiding KVMs commonly lack.
  static const CpuModel model = CpuModelBuilder::make(
      "x86-64-v1", 1, "deja virtual CPU x86-64-v1",
      {"HYPERVISOR", "FPU", "PSE", "TSC", "MSR", "PAE", "CX8", "PGE", "CMOV", "PAT", "CLFSH", "FXSR", "SSE", "SSE2",
       "SYSCALL", "NX", "LM", "INVARIANT_TSC"});
  return model;
}

const CpuModel& CpuModel::with_local_apic() const {
  // Built once per model (models are static); the local APIC (devices/lapic.*) provides the three flags.
  static std::mutex lock;
  static std::map<const CpuModel*, std::unique_ptr<CpuModel>> variants;
  std::lock_guard guard(lock);
  auto& variant = variants[this];
  if (!variant) {
    variant = std::make_unique<CpuModel>(*this);
    for (std::string_view name : {"APIC", "X2APIC", "TSC_DEADLINE"}) {
      const CpuFeature& flag = feature(name);
      for (auto& entry : variant->entries_) {
        if (entry.function == flag.leaf && (!entry.indexed || entry.index == flag.subleaf)) {
          *register_of(entry.result, flag.reg) |= bit(flag.bit);
        }
      }
    }
  }
  return *variant;
}

const CpuModel& CpuModel::for_apic_id(uint8_t apic_id) const {
  if (apic_id == 0) return *this;
  static std::mutex lock;
  static std::map<std::pair<const CpuModel*, uint8_t>, std::unique_ptr<CpuModel>> variants;
  std::lock_guard guard(lock);
  auto& variant = variants[{this, apic_id}];
  if (!variant) {
    variant = std::make_unique<CpuModel>(*this);
    for (auto& entry : variant->entries_) {
      if (entry.function == 1) entry.result.ebx = (entry.result.ebx & 0x00ffffffu) | (uint32_t(apic_id) << 24);
    }
  }
  return *variant;
}

std::span<const CpuModel* const> CpuModel::all() {
  static const CpuModel* const models[] = {&x86_64_v1(), &deja_v1()};
  return models;
}

const CpuModel* CpuModel::find(std::string_view name) {
  for (const CpuModel* m : all()) {
    if (m->name() == name) return m;
  }
  return nullptr;
}

const CpuModel* CpuModel::for_trace(std::string_view name, uint32_t version) {
  const CpuModel* m = name.empty() && version == 1 ? &deja_v1() : find(name);
  return m && m->version() == version ? m : nullptr;
}

std::string CpuModel::names() {
  std::string out;
  for (const CpuModel* m : all()) out += (out.empty() ? "" : ", ") + std::string(m->name());
  return out;
}

bool CpuModel::has(const CpuFeature& f) const { return (cpuid_register(cpuid(f.leaf, f.subleaf), f.reg) >> f.bit) & 1; }

std::vector<CpuFeature> CpuModel::hardware_features() const {
  std::vector<CpuFeature> out;
  for (const auto& f : kFeatures) {
    if (f.hardware && has(f)) out.push_back(f);
  }
  return out;
}

std::optional<CpuFeature> CpuModel::first_missing(std::span<const std::string_view> provided) const {
  for (const auto& f : hardware_features()) {
    if (std::find(provided.begin(), provided.end(), f.name) == provided.end()) return f;
  }
  return std::nullopt;
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
