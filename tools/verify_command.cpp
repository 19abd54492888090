// `deja verify`: check a trace's integrity (checksums, hash chain, index, completeness) without a machine.
#include <cstdio>

#include "logging/trace_verify.h"
#include "tools/command_support.h"
#include "tools/progress_line.h"
#include "core/exit_status.h"

namespace deja {

Subcommand add_verify_command(CLI::App& app) {
  auto path = std::make_shared<std::string>();
  auto display = std::make_shared<ProgressDisplay>();
  auto* verify = app.add_subcommand("verify", "check a trace: checksums, hash chain, index, completeness");
  verify->add_option("TRACE", *path, "trace file")->required();
  add_progress_display_options(verify, *display);
  return {verify, [path, display] {
            ProgressLine progress("verify", *display);
            std::vector<ProgressMeasure> counters{{"bytes", 0, std::nullopt}, {"events", 0, std::nullopt}};
            progress.set_source([&counters] { return counters; });
            VerifyReport report = verify_trace(*path, [&](uint64_t bytes, uint64_t file_bytes, uint64_t events) {
              counters = {{"bytes", bytes, file_bytes}, {"events", events, std::nullopt}};
              progress.poll();
            });
            progress.finish();
            std::printf("%s\n", report.summary.c_str());
            if (!report.ok) {
              std::fprintf(stderr, "deja: %s: %s\n", path->c_str(), report.first_problem.c_str());
              // deja's own statuses, as replay uses them: not a (readable) trace at all is a bad
              // argument; a trace that is cut short, damaged or incomplete "ended early".
              return report.opened ? exit_status::kTraceEnded : exit_status::kUsage;
            }
            return 0;
          }};
}

}  // namespace deja
