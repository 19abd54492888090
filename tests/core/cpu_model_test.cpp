// CPU model: the vendor (AuthenticAMD, deja's own in the first models), untrappable features hidden, out-of-range leaves and MSRs as KVM answers them.
#include "core/cpu_model.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

namespace deja {
namespace {

TEST(CpuModel, VendorIsAmdSinceTheFirstModelsKeepDejasOwn) {
  for (const CpuModel* m : {&CpuModel::x86_64_v1(), &CpuModel::x86_64_v2(), &CpuModel::x86_64_v3()}) {
    EXPECT_EQ(m->vendor(), "AuthenticAMD") << m->name();
    EXPECT_TRUE(m->is_amd());
  }
  EXPECT_EQ(CpuModel::deja_v1().vendor(), "DejaVuReplay");
  // The earlier versions from before the AMD identity; x86-64-v3 version 2 (before XINUSE) is AuthenticAMD.
  const CpuModel* v3_version2 = CpuModel::for_trace("x86-64-v3", 2);
  for (const CpuModel* m : CpuModel::earlier_versions())
    EXPECT_EQ(m->vendor(), m == v3_version2 ? "AuthenticAMD" : "DejaVuReplay") << m->name() << " v" << m->version();
}

// What AuthenticAMD software reads beside the vendor (APM vol. 3, appendix E): the vendor again in 80000000H,
// the signature in 80000001H with the aliased leaf-1 flags, the caches in 80000005H-80000006H (leaves 2 and 4
// reserved), one core in 80000008H.
TEST(CpuModel, AmdLeaves) {
  const CpuModel& m = CpuModel::x86_64_v3();
  const CpuidResult l0 = m.cpuid(0, 0), l1 = m.cpuid(1, 0), e0 = m.cpuid(0x80000000, 0), e1 = m.cpuid(0x80000001, 0);
  EXPECT_EQ(l1.eax, 0x663u) << "family 6, model 6, stepping 3";
  EXPECT_EQ(e0.eax, 0x80000008u);
  EXPECT_EQ(CpuidResult({0, e0.ebx, e0.ecx, e0.edx}), CpuidResult({0, l0.ebx, l0.ecx, l0.edx}));
  EXPECT_EQ(e1.eax, l1.eax);
  EXPECT_EQ(e1.edx & 0x0183f3ffu, l1.edx & 0x0183f3ffu) << "FPU..PSE36, MMX, FXSR repeated";
  EXPECT_TRUE(e1.edx & (1u << 23)) << "MMX";
  EXPECT_EQ(m.cpuid(2, 0), CpuidResult{});
  EXPECT_EQ(m.cpuid(4, 0), CpuidResult{});
  const CpuidResult l1cache = m.cpuid(0x80000005, 0), l2cache = m.cpuid(0x80000006, 0);
  EXPECT_EQ(l1cache.ecx >> 24, 32u) << "KiB of L1 data";
  EXPECT_EQ(l1cache.edx >> 24, 32u) << "KiB of L1 instruction";
  EXPECT_EQ(l2cache.ecx >> 16, 512u) << "KiB of L2";
  EXPECT_EQ((l2cache.ecx >> 12) & 0xf, 6u) << "8-way";
  EXPECT_EQ((l2cache.edx >> 18) * 512, 8192u) << "KiB of L3";
  EXPECT_EQ(m.cpuid(0x80000008, 0).ecx & 0xff, 0u) << "one core";
  EXPECT_EQ(m.with_local_apic().cpuid(0x80000001, 0).edx, e1.edx | (1u << 9)) << "APIC repeated too";
}

// KVM answers every leaf without an entry of an AuthenticAMD vCPU with zeros (not with the highest basic leaf).
TEST(CpuModel, AmdOutOfRangeLeavesReadAsZeros) {
  const CpuModel& m = CpuModel::x86_64_v1();
  EXPECT_EQ(m.cpuid(0x1234, 0), CpuidResult{});
  EXPECT_EQ(m.cpuid(0x80000009, 0), CpuidResult{});
  EXPECT_EQ(m.cpuid(0x8000001d, 3), CpuidResult{});
  EXPECT_EQ(m.cpuid(0x40000005, 0), CpuidResult{});
  EXPECT_EQ(m.cpuid(3, 0), CpuidResult{});
}

TEST(CpuModel, HidesWhatKvmCannotTrap) {
  const auto& m = CpuModel::deja_v1();
  EXPECT_EQ(m.cpuid(1, 0).ecx & (1u << 30), 0u) << "RDRAND";
  EXPECT_EQ(m.cpuid(7, 0).ebx & (1u << 18), 0u) << "RDSEED";
  EXPECT_EQ(m.cpuid(7, 0).ecx & (1u << 22), 0u) << "RDPID";
  EXPECT_EQ(m.cpuid(0x80000001, 0).edx & (1u << 27), 0u) << "RDTSCP";
  EXPECT_EQ(m.cpuid(1, 0).ecx & (1u << 26), 0u) << "XSAVE";
}

TEST(CpuModel, OutOfRangeLeafReadsAsHighestBasicLeaf) {
  const auto& m = CpuModel::deja_v1();
  EXPECT_EQ(m.cpuid(0x1234, 0), m.cpuid(7, 0));
  EXPECT_EQ(m.cpuid(0x80000009, 0), m.cpuid(7, 0));
  EXPECT_EQ(m.cpuid(0x40000005, 0), m.cpuid(7, 0));
  // In range but absent: zeros. Indexed leaf 4 beyond the last cache: the null entry.
  EXPECT_EQ(m.cpuid(3, 0), CpuidResult{});
  EXPECT_EQ(m.cpuid(4, 9), CpuidResult{});
  EXPECT_NE(m.cpuid(4, 0).eax, 0u);
}

TEST(CpuModel, BrandString) {
  const auto& m = CpuModel::deja_v1();
  std::string brand;
  for (uint32_t leaf = 0x80000002; leaf <= 0x80000004; ++leaf) {
    auto r = m.cpuid(leaf, 0);
    for (uint32_t reg : {r.eax, r.ebx, r.ecx, r.edx}) brand.append(reinterpret_cast<const char*>(&reg), 4);
  }
  EXPECT_EQ(std::string(brand.c_str()), "deja virtual CPU v1");
}

TEST(CpuModel, TheBaselineHasWhatLinuxNeedsAndNothingOfV2) {
  const CpuModel& m = CpuModel::x86_64_v1();
  for (const char* f : {"FPU", "PSE", "TSC", "MSR", "PAE", "CX8", "PGE", "CMOV", "MMX", "FXSR", "SSE", "SSE2", "SYSCALL", "NX", "LM"}) {
    EXPECT_TRUE(m.has(feature(f))) << f;
  }
  for (const char* f : {"POPCNT", "MOVBE", "ABM/LZCNT", "CX16", "SSE3", "LAHF_LM", "APIC", "XSAVE", "RDTSCP"}) {
    EXPECT_FALSE(m.has(feature(f))) << f;
  }
}

TEST(CpuModel, TracesFindTheirModelByNameOrByTheFirstVersion) {
  EXPECT_EQ(CpuModel::for_trace("", 1), &CpuModel::deja_v1()) << "traces before names: v1 = deja-v1";
  EXPECT_EQ(CpuModel::for_trace("x86-64-v1", 1), &CpuModel::x86_64_v1_version1()) << "the first x86-64-v1";
  EXPECT_EQ(CpuModel::for_trace("x86-64-v1", 3), &CpuModel::x86_64_v1());
  EXPECT_EQ(CpuModel::for_trace("x86-64-v2", 2), &CpuModel::x86_64_v2());
  EXPECT_EQ(CpuModel::for_trace("x86-64-v3", 3), &CpuModel::x86_64_v3());
  EXPECT_EQ(CpuModel::for_trace("deja-v1", 1), &CpuModel::deja_v1());
  for (auto [name, version] : {std::pair{"x86-64-v1", 2u}, {"x86-64-v2", 1u}, {"x86-64-v3", 1u}}) {
    const CpuModel* m = CpuModel::for_trace(name, version);
    ASSERT_NE(m, nullptr) << name << " version " << version;
    EXPECT_EQ(m->vendor(), "DejaVuReplay");
    EXPECT_EQ(m->hardware_features().size() + (std::string_view(name) == "x86-64-v3" ? 1 : 0),
              CpuModel::find(name)->hardware_features().size())
        << name << " (x86-64-v3 version 3 adds XGETBV(1))";
  }
  // x86-64-v3 version 2: version 3 without XGETBV(1), whose XINUSE is all of XCR0 (interp/exec_xsave.cpp).
  const CpuModel* v3_version2 = CpuModel::for_trace("x86-64-v3", 2);
  ASSERT_NE(v3_version2, nullptr);
  EXPECT_TRUE(v3_version2->is_amd());
  EXPECT_EQ(v3_version2->cpuid(0xd, 1).eax, 0x1u) << "XSAVEOPT only";
  EXPECT_EQ(CpuModel::x86_64_v3().cpuid(0xd, 1).eax, 0x5u) << "XSAVEOPT and XGETBV with ECX = 1";
  for (uint32_t leaf : {0u, 1u, 7u, 0x80000001u})
    EXPECT_EQ(v3_version2->cpuid(leaf, 0), CpuModel::x86_64_v3().cpuid(leaf, 0)) << std::hex << leaf;
  EXPECT_EQ(CpuModel::for_trace("x86-64-v1", 4), nullptr) << "a version this deja does not implement";
  EXPECT_EQ(CpuModel::for_trace("no-such-model", 1), nullptr);
  EXPECT_EQ(CpuModel::for_trace("", 2), nullptr);
  EXPECT_EQ(CpuModel::find("x86-64-v1"), &CpuModel::x86_64_v1()) << "--cpu names the newest version";
}

// The first x86-64-v1 is kept bit for bit (its traces replay unchanged); its second version adds MMX only.
TEST(CpuModel, X8664V1Version2AddsMmxOnly) {
  const CpuModel& first = CpuModel::x86_64_v1_version1();
  const CpuModel& second = *CpuModel::for_trace("x86-64-v1", 2);
  EXPECT_EQ(first.version(), 1u);
  EXPECT_EQ(second.version(), 2u);
  EXPECT_FALSE(first.has(feature("MMX")));
  EXPECT_TRUE(second.has(feature("MMX")));
  EXPECT_EQ(first.cpuid(1, 0).edx, 0x0709a179u) << "guest-tests/cpuid.expected-deja of the first version";
  EXPECT_EQ(second.cpuid(1, 0).edx, first.cpuid(1, 0).edx | (1u << 23));
  ASSERT_EQ(first.entries().size(), second.entries().size());
  for (size_t i = 0; i < first.entries().size(); ++i) {
    if (first.entries()[i].function == 1) continue;
    EXPECT_EQ(first.entries()[i].result, second.entries()[i].result) << "leaf " << first.entries()[i].function;
  }
}

// x86-64-v2 and -v3 are the psABI's levels (each the one before plus its features) and nothing else.
TEST(CpuModel, TheLevelsAreThePsAbis) {
  auto names = [](const CpuModel& m) {
    std::vector<std::string_view> out;
    for (const auto& f : m.hardware_features()) out.push_back(f.name);
    return out;
  };
  auto plus = [](std::vector<std::string_view> base, std::initializer_list<std::string_view> more) {
    base.insert(base.end(), more);
    std::sort(base.begin(), base.end());
    return base;
  };
  auto sorted = [](std::vector<std::string_view> v) {
    std::sort(v.begin(), v.end());
    return v;
  };
  const auto v1 = names(CpuModel::x86_64_v1());
  for (std::string_view f : {"CMOV", "CX8", "FPU", "FXSR", "MMX", "SSE", "SSE2", "SYSCALL"}) {
    EXPECT_NE(std::find(v1.begin(), v1.end(), f), v1.end()) << f;
  }
  EXPECT_EQ(sorted(names(CpuModel::x86_64_v2())),
            plus(v1, {"CX16", "LAHF_LM", "POPCNT", "SSE3", "SSSE3", "SSE4.1", "SSE4.2"}));
  EXPECT_EQ(sorted(names(CpuModel::x86_64_v3())),
            plus(names(CpuModel::x86_64_v2()),
                 {"AVX", "AVX2", "BMI1", "BMI2", "F16C", "FMA", "ABM/LZCNT", "MOVBE", "XSAVE",
                  "XGETBV_ECX1"}));  // (XSAVE's own sub-leaf: XINUSE reported)
  EXPECT_EQ(CpuModel::x86_64_v3().cpuid(0, 0).eax, 0xdu) << "leaf 0xD describes the XSAVE area";
  EXPECT_EQ(CpuModel::x86_64_v3().cpuid(0xd, 0).ecx, 832u) << "x87, SSE and AVX state";
  EXPECT_FALSE(CpuModel::x86_64_v3().has(feature("OSXSAVE"))) << "CR4.OSXSAVE is clear after reset";
  EXPECT_EQ(CpuModel::all().front(), &CpuModel::x86_64_v3()) << "the richest first";
}

// The legacy performance counters read as 0 and ignore writes on the models from x86-64-v1 version 2 on; the
// models before keep them #GP (their traces replay unchanged).
TEST(CpuModel, InertPerformanceCounterMsrs) {
  std::vector<const CpuModel*> models = {&CpuModel::x86_64_v1(), &CpuModel::x86_64_v2(), &CpuModel::x86_64_v3()};
  models.insert(models.end(), CpuModel::earlier_versions().begin() + 1, CpuModel::earlier_versions().end());
  for (const CpuModel* m : models) {
    for (uint32_t index = 0xc0010000; index <= 0xc0010007; ++index) {
      const ModelMsr* counter = m->msr(index);
      ASSERT_NE(counter, nullptr) << m->name() << " version " << m->version();
      EXPECT_EQ(counter->value, 0u);
      EXPECT_TRUE(counter->accepts(0x12345678abcdull));
    }
    for (uint32_t index : {0xc1u, 0xc2u, 0x186u, 0x187u}) EXPECT_NE(m->msr(index), nullptr) << m->name();
    EXPECT_EQ(m->msr(0xc0010008), nullptr);
    EXPECT_EQ(m->msr(0x10), nullptr) << "the TSC is the engine's";
  }
  EXPECT_EQ(CpuModel::deja_v1().msr(0xc0010000), nullptr);
  EXPECT_EQ(CpuModel::x86_64_v1_version1().msr(0xc0010004), nullptr);
  EXPECT_EQ(CpuModel::for_trace("x86-64-v3", 1)->msr(0xc0010015), nullptr) << "HWCR came with AuthenticAMD";
}

// The AMD MSRs Linux reads on the AMD path, as KVM answers them; bits a write may not set are #GP.
TEST(CpuModel, AmdMsrs) {
  const CpuModel& m = CpuModel::x86_64_v3();
  const ModelMsr* hwcr = m.msr(0xc0010015);
  ASSERT_NE(hwcr, nullptr);
  EXPECT_EQ(hwcr->value, 1ull << 24) << "TscFreqSel: the TSC counts at P0 frequency";
  EXPECT_TRUE(hwcr->accepts(hwcr->value | (1ull << 6))) << "K8's flush filter disable (Linux sets it)";
  EXPECT_FALSE(hwcr->accepts(1ull << 30)) << "IRPERF: CPUID.80000008H:EBX[1] is clear";
  ASSERT_NE(m.msr(0xc0011029), nullptr);
  EXPECT_EQ(m.msr(0xc0011029)->value, 0x2u) << "DE_CFG: LFENCE serializing";
  EXPECT_FALSE(m.msr(0xc0011029)->accepts(1ull << 9));
  ASSERT_NE(m.msr(0x8b), nullptr);
  EXPECT_EQ(m.msr(0x8b)->value, 0x01000065u) << "patch level";
  for (uint32_t index : {0xc0010010u, 0xc0010112u, 0xc0010113u, 0xc001001fu, 0xc0010055u, 0xc0010058u}) {
    ASSERT_NE(m.msr(index), nullptr) << std::hex << index;
    EXPECT_EQ(m.msr(index)->value, 0u);
  }
  EXPECT_FALSE(m.msr(0xc0010010)->accepts(1ull << 23)) << "SYSCFG's memory encryption cannot be enabled";
  EXPECT_EQ(m.msr(0xc0010140), nullptr) << "OSVW: CPUID.80000001H:ECX[9] is clear, so #GP";
  EXPECT_EQ(m.msr(0xc0011020), nullptr) << "LS_CFG: #GP, as under KVM (Linux probes it with rdmsr_safe)";
}

TEST(CpuModel, DejaV1ComesLastAndNamesAreUnique) {
  auto all = CpuModel::all();
  ASSERT_GE(all.size(), 2u);
  EXPECT_EQ(all.back(), &CpuModel::deja_v1());
  for (const CpuModel* m : all) EXPECT_EQ(CpuModel::find(m->name()), m);
}

TEST(CpuModel, FirstMissingNamesTheFeature) {
  const std::string_view provided[] = {"FPU", "TSC"};
  auto missing = CpuModel::x86_64_v1().first_missing(provided);
  ASSERT_TRUE(missing);
  EXPECT_EQ(missing->label(), "PSE (CPUID.01H:EDX[3])");
  EXPECT_EQ(CpuModel::x86_64_v1().hardware_features().front().name, "FPU");
}

// The APIC PC's variant of every model differs only in CPUID.1's APIC, x2APIC and TSC-deadline bits (and AMD's
// copy of the APIC bit in 80000001H).
TEST(CpuModel, LocalApicOnlyOnTheApicMachine) {
  for (const CpuModel* model : CpuModel::all()) {
    const CpuModel& pc = *model;
    const CpuModel& apic = pc.with_local_apic();
    EXPECT_EQ(&apic, &pc.with_local_apic()) << "built once";
    EXPECT_EQ(apic.name(), pc.name());
    EXPECT_EQ(apic.version(), pc.version());
    EXPECT_FALSE(pc.has(feature("APIC")));
    EXPECT_FALSE(pc.has(feature("X2APIC")));
    EXPECT_FALSE(pc.has(feature("TSC_DEADLINE")));
    CpuidResult leaf1 = apic.cpuid(1, 0);
    EXPECT_EQ(leaf1.edx, pc.cpuid(1, 0).edx | (1u << 9));
    EXPECT_EQ(leaf1.ecx, pc.cpuid(1, 0).ecx | (1u << 21) | (1u << 24));
    EXPECT_EQ(leaf1.ebx >> 24, 0u) << "initial APIC ID";
    EXPECT_EQ(apic.hardware_features().size(), pc.hardware_features().size()) << "the VMM provides the APIC";
    ASSERT_EQ(pc.entries().size(), apic.entries().size());
    for (size_t i = 0; i < pc.entries().size(); ++i) {
      const uint32_t function = pc.entries()[i].function;
      if (function == 1 || (pc.is_amd() && function == 0x80000001)) continue;  // (AMD repeats the APIC flag)
      EXPECT_EQ(pc.entries()[i].result, apic.entries()[i].result) << "leaf " << function;
    }
  }
}

}  // namespace
}  // namespace deja
