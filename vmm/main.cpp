// deja's command line: run, record, replay, inspect and verify (a git-style subcommand table).
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "kvm/pmu.h"
#include "logging/trace_inspect.h"
#include "logging/trace_verify.h"
#include "vmm/build_info.h"
#include "vmm/exit_status.h"
#include "vmm/guest_memory.h"
#include "vmm/session.h"

namespace deja {
namespace {

struct RunArgs {
  std::string backend;
  std::string mem = "256M";
  std::string cmdline;
  std::string serial_in;
  std::string serial_out = "-";
  std::vector<std::string> modules;
  std::string progress;
  bool stats = false;
  bool digest = false;
  std::string image;
  std::string output;
};

void add_run_options(CLI::App* cmd, RunArgs& a) {
  cmd->add_option("--backend", a.backend, "vCPU backend: kvm or interp (default: kvm where /dev/kvm is usable, else interp)")
      ->check(CLI::IsMember({"kvm", "interp"}));
  cmd->add_option("--mem", a.mem, "guest RAM size, e.g. 256M or 1G (default 256M)");
  cmd->add_option("--cmdline", a.cmdline, "kernel command line passed to the guest (Multiboot, fw_cfg)");
  cmd->add_option("--serial-in", a.serial_in, "file whose bytes arrive on COM1's receiver ('-' = stdin)");
  cmd->add_option("--serial-out", a.serial_out, "file receiving COM1's output (default '-' = stdout)");
  cmd->add_option("--module", a.modules, "Multiboot boot module: 'PATH' or 'PATH ARGS' (repeatable)");
  cmd->add_option("--progress", a.progress,
                  "where asynchronous events land: exact (any instruction, by branch count: interp, or KVM with a "
                  "usable PMU), exit-sync (only at guest I/O and HLT exits), or emulated-pmu:SKID[:SEED] (interp "
                  "counting like a PMU whose overflow lands up to SKID branches late; for testing). Default: exact "
                  "on interp; on KVM exact when `deja selftest` passes, else exit-sync");
  cmd->add_flag("--stats", a.stats, "print exit counts, unknown ports and unimplemented instructions at the end");
  cmd->add_flag("--digest", a.digest, "print the final state digest (registers, control registers, RAM hash)");
  cmd->add_option("IMAGE", a.image, "guest image: Multiboot ELF32/ELF64, or ELF64 for direct 64-bit boot")->required();
}

bool kvm_usable() { return access("/dev/kvm", R_OK | W_OK) == 0; }

Result<SessionOptions> to_session(const RunArgs& a) {
  SessionOptions o;
  auto mem = parse_size(a.mem);
  if (!mem) return std::unexpected(Error{ErrorKind::kInvalidArgument, "--mem: " + mem.error().message});
  o.machine.memory_bytes = *mem;
  o.machine.cmdline = a.cmdline;
  o.machine.backend = a.backend;
  if (o.machine.backend.empty()) {
    if (kvm_usable()) {
      o.machine.backend = "kvm";
    } else {
      o.machine.backend = "interp";
      std::fputs("deja: note: /dev/kvm is not available here; using the software CPU (--backend interp)\n", stderr);
    }
  }
  if (a.progress.empty()) {
    o.progress.automatic = o.machine.backend == "kvm";
  } else {
    auto progress = parse_progress(a.progress);
    if (!progress) return std::unexpected(progress.error());
    o.progress = *progress;
    if (o.progress.emulated_skid && o.machine.backend != "interp") {
      return fail(ErrorKind::kInvalidArgument, "--progress {} emulates a PMU on the software CPU: add --backend interp",
                  a.progress);
    }
  }
  o.image_path = a.image;
  o.load.cmdline = a.cmdline;
  for (const auto& m : a.modules) {
    auto space = m.find(' ');
    o.load.modules.push_back(
        {m.substr(0, space), space == std::string::npos ? std::string() : m.substr(space + 1)});
  }
  o.serial_in = a.serial_in;
  o.serial_out = a.serial_out;
  o.stats = a.stats;
  o.print_digest = a.digest;
  return o;
}

int usage_error(const std::string& message) {
  std::fprintf(stderr, "deja: %s\n", message.c_str());
  return exit_status::kUsage;
}

}  // namespace
}  // namespace deja

