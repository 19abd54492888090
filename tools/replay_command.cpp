// `deja replay`: re-execute a recorded guest from its trace on either backend, checking every event.
#include <sys/stat.h>
#include <unistd.h>

#include <string>

#include "kvm/pmu.h"
#include "logging/trace_format.h"
#include "tools/command_support.h"
#include "tools/progress_line.h"
#include "replay/replay_setup.h"
#include "core/cpu_model.h"
#include "core/exit_status.h"
#include "core/messages.h"

namespace deja {
namespace {

struct ReplayOptions {
  std::string trace_path;
  std::string backend;      // "" = the backend the trace was recorded on, if available here
  std::string image_path;   // "" = the path recorded in the trace
  std::string initrd_path;  // "" = the path recorded in the trace
  std::vector<std::string> disk_paths;
  std::string serial_out = "-";
  bool stats = false;
  bool print_digest = false;
  ProgressDisplay display;            // --quiet: no progress line and no summary line; --progress-json
  std::string test_device_semantics;  // test-only: replay with perturbed device semantics
  std::string progress;               // "" = as recorded; "exact" or "emulated-pmu:SKID[:SEED]" to override the counter
  std::string interp_mode;            // "" = the software CPU's default executor
  bool verify = false;                // `deja verify --replay`: 0 when the replay matched, whatever the guest's status
};

int replay_trace(const ReplayOptions& options) {
  install_stop_signal_handlers();
  auto setup = open_replay(ReplaySetupOptions{.trace_path = options.trace_path,
                                              .backend = options.backend,
                                              .image_path = options.image_path,
                                              .initrd_path = options.initrd_path,
                                              .disk_paths = options.disk_paths,
                                              .serial_out = options.serial_out,
                                              .progress = options.progress,
                                              .test_device_semantics = options.test_device_semantics,
                                              .interp_mode = options.interp_mode});
  if (!setup) return report_error(setup.error());
  Session& session = *setup->session;
  Engine& engine = session.engine();

  ProgressLine progress("replay", options.display);
  follow_replay(session, progress, replay_totals(options.trace_path));
  auto outcome = session.run();
  progress.finish();
  if (!outcome) return report_error(outcome.error());

  if (outcome->status == exit_status::kInterrupted && !outcome->recorded_end) {
    say("replay interrupted after {} events", engine.events_processed());
    return exit_status::kInterrupted;
  }
  bool end_matched = false;
  std::optional<Digest> final_digest;
  if (outcome->status != exit_status::kDivergence && outcome->status != exit_status::kTraceEnded) {
    // replay_end_here() matched the End of a recording that stopped here (interrupted, or stopped by deja),
    // or the guest stopped by itself; either way the recording must end the same way, with the same state.
    const trace::End* end = engine.expect_end(outcome->recorded_end
                                                  ? std::string("the recording's end")
                                                  : fmt::format("the guest stopped: {}", outcome->reason));
    if (end) {
      end_matched = true;
      final_digest = session.check_replay_end(*end, *outcome);
    }
  }
  if (options.stats) session.print_stats();
  if (engine.divergence()) {
    std::fputs(("deja: " + engine.divergence()->report).c_str(), stderr);
    return exit_status::kDivergence;
  }
  if (!end_matched) {
    TraceReader* r = engine.reader();
    if (!engine.trace_error().empty()) {
      say("{}", engine.trace_error());
    } else {
      say("replayed the valid prefix of {}: {} events; {}", options.trace_path, engine.events_processed(),
          r ? r->end_description() : "end of trace");
    }
    return exit_status::kTraceEnded;
  }
  finish_outcome_message(*outcome);
  if (options.print_digest) say("digest {}", session.final_cpu_ram_digest().hex());
  // Everything up to the End event replayed; say so if the index after it is damaged or missing.
  engine.peek();
  if (TraceReader* r = engine.reader(); r && !r->complete()) {
    say("note: {} has no valid index after its last event ({}); `deja verify` reports it",
        options.trace_path, engine.trace_error().empty() ? r->end_description() : engine.trace_error());
  }
  if (!options.display.quiet) {
    // Every vCPU's instructions (the sum), as record says.
    std::optional<uint64_t> instructions = session.machine().backend().instruction_count();
    for (size_t v = 1; instructions && v < session.machine().vcpu_count(); ++v)
      *instructions += session.vcpu_counts(uint32_t(v)).instructions;
    // Every event of the trace, serial output included (the engine's own count leaves that out): the
    // number record, verify and inspect give.
    say("replay OK: {} events, {} instructions, {}, exit status {}",
        engine.reader() ? engine.reader()->events_read() : engine.events_processed(),
        instructions ? fmt::format("{}", *instructions) : std::string("(not counted on kvm)"),
        outcome->recorded_end ? "stopped where the recording stopped, state digest matches (" + final_digest->hex() + ")"
                              : "final state digest matches (" + final_digest->hex() + ")",
        outcome->status);
  }
  return options.verify ? 0 : outcome->status;
}


}  // namespace

int replay_for_verify(const std::string& trace_path, const ProgressDisplay& display) {
  return replay_trace(
      ReplayOptions{.trace_path = trace_path, .serial_out = "/dev/null", .display = display, .verify = true});
}

Subcommand add_replay_command(CLI::App& app) {
  auto o = std::make_shared<ReplayOptions>();
  auto* replay = app.add_subcommand("replay", "re-execute a recorded guest from its trace, checking every event");
  replay->add_option("TRACE", o->trace_path, "trace file")->required();
  replay->add_option("--backend", o->backend, "kvm or interp (default: the recording's, if usable here)")
      ->check(CLI::IsMember({"kvm", "interp"}));
  replay->add_option("--progress", o->progress,
                     "exact-mode traces: the counter to reach coordinates with: exact, or emulated-pmu:SKID[:SEED] "
                     "(interp; default: as recorded)");
  replay->add_option("--interp-mode", o->interp_mode, "the software CPU's executor: jit (default), threaded or reference")
      ->check(CLI::IsMember({"reference", "threaded", "jit"}));
  replay->add_option("--image,--kernel", o->image_path,
                     "guest image or Linux kernel (default: the path in the trace; hash-checked)");
  replay->add_option("--initrd", o->initrd_path, "the Linux kernel's initrd (default: the path in the trace; hash-checked)");
  replay->add_option("--disk", o->disk_paths,
                     "the disk images, in the order recorded (default: the paths in the trace; checked against the "
                     "recording); repeatable");
  replay->add_option("--serial-out", o->serial_out, "where the replayed serial output goes (default stdout)");
  replay->add_flag("--stats", o->stats, "print exit counts at the end");
  replay->add_flag("--digest", o->print_digest, "print the final state digest");
  replay->add_flag("--quiet", o->display.quiet, "no progress line and no summary line");
  add_progress_display_options(replay, o->display, false);
  // Tests only: replays with a deliberately changed device model, which must be reported as divergence.
  replay->add_option("--test-device-semantics", o->test_device_semantics)->group("");
  return {replay, [o] { return replay_trace(*o); }};
}

}  // namespace deja
