// The KVM usability check's algorithm, on any host: it passes on a faithful vCPU (the software CPU) and names each fault of an emulating one.
#include <gtest/gtest.h>

#include <unistd.h>

#include <chrono>
#include <functional>
#include <string>
#include <thread>

#include "interp/interp_backend.h"
#include "kvm/kvm_usability.h"

extern "C" const uint8_t deja_usability_guest_begin[], deja_probe_loop[], deja_probe_sse[], deja_probe_cpuid[],
    deja_probe_lzcnt[], deja_probe_avx2[], deja_probe_xsetbv[];

namespace deja {
namespace {

constexpr uint64_t kCode = 0x10000;  // where kvm_usability.cpp loads the snippets
uint64_t at(const uint8_t* snippet) { return kCode + uint64_t(snippet - deja_usability_guest_begin); }

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

const HostCheck& check(const KvmUsability& r, const std::string& name) {
  for (const auto& c : r.checks) {
    if (c.name == name) return c;
  }
  ADD_FAILURE() << "no check named " << name;
  static const HostCheck none;
  return none;
}

UsabilityProbeHost interp_host() {
  // The software CPU is slower than hardware KVM but faithful; the speed limit is lifted for it (and for
  // the sanitizer build).
  return {.make_vcpu = [](GuestMemory& memory, const CpuModel& model) { return make_interp_backend(memory, model); },
          .max_ns_per_iteration = 1'000'000};
}

const CpuModel* richest_interp_model() {
  for (const CpuModel* m : CpuModel::all()) {
    if (!m->first_missing(interp_features())) return m;
  }
  return nullptr;
}

TEST(KvmUsability, PassesOnAFaithfulVcpu) {
  KvmUsability r = check_kvm_usability_with(interp_host());
  EXPECT_TRUE(r.usable()) << r.failures();
  EXPECT_EQ(r.checks.size(), 9u);
  ASSERT_FALSE(r.models.empty());
  // The richest model: every model the vCPU implements (the software CPU: x86-64-v3 on a host with AVX2) runs.
  EXPECT_EQ(r.default_model(), richest_interp_model());
  EXPECT_TRUE(r.supports(*richest_interp_model()));
  EXPECT_TRUE(r.supports(CpuModel::x86_64_v1()));
  EXPECT_EQ(r.summary(), "");
  EXPECT_TRUE(contains(check(r, "guest code runs natively").detail, "20,000-iteration loop took"));
  EXPECT_EQ(check(r, "interrupt window").detail, "exit right after STI's shadow");
  EXPECT_TRUE(contains(check(r, "architectural details").detail, "as the SDM says"))
      << check(r, "architectural details").detail;
  EXPECT_TRUE(r.cpu_quirks.empty());
}

// QEMU's TCG (the nested harness) leaves a descriptor's accessed bit clear on IRET and writes FXSAVE images and x87
// environments of its own: the check finds each quirk, on the software CPU told to reproduce them (as the replay of such a trace tells it).
TEST(KvmUsability, FindsEachQuirkOfQemuTcg) {
  const std::vector<std::string> all{std::string(kCpuQuirkAccessedBitOnlyBySegmentLoads),
                                     std::string(kCpuQuirkFxsaveNoX87Pointers),
                                     std::string(kCpuQuirkFxsaveSkipsReservedBytes),
                                     std::string(kCpuQuirkX87EnvironmentZeroExtended)};
  for (const std::vector<std::string>& quirks : {std::vector<std::string>{all[0]}, std::vector<std::string>{all[1]},
                                                  std::vector<std::string>{all[2]}, std::vector<std::string>{all[3]},
                                                  all}) {
    UsabilityProbeHost host{.make_vcpu = [&](GuestMemory& memory, const CpuModel& model) -> Result<std::unique_ptr<Backend>> {
                              auto cpu = std::make_unique<InterpBackend>(memory, model);
                              if (auto ok = cpu->adopt_cpu_quirks(quirks); !ok) return std::unexpected(ok.error());
                              return cpu;
                            },
                            .max_ns_per_iteration = 1'000'000};
    KvmUsability r = check_kvm_usability_with(host);
    EXPECT_TRUE(r.usable()) << r.failures();
    EXPECT_EQ(r.cpu_quirks, quirks);
    EXPECT_TRUE(contains(check(r, "architectural details").detail, "QEMU's TCG does"));
  }
}

// A vCPU that is the software CPU except where a test makes it misbehave like an imperfect KVM.
class AlteredVcpu : public Backend {
 public:
  AlteredVcpu(GuestMemory& memory, const CpuModel& model) : inner_(memory, model) {}
  std::string_view name() const override { return "kvm"; }
  Result<CpuState> get_state() override { return inner_.get_state(); }
  Result<> set_state(const CpuState& s) override { return inner_.set_state(s); }
  bool can_inject_interrupt() override { return inner_.can_inject_interrupt(); }
  Result<> inject_interrupt(uint8_t v) override { return inner_.inject_interrupt(v); }
  void request_interrupt_window(bool e) override { inner_.request_interrupt_window(e); }
  void kick() override { inner_.kick(); }
  ProgressCounter* progress_counter() override { return nullptr; }
  std::optional<uint64_t> instruction_count() const override { return std::nullopt; }
  Result<> set_debug(const DebugControl& c) override { return inner_.set_debug(c); }

