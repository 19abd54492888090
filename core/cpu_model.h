// The fixed, versioned CPU models deja presents to guests (one CPUID table each, shared by every backend) and the feature bits they are made of.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace deja {

struct CpuidResult {
  uint32_t eax = 0, ebx = 0, ecx = 0, edx = 0;
  bool operator==(const CpuidResult&) const = default;
};

struct CpuidEntry {
  uint32_t function = 0;
  uint32_t index = 0;
  bool indexed = false;  // the sub-leaf (ECX) selects the entry
  CpuidResult result;
};

enum class CpuidRegister : uint8_t { kEax, kEbx, kEcx, kEdx };
uint32_t cpuid_register(const CpuidResult& r, CpuidRegister reg);

// One CPUID feature flag. `hardware` is false for flags that are a promise kept by software rather than an
// instruction or mode the CPU must implement (HYPERVISOR, INVARIANT_TSC, APIC: the VMM provides those).
struct CpuFeature {
  uint32_t leaf;
  uint32_t subleaf;
  CpuidRegister reg;
  int bit;
  std::string_view name;
  bool hardware = true;
  // "MOVBE (CPUID.01H:ECX[22])"
  std::string label() const;
};
// Every feature flag a deja CPU model may set, named; `feature("POPCNT")` finds one.
std::span<const CpuFeature> cpu_features();
const CpuFeature& feature(std::string_view name);

// An MSR a CPU model answers by itself, without state: reads give `value`; a write is accepted, and has no
// effect, when it sets no bit outside `writable`, else it is #GP (docs/cpu-models.md, "MSRs").
struct ModelMsr {
  uint32_t index = 0;
  uint64_t value = 0;
  uint64_t writable = 0;
  bool accepts(uint64_t written) const { return (written & ~writable) == 0; }
};

class CpuModel {
 public:
  // The models this deja implements, in the order a default is chosen (richest first). deja-v1, the model
  // of the first traces, comes last: it lacks PSE and PGE, which Linux requires.
  static std::span<const CpuModel* const> all();
  static const CpuModel* find(std::string_view name);
  // The model a trace was recorded with: its name, or (traces before models had names) version 1 = deja-v1.
  static const CpuModel* for_trace(std::string_view name, uint32_t version);
  // Names of all models, for messages: "x86-64-v1, deja-v1".
  static std::string names();

  static const CpuModel& deja_v1();    // CX16, POPCNT, MOVBE, LZCNT on SSE2; no PSE/PGE
  static const CpuModel& x86_64_v1();  // the x86-64 baseline (psABI v1) plus what Linux requires
  static const CpuModel& x86_64_v2();  // x86-64-v1 plus the psABI's v2: CX16, LAHF_LM, POPCNT, SSE3-SSE4.2
  static const CpuModel& x86_64_v3();  // x86-64-v2 plus the psABI's v3: AVX, AVX2, BMI1/2, F16C, FMA, LZCNT, MOVBE, XSAVE
  // The earlier versions of the models, which only traces name: x86-64-v1 version 1 (deja's own vendor, no MMX),
  // x86-64-v1 version 2, x86-64-v2 and x86-64-v3 version 1 (deja's own vendor, which glibc does not read), and
  // x86-64-v3 version 2 (all of XCR0 in use at all times: no XINUSE tracking).
  static std::span<const CpuModel* const> earlier_versions();
  static const CpuModel& x86_64_v1_version1();

  // This model on the APIC PC (--machine pc-apic): the same name, version and table, plus APIC, X2APIC and
  // TSC_DEADLINE in CPUID.1, which the machine's local APIC provides. The machine type is recorded next to
  // the model, so a trace names both. Models without a local APIC never set these bits.
  const CpuModel& with_local_apic() const;
  // This model as vCPU `apic_id` of a multiprocessor sees it: its initial APIC ID in CPUID.1:EBX[31:24]
  // (each vCPU is a package of its own: one logical processor, as leaves 1 and 4 already say). ID 0 is
  // this model itself.
  const CpuModel& for_apic_id(uint8_t apic_id) const;

  // Recorded in trace headers with the name; bump `version` whenever any answer of the model changes.
  uint32_t version() const { return version_; }
  std::string_view name() const { return name_; }
  std::span<const CpuidEntry> entries() const { return entries_; }

  // What CPUID returns for (leaf, subleaf), with KVM's exact semantics for leaves absent from the
  // table (for AuthenticAMD every such leaf reads as zeros, as on AMD's CPUs; for deja's own vendor an
  // out-of-range leaf reads as the highest basic leaf and an in-range leaf with no entry as zeros), so both
  // backends answer identically.
  CpuidResult cpuid(uint32_t leaf, uint32_t subleaf) const;
  // What CPUID returns in a vCPU whose CR4 and XCR0 are these: CPUID.01H:ECX.OSXSAVE follows CR4.OSXSAVE, and
  // leaf 0DH's EBX (sub-leaf 0; sub-leaf 1 where XSAVEC is offered) the size of the XSAVE area XCR0 enables, as KVM
  // computes them (arch/x86/kvm/cpuid.c, kvm_update_cpuid_runtime), so that every backend answers alike.
  CpuidResult cpuid(uint32_t leaf, uint32_t subleaf, uint64_t cr4, uint64_t xcr0) const;
  // The vendor string of CPUID leaf 0 ("AuthenticAMD", or deja's own "DejaVuReplay" in the first models).
  std::string vendor() const;
  bool is_amd() const;
  bool has(const CpuFeature& f) const;
  // The hardware features this model advertises, in cpu_features() order.
  std::vector<CpuFeature> hardware_features() const;
  // The first hardware feature of this model that is not in `provided` (by name), if any.
  std::optional<CpuFeature> first_missing(std::span<const std::string_view> provided) const;

  // MSRs whose state lives in the vCPU (EFER, STAR, LSTAR, FS/GS base, SYSENTER, PAT, ...). Every
  // other MSR exits to the VMM (KVM: via the MSR filter), which emulates it or answers #GP.
  static bool cpu_owns_msr(uint32_t msr);
  static std::span<const uint32_t> cpu_owned_msrs();
  // The MSR `index` if this model answers it itself (the same answer on every backend, a function of the model:
  // never recorded): the AMD MSRs that AuthenticAMD software relies on and the performance counters of a CPU
  // without a PMU, as KVM answers them (docs/cpu-models.md). None for deja-v1 and the first x86-64-v1.
  const ModelMsr* msr(uint32_t index) const;
  std::span<const ModelMsr> msrs() const { return msrs_; }

  // TSC frequency every model promises (the guest's TSC ticks at this rate of virtual time).
  static constexpr uint64_t kTscHz = 2'000'000'000;

 private:
  uint32_t version_ = 0;
  std::string_view name_;
  std::vector<CpuidEntry> entries_;
  std::span<const ModelMsr> msrs_;
  friend struct CpuModelBuilder;
};

namespace msr {
constexpr uint32_t kTsc = 0x10, kApicBase = 0x1b, kSysenterCs = 0x174, kSysenterEsp = 0x175, kSysenterEip = 0x176,
                   kPat = 0x277, kEfer = 0xc0000080, kStar = 0xc0000081, kLstar = 0xc0000082, kCstar = 0xc0000083,
                   kSfmask = 0xc0000084, kFsBase = 0xc0000100, kGsBase = 0xc0000101, kKernelGsBase = 0xc0000102,
                   kTscAux = 0xc0000103;
}

}  // namespace deja