int main(int argc, char** argv) {
  using namespace deja;
  CLI::App app{"deja: a virtual machine monitor for deterministic record and replay of x86-64 guests.\n"
               "Exit status: the guest's isa-debug-exit status ((value << 1) | 1, always odd), or deja's own:\n"
               "  2 bad arguments/image/trace, 4 guest stopped abnormally, 6 replay diverged,\n"
               "  8 trace ended early (truncated/corrupt), 10 host failure, 12 interrupted."};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string(deja_version()) + " (" + build_id() + ")");

  RunArgs run_args;
  auto* run = app.add_subcommand("run", "run a guest");
  add_run_options(run, run_args);

  RunArgs record_args;
  auto* record = app.add_subcommand("record", "run a guest and record every nondeterministic input to a trace");
  record->add_option("-o,--output", record_args.output, "trace file to write (mode 0600)")->required();
  add_run_options(record, record_args);

  ReplayOptions replay_opts;
  auto* replay = app.add_subcommand("replay", "re-execute a recorded guest from its trace, checking every event");
  replay->add_option("TRACE", replay_opts.trace_path, "trace file")->required();
  replay->add_option("--backend", replay_opts.backend, "kvm or interp (default: the recording's, if usable here)")
      ->check(CLI::IsMember({"kvm", "interp"}));
  replay->add_option("--progress", replay_opts.progress,
                     "exact-mode traces: the counter to reach coordinates with: exact, or emulated-pmu:SKID[:SEED] "
                     "(interp; default: as recorded)");
  replay->add_option("--image", replay_opts.image_path, "guest image (default: the path in the trace; hash-checked)");
  replay->add_option("--serial-out", replay_opts.serial_out, "where the replayed serial output goes (default stdout)");
  replay->add_flag("--stats", replay_opts.stats, "print exit counts at the end");
  replay->add_flag("--digest", replay_opts.print_digest, "print the final state digest");
  replay->add_flag("--quiet", replay_opts.quiet, "no summary line");
  // Tests only: replays with a deliberately changed device model, which must be reported as divergence.
  replay->add_option("--test-device-semantics", replay_opts.test_device_semantics)->group("");

  std::string inspect_path;
  InspectOptions inspect_opts;
  auto* inspect = app.add_subcommand("inspect", "describe a trace: provenance, duration, events, serial output");
  inspect->add_option("TRACE", inspect_path, "trace file")->required();
  inspect->add_flag("--events", inspect_opts.events, "print the timeline of events");
  inspect->add_flag("--serial", inspect_opts.serial, "print the recorded serial output");
  inspect->add_flag("--json", inspect_opts.json, "machine-readable JSON");

  std::string verify_path;
  auto* verify = app.add_subcommand("verify", "check a trace: checksums, hash chain, index, completeness");
  verify->add_option("TRACE", verify_path, "trace file")->required();

  auto* selftest = app.add_subcommand(
      "selftest", "check whether this host's PMU can give KVM exact interrupt timing (docs/pmu-hosts.md)");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int code = app.exit(e);
    return code == 0 ? 0 : exit_status::kUsage;
  }

  if (run->parsed() || record->parsed()) {
    RunArgs& a = run->parsed() ? run_args : record_args;
    auto options = to_session(a);
    if (!options) return usage_error(options.error().message);
    if (record->parsed()) {
      options->trace_path = a.output;
      return record_guest(*options);
    }
    return run_guest(*options);
  }
  if (replay->parsed()) return replay_trace(replay_opts);
  if (inspect->parsed()) {
    if (auto r = inspect_trace(inspect_path, inspect_opts, stdout); !r) return usage_error(r.error().message);
    return 0;
  }
  if (verify->parsed()) {
    VerifyReport report = verify_trace(verify_path);
    std::printf("%s\n", report.summary.c_str());
    if (!report.ok) {
      std::fprintf(stderr, "deja: %s: %s\n", verify_path.c_str(), report.first_problem.c_str());
      return 1;
    }
    return 0;
  }
  if (selftest->parsed()) {
    PmuSelftest result = run_pmu_selftest();
    for (const auto& c : result.checks) {
      std::printf("%-24s %s%s%s\n", c.name.c_str(), c.skipped ? "skipped" : c.passed ? "ok" : "FAILED",
                  c.detail.empty() ? "" : ": ", c.detail.c_str());
    }
    if (result.usable()) {
      std::printf("precise interrupt timing on KVM: available (%s)\n", result.counter.c_str());
      return 0;
    }
    std::printf("precise interrupt timing on KVM: unavailable; deja records KVM guests exit-synchronously\n");
    return exit_status::kHostFailure;
  }
  return exit_status::kUsage;
}