 protected:
  // Replaces the answer a snippet entered at `entry` leaves in register `reg` at its HLT.
  Result<VcpuExit*> run_and_alter(uint64_t entry, int reg, uint64_t (*alter)(uint64_t, const CpuState& before)) {
    auto before = inner_.get_state();
    if (!before) return std::unexpected(before.error());
    auto exit = inner_.run();
    if (exit && (*exit)->kind == ExitKind::kHlt && before->rip == entry) {
      auto after = inner_.get_state();
      after->gpr[reg] = alter(after->gpr[reg], *before);
      (void)inner_.set_state(*after);
    }
    return exit;
  }
  InterpBackend inner_;
};

// LZCNT run as BSR (as on kvm-pvm).
class LzcntAsBsr final : public AlteredVcpu {
 public:
  using AlteredVcpu::AlteredVcpu;
  Result<VcpuExit*> run() override {
    return run_and_alter(at(deja_probe_lzcnt), kRax, [](uint64_t, const CpuState&) -> uint64_t { return 0; });
  }
};

// kvm-pvm as measured (design.md): CPL0 code emulated at about a microsecond an instruction, SSE an emulation
// failure, CPUID answered from the host, LZCNT run as BSR.
class EmulatingKvm final : public AlteredVcpu {
 public:
  using AlteredVcpu::AlteredVcpu;
  Result<VcpuExit*> run() override {
    auto st = inner_.get_state();
    if (!st) return std::unexpected(st.error());
    if (st->rip == at(deja_probe_sse)) {
      fault_ = VcpuExit{};
      fault_.kind = ExitKind::kFault;
      fault_.rip = st->rip;
      fault_.detail = "KVM internal error (KVM_EXIT_INTERNAL_ERROR): suberror 1 (emulation failure), data: 0x1\nrax=...";
      return &fault_;
    }
    if (st->rip == at(deja_probe_loop)) std::this_thread::sleep_for(std::chrono::microseconds(st->gpr[kRdi]));
    if (st->rip == at(deja_probe_lzcnt)) {
      return run_and_alter(at(deja_probe_lzcnt), kRax, [](uint64_t, const CpuState&) -> uint64_t { return 0; });
    }
    // The host's XSAVE bit leaks into leaf 1.
    return run_and_alter(at(deja_probe_cpuid), kRcx, [](uint64_t ecx, const CpuState& before) -> uint64_t {
      return before.gpr[kRdi] == 1 ? ecx | (1u << 26) : ecx;
    });
  }

