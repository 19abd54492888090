// `deja index`: the checkpoints that travel with a trace (TRACE.ckpt/), made after the fact in one replay.
#include <chrono>

#include "core/exit_status.h"
#include "core/messages.h"
#include "replay/replay_setup.h"
#include "segments/trace_checkpoints.h"
#include "tools/command_support.h"

namespace deja {
namespace {

struct IndexOptions {
  ReplaySetupOptions replay{.serial_out = "/dev/null"};
  std::string every = "1s";
  uint64_t full_every = CheckpointWriter::kDefaultFullEvery;
  std::string output;  // "" = TRACE.ckpt
};

int run_index(const IndexOptions& o) {
  install_stop_signal_handlers();
  const auto started = std::chrono::steady_clock::now();
  auto setup = open_replay(o.replay);
  if (!setup) return report_error(setup.error());
  Session& session = *setup->session;
  const auto rates = session.engine().derived_time_rates();
  auto every = parse_checkpoint_interval(o.every, rates ? rates->ps_per_instruction : 1000);
  if (!every) return report_error(every.error());
  const std::string directory = o.output.empty() ? checkpoint_directory(o.replay.trace_path) : o.output;
  auto report = index_trace(session, setup->identity, directory, *every, o.full_every);
  if (!report) {
    if (report.error().kind == ErrorKind::kDivergence) {
      std::fputs(("deja: " + report.error().message).c_str(), stderr);
      return exit_status::kDivergence;
    }
    if (report.error().kind == ErrorKind::kBadTrace) {
      say("{}", report.error().message);
      return exit_status::kTraceEnded;
    }
    return report_error(report.error());
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  say("indexed {}: {} checkpoints every {} instructions in {} ({:.1f} MiB), {} instructions replayed exactly in "
      "{:.1f} s",
      o.replay.trace_path, report->checkpoints, *every, directory, double(report->bytes) / (1 << 20),
      report->instructions, seconds);
  return 0;
}

}  // namespace

Subcommand add_index_command(CLI::App& app) {
  auto o = std::make_shared<IndexOptions>();
  auto* cmd = app.add_subcommand("index", "make the checkpoints that travel with a trace (TRACE.ckpt/) in one replay");
  cmd->add_option("TRACE", o->replay.trace_path, "trace file")->required();
  cmd->add_option("--every", o->every,
                  "a checkpoint every DURATION of guest time (60s, 500ms) or N instructions (5G, 250M); default 1s");
  cmd->add_option("--full-every", o->full_every,
                  "every Nth checkpoint holds all of RAM, the others what changed since the one before (default 16)")
      ->check(CLI::Range(uint64_t{1}, uint64_t{1} << 20));
  cmd->add_option("-o,--output", o->output, "the checkpoint directory (default TRACE.ckpt)");
  cmd->add_option("--backend", o->replay.backend, "interp (checkpoints need a backend that counts instructions)")
      ->check(CLI::IsMember({"kvm", "interp"}));
  cmd->add_option("--interp-mode", o->replay.interp_mode, "the software CPU's executor: jit (default), threaded or reference")
      ->check(CLI::IsMember({"reference", "threaded", "jit"}));
  cmd->add_option("--image,--kernel", o->replay.image_path, "guest image or Linux kernel (default: the path in the trace)");
  cmd->add_option("--initrd", o->replay.initrd_path, "the Linux kernel's initrd (default: the path in the trace)");
  cmd->add_option("--disk", o->replay.disk_paths, "the disk images, in the order recorded; repeatable");
  return {cmd, [o] { return run_index(*o); }};
}

}  // namespace deja
