// Tests of the PMU table, CPU detection, perf_event_open error handling, the self-test's verdicts and its calibration guests (host-runnable).
#include <fcntl.h>
#include <linux/perf_event.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "interp/interp_backend.h"
#include "kvm/kvm_backend.h"
#include "kvm/perf_counter.h"
#include "kvm/pmu.h"
#include "kvm/pmu_selftest.h"
#include "core/cpu_model.h"

namespace deja {
namespace {

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

PmuModel model_of(const char* vendor, uint32_t family, uint32_t model) {
  auto row = pmu_model_for(CpuIdentity{.vendor = vendor, .family = family, .model = model});
  EXPECT_TRUE(row) << vendor << " " << family << " " << model << ": " << row.error().message;
  return row ? *row : PmuModel{};
}

std::string unsupported(const char* vendor, uint32_t family, uint32_t model) {
  auto row = pmu_model_for(CpuIdentity{.vendor = vendor, .family = family, .model = model});
  EXPECT_FALSE(row) << "expected " << vendor << " family " << family << " model " << model << " to be unsupported";
  if (row) return "";
  EXPECT_EQ(row.error().kind, ErrorKind::kUnsupported);
  return row.error().message;
}

TEST(PmuTable, DecodesCpuidSignatures) {
  // Kaby Lake desktop (i7-7700): base family 6, extended model 9, model 0xe, stepping 9.
  CpuIdentity kaby = cpu_identity_from_signature("GenuineIntel", 0x000906e9);
  EXPECT_EQ(kaby.family, 6u);
  EXPECT_EQ(kaby.model, 0x9eu);
  EXPECT_EQ(kaby.stepping, 9u);
  // AMD adds the extended family only when the base family is 0xF: Zen 3 Vermeer 0x00a20f10 = F19h model 21h.
  CpuIdentity vermeer = cpu_identity_from_signature("AuthenticAMD", 0x00a20f10);
  EXPECT_EQ(vermeer.family, 0x19u);
  EXPECT_EQ(vermeer.model, 0x21u);
  CpuIdentity matisse = cpu_identity_from_signature("AuthenticAMD", 0x00870f10);  // Zen 2
  EXPECT_EQ(matisse.family, 0x17u);
  EXPECT_EQ(matisse.model, 0x71u);
  // Family 5 (Pentium): the extended model is not part of the model number.
  CpuIdentity p5 = cpu_identity_from_signature("GenuineIntel", 0x00010543);
  EXPECT_EQ(p5.family, 5u);
  EXPECT_EQ(p5.model, 4u);
}

TEST(PmuTable, IntelCoresMapToRrEventsAndSkids) {
  struct Case {
    uint32_t model;
    const char* id;
    uint64_t raw;
    uint64_t skid;
  };
  const Case cases[] = {
      {0x1a, "intel-nehalem", 0x5101c4, 100},      {0x2a, "intel-sandybridge", 0x5101c4, 100},
      {0x3c, "intel-haswell", 0x5101c4, 100},      {0x4f, "intel-broadwell", 0x5101c4, 100},
      {0x5e, "intel-skylake", 0x5101c4, 100},      {0x55, "intel-skylake", 0x5101c4, 100},
      {0x9e, "intel-kabylake", 0x5101c4, 100},     {0xa5, "intel-cometlake", 0x5101c4, 100},
      {0x5c, "intel-goldmont", 0x517ec4, 100},     {0x7e, "intel-icelake", 0x5111c4, 100},
      {0x8c, "intel-tigerlake", 0x5111c4, 100},    {0xa7, "intel-rocketlake", 0x5111c4, 100},
      {0x97, "intel-alderlake", 0x5111c4, 125},    {0xb7, "intel-raptorlake", 0x5111c4, 125},
      {0x8f, "intel-sapphirerapids", 0x5111c4, 125}, {0xaa, "intel-meteorlake", 0x5111c4, 125},
      {0xc6, "intel-arrowlake", 0x100005111c4, 125},
  };
  for (const auto& c : cases) {
    PmuModel m = model_of("GenuineIntel", 6, c.model);
    EXPECT_EQ(m.id, c.id) << "model " << std::hex << c.model;
    EXPECT_EQ(m.raw_event, c.raw) << c.id;
    EXPECT_EQ(m.skid, c.skid) << c.id;
    EXPECT_FALSE(m.amd_zen) << c.id;
    EXPECT_FALSE(m.skid_unbounded) << c.id;
  }
  EXPECT_TRUE(model_of("GenuineIntel", 6, 0x97).intel_hybrid_capable);
  EXPECT_FALSE(model_of("GenuineIntel", 6, 0x5e).intel_hybrid_capable);
}

TEST(PmuTable, AmdZenGenerationsUseRetiredConditionalBranches) {
  struct Case {
    uint32_t family, model;
    const char* id;
  };
  const Case cases[] = {{0x17, 0x01, "amd-zen"},  {0x17, 0x08, "amd-zen"},  {0x17, 0x31, "amd-zen2"},
                        {0x17, 0x71, "amd-zen2"}, {0x17, 0x60, "amd-zen2"}, {0x19, 0x21, "amd-zen3"},
                        {0x19, 0x01, "amd-zen3"}, {0x19, 0x50, "amd-zen3"}, {0x19, 0x61, "amd-zen4"},
                        {0x19, 0x74, "amd-zen4"}, {0x19, 0x11, "amd-zen4"}, {0x1a, 0x24, "amd-zen5"},
                        {0x1a, 0x02, "amd-zen5"}};
  for (const auto& c : cases) {
    PmuModel m = model_of("AuthenticAMD", c.family, c.model);
    EXPECT_EQ(m.id, c.id) << std::hex << c.family << "/" << c.model;
    EXPECT_EQ(m.raw_event, 0x5100d1u) << c.id;
    EXPECT_EQ(m.skid, 10000u) << c.id;
    EXPECT_TRUE(m.skid_unbounded) << c.id;
    EXPECT_TRUE(m.amd_zen) << c.id;
  }
}

TEST(PmuTable, UnsupportedCpusAreNamedWithTheReason) {
  std::string merom = unsupported("GenuineIntel", 6, 0x0f);
  EXPECT_TRUE(contains(merom, "Intel Merom")) << merom;
  EXPECT_TRUE(contains(merom, "model 0xf")) << merom;
  std::string penryn = unsupported("GenuineIntel", 6, 0x17);
  EXPECT_TRUE(contains(penryn, "Intel Penryn")) << penryn;
  std::string unknown = unsupported("GenuineIntel", 6, 0x01);
  EXPECT_TRUE(contains(unknown, "GenuineIntel family 6 model 0x1")) << unknown;
  EXPECT_TRUE(contains(unknown, "kIntelRows")) << "says where to add it: " << unknown;
  std::string p4 = unsupported("GenuineIntel", 0xf, 0x4);
  EXPECT_TRUE(contains(p4, "family 0xf model 0x4")) << p4;
  std::string f15 = unsupported("AuthenticAMD", 0x15, 0x02);
  EXPECT_TRUE(contains(f15, "taken branches")) << f15;
  // What QEMU's TCG "max"/qemu64 CPU reports inside the nested harness.
  std::string qemu = unsupported("AuthenticAMD", 0xf, 0x6b);
  EXPECT_TRUE(contains(qemu, "AuthenticAMD family 0xf model 0x6b")) << qemu;
  std::string hygon = unsupported("HygonGenuine", 0x18, 0x01);
  EXPECT_TRUE(contains(hygon, "'HygonGenuine'")) << hygon;
  EXPECT_TRUE(contains(hygon, "family 0x18 model 0x1")) << hygon;
}

TEST(PmuTable, SupportedListHasEveryUsableRowOnce) {
  auto models = supported_pmu_models();
  std::set<std::string> ids;
  for (const auto& m : models) {
    EXPECT_TRUE(ids.insert(m.id).second) << "duplicate " << m.id;
    EXPECT_NE(m.raw_event, 0u) << m.id;
    EXPECT_GT(m.skid, 0u) << m.id;
  }
  EXPECT_TRUE(ids.contains("intel-skylake"));
  EXPECT_TRUE(ids.contains("amd-zen4"));
  EXPECT_FALSE(ids.contains("intel-merom"));
}

TEST(PmuTable, HostDetectionAgreesWithProcCpuinfo) {
  CpuIdentity host = host_cpu_identity();
  ASSERT_FALSE(host.vendor.empty());
  std::ifstream cpuinfo("/proc/cpuinfo");
  if (!cpuinfo) GTEST_SKIP() << "no /proc/cpuinfo";
  std::string line, vendor;
  int family = -1, model = -1;
  while (std::getline(cpuinfo, line) && (vendor.empty() || family < 0 || model < 0)) {
    auto value = line.substr(line.find(':') == std::string::npos ? line.size() : line.find(':') + 1);
    if (line.starts_with("vendor_id")) vendor = value.substr(value.find_first_not_of(' '));
    if (line.starts_with("cpu family")) family = std::atoi(value.c_str());
    if (line.starts_with("model\t")) model = std::atoi(value.c_str());
  }
  EXPECT_EQ(host.vendor, vendor);
  EXPECT_EQ(static_cast<int>(host.family), family);
  EXPECT_EQ(static_cast<int>(host.model), model);
}

// A scripted perf_event_open: records what it was asked and answers from a queue of results.
struct FakePerf {
  static inline std::vector<perf_event_attr> attrs;
  static inline std::vector<std::pair<pid_t, int>> targets;
  // 0: /dev/null as the fd; 1 / 2: a pipe that reads as counts 0 then 5 / 3 then 3; < 0: fail with errno -answer.
  static inline std::vector<int> answers;
  static inline std::vector<int> opened;
  static int open(perf_event_attr* attr, pid_t pid, int cpu, int, unsigned long) {
    attrs.push_back(*attr);
    targets.emplace_back(pid, cpu);
    int answer = answers.empty() ? -ENOENT : answers.front();
    if (!answers.empty()) answers.erase(answers.begin());
    if (answer < 0) {
      errno = -answer;
      return -1;
    }
    int fd = -1;
    if (answer == 0) {
      fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    } else {
      int ends[2];
      if (::pipe2(ends, O_CLOEXEC) != 0) return -1;
      const uint64_t counts[2] = {answer == 1 ? 0u : 3u, answer == 1 ? 5u : 3u};
      if (::write(ends[1], counts, sizeof(counts)) != sizeof(counts)) return -1;
      ::close(ends[1]);
      fd = ends[0];
    }
    opened.push_back(fd);
    return fd;
  }
  static void reset(std::vector<int> script) {
    attrs.clear();
    targets.clear();
    opened.clear();
    answers = std::move(script);
  }
};

class PerfErrors : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("deja-pmu-test-" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
    host_.perf_event_open = FakePerf::open;
    host_.paranoid_path = (dir_ / "perf_event_paranoid").string();
    host_.event_source_dir = (dir_ / "devices").string();
    write(host_.paranoid_path, "3\n");
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  static void write(const std::string& path, const std::string& text) {
    std::filesystem::create_directories(std::filesystem::path(path).parent_path());
    std::ofstream(path) << text;
  }
  std::string open_error(std::vector<int> script, const PmuModel& model) {
    FakePerf::reset(std::move(script));
    auto counter = PerfCounter::open(model, nullptr, host_);
    EXPECT_FALSE(counter);
    if (counter) return "";
    EXPECT_EQ(counter.error().kind, ErrorKind::kUnsupported);
    return counter.error().message;
  }

  std::filesystem::path dir_;
  PerfHost host_;
  PmuModel skylake_ = model_of("GenuineIntel", 6, 0x5e);
};

TEST_F(PerfErrors, PermissionDeniedNamesParanoidValueAndTheFix) {
  for (int error : {EACCES, EPERM}) {
    std::string message = open_error({-error}, skylake_);
    EXPECT_TRUE(contains(message, "Intel Skylake retired conditional branches (raw 0x5101c4, guest only)")) << message;
    EXPECT_TRUE(contains(message, std::strerror(error))) << message;
    EXPECT_TRUE(contains(message, host_.paranoid_path + " is 3")) << message;
    EXPECT_TRUE(contains(message, "kernel.perf_event_paranoid=1")) << message;
    EXPECT_TRUE(contains(message, "CAP_PERFMON")) << message;
  }
  host_.paranoid_path = (dir_ / "missing").string();
  EXPECT_TRUE(contains(perf_permission_advice(host_), "is unreadable"));
}

TEST_F(PerfErrors, MissingPmuSaysSo) {
  for (int error : {ENOENT, ENODEV, EOPNOTSUPP}) {
    std::string message = open_error({-error}, skylake_);
    EXPECT_TRUE(contains(message, std::strerror(error))) << message;
    EXPECT_TRUE(contains(message, "no hardware PMU")) << message;
    EXPECT_TRUE(contains(message, "perf stat -e r5101c4")) << message;
  }
  std::string busy = open_error({-EBUSY}, skylake_);
  EXPECT_TRUE(contains(busy, "nmi_watchdog")) << busy;
}

TEST_F(PerfErrors, AsksForGuestOnlyPinnedEventsOnThisThread) {
  // The counting event opens, the sampling one fails: the first fd must not leak.
  std::string message = open_error({0, -EINVAL}, skylake_);
  EXPECT_TRUE(contains(message, "overflow (sampling) event")) << message;
  ASSERT_EQ(FakePerf::attrs.size(), 2u);
  ASSERT_EQ(FakePerf::opened.size(), 1u);
  EXPECT_EQ(::fcntl(FakePerf::opened[0], F_GETFD), -1) << "the counting event's fd was leaked";
  for (size_t i = 0; i < 2; ++i) {
    const perf_event_attr& a = FakePerf::attrs[i];
    EXPECT_EQ(a.type, PERF_TYPE_RAW);
    EXPECT_EQ(a.config, 0x5101c4u);
    EXPECT_EQ(a.size, sizeof(perf_event_attr));
    EXPECT_EQ(a.exclude_host, 1u) << "guest mode only";
    EXPECT_EQ(a.exclude_guest, 0u);
    EXPECT_EQ(a.exclude_kernel, 0u) << "guest kernel branches count";
    EXPECT_EQ(a.exclude_user, 0u);
    EXPECT_EQ(a.pinned, 1u) << "never multiplexed";
    EXPECT_EQ(FakePerf::targets[i], std::make_pair(pid_t{0}, -1)) << "this thread, any CPU";
  }
  EXPECT_EQ(FakePerf::attrs[0].sample_period, 0u) << "the counting event is never a sampling one";
  EXPECT_EQ(FakePerf::attrs[0].disabled, 0u);
  EXPECT_NE(FakePerf::attrs[1].sample_period, 0u);
  EXPECT_EQ(FakePerf::attrs[1].disabled, 1u) << "the overflow event waits for arm()";
}

TEST_F(PerfErrors, IoctlFailuresNameTheRequest) {
  // Both events "open" (as /dev/null), but the overflow event then refuses PERF_EVENT_IOC_PERIOD.
  std::string message = open_error({0, 0}, skylake_);
  EXPECT_TRUE(contains(message, "PERF_EVENT_IOC_PERIOD")) << message;
  EXPECT_TRUE(contains(message, "Intel Skylake")) << message;
  EXPECT_TRUE(contains(message, std::strerror(ENOTTY))) << message;
  for (int fd : FakePerf::opened) EXPECT_EQ(::fcntl(fd, F_GETFD), -1) << "fd " << fd << " leaked";
}

TEST_F(PerfErrors, HybridIntelUsesTheCoreAndWarns) {
  write(host_.event_source_dir + "/cpu_core/type", "8\n");
  PmuModel alderlake = model_of("GenuineIntel", 6, 0x97);
  open_error({-ENOENT}, alderlake);
  ASSERT_EQ(FakePerf::attrs.size(), 1u);
  EXPECT_EQ(FakePerf::attrs[0].type, 8u);
  open_error({-ENOENT}, skylake_);
  EXPECT_EQ(FakePerf::attrs[0].type, PERF_TYPE_RAW) << "non-hybrid cores ignore cpu_core";
}

TEST(PerfCounterOnThisHost, OpensOrFailsClearly) {
  auto model = pmu_model_for(host_cpu_identity());
  if (!model) {
    // An unknown CPU: still check the real syscall path with a row from the table.
    model = supported_pmu_models().front();
  }
  auto counter = PerfCounter::open(*model, nullptr);
  if (counter) {
    EXPECT_TRUE((*counter)->describe().starts_with("pmu " + model->id + " raw ")) << (*counter)->describe();
    EXPECT_GE((*counter)->skid(), model->skid);
    return;
  }
  // These build machines: no PMU at all.
  const std::string& message = counter.error().message;
  EXPECT_TRUE(contains(message, "perf_event_open of the counting event for " + model->name)) << message;
  EXPECT_TRUE(contains(message, "guest only")) << message;
  EXPECT_TRUE(contains(message, "(")) << message;
}

TEST(PmuSelftestVerdict, UsableOnlyWhenEveryCheckPassed) {
  PmuSelftest none;
  EXPECT_FALSE(none.usable());
  EXPECT_EQ(none.first_failure(), "no checks ran");

  PmuSelftest good;
  good.checks = {{"a", true, false, ""}, {"b", true, false, "fine"}};
  EXPECT_TRUE(good.usable());
  EXPECT_EQ(good.first_failure(), "");

  PmuSelftest bad;
  bad.checks = {{"a", true, false, ""}, {"counter opens", false, false, "EACCES"}, {"c", false, true, "skipped"}};
  EXPECT_FALSE(bad.usable());
  EXPECT_EQ(bad.first_failure(), "counter opens: EACCES");

  PmuSelftest only_skipped;
  only_skipped.checks = {{"a", false, true, "skipped"}};
  EXPECT_FALSE(only_skipped.usable());
}

TEST(PmuSelftestVerdict, ThisHostGetsAConsistentAnswer) {
  PmuSelftest result = run_pmu_selftest();
  ASSERT_FALSE(result.checks.empty());
  EXPECT_EQ(result.checks.front().name, "/dev/kvm usable");
  if (::access("/dev/kvm", F_OK) != 0) {
    EXPECT_FALSE(result.usable());
    EXPECT_TRUE(contains(result.first_failure(), "/dev/kvm usable: /dev/kvm does not exist")) << result.first_failure();
  }
  if (result.usable()) {
    EXPECT_TRUE(result.counter.starts_with("pmu ")) << result.counter;
    EXPECT_EQ(result.checks.back().name, "overflow within skid");
    return;
  }
  // Exactly one failure; everything after it is skipped, everything before it passed.
  bool seen_failure = false;
  for (const auto& c : result.checks) {
    if (seen_failure) {
      EXPECT_TRUE(c.skipped) << c.name;
    } else if (!c.passed) {
      seen_failure = true;
      EXPECT_FALSE(c.skipped) << c.name;
      EXPECT_FALSE(c.detail.empty()) << c.name;
    }
  }
  EXPECT_TRUE(seen_failure);
  EXPECT_EQ(result.checks.back().name, "overflow within skid");
}

TEST(PmuAttach, RefusesOtherBackends) {
  auto memory = GuestMemory::create(kCalibrationRam);
  ASSERT_TRUE(memory);
  auto interp = make_interp_backend(*memory, CpuModel::deja_v1());
  ASSERT_TRUE(interp);
  auto ok = attach_pmu_counter(**interp);
  ASSERT_FALSE(ok);
  EXPECT_EQ(ok.error().kind, ErrorKind::kUnsupported);
  EXPECT_TRUE(contains(ok.error().message, "only be attached to a KVM backend, not to the 'interp' backend"))
      << ok.error().message;
}

// The calibration guests on the software CPU: the self-test's reference counts must be what the code says.
TEST(CalibrationGuest, SoftwareCpuCountsTheDocumentedBranches) {
  for (const CalibrationGuest& guest : {calibration_loop(1000), calibration_loop_with_exits(1000, 10)}) {
    auto memory = GuestMemory::create(kCalibrationRam);
    ASSERT_TRUE(memory);
    auto cpu = make_interp_backend(*memory, CpuModel::deja_v1());
    ASSERT_TRUE(cpu);
    auto run = run_calibration_guest(**cpu, *memory, guest);
    ASSERT_TRUE(run) << run.error().message;
    ASSERT_TRUE(run->branches.has_value());
    EXPECT_EQ(*run->branches, guest.branches);
    EXPECT_EQ(run->port_exits, guest.port_exits);
    EXPECT_FALSE(run->stopped_by_overflow);
    EXPECT_EQ(run->stop_rip, kCalibrationEntry + guest.code.size() - 1) << "stops at the HLT";
  }
  EXPECT_EQ(calibration_loop_with_exits(1000, 10).branches, 2000u);
  EXPECT_EQ(calibration_loop_with_exits(1000, 10).port_exits, 101u);
}

TEST(CalibrationGuest, ArmedCounterStopsWithinItsSkid) {
  auto memory = GuestMemory::create(kCalibrationRam);
  ASSERT_TRUE(memory);
  auto cpu = make_interp_backend(*memory, CpuModel::deja_v1());
  ASSERT_TRUE(cpu);
  auto* interp = dynamic_cast<InterpBackend*>(cpu->get());
  ASSERT_NE(interp, nullptr);
  interp->emulate_pmu_skid(50, 7);
  auto run = run_calibration_guest(**cpu, *memory, calibration_loop(10'000), 5'000);
  ASSERT_TRUE(run) << run.error().message;
  EXPECT_TRUE(run->stopped_by_overflow);
  ASSERT_TRUE(run->branches.has_value());
  EXPECT_GE(*run->branches, 5'000u);
  EXPECT_LE(*run->branches, 5'050u);
}

// The software CPU behind a progress counter that misbehaves the way a bad PMU or kernel could, so the
// self-test's calibration checks can be seen to catch each fault (no machine here has a real PMU).
enum class Fault { kNone, kCountsHostWork, kDrifts, kStopsEarly };

class FaultyVcpu final : public Backend, public ProgressCounter, public KvmVcpu {
 public:
  FaultyVcpu(std::unique_ptr<Backend> inner, Fault fault) : inner_(std::move(inner)), fault_(fault) {}
  std::string_view name() const override { return "faulty"; }
  Result<VcpuExit*> run() override {
    auto exit = inner_->run();
    if (exit && (*exit)->kind == ExitKind::kIoOut) {
      if (fault_ == Fault::kCountsHostWork) ++extra_;
      extra_ += std::exchange(pending_drift_, 0);
    }
    return exit;
  }
  Result<CpuState> get_state() override { return inner_->get_state(); }
  Result<> set_state(const CpuState& state) override {
    // From the third calibration run on, 7 phantom branches appear during the run.
    if (fault_ == Fault::kDrifts && ++loads_ >= 3) pending_drift_ = 7;
    return inner_->set_state(state);
  }
  bool can_inject_interrupt() override { return inner_->can_inject_interrupt(); }
  Result<> inject_interrupt(uint8_t vector) override { return inner_->inject_interrupt(vector); }
  void request_interrupt_window(bool enable) override { inner_->request_interrupt_window(enable); }
  void kick() override { inner_->kick(); }
  ProgressCounter* progress_counter() override { return this; }
  // Posing as a KVM vCPU lets the real attach path (PerfCounter::open with a scripted perf) run against it.
  volatile uint8_t* immediate_exit_flag() override { return &immediate_exit_; }
  void adopt_progress_counter(std::unique_ptr<ProgressCounter> counter) override { adopted_ = std::move(counter); }
  std::optional<uint64_t> instruction_count() const override { return inner_->instruction_count(); }
  Result<> set_debug(const DebugControl& control) override { return inner_->set_debug(control); }

  std::string describe() const override { return "faulty " + inner_->progress_counter()->describe(); }
  uint64_t read() override { return inner_->progress_counter()->read() + extra_; }
  Result<> arm(uint64_t at) override {
    uint64_t early = fault_ == Fault::kStopsEarly ? skid() + 10 : 0;
    return inner_->progress_counter()->arm(at - extra_ - early);
  }
  void disarm() override { inner_->progress_counter()->disarm(); }
  uint64_t skid() const override { return inner_->progress_counter()->skid(); }

 private:
  std::unique_ptr<Backend> inner_;
  Fault fault_;
  uint64_t extra_ = 0;
  uint64_t pending_drift_ = 0;
  int loads_ = 0;
  uint8_t immediate_exit_ = 0;
  std::unique_ptr<ProgressCounter> adopted_;
};

// The whole self-test with the software CPU standing in for KVM and an emulated PMU (skid 100) for perf.
PmuSelftest selftest_on_emulated_pmu(Fault fault) {
  SelftestHost host;
  host.identify = [] { return CpuIdentity{.vendor = "GenuineIntel", .family = 6, .model = 0x5e}; };
  host.make_vcpu = [fault](GuestMemory& memory) -> Result<std::unique_ptr<Backend>> {
    auto cpu = make_interp_backend(memory, CpuModel::deja_v1());
    if (!cpu) return std::unexpected(cpu.error());
    dynamic_cast<InterpBackend&>(**cpu).emulate_pmu_skid(100, 42);
    return std::unique_ptr<Backend>(new FaultyVcpu(std::move(*cpu), fault));
  };
  host.attach = [](Backend&, const PmuModel&) -> Result<> { return {}; };
  return run_pmu_selftest_with(host);
}

TEST(PmuSelftestChecks, PassOnAWellBehavedCounter) {
  PmuSelftest result = selftest_on_emulated_pmu(Fault::kNone);
  EXPECT_TRUE(result.usable()) << result.first_failure();
  std::vector<std::string> names;
  for (const auto& c : result.checks) names.push_back(c.name);
  EXPECT_EQ(names, (std::vector<std::string>{"/dev/kvm usable", "CPU microarchitecture", "counter opens",
                                             "counts guest only", "deterministic", "overflow within skid"}));
  EXPECT_TRUE(result.counter.starts_with("faulty ")) << result.counter;
  EXPECT_TRUE(contains(result.checks[1].detail, "Intel Skylake (GenuineIntel family 0x6 model 0x5e")) << result.checks[1].detail;
  EXPECT_TRUE(contains(result.checks[3].detail, "KVM counted 100000, software CPU 100000")) << result.checks[3].detail;
  EXPECT_TRUE(contains(result.checks[5].detail, "armed at 1000000 branches, stopped at 10")) << result.checks[5].detail;
}

TEST(PmuSelftestChecks, CatchHostWorkCounted) {
  PmuSelftest result = selftest_on_emulated_pmu(Fault::kCountsHostWork);
  EXPECT_FALSE(result.usable());
  EXPECT_TRUE(result.first_failure().starts_with("counts guest only: ")) << result.first_failure();
  EXPECT_TRUE(contains(result.first_failure(), "counts host code")) << result.first_failure();
}

TEST(PmuSelftestChecks, CatchDriftBetweenRuns) {
  PmuSelftest result = selftest_on_emulated_pmu(Fault::kDrifts);
  EXPECT_FALSE(result.usable());
  EXPECT_TRUE(result.first_failure().starts_with("deterministic: three runs of the same guest counted 80000, 80007 and 80007"))
      << result.first_failure();
  EXPECT_TRUE(result.checks.back().skipped);
}

TEST(PmuSelftestChecks, CatchAnEarlyOverflow) {
  PmuSelftest result = selftest_on_emulated_pmu(Fault::kStopsEarly);
  EXPECT_FALSE(result.usable());
  EXPECT_TRUE(result.first_failure().starts_with("overflow within skid: ")) << result.first_failure();
  EXPECT_TRUE(contains(result.first_failure(), "stopped EARLY")) << result.first_failure();
}

TEST(PmuSelftestChecks, ReportAnAttachFailureAtCounterOpens) {
  SelftestHost host;
  host.identify = [] { return CpuIdentity{.vendor = "GenuineIntel", .family = 6, .model = 0x5e}; };
  host.make_vcpu = [](GuestMemory& memory) { return make_interp_backend(memory, CpuModel::deja_v1()); };
  PmuSelftest result = run_pmu_selftest_with(host);
  EXPECT_FALSE(result.usable());
  EXPECT_TRUE(result.first_failure().starts_with("counter opens: ")) << result.first_failure();
  EXPECT_TRUE(contains(result.first_failure(), "'interp'")) << result.first_failure();
}

// The real attach path against a vCPU posing as KVM, with perf_event_open scripted: the AMD SpecLockMap check
// and the counter-open failure, each with the message a user acts on.
PmuSelftest selftest_with_scripted_perf(CpuIdentity cpu, std::vector<int> script, const std::string& paranoid) {
  static const std::string paranoid_path =
      (std::filesystem::temp_directory_path() / ("deja-pmu-paranoid-" + std::to_string(::getpid()))).string();
  std::ofstream(paranoid_path) << paranoid;
  FakePerf::reset(std::move(script));
  SelftestHost host;
  host.perf.perf_event_open = FakePerf::open;
  host.perf.paranoid_path = paranoid_path;
  host.identify = [cpu] { return cpu; };
  host.make_vcpu = [](GuestMemory& memory) -> Result<std::unique_ptr<Backend>> {
    auto inner = make_interp_backend(memory, CpuModel::deja_v1());
    if (!inner) return std::unexpected(inner.error());
    return std::unique_ptr<Backend>(new FaultyVcpu(std::move(*inner), Fault::kNone));
  };
  PmuSelftest result = run_pmu_selftest_with(host);
  std::filesystem::remove(paranoid_path);
  return result;
}

TEST(PmuSelftestChecks, PermissionDeniedAtCounterOpensSaysWhatToSet) {
  PmuSelftest result = selftest_with_scripted_perf({.vendor = "GenuineIntel", .family = 6, .model = 0x8f}, {-EACCES}, "2");
  EXPECT_FALSE(result.usable());
  const std::string failure = result.first_failure();
  EXPECT_TRUE(failure.starts_with("counter opens: perf_event_open of the counting event for Intel SapphireRapid"))
      << failure;
  EXPECT_TRUE(contains(failure, " is 2; counting guest kernel code needs 1 or lower")) << failure;
  EXPECT_TRUE(contains(failure, "CAP_PERFMON")) << failure;
  EXPECT_TRUE(result.counter.empty());
}

TEST(PmuSelftestChecks, AmdSpecLockMapIsCheckedLikeRr) {
  const CpuIdentity zen3{.vendor = "AuthenticAMD", .family = 0x19, .model = 0x21};
  // Enabled: the lock-instruction counter moved (0 -> 5) across a locked add.
  PmuSelftest enabled = selftest_with_scripted_perf(zen3, {1}, "1");
  EXPECT_TRUE(enabled.first_failure().starts_with("AMD SpecLockMap off: a locked add counted 5 SpecLockMap commits"))
      << enabled.first_failure();
  EXPECT_TRUE(contains(enabled.first_failure(), "0xc0011020")) << enabled.first_failure();
  EXPECT_EQ(FakePerf::attrs.at(0).config, 0x510825u);
  EXPECT_EQ(FakePerf::attrs.at(0).exclude_guest, 1u) << "the check measures the host's own locked add";
  // Disabled: the count stayed (3 -> 3); the self-test goes on to open the branch counter (which fails here).
  PmuSelftest disabled = selftest_with_scripted_perf(zen3, {2, -ENOENT}, "1");
  ASSERT_GE(disabled.checks.size(), 4u);
  EXPECT_EQ(disabled.checks[2].name, "AMD SpecLockMap off");
  EXPECT_TRUE(disabled.checks[2].passed) << disabled.checks[2].detail;
  EXPECT_TRUE(disabled.first_failure().starts_with("counter opens: ")) << disabled.first_failure();
  EXPECT_TRUE(contains(disabled.first_failure(), "AMD Zen 3 retired conditional branches (raw 0x5100d1")) << disabled.first_failure();
  // Not measurable: the check passes and says so.
  PmuSelftest unknown = selftest_with_scripted_perf(zen3, {-ENOENT, -ENOENT}, "1");
  EXPECT_TRUE(contains(unknown.checks.at(2).detail, "could not be checked")) << unknown.checks.at(2).detail;
}

}  // namespace
}  // namespace deja
