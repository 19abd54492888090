// Running a job over a trace's segments from a command: plan, executor, merge, print.
#include "tools/job_support.h"

#include <stdlib.h>

#include <filesystem>

#include "core/exit_status.h"
#include "core/messages.h"
#include "logging/trace_format.h"
#include "logging/trace_reader.h"
#include "segments/merge.h"
#include "segments/segment_run.h"
#include "segments/trace_checkpoints.h"
#include "tools/command_support.h"

namespace deja {

void add_executor_options(CLI::App* cmd, ExecutorOptions& o) {
  cmd->add_option("--executor", o.kind,
                  "where the segments run: local (worker processes here, the default) or slurm (an array job and a "
                  "dependent merge job on the cluster sbatch reaches)")
      ->check(CLI::IsMember({"local", "slurm"}));
  cmd->add_option("-j,--jobs", o.jobs, "local: workers at a time (default: one per core)");
  cmd->add_option("--partition", o.partition, "slurm: the partition (default: the cluster's)");
  cmd->add_option("--retries", o.retries, "slurm: submit a task that ended without a result again N times");
  cmd->add_option("--start-timeout", o.start_timeout,
                  "slurm: cancel the jobs when every remaining task has waited this many seconds to start (default 3600)");
  cmd->add_option("--worker-deja", o.deja, "the deja binary workers run (default: this one; on Slurm, at the same "
                                           "path on every node)");
}

void add_job_options(CLI::App* cmd, JobOptions& o) {
  add_executor_options(cmd, o.executor);
  cmd->add_option("--segments", o.plan.segments,
                  "cut the trace into about this many segments at its checkpoints (default: at every checkpoint)");
  cmd->add_option("--every", o.every, "cut the trace into segments about this long (guest time or instructions)");
  cmd->add_option("--checkpoints", o.plan.checkpoints, "the trace's checkpoints (default TRACE.ckpt, `deja index`)");
  cmd->add_option("--workdir", o.plan.workdir,
                  "where the manifest, results and logs go: on Slurm a directory every node mounts (default "
                  "TRACE.segments; local: a temporary directory)");
  cmd->add_option("--store", o.plan.store,
                  "a content-addressed store (DIR/sha256/HEX) the trace, its inputs and checkpoints are put into and "
                  "workers read them from");
}

int run_job(const LoadedManifest& loaded, ExecutorOptions& executor, bool json) {
  if (executor.kind == "slurm") {
    if (json) executor.merge_args.push_back("--json");
    auto ran = run_slurm(loaded, executor);
    return ran ? *ran : report_error(ran.error());
  }
  auto ran = run_local(loaded, executor);
  if (!ran) return report_error(ran.error());
  if (*ran != 0) return *ran;
  return print_merge(merge_results(loaded), loaded, json);
}

int run_trace_job(JobOptions& o, bool json) {
  if (!o.every.empty()) {
    auto every = parse_checkpoint_interval(o.every, 1000);
    if (!every) return report_error(every.error());
    o.plan.every_instructions = *every;
  }
  const bool given_workdir = !o.plan.workdir.empty();
  if (o.executor.kind == "slurm" && !given_workdir) o.plan.workdir = o.plan.trace + ".segments";
  auto manifest = plan_segments(o.plan);
  if (!manifest) return report_error(manifest.error());
  if (o.executor.kind == "local" && manifest->segments_size() == 1 && !given_workdir) {
    // One segment (a trace without checkpoints): in this process.
    LoadedManifest loaded{*manifest, {}, ""};
    const std::string text = to_json(*manifest);
    loaded.sha256 = sha256_bytes(std::span(reinterpret_cast<const uint8_t*>(text.data()), text.size()));
    std::vector<std::optional<segments::ItemResult>> results{run_item(loaded, 0, {})};
    return print_merge(merge_results(loaded, std::move(results), {}), loaded, json);
  }
  std::string temporary;
  if (!given_workdir && o.executor.kind == "local") {
    std::string pattern = (std::filesystem::temp_directory_path() / "deja-segments-XXXXXX").string();
    if (!::mkdtemp(pattern.data())) return report_error({ErrorKind::kHost, "cannot make a temporary directory"});
    temporary = pattern;
    manifest->set_workdir(temporary);
  }
  auto path = write_manifest(*manifest);
  if (!path) return report_error(path.error());
  auto loaded = read_manifest(*path);
  if (!loaded) return report_error(loaded.error());
  const int status = run_job(*loaded, o.executor, json);
  if (!temporary.empty()) {
    if (status == 0) {
      std::error_code ec;
      std::filesystem::remove_all(temporary, ec);
    } else {
      say("the job's manifest, results and logs are in {}", temporary);
    }
  }
  return status;
}

}  // namespace deja
