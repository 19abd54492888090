// Tests of the KVM backend's use of the kvm-deja module: RDTSC exits and their completion with it, unchanged behaviour without it.
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kvm/kvm_backend.h"
#include "tests/kvm/kvm_test_support.h"

namespace deja {
namespace {

constexpr uint64_t kRamSize = 1 << 20;
constexpr uint64_t kGdt = 0x500;
constexpr uint64_t kCode = 0x10000;
constexpr uint16_t kData32 = 0x10, kCode32 = 0x18;

// DEJA_EXPECT_KVM_DEJA=1 / 0 (set by tests/kvm/kvm_deja_test.sh) says which KVM this run must find, so a module
// that silently failed to load cannot pass as "stock" and vice versa; unset, the tests follow what the host has.
std::optional<bool> expected_module() {
  const char* v = std::getenv("DEJA_EXPECT_KVM_DEJA");
  if (v == nullptr) return std::nullopt;
  return std::string(v) == "1";
}

class KvmDejaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    DEJA_REQUIRE_USABLE_KVM();
  }

  // A VM in 32-bit flat protected mode (no IDT: an exception ends in a triple fault) running `code` at kCode.
  void boot(const std::vector<uint8_t>& code, bool trap_rdtsc = true) {
    auto memory = GuestMemory::create(kRamSize);
    ASSERT_TRUE(memory) << memory.error().message;
    memory_.emplace(std::move(*memory));
    auto backend = make_kvm_backend(*memory_, kvm_test_model(), KvmOptions{.trap_rdtsc = trap_rdtsc});
    ASSERT_TRUE(backend) << backend.error().message;
    backend_ = std::move(*backend);
    const uint64_t gdt[] = {0, 0, 0x00cf93000000ffffull, 0x00cf9b000000ffffull};
    ASSERT_TRUE(memory_->write(Gpa{kGdt}, std::span(reinterpret_cast<const uint8_t*>(gdt), sizeof(gdt))));
    ASSERT_TRUE(memory_->write(Gpa{kCode}, std::span(code.data(), code.size())));
    CpuState s;
    s.rip = kCode;
    s.cs = SegmentReg{.limit = 0xffffffff, .selector = kCode32, .type = 0xb, .present = true, .s = true, .db = true,
                      .g = true};
    s.ds = s.es = s.fs = s.gs = s.ss = SegmentReg{.limit = 0xffffffff, .selector = kData32, .type = 0x3,
                                                   .present = true, .s = true, .db = true, .g = true};
    s.gdt = {kGdt, 4 * 8 - 1};
    s.cr0 = cr0::kPe | cr0::kEt;
    auto ok = backend_->set_state(s);
    ASSERT_TRUE(ok) << ok.error().message;
  }

  VcpuExit* run() {
    auto exit = backend_->run();
    EXPECT_TRUE(exit) << exit.error().message;
    return exit ? *exit : nullptr;
  }

  bool module_present() {
    bool traps = backend_->traps_rdtsc();
    if (auto want = expected_module()) {
      EXPECT_EQ(traps, *want) << (traps ? "the kvm-deja module traps RDTSC, but stock KVM was expected"
                                        : "expected the kvm-deja module: " + backend_->rdtsc_untrapped_reason());
    }
    return traps;
  }

  std::optional<GuestMemory> memory_;
  std::unique_ptr<Backend> backend_;
};

// rdtsc; hlt
const std::vector<uint8_t> kRdtscHlt = {0x0f, 0x31, 0xf4};

TEST_F(KvmDejaTest, RdtscExitsWithTheModuleAndTheVmmChoosesTheValue) {
  ASSERT_NO_FATAL_FAILURE(boot(kRdtscHlt));
  if (!module_present()) {
    // Stock KVM: the guest reads the TSC itself; deja sees nothing until HLT and says why.
    EXPECT_FALSE(backend_->rdtsc_untrapped_reason().empty());
    VcpuExit* exit = run();
    ASSERT_NE(exit, nullptr);
    EXPECT_EQ(exit->kind, ExitKind::kHlt) << exit_kind_name(exit->kind);
    return;
  }
  VcpuExit* exit = run();
  ASSERT_NE(exit, nullptr);
  ASSERT_EQ(exit->kind, ExitKind::kRdtsc) << exit_kind_name(exit->kind) << " " << exit->detail;
  EXPECT_EQ(exit->rip, kCode);  // RIP still at the RDTSC
  EXPECT_FALSE(exit->is_rdtscp);
  exit->value = 0x1122334455667788ull;
  exit = run();
  ASSERT_NE(exit, nullptr);
  EXPECT_EQ(exit->kind, ExitKind::kHlt) << exit_kind_name(exit->kind);
  auto state = backend_->get_state();
  ASSERT_TRUE(state) << state.error().message;
  EXPECT_EQ(state->gpr[kRax], 0x55667788u);
  EXPECT_EQ(state->gpr[kRdx], 0x11223344u);
  EXPECT_EQ(state->rip, kCode + 3);  // past RDTSC and HLT: the completion skipped the RDTSC
}

