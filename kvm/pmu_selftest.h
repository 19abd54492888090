// The PMU self-test's parts, exposed for tests: calibration guests, running them on any backend, and the self-test with an injectable perf host.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "kvm/perf_counter.h"
#include "kvm/pmu.h"
#include "core/backend.h"
#include "core/guest_memory.h"

namespace deja {

// A calibration guest: 32-bit flat protected-mode code that loops and then does `out 0x80, al; hlt`.
struct CalibrationGuest {
  std::vector<uint8_t> code;
  uint64_t branches = 0;   // retired conditional branches from entry to the HLT
  uint64_t port_exits = 0; // OUTs to port 0x81 on the way (host work between guest stretches), plus the final one
};
constexpr uint64_t kCalibrationEntry = 0x1000;
constexpr uint64_t kCalibrationRam = 1 << 20;
// `mov ecx, n; 1: dec ecx; jnz 1b; out 0x80, al; hlt`: n branches.
CalibrationGuest calibration_loop(uint32_t iterations);
// The same loop with an `out 0x81, al` every `exit_every` iterations: 2n branches.
CalibrationGuest calibration_loop_with_exits(uint32_t iterations, uint32_t exit_every);

struct CalibrationRun {
  uint64_t port_exits = 0;               // OUT exits seen (0x81s and the final 0x80)
  bool stopped_by_overflow = false;      // run() returned kKicked before the HLT
  uint64_t stop_rip = 0;                 // RIP at the HLT or at the kicked stop
  std::optional<uint64_t> branches;      // the backend's progress counter over the run, if it has one
  std::optional<uint64_t> counter_at_stop;  // progress counter value (absolute) when it stopped
};
// Loads `guest` at kCalibrationEntry in `memory` (with a flat GDT), puts `cpu` in 32-bit flat protected mode
// there and runs it to its HLT, answering port writes; with `arm_at` (relative to the counter at entry) it
// arms the progress counter and returns at the first kKicked.
Result<CalibrationRun> run_calibration_guest(Backend& cpu, GuestMemory& memory, const CalibrationGuest& guest,
                                             std::optional<uint64_t> arm_at = std::nullopt);

// What the self-test runs on; every empty member means the real thing. Tests substitute the perf syscall
// (to make it fail on purpose) or the whole vCPU and counter (the software CPU with an emulated PMU) to
// exercise the calibration checks on machines without a PMU.
struct SelftestHost {
  PerfHost perf;
  std::function<CpuIdentity()> identify;                                    // host_cpu_identity
  std::function<Result<std::unique_ptr<Backend>>(GuestMemory&)> make_vcpu;  // make_kvm_backend
  std::function<Result<>(Backend&, const PmuModel&)> attach;                // attach_pmu_counter_with(perf)
};
PmuSelftest run_pmu_selftest_with(const SelftestHost& host);
// attach_pmu_counter() with an explicit table row and perf host.
Result<> attach_pmu_counter_with(Backend& kvm_backend, const PmuModel& model, const PerfHost& host);

}  // namespace deja