 private:
  VcpuExit fault_;
};

TEST(KvmUsability, NamesEachFaultOfAnEmulatingKvm) {
  UsabilityProbeHost host{.make_vcpu = [](GuestMemory& memory, const CpuModel& model) -> Result<std::unique_ptr<Backend>> {
    return std::make_unique<EmulatingKvm>(memory, model);
  }};
  KvmUsability r = check_kvm_usability_with(host);
  EXPECT_FALSE(r.usable());
  EXPECT_TRUE(check(r, "/dev/kvm opens").passed);
  const HostCheck& speed = check(r, "guest code runs natively");
  EXPECT_FALSE(speed.passed);
  EXPECT_TRUE(contains(speed.detail, "guest kernel code is emulated: a 20,000-iteration loop took")) << speed.detail;
  const HostCheck& sse = check(r, "SSE executes");
  EXPECT_FALSE(sse.passed);
  EXPECT_EQ(sse.detail, "SSE stops with an emulation failure (KVM_EXIT_INTERNAL_ERROR)");
  const HostCheck& cpuid = check(r, "CPUID answers from the model");
  EXPECT_FALSE(cpuid.passed);
  EXPECT_TRUE(contains(cpuid.detail, "leaf 0x1:")) << cpuid.detail;
  // SSE fails in every model (each has SSE); the first model's failure is named.
  const HostCheck& features = check(r, "CPU model features execute");
  EXPECT_FALSE(features.passed);
  EXPECT_TRUE(contains(features.detail, "no CPU model runs here")) << features.detail;
  EXPECT_TRUE(check(r, "single-step").passed) << check(r, "single-step").detail;
  EXPECT_TRUE(check(r, "interrupt window").passed) << check(r, "interrupt window").detail;
  // The one-line summary: the first two failures, then how many more.
  EXPECT_TRUE(contains(r.summary(), "guest kernel code is emulated")) << r.summary();
  EXPECT_TRUE(contains(r.summary(), "SSE stops with an emulation failure")) << r.summary();
  EXPECT_TRUE(contains(r.summary(), "and 2 more checks failed")) << r.summary();
  EXPECT_FALSE(r.supports(CpuModel::x86_64_v1()));
}

TEST(KvmUsability, AWrongAnswerIsNamedWithWhatCameBack) {
  // Only LZCNT wrong (BSR's answer): deja-v1 (which has LZCNT) is refused, the baseline is not.
  UsabilityProbeHost host{.make_vcpu = [](GuestMemory& memory, const CpuModel& model) -> Result<std::unique_ptr<Backend>> {
                            return std::make_unique<LzcntAsBsr>(memory, model);
                          },
                          .max_ns_per_iteration = 1'000'000};
  KvmUsability r = check_kvm_usability_with(host);
  EXPECT_TRUE(r.usable()) << r.failures();
  auto refused = r.supports(CpuModel::deja_v1());
  ASSERT_FALSE(refused);
  EXPECT_TRUE(contains(refused.error().message,
                       "deja-v1: ABM/LZCNT returned 0 where 0x1f is right (BSR's answer: the instruction was run as BSR)"))
      << refused.error().message;
  EXPECT_TRUE(r.supports(CpuModel::x86_64_v1()));
}

// A KVM whose leaf 0DH keeps the reset size whatever XCR0 enables, one without AVX2, one that loses the guest's own
// XSETBV: x86-64-v3 is refused naming what went wrong, and the default is the richest model left.
class StaticXsaveSize final : public AlteredVcpu {
 public:
  using AlteredVcpu::AlteredVcpu;
  Result<VcpuExit*> run() override {
    return run_and_alter(at(deja_probe_cpuid), kRbx, [](uint64_t ebx, const CpuState& before) -> uint64_t {
      return before.gpr[kRdi] == 0xd && before.gpr[kRsi] == 0 ? 576 : ebx;
    });
  }
};

// Raises #UD in one snippet, as a host without the feature does (the #UD stub reports vector 6 on port 0xe0).
class UdAt final : public AlteredVcpu {
 public:
  UdAt(GuestMemory& memory, const CpuModel& model, const uint8_t* snippet)
      : AlteredVcpu(memory, model), at_(at(snippet)) {}
  Result<VcpuExit*> run() override {
    auto st = inner_.get_state();
    if (st && st->rip == at_) {
      ud_ = VcpuExit{};
      ud_.kind = ExitKind::kIoOut;
      ud_.port = 0xe0;
      ud_.value = 6;
      ud_.rip = st->rip;
      return &ud_;
    }
    return inner_.run();
  }