TEST_F(KvmDejaTest, AVmThatDoesNotAskIsUnchanged) {
  // trap_rdtsc = false is what replay of a stock-KVM recording asks for: the module must not exit RDTSC then.
  ASSERT_NO_FATAL_FAILURE(boot(kRdtscHlt, /*trap_rdtsc=*/false));
  EXPECT_FALSE(backend_->traps_rdtsc());
  VcpuExit* exit = run();
  ASSERT_NE(exit, nullptr);
  EXPECT_EQ(exit->kind, ExitKind::kHlt) << exit_kind_name(exit->kind);
}

TEST_F(KvmDejaTest, ManyRdtscsEachExitInOrder) {
  // mov ecx, 5; loop: rdtsc; mov [0x20000 + ecx*4], eax; dec ecx; jnz loop; hlt
  ASSERT_NO_FATAL_FAILURE(boot({0xb9, 0x05, 0x00, 0x00, 0x00, 0x0f, 0x31, 0x89, 0x04, 0x8d, 0x00, 0x00, 0x02, 0x00,
                                0x49, 0x75, 0xf4, 0xf4}));
  if (!module_present()) {
    // Stock KVM: the loop runs through without the VMM seeing any RDTSC.
    VcpuExit* exit = run();
    ASSERT_NE(exit, nullptr);
    EXPECT_EQ(exit->kind, ExitKind::kHlt) << exit_kind_name(exit->kind);
    return;
  }
  for (uint32_t i = 5; i >= 1; --i) {
    VcpuExit* exit = run();
    ASSERT_NE(exit, nullptr);
    ASSERT_EQ(exit->kind, ExitKind::kRdtsc) << "iteration " << i << ": " << exit_kind_name(exit->kind);
    EXPECT_EQ(exit->rip, kCode + 5);
    exit->value = 1000 + i;
  }
  VcpuExit* exit = run();
  ASSERT_NE(exit, nullptr);
  EXPECT_EQ(exit->kind, ExitKind::kHlt);
  for (uint32_t i = 5; i >= 1; --i) {
    uint32_t stored = 0;
    ASSERT_TRUE(memory_->read(Gpa{0x20000 + i * 4}, std::span(reinterpret_cast<uint8_t*>(&stored), 4)));
    EXPECT_EQ(stored, 1000 + i);
  }
}

TEST_F(KvmDejaTest, RdtscpStaysHiddenAndRaisesUd) {
  // CPU model v1 hides RDTSCP; with or without the module it must fault (#UD; with no IDT a triple fault), never
  // exit to the VMM or read the host's TSC_AUX.
  ASSERT_NO_FATAL_FAILURE(boot({0x0f, 0x01, 0xf9, 0xf4}));
  bool module = module_present();
  VcpuExit* exit = run();
  ASSERT_NE(exit, nullptr);
  if (std::getenv("DEJA_NESTED_TCG") != nullptr) {
    // QEMU's software SVM (the nested harness) ignores the RDTSCP intercept and checks only the RDTSC one
    // for RDTSCP (helper_rdtscp calls helper_rdtsc): stock KVM's #UD never happens and the instruction runs,
    // and with the module it exits as an RDTSC. Real AMD and Intel CPUs take the RDTSCP intercept.
    EXPECT_EQ(exit->kind, module ? ExitKind::kRdtsc : ExitKind::kHlt) << exit_kind_name(exit->kind);
    return;
  }
  EXPECT_EQ(exit->kind, ExitKind::kShutdown) << exit_kind_name(exit->kind);
}

}  // namespace
}  // namespace deja
