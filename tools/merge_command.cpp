// `deja merge`: every segment's result together: the task's findings, and the proof that the whole trace was replayed.
#include "segments/merge.h"
#include "tools/command_support.h"

namespace deja {

Subcommand add_merge_command(CLI::App& app) {
  auto manifest = std::make_shared<std::string>();
  auto json = std::make_shared<bool>(false);
  auto* cmd = app.add_subcommand("merge", "combine a job's results and prove every segment exact and chained");
  cmd->add_option("MANIFEST", *manifest, "the job's manifest (deja plan)")->required();
  cmd->add_flag("--json", *json, "the task's records as JSON");
  return {cmd, [manifest, json] {
            auto loaded = read_manifest(*manifest);
            if (!loaded) return report_error(loaded.error());
            return print_merge(merge_results(*loaded), *loaded, *json);
          }};
}

}  // namespace deja
