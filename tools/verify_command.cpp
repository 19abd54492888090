// `deja verify`: the ordered checks of a trace (structure, hash chain, seals and signature, inputs, and with --replay
// the re-execution, in parallel segments when the trace has checkpoints), naming the first failure.
#include <cstdio>
#include <filesystem>

#include "logging/trace_verify.h"
#include "tools/command_support.h"
#include "tools/progress_line.h"
#include "core/exit_status.h"
#include "logging/trace_verify.h"
#include "segments/trace_checkpoints.h"
#include "tools/command_support.h"
#include "tools/job_support.h"

namespace deja {

Subcommand add_verify_command(CLI::App& app) {
  struct Args {
    std::string path;
    std::vector<std::string> keys;
    std::string keyring;
    VerifyOptions options;
    bool replay = false;
    JobOptions job;
    ProgressDisplay display;
  };
  auto a = std::make_shared<Args>();
  auto* verify = app.add_subcommand("verify", "check a trace, in order: structure, hash chain, seals and signature "
                                              "(with the signer), input files, and with --replay the re-execution");
  verify->add_option("TRACE", a->path, "trace file")->required();
  verify->add_option("--key", a->keys, "a trusted public key (PEM; repeatable): the trace must be signed by it");
  verify->add_option("--keyring", a->keyring, "a directory of trusted *.pub keys, each named by its file");
  verify->add_option("--input", a->options.inputs, "a file that must be one of the recorded inputs (image, kernel, "
                                                   "initrd, module, disk); repeatable")
      ->type_name("FILE");
  verify->add_option("--signature", a->options.signature, "the detached signature (default TRACE.sig)")
      ->type_name("FILE");
  verify->add_option("--tsa-ca", a->options.tsa_ca, "CA certificates to check the time-stamp's authority against")
      ->type_name("FILE");
  verify->add_flag("--replay", a->replay,
                   "also replay the trace, checking every event and state digest; a trace with checkpoints (TRACE.ckpt, "
                   "`deja index`) replays in segments that run in parallel, and the merge proves every segment exact "
                   "and their state digests chained from the start to the End (docs/segments.md)");
  add_job_options(verify, a->job);
  verify->add_option("--backend", a->job.plan.backend, "--replay in segments: the backend (default: the recording's)")
      ->check(CLI::IsMember({"kvm", "interp"}));
  add_progress_display_options(verify, a->display);
  return {verify, [a] {
            for (const auto& k : a->keys)
              if (auto r = a->options.keys.add_key_file(k); !r) return report_error(r.error());
            if (!a->keyring.empty())
              if (auto r = a->options.keys.add_keyring(a->keyring); !r) return report_error(r.error());
            VerifyReport report;
            {
              ProgressLine progress("verify", a->display);
              std::vector<ProgressMeasure> counters{{"bytes", 0, std::nullopt}, {"events", 0, std::nullopt}};
              progress.set_source([&counters] { return counters; });
              a->options.progress = [&](uint64_t bytes, uint64_t file_bytes, uint64_t events) {
                counters = {{"bytes", bytes, file_bytes}, {"events", events, std::nullopt}};
                progress.poll();
              };
              report = verify_trace(a->path, a->options);
              progress.finish();
            }
            std::fputs(describe_checks(report).c_str(), stdout);
            if (!report.ok) {
              std::printf("  5 replay      -      not run: an earlier check failed\n");
              std::fprintf(stderr, "deja: %s: %s\n", a->path.c_str(), report.first_problem.c_str());
              // deja's own statuses, as replay uses them: not a (readable) trace at all is a bad
              // argument; a trace that is cut short, damaged, incomplete or not signed as asked "ended early".
              return report.opened ? exit_status::kTraceEnded : exit_status::kUsage;
            }
            if (!a->replay) {
              std::printf("  5 replay      -      not run (--replay)\n");
              return 0;
            }
            std::fflush(stdout);
            std::error_code ec;
            const bool segmented = !a->job.plan.checkpoints.empty() || a->job.executor.kind != "local" ||
                                   std::filesystem::is_directory(checkpoint_directory(a->path), ec);
            int status = 0;
            if (segmented) {
              a->job.plan.trace = a->path;
              a->job.plan.task = "verify";
              status = run_trace_job(a->job, false);
            } else {
              status = replay_for_verify(a->path, a->display);
            }
            std::printf("  5 replay      %-6s %s\n", status == 0 ? "ok" : "FAILED",
                        status == 0                              ? "every event and state digest replayed as recorded"
                        : status == exit_status::kInterrupted ? "interrupted before every event was replayed"
                                                                 : "the replay did not match the recording (deja's "
                                                                   "message above)");
            return status;
          }};
}

}  // namespace deja
