// The fixed, versioned CPU model deja presents to guests: one CPUID table and MSR ownership, shared by every backend.
#pragma once

#include <cstdint>
#include <span>
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

class CpuModel {
 public:
  // The model recorded in trace headers; bump `version` whenever any answer changes.
  static const CpuModel& current();
  // The same model on the APIC PC (--machine pc-apic): CPUID.1 also reports the local APIC
  // (EDX.APIC), x2APIC and the TSC-deadline timer (ECX). The PIC-only PC's model has none of them.
  static const CpuModel& with_local_apic();

  uint32_t version() const { return version_; }
  std::string_view name() const { return name_; }
  std::span<const CpuidEntry> entries() const { return entries_; }

  // What CPUID returns for (leaf, subleaf), with KVM's exact semantics for leaves absent from the
  // table (for a non-AMD vendor: an out-of-range leaf reads as the highest basic leaf, an in-range
  // leaf with no entry reads as zeros), so both backends answer identically.
  CpuidResult cpuid(uint32_t leaf, uint32_t subleaf) const;

  // MSRs whose state lives in the vCPU (EFER, STAR, LSTAR, FS/GS base, SYSENTER, PAT, ...). Every
  // other MSR exits to the VMM (KVM: via the MSR filter), which emulates it or answers #GP.
  static bool cpu_owns_msr(uint32_t msr);
  static std::span<const uint32_t> cpu_owned_msrs();

  // TSC frequency the model promises (the guest's TSC ticks at this rate of virtual time).
  static constexpr uint64_t kTscHz = 2'000'000'000;

 private:
  uint32_t version_ = 0;
  std::string_view name_;
  std::vector<CpuidEntry> entries_;
  friend CpuModel make_cpu_model_v1(bool local_apic);
};

namespace msr {
constexpr uint32_t kTsc = 0x10, kApicBase = 0x1b, kSysenterCs = 0x174, kSysenterEsp = 0x175, kSysenterEip = 0x176,
                   kPat = 0x277, kEfer = 0xc0000080, kStar = 0xc0000081, kLstar = 0xc0000082, kCstar = 0xc0000083,
                   kSfmask = 0xc0000084, kFsBase = 0xc0000100, kGsBase = 0xc0000101, kKernelGsBase = 0xc0000102,
                   kTscAux = 0xc0000103;
}

}  // namespace deja
