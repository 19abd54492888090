// `deja selftest`: can this host's PMU give KVM exact interrupt timing? Each check on one line.
#include <cstdio>

#include "kvm/pmu.h"
#include "tools/command_support.h"
#include "vmm/exit_status.h"

namespace deja {

Subcommand add_selftest_command(CLI::App& app) {
  auto* selftest = app.add_subcommand(
      "selftest", "check whether this host's PMU can give KVM exact interrupt timing (docs/pmu-hosts.md)");
  return {selftest, [] {
            PmuSelftest result = run_pmu_selftest();
            for (const auto& c : result.checks) {
              std::printf("%-24s %s%s%s\n", c.name.c_str(), c.skipped ? "skipped" : c.passed ? "ok" : "FAILED",
                          c.detail.empty() ? "" : ": ", c.detail.c_str());
            }
            if (result.usable()) {
              std::printf("precise interrupt timing on KVM: available (%s)\n", result.counter.c_str());
              return 0;
            }
            std::printf("precise interrupt timing on KVM: unavailable; deja records KVM guests exit-synchronously\n");
            return exit_status::kHostFailure;
          }};
}

}  // namespace deja
