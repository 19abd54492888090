// `deja segment`: run one item of a job (a segment of a trace with its task, or a shard) and write its result.
#include "core/messages.h"
#include "segments/files.h"
#include "segments/segment_run.h"
#include "tools/command_support.h"

namespace deja {
namespace {

struct SegmentArgs {
  std::string manifest;
  uint32_t index = 0;
  ItemOptions item;
  bool stdout_result = false;
};

int run_segment(const SegmentArgs& a) {
  install_stop_signal_handlers();
  auto loaded = read_manifest(a.manifest);
  if (!loaded) return report_error(loaded.error());
  if (a.index >= item_count(loaded->manifest)) {
    return report_error({ErrorKind::kInvalidArgument, fmt::format("--index {}: the manifest has {} items", a.index,
                                                                  item_count(loaded->manifest))});
  }
  const segments::ItemResult result = run_item(*loaded, a.index, a.item);
  const std::string json = to_json(result);
  if (auto r = write_work_file(result_path(loaded->manifest.workdir(), a.index), json, "result"); !r) {
    return report_error(r.error());
  }
  if (!result.ok()) {
    say("{}", result.error());
    return result.status();
  }
  say("item {} OK: {} events in {:.1f} s ({:.1f} s CPU) on {}", a.index, result.events(), result.seconds(),
      result.cpu_seconds(), result.host());
  return 0;
}

}  // namespace

Subcommand add_segment_command(CLI::App& app) {
  auto a = std::make_shared<SegmentArgs>();
  auto* cmd = app.add_subcommand("segment", "run one segment of a job's manifest and write its result (a worker's part)");
  cmd->add_option("MANIFEST", a->manifest, "the job's manifest (deja plan)")->required();
  cmd->add_option("--index", a->index, "which segment (or shard), from 0")->required();
  cmd->add_option("--task", a->item.task, "what the segment does (default: the manifest's task)");
  cmd->add_option("--store", a->item.store, "the content-addressed store to read files from (default: the manifest's)");
  return {cmd, [a] { return run_segment(*a); }};
}

}  // namespace deja
