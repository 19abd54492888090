// `deja merge`: every segment's result together: the task's findings, and the proof that the whole trace was replayed.
#include "segments/merge.h"
#include "tools/command_support.h"
#include "tools/job_support.h"

namespace deja {
namespace {

struct MergeArgs {
  std::string manifest;
  bool json = false;
  bool run = false;
  ExecutorOptions executor;
};

}  // namespace

Subcommand add_merge_command(CLI::App& app) {
  auto a = std::make_shared<MergeArgs>();
  auto* cmd = app.add_subcommand("merge", "combine a job's results and prove every segment exact and chained");
  cmd->add_option("MANIFEST", a->manifest, "the job's manifest (deja plan)")->required();
  cmd->add_flag("--json", a->json, "the task's records as JSON");
  cmd->add_flag("--run", a->run, "run every item first, on the executor (--executor local|slurm), then merge");
  add_executor_options(cmd, a->executor);
  return {cmd, [a] {
            auto loaded = read_manifest(a->manifest);
            if (!loaded) return report_error(loaded.error());
            if (a->run) return run_job(*loaded, a->executor, a->json);
            return print_merge(merge_results(*loaded), *loaded, a->json);
          }};
}

}  // namespace deja
