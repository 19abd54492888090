// CPU model: identity is deja's own, untrappable features are hidden, out-of-range leaves follow KVM.
#include "core/cpu_model.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

namespace deja {
namespace {

TEST(CpuModel, VendorIsDejasOwn) {
  auto r = CpuModel::deja_v1().cpuid(0, 0);
  char vendor[13] = {};
  std::memcpy(vendor, &r.ebx, 4);
  std::memcpy(vendor + 4, &r.edx, 4);
  std::memcpy(vendor + 8, &r.ecx, 4);
  EXPECT_STREQ(vendor, "DejaVuReplay");
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
  EXPECT_EQ(CpuModel::for_trace("x86-64-v1", 2), &CpuModel::x86_64_v1());
  EXPECT_EQ(CpuModel::for_trace("x86-64-v2", 1), &CpuModel::x86_64_v2());
  EXPECT_EQ(CpuModel::for_trace("x86-64-v3", 1), &CpuModel::x86_64_v3());
  EXPECT_EQ(CpuModel::for_trace("deja-v1", 1), &CpuModel::deja_v1());
  EXPECT_EQ(CpuModel::for_trace("x86-64-v1", 3), nullptr) << "a version this deja does not implement";
  EXPECT_EQ(CpuModel::for_trace("no-such-model", 1), nullptr);
  EXPECT_EQ(CpuModel::for_trace("", 2), nullptr);
  EXPECT_EQ(CpuModel::find("x86-64-v1"), &CpuModel::x86_64_v1()) << "--cpu names the newest version";
}

// The first x86-64-v1 is kept bit for bit (its traces replay unchanged); its second version adds MMX only.
TEST(CpuModel, X8664V1Version2AddsMmxOnly) {
  const CpuModel& first = CpuModel::x86_64_v1_version1();
  const CpuModel& second = CpuModel::x86_64_v1();
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
                 {"AVX", "AVX2", "BMI1", "BMI2", "F16C", "FMA", "ABM/LZCNT", "MOVBE", "XSAVE"}));
  EXPECT_EQ(CpuModel::x86_64_v3().cpuid(0, 0).eax, 0xdu) << "leaf 0xD describes the XSAVE area";
  EXPECT_EQ(CpuModel::x86_64_v3().cpuid(0xd, 0).ecx, 832u) << "x87, SSE and AVX state";
  EXPECT_FALSE(CpuModel::x86_64_v3().has(feature("OSXSAVE"))) << "CR4.OSXSAVE is clear after reset";
  EXPECT_EQ(CpuModel::all().front(), &CpuModel::x86_64_v3()) << "the richest first";
}

// The legacy performance counters read as 0 and ignore writes on the models from x86-64-v1 version 2 on; the
// models before keep them #GP (their traces replay unchanged).
TEST(CpuModel, InertPerformanceCounterMsrs) {
  for (const CpuModel* m : {&CpuModel::x86_64_v1(), &CpuModel::x86_64_v2(), &CpuModel::x86_64_v3()}) {
    for (uint32_t msr = 0xc0010000; msr <= 0xc0010007; ++msr) EXPECT_TRUE(m->inert_msr(msr)) << m->name();
    for (uint32_t msr : {0xc1u, 0xc2u, 0x186u, 0x187u}) EXPECT_TRUE(m->inert_msr(msr)) << m->name();
    EXPECT_FALSE(m->inert_msr(0xc0010008));
    EXPECT_FALSE(m->inert_msr(0x10));
  }
  EXPECT_FALSE(CpuModel::deja_v1().inert_msr(0xc0010000));
  EXPECT_FALSE(CpuModel::x86_64_v1_version1().inert_msr(0xc0010004));
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

// The APIC PC's variant of every model differs only in CPUID.1's APIC, x2APIC and TSC-deadline bits.
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
      if (pc.entries()[i].function == 1) continue;
      EXPECT_EQ(pc.entries()[i].result, apic.entries()[i].result) << "leaf " << pc.entries()[i].function;
    }
  }
}

}  // namespace
}  // namespace deja
