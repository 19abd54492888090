// CPU models: the vendor (AuthenticAMD; deja's own in the first models), brand and topology, with exactly the feature flags and MSRs both backends implement.
#include "core/cpu_model.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>

#include <fmt/format.h>

#include "core/cpu_state.h"
#include "core/error.h"

namespace deja {
namespace {

constexpr uint32_t bit(int n) { return uint32_t{1} << n; }

using R = CpuidRegister;
constexpr CpuFeature kFeatures[] = {
    {1, 0, R::kEcx, 0, "SSE3"},        {1, 0, R::kEcx, 1, "PCLMULQDQ"},  {1, 0, R::kEcx, 9, "SSSE3"},
    {1, 0, R::kEcx, 12, "FMA"},        {1, 0, R::kEcx, 13, "CX16"},      {1, 0, R::kEcx, 19, "SSE4.1"},
    {1, 0, R::kEcx, 20, "SSE4.2"},     {1, 0, R::kEcx, 27, "OSXSAVE", false}, {1, 0, R::kEcx, 29, "F16C"},
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
    {0xd, 1, R::kEax, 2, "XGETBV_ECX1"},
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

namespace {

// Who a model says it is. deja's own identity (the first models) names a vendor no software knows, so glibc
// reads no feature flags at all (docs/cpu-models.md); AuthenticAMD is the vendor the CPU resembles since.
enum class Identity { kDeja, kAmd };

constexpr char kAmdVendor[13] = "AuthenticAMD";
constexpr char kDejaVendor[13] = "DejaVuReplay";

bool is_amd_vendor(const CpuidResult& leaf0) {
  return leaf0.ebx == chars(kAmdVendor, 0) && leaf0.edx == chars(kAmdVendor, 4) && leaf0.ecx == chars(kAmdVendor, 8);
}

// AMD repeats these CPUID.01H:EDX flags in CPUID.80000001H:EDX (APM vol. 3, E.4.2; QEMU's AMD aliases).
constexpr uint32_t kAmdAliasedFlags = 0x0183f3ff;

void set_amd_aliases(std::vector<CpuidEntry>& entries) {
  uint32_t leaf1_edx = 0;
  for (const auto& e : entries) {
    if (e.function == 1) leaf1_edx = e.result.edx;
  }
  for (auto& e : entries) {
    if (e.function == 0x80000001) e.result.edx |= leaf1_edx & kAmdAliasedFlags;
  }
}

// The performance counters of a CPU without a PMU, as KVM answers them on every vendor: reads 0, writes ignored.
// AMD's legacy counters (PERF_CTL0-3, PERF_CTR0-3), which every AMD64 CPU has and software that does not know
// the vendor takes the AMD path to; and the architectural P6 counters and event selects.
#define DEJA_PERF_COUNTER_MSRS                                                                                    \
  {0xc0010000, 0, ~0ull}, {0xc0010001, 0, ~0ull}, {0xc0010002, 0, ~0ull}, {0xc0010003, 0, ~0ull},                 \
      {0xc0010004, 0, ~0ull}, {0xc0010005, 0, ~0ull}, {0xc0010006, 0, ~0ull}, {0xc0010007, 0, ~0ull},             \
      {0xc1, 0, ~0ull}, {0xc2, 0, ~0ull}, {0x186, 0, ~0ull}, {0x187, 0, ~0ull}
constexpr ModelMsr kPerfCounterMsrs[] = {DEJA_PERF_COUNTER_MSRS};
// AuthenticAMD's MSRs beyond those the vCPU holds: what KVM answers an AMD guest (arch/x86/kvm/x86.c,
// kvm_get/set_msr_common), with the values of a machine without SMM, microcode loader, northbridge or PMU.
constexpr ModelMsr kAmdMsrs[] = {
    DEJA_PERF_COUNTER_MSRS,
    {0x8b, 0x01000065, ~0ull},  // PATCH_LEVEL: QEMU's AMD default; writes (Intel's read protocol) ignored
    {0x1d9, 0, 0x3},             // DEBUGCTL: LBR and BTF accepted and ignored, as KVM does
    {0x1db, 0, 0}, {0x1dc, 0, 0}, {0x1dd, 0, 0}, {0x1de, 0, 0},  // last branch/interrupt from/to IP
    {0xc0010010, 0, 0},                                        // SYSCFG: no memory encryption, MTRR extensions off
    {0xc0010015, 1ull << 24, (1ull << 3) | (1ull << 6) | (1ull << 8) | (1ull << 18) | (1ull << 24)},  // HWCR: TscFreqSel
    {0xc001001f, 0, ~0ull},  // NB_CFG
    {0xc0010055, 0, 0},      // interrupt pending message: no C1E (erratum 400)
    {0xc0010058, 0, 0},      // MMIO configuration base: no MMCONFIG
    {0xc0010112, 0, 0}, {0xc0010113, 0, 0},  // TSEG base and mask: no SMM
    {0xc0011022, 0, ~0ull}, {0xc0011023, 0, ~0ull},  // DC_CFG, TW_CFG
    {0xc0011029, 0x2, 0x2},                          // DE_CFG: LFENCE is dispatch serializing (bit 1)
    {0xc001102a, 0, ~0ull}, {0xc001102c, 0, ~0ull},  // BU_CFG2, EX_CFG
};
#undef DEJA_PERF_COUNTER_MSRS

}  // namespace

// A model is its identity, its feature flags and its brand. Both identities share the cache sizes (32 KiB L1
// data and instruction, 512 KiB L2, 8 MiB L3, 64-byte lines), address sizes and one logical processor.
struct CpuModelBuilder {
  static CpuModel make(std::string_view name, uint32_t version, Identity identity, const char* brand,
                       std::initializer_list<std::string_view> features, std::span<const ModelMsr> msrs = {}) {
    const bool amd = identity == Identity::kAmd;
    const char(&vendor)[13] = amd ? kAmdVendor : kDejaVendor;
    CpuModel m;
    m.version_ = version;
    m.name_ = name;
    m.msrs_ = msrs;
    const bool xsave = std::find(features.begin(), features.end(), "XSAVE") != features.end();
    auto& e = m.entries_;
    // Leaf 0: max basic leaf 7 (0xD with XSAVE), vendor string in EBX, EDX, ECX.
    e.push_back({0, 0, false, {xsave ? 0xdu : 7u, chars(vendor, 0), chars(vendor, 8), chars(vendor, 4)}});
    // Leaf 1: the signature (deja: family 6, model 1, stepping 0; AMD: family 6, model 6, stepping 3, the
    // signature of QEMU's qemu64, which no family-specific code of Linux or glibc acts on); CLFLUSH line 8
    // qwords, 1 logical CPU, APIC id 0. Flags below.
    const uint32_t signature = amd ? 0x00000663 : 0x00000610;
    e.push_back({1, 0, false, {signature, (8u << 8) | (1u << 16), 0, 0}});
    if (!amd) {
      // Leaf 2: no descriptors (0xff: use leaf 4). Leaf 4: deterministic cache parameters (L1d, L1i, L2, L3),
      // then the null terminator. AMD reserves both (zeros): its caches are in 80000005H and 80000006H.
      e.push_back({2, 0, false, {0x00ff0001, 0, 0, 0}});
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
    }
    // Leaves 5 and 6 (MONITOR/MWAIT, power): nothing.
    e.push_back({5, 0, false, {}});
    e.push_back({6, 0, false, {}});
    // Leaf 7: structured extended features (flags below).
    e.push_back({7, 0, true, {0, 0, 0, 0}});
    if (xsave) {
      // Leaf 0xD: the XSAVE state components x87, SSE and AVX (XCR0 bits 0-2). Sub-leaf 0: EBX is the size
      // XCR0 enables (576 after reset, with XCR0 = x87 only; it follows XCR0 at run time), ECX the size of all
      // three; sub-leaf 1: XSAVEOPT (not XSAVEC: QEMU's TCG lacks it, so the nested harness's KVM could not run
      // the model); sub-leaf 2: the AVX state's 256 bytes at offset 576.
      e.push_back({0xd, 0, true, {0x7, 576, 832, 0}});
      e.push_back({0xd, 1, true, {0x1, 0, 0, 0}});
      e.push_back({0xd, 2, true, {256, 576, 0, 0}});
    }
    // Hypervisor leaves.
    static constexpr char kHv[13] = "dejadejadeja";
    e.push_back({0x40000000, 0, false, {0x40000000, chars(kHv, 0), chars(kHv, 4), chars(kHv, 8)}});
    // Extended leaves. AMD repeats the vendor in 80000000H and the signature in 80000001H:EAX.
    if (amd) e.push_back({0x80000000, 0, false, {0x80000008, chars(vendor, 0), chars(vendor, 8), chars(vendor, 4)}});
    else e.push_back({0x80000000, 0, false, {0x80000008, 0, 0, 0}});
    e.push_back({0x80000001, 0, false, {amd ? signature : 0, 0, 0, 0}});
    std::array<char, 48> text{};
    std::strncpy(text.data(), brand, text.size() - 1);
    for (uint32_t leaf = 0; leaf < 3; ++leaf) {
      uint32_t regs[4];
      std::memcpy(regs, text.data() + leaf * 16, 16);
      e.push_back({0x80000002 + leaf, 0, false, {regs[0], regs[1], regs[2], regs[3]}});
    }
    if (amd) {
      // APM vol. 3, E.4.4-E.4.5. 80000005H: the L1 TLBs (2M/4M pages in EAX, 4K in EBX: 64 entries each, fully
      // associative), the L1 data (ECX) and instruction (EDX) caches: KiB, ways, lines per tag, line size.
      constexpr uint32_t kL1Tlb = (0xffu << 24) | (64u << 16) | (0xffu << 8) | 64u;
      constexpr uint32_t kL1Cache = (32u << 24) | (8u << 16) | (1u << 8) | 64u;
      e.push_back({0x80000005, 0, false, {kL1Tlb, kL1Tlb, kL1Cache, kL1Cache}});
      // 80000006H: the L2 TLBs (8-way, encoded 6: 1024 entries for 2M/4M pages, 2048 data and 1024 instruction for
      // 4K), the L2 cache (KiB, ways encoded, lines per tag, line size) and the L3 (512 KiB units; 16-way is 8).
      constexpr uint32_t kL2Tlb2M = (6u << 28) | (1024u << 16) | (6u << 12) | 1024u;
      constexpr uint32_t kL2Tlb4K = (6u << 28) | (2048u << 16) | (6u << 12) | 1024u;
      constexpr uint32_t kL2 = (512u << 16) | (6u << 12) | (1u << 8) | 64u;
      constexpr uint32_t kL3 = (16u << 18) | (8u << 12) | (1u << 8) | 64u;
      e.push_back({0x80000006, 0, false, {kL2Tlb2M, kL2Tlb4K, kL2, kL3}});
    } else {
      e.push_back({0x80000005, 0, false, {}});
      e.push_back({0x80000006, 0, false, {0, 0, (512u << 16) | (8u << 12) | 64u, 0}});
    }
    e.push_back({0x80000007, 0, false, {0, 0, 0, 0}});
    // 39 physical, 48 linear address bits; ECX 0: one core (NC), APIC ID size derived from it.
    e.push_back({0x80000008, 0, false, {0x00003027, 0, 0, 0}});

    for (std::string_view f : features) {
      const CpuFeature& flag = feature(f);
      auto entry = std::find_if(e.begin(), e.end(), [&](const CpuidEntry& x) {
        return x.function == flag.leaf && (!x.indexed || x.index == flag.subleaf);
      });
      DEJA_ASSERT(entry != e.end(), "feature {} has no leaf in model {}", f, name);
      *register_of(entry->result, flag.reg) |= bit(flag.bit);
    }
    if (amd) set_amd_aliases(e);
    return m;
  }
};

const CpuModel& CpuModel::deja_v1() {
  // Exactly the table of the first traces; do not change a bit (its traces must keep replaying).
  static const CpuModel model = CpuModelBuilder::make(
      "deja-v1", 1, Identity::kDeja, "deja virtual CPU v1",
      {"CX16", "POPCNT", "MOVBE", "HYPERVISOR", "FPU", "TSC", "MSR", "PAE", "CX8", "CMOV", "PAT", "CLFSH", "FXSR",
       "SSE", "SSE2", "LAHF_LM", "ABM/LZCNT", "SYSCALL", "NX", "LM", "INVARIANT_TSC"});
  return model;
}

// The x86-64 psABI levels (x86-64-v1, -v2, -v3) plus what a Linux x86-64 kernel requires (PSE, PAE, PGE, MSR, TSC)
// and PAT, CLFLUSH, NX. Nothing that kvm-pvm-like or feature-hiding KVMs commonly lack.
#define DEJA_X86_64_V1                                                                                              \
  "HYPERVISOR", "FPU", "PSE", "TSC", "MSR", "PAE", "CX8", "PGE", "CMOV", "PAT", "CLFSH", "MMX", "FXSR", "SSE", "SSE2", \
      "SYSCALL", "NX", "LM", "INVARIANT_TSC"
#define DEJA_X86_64_V2 DEJA_X86_64_V1, "CX16", "LAHF_LM", "POPCNT", "SSE3", "SSSE3", "SSE4.1", "SSE4.2"
// v3's OSXSAVE is not in the table: CPUID.01H:ECX[27] reflects CR4.OSXSAVE at run time (0 after reset).
#define DEJA_X86_64_V3 DEJA_X86_64_V2, "AVX", "AVX2", "BMI1", "BMI2", "F16C", "FMA", "ABM/LZCNT", "MOVBE", "XSAVE"
// Version 3 of x86-64-v3 reports XINUSE (XGETBV with ECX = 1) and tracks it as Intel's processors do, so that the
// XSAVE areas a guest writes match a recording made on KVM (interp/exec_xsave.cpp).
#define DEJA_X86_64_V3_XINUSE DEJA_X86_64_V3, "XGETBV_ECX1"

const CpuModel& CpuModel::x86_64_v1_version1() {
  // Exactly the table of the first x86-64-v1 traces; do not change a bit: the baseline without MMX, which
  // neither backend's software CPU implemented then; unknown MSRs are #GP.
  static const CpuModel model = CpuModelBuilder::make(
      "x86-64-v1", 1, Identity::kDeja, "deja virtual CPU x86-64-v1",
      {"HYPERVISOR", "FPU", "PSE", "TSC", "MSR", "PAE", "CX8", "PGE", "CMOV", "PAT", "CLFSH", "FXSR", "SSE", "SSE2",
       "SYSCALL", "NX", "LM", "INVARIANT_TSC"});
  return model;
}

std::span<const CpuModel* const> CpuModel::earlier_versions() {
  // Exactly the tables their traces were recorded with; do not change a bit. After x86-64-v1 version 1: deja's
  // own vendor with MMX, the psABI levels and the inert performance counters.
  static const CpuModel v1_version2 = CpuModelBuilder::make("x86-64-v1", 2, Identity::kDeja,
                                                            "deja virtual CPU x86-64-v1", {DEJA_X86_64_V1},
                                                            kPerfCounterMsrs);
  static const CpuModel v2_version1 = CpuModelBuilder::make("x86-64-v2", 1, Identity::kDeja,
                                                            "deja virtual CPU x86-64-v2", {DEJA_X86_64_V2},
                                                            kPerfCounterMsrs);
  static const CpuModel v3_version1 = CpuModelBuilder::make("x86-64-v3", 1, Identity::kDeja,
                                                            "deja virtual CPU x86-64-v3", {DEJA_X86_64_V3},
                                                            kPerfCounterMsrs);
  // x86-64-v3 version 2: AuthenticAMD, with all of XCR0 in use at all times (no XINUSE tracking).
  static const CpuModel v3_version2 = CpuModelBuilder::make("x86-64-v3", 2, Identity::kAmd,
                                                            "deja virtual CPU x86-64-v3", {DEJA_X86_64_V3}, kAmdMsrs);
  static const CpuModel* const models[] = {&x86_64_v1_version1(), &v1_version2, &v2_version1, &v3_version1,
                                           &v3_version2};
  return models;
}

const CpuModel& CpuModel::x86_64_v1() {
  static const CpuModel model = CpuModelBuilder::make("x86-64-v1", 3, Identity::kAmd, "deja virtual CPU x86-64-v1",
                                                      {DEJA_X86_64_V1}, kAmdMsrs);
  return model;
}

const CpuModel& CpuModel::x86_64_v2() {
  static const CpuModel model = CpuModelBuilder::make("x86-64-v2", 2, Identity::kAmd, "deja virtual CPU x86-64-v2",
                                                      {DEJA_X86_64_V2}, kAmdMsrs);
  return model;
}

const CpuModel& CpuModel::x86_64_v3() {
  static const CpuModel model = CpuModelBuilder::make("x86-64-v3", 3, Identity::kAmd, "deja virtual CPU x86-64-v3",
                                                      {DEJA_X86_64_V3_XINUSE}, kAmdMsrs);
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
    if (is_amd()) set_amd_aliases(variant->entries_);
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
  static const CpuModel* const models[] = {&x86_64_v3(), &x86_64_v2(), &x86_64_v1(), &deja_v1()};
  return models;
}

const CpuModel* CpuModel::find(std::string_view name) {
  for (const CpuModel* m : all()) {
    if (m->name() == name) return m;
  }
  return nullptr;
}

const CpuModel* CpuModel::for_trace(std::string_view name, uint32_t version) {
  if (name.empty()) return version == 1 ? &deja_v1() : nullptr;
  // The current models, then the earlier versions of them that old traces name.
  for (auto models : {all(), earlier_versions()}) {
    for (const CpuModel* m : models) {
      if (m->name() == name && m->version() == version) return m;
    }
  }
  return nullptr;
}

const ModelMsr* CpuModel::msr(uint32_t index) const {
  for (const ModelMsr& m : msrs_) {
    if (m.index == index) return &m;
  }
  return nullptr;
}

std::string CpuModel::vendor() const {
  const CpuidResult r = cpuid(0, 0);
  std::string out(12, '\0');
  std::memcpy(out.data(), &r.ebx, 4);
  std::memcpy(out.data() + 4, &r.edx, 4);
  std::memcpy(out.data() + 8, &r.ecx, 4);
  return out;
}

bool CpuModel::is_amd() const { return is_amd_vendor(cpuid(0, 0)); }

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
  // KVM (arch/x86/kvm/cpuid.c, get_out_of_range_cpuid_entry): for AuthenticAMD, as on AMD's CPUs, a leaf
  // without an entry reads as zeros; for other vendors a leaf past the maximum of its class reads as the
  // highest basic leaf, with the original sub-leaf.
  const CpuidEntry* basic = find(0, 0);
  if (basic && is_amd_vendor(basic->result)) {
    const CpuidEntry* entry = find(leaf, subleaf);
    return entry ? entry->result : CpuidResult{};
  }
  const CpuidEntry* klass = nullptr;
  if (leaf >= 0x40000000 && leaf <= 0x4fffffff) klass = find(leaf & 0xffffff00, 0);
  else if (leaf >= 0xc0000000) klass = find(0xc0000000, 0);
  else klass = find(leaf & 0x80000000, 0);
  if (!(klass && leaf <= klass->result.eax) && basic) leaf = basic->result.eax;
  const CpuidEntry* entry = find(leaf, subleaf);
  return entry ? entry->result : CpuidResult{};
}

CpuidResult CpuModel::cpuid(uint32_t leaf, uint32_t subleaf, uint64_t cr4, uint64_t xcr0) const {
  CpuidResult r = cpuid(leaf, subleaf);
  constexpr uint32_t kXsave = 1u << 26, kOsxsave = 1u << 27, kXsavec = 1u << 1;
  if (leaf == 1) {
    r.ecx = (r.ecx & ~kOsxsave) | ((cr4 & cr4::kOsxsave) && (r.ecx & kXsave) ? kOsxsave : 0);
  } else if (leaf == 0xd && cpuid(0, 0).eax >= 0xd && (subleaf == 0 || (subleaf == 1 && (r.eax & kXsavec)))) {
    // KVM's xstate_required_size: the legacy area and header (576 bytes), then each component XCR0 enables, from
    // its sub-leaf (EAX size, EBX offset in the standard format, ECX bit 1 64-byte aligned when compacted).
    const bool compacted = subleaf == 1;
    uint32_t size = 576;
    for (uint32_t i = 2; i < 64; ++i) {
      if (!((xcr0 >> i) & 1)) continue;
      const CpuidResult c = cpuid(0xd, i);
      size = compacted ? ((c.ecx & 2) ? (size + 63) & ~63u : size) + c.eax : std::max(size, c.eax + c.ebx);
    }
    r.ebx = size;
  }
  return r;
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
