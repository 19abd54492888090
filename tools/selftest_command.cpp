// `deja selftest`: can deja use this host's KVM, and can its PMU give exact interrupt timing? Each check on one line.
#include <cstdio>

#include "kvm/kvm_usability.h"
#include "kvm/pmu.h"
#include "tools/command_support.h"
#include "core/exit_status.h"

namespace deja {
namespace {

void print_checks(const std::vector<HostCheck>& checks) {
  for (const auto& c : checks) {
    std::printf("%-30s %s%s%s\n", c.name.c_str(), c.skipped ? "skipped" : c.passed ? "ok" : "FAILED",
                c.detail.empty() ? "" : ": ", c.detail.c_str());
  }
}

}  // namespace

Subcommand add_selftest_command(CLI::App& app) {
  auto kvm_only = std::make_shared<bool>(false);
  auto* selftest = app.add_subcommand(
      "selftest",
      "check whether deja can use this host's KVM (docs/kvm.md) and whether its PMU gives KVM exact interrupt "
      "timing (docs/pmu-hosts.md). Exit status 0: both; 10: not");
  selftest->add_flag("--kvm-only", *kvm_only, "only the KVM usability check (exit status 0 when KVM is usable)");
  return {selftest, [kvm_only] {
            const KvmUsability& kvm = kvm_usability();
            print_checks(kvm.checks);
            std::printf("KVM for deja: %s (checked in %.1f ms)\n",
                        kvm.usable() ? "usable" : "UNUSABLE; deja runs guests on the software CPU (--backend interp)",
                        kvm.elapsed_ns / 1e6);
            if (*kvm_only) return kvm.usable() ? 0 : exit_status::kHostFailure;
            if (!kvm.usable()) return exit_status::kHostFailure;
            PmuSelftest result = run_pmu_selftest();
            print_checks(result.checks);
            if (result.usable()) {
              std::printf("precise interrupt timing on KVM: available (%s)\n", result.counter.c_str());
              return 0;
            }
            std::printf("precise interrupt timing on KVM: unavailable; deja records KVM guests exit-synchronously\n");
            return exit_status::kHostFailure;
          }};
}

}  // namespace deja
