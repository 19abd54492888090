// `deja verify`: check a trace's integrity (checksums, hash chain, index, completeness) without a machine; with
// --replay, also replay it in segments across cores or a cluster.
#include <cstdio>

#include "core/exit_status.h"
#include "logging/trace_verify.h"
#include "tools/command_support.h"
#include "tools/job_support.h"

namespace deja {

Subcommand add_verify_command(CLI::App& app) {
  auto path = std::make_shared<std::string>();
  auto replay = std::make_shared<bool>(false);
  auto job = std::make_shared<JobOptions>();
  auto* verify = app.add_subcommand("verify", "check a trace: checksums, hash chain, index, completeness; with "
                                              "--replay, that every event replays exactly, in parallel segments");
  verify->add_option("TRACE", *path, "trace file")->required();
  verify->add_flag("--replay", *replay,
                   "replay the whole trace too, cut at its checkpoints (TRACE.ckpt, `deja index`) into segments that "
                   "run in parallel; the merge proves every segment exact and their state digests chained from the "
                   "start to the End");
  add_job_options(verify, *job);
  verify->add_option("--backend", job->plan.backend, "--replay: the backend (default: the recording's)")
      ->check(CLI::IsMember({"kvm", "interp"}));
  return {verify, [path, replay, job] {
            VerifyReport report = verify_trace(*path);
            std::printf("%s\n", report.summary.c_str());
            if (!report.ok) {
              std::fprintf(stderr, "deja: %s: %s\n", path->c_str(), report.first_problem.c_str());
              // deja's own statuses, as replay uses them: not a (readable) trace at all is a bad
              // argument; a trace that is cut short, damaged or incomplete "ended early".
              return report.opened ? exit_status::kTraceEnded : exit_status::kUsage;
            }
            if (!*replay) return 0;
            std::fflush(stdout);
            job->plan.trace = *path;
            job->plan.task = "verify";
            return run_trace_job(*job, false);
          }};
}

}  // namespace deja