 private:
  uint64_t at_;
  VcpuExit ud_;
};

TEST(KvmUsability, AnXsaveModelNeedsEveryFeatureAndTheRunTimeCpuid) {
  if (richest_interp_model() != &CpuModel::x86_64_v3()) GTEST_SKIP() << "the software CPU has no x86-64-v3 here";
  struct Case {
    std::function<std::unique_ptr<Backend>(GuestMemory&, const CpuModel&)> make;
    std::string refusal;
  };
  const Case cases[] = {
      {[](GuestMemory& m, const CpuModel& model) { return std::make_unique<StaticXsaveSize>(m, model); },
       "x86-64-v3: CPUID leaf 0xd: the guest read 00000007 00000240 00000340 00000000, model x86-64-v3 says 00000007 "
       "00000340 00000340 00000000 with CR4.OSXSAVE set and XCR0 = 0x7"},
      {[](GuestMemory& m, const CpuModel& model) { return std::make_unique<UdAt>(m, model, deja_probe_avx2); },
       "x86-64-v3: AVX2 raises #UD (vector 6)"},
      // QEMU 7.2's TCG under nested KVM: the guest's XSETBV never reaches KVM, which restores XCR0 = 1 at the next
      // entry, so the AVX instruction after it raises #UD.
      {[](GuestMemory& m, const CpuModel& model) { return std::make_unique<UdAt>(m, model, deja_probe_xsetbv); },
       "x86-64-v3: XSETBV in the guest: the AVX state it enabled was lost at the next exit to KVM (the sum raises #UD "
       "(vector 6)): KVM never saw the XSETBV"},
  };
  for (const Case& c : cases) {
    UsabilityProbeHost host{.make_vcpu = [&](GuestMemory& memory, const CpuModel& model)
                                -> Result<std::unique_ptr<Backend>> { return c.make(memory, model); },
                            .max_ns_per_iteration = 1'000'000};
    KvmUsability r = check_kvm_usability_with(host);
    EXPECT_TRUE(r.usable()) << r.failures();
    EXPECT_EQ(r.default_model(), &CpuModel::x86_64_v2());
    auto refused = r.supports(CpuModel::x86_64_v3());
    ASSERT_FALSE(refused);
    EXPECT_TRUE(contains(refused.error().message, c.refusal)) << refused.error().message;
  }
}

TEST(KvmUsability, NoVmMeansOneFailedCheckAndNothingElse) {
  UsabilityProbeHost host{.make_vcpu = [](GuestMemory&, const CpuModel&) -> Result<std::unique_ptr<Backend>> {
    return fail(ErrorKind::kUnsupported, "/dev/kvm does not exist: this host has no KVM");
  }};
  KvmUsability r = check_kvm_usability_with(host);
  ASSERT_EQ(r.checks.size(), 1u);
  EXPECT_EQ(r.checks[0].name, "/dev/kvm opens");
  EXPECT_FALSE(r.usable());
  EXPECT_EQ(r.summary(), "/dev/kvm does not exist: this host has no KVM");
  EXPECT_EQ(r.default_model(), nullptr);
}

// On this host: the result agrees with independent evidence of what the host is.
TEST(KvmUsability, AgreesWithWhatThisHostIs) {
  const KvmUsability& r = kvm_usability();
  if (::access("/dev/kvm", F_OK) != 0) {
    EXPECT_FALSE(r.usable());
    EXPECT_EQ(r.checks.front().name, "/dev/kvm opens");
  } else if (host_kvm_is_pvm()) {
    EXPECT_FALSE(r.usable());
    EXPECT_FALSE(check(r, "guest code runs natively").passed);
  }
  // Where the host is an emulating KVM, the check stays well under a second.
  EXPECT_LT(r.elapsed_ns, 2'000'000'000u) << r.elapsed_ns;
}

}  // namespace
}  // namespace deja
