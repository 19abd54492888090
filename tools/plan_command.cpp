// `deja plan`: a job's manifest: the trace cut into segments at its checkpoints, every file a worker reads named by SHA-256.
#include <cstdio>

#include "core/messages.h"
#include "segments/manifest.h"
#include "segments/trace_checkpoints.h"
#include "tools/command_support.h"

namespace deja {
namespace {

struct PlanArgs {
  PlanOptions plan;
  std::string every;
  std::string campaign;
  uint32_t shards = 0;
  std::vector<std::string> campaign_args;
};

int run_campaign_plan(const PlanArgs& a) {
  if (a.shards == 0) return report_error({ErrorKind::kInvalidArgument, "--campaign needs --shards N"});
  // The first positional argument fills TRACE: with a campaign it is the campaign's first.
  std::vector<std::string> args = a.campaign_args;
  if (!a.plan.trace.empty()) args.insert(args.begin(), a.plan.trace);
  auto manifest = plan_shards(a.campaign, args, a.shards,
                              a.plan.workdir.empty() ? a.campaign + ".shards" : a.plan.workdir);
  if (!manifest) return report_error(manifest.error());
  auto path = write_manifest(*manifest);
  if (!path) return report_error(path.error());
  say("planned {} shards of campaign {} in {}", a.shards, a.campaign, *path);
  return 0;
}

int run_plan(PlanArgs& a) {
  if (!a.campaign.empty()) return run_campaign_plan(a);
  if (a.plan.trace.empty()) return report_error({ErrorKind::kInvalidArgument, "plan needs a TRACE (or --campaign)"});
  if (!a.every.empty()) {
    auto every = parse_checkpoint_interval(a.every, 1000);
    if (!every) return report_error(every.error());
    a.plan.every_instructions = *every;
  }
  auto manifest = plan_segments(a.plan);
  if (!manifest) return report_error(manifest.error());
  auto path = write_manifest(*manifest);
  if (!path) return report_error(path.error());
  for (const auto& s : manifest->segments()) {
    std::printf("segment %u: from %s to %s\n", s.index(),
                describe_boundary(*manifest, s.start_checkpoint(), false).c_str(),
                describe_boundary(*manifest, s.end_checkpoint(), true).c_str());
  }
  say("planned {} segments of {} (task {}) in {}", manifest->segments_size(), a.plan.trace, manifest->task(), *path);
  return 0;
}

}  // namespace

Subcommand add_plan_command(CLI::App& app) {
  auto a = std::make_shared<PlanArgs>();
  auto* cmd = app.add_subcommand("plan", "cut a trace into segments at its checkpoints: write a job's manifest");
  cmd->add_option("TRACE", a->plan.trace, "trace file");
  cmd->add_option("--campaign", a->campaign,
                  "instead of a trace: a campaign of shards, the sharded task's name (sha256: hash the files given "
                  "after --, as absolute paths: workers run in the work directory)");
  cmd->add_option("--shards", a->shards, "--campaign: how many shards");
  cmd->add_option("CAMPAIGN_ARGS", a->campaign_args, "--campaign: its arguments, after --");
  cmd->add_option("--segments", a->plan.segments, "about this many segments of equal length (default: at every checkpoint)");
  cmd->add_option("--every", a->every, "segments about this long: guest time (60s) or instructions (5G)");
  cmd->add_option("--task", a->plan.task, "what each segment does: verify (default), writes:ADDR:LEN, sample:N[:ADDR:LEN]");
  cmd->add_option("--workdir", a->plan.workdir, "where the manifest, results and logs go (default TRACE.segments)");
  cmd->add_option("--store", a->plan.store, "put every file a worker reads into this content-addressed store");
  cmd->add_option("--checkpoints", a->plan.checkpoints, "the checkpoint directory (default TRACE.ckpt)");
  cmd->add_option("--backend", a->plan.backend, "the backend workers replay on (default: the recording's)")
      ->check(CLI::IsMember({"kvm", "interp"}));
  cmd->add_option("--interp-mode", a->plan.interp_mode, "the software CPU's executor")
      ->check(CLI::IsMember({"reference", "threaded", "jit"}));
  cmd->add_option("--image,--kernel", a->plan.image_path, "guest image or Linux kernel (default: the path in the trace)");
  cmd->add_option("--initrd", a->plan.initrd_path, "the Linux kernel's initrd (default: the path in the trace)");
  cmd->add_option("--disk", a->plan.disk_paths, "the disk images, in the order recorded; repeatable");
  return {cmd, [a] { return run_plan(*a); }};
}

}  // namespace deja
