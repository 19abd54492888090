// `deja run` and `deja record`: build a machine for a guest image, run it, and (record) write every input to a trace.
#include <string>
#include <vector>

#include "kvm/pmu.h"
#include "logging/trace_format.h"
#include "tools/command_support.h"
#include "vmm/build_info.h"
#include "vmm/cpu_model.h"
#include "vmm/guest_memory.h"
#include "vmm/host_io.h"
#include "vmm/messages.h"

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
  std::string cpu;
  bool stats = false;
  bool digest = false;
  std::string image;
  std::string output;  // record: the trace
};

// What a run or a recording needs, resolved from the options.
struct SessionOptions {
  MachineConfig machine;
  std::string image_path;
  LoadOptions load;
  std::string serial_in;         // "" = none, "-" = stdin, else a file
  std::string serial_out = "-";  // "-" = stdout
  bool stats = false;
  bool print_digest = false;
  ProgressChoice progress;
  std::string trace_path;            // record: output file
  uint64_t digest_interval = 16384;  // record a full state digest every N events
};

void add_run_options(CLI::App* cmd, RunArgs& a) {
  cmd->add_option("--backend", a.backend,
                  "vCPU backend: kvm or interp (default: kvm where this host's KVM passes deja's usability check, "
                  "see `deja selftest`; else interp)")
      ->check(CLI::IsMember({"kvm", "interp"}));
  std::vector<std::string> models;
  for (const CpuModel* m : CpuModel::all()) models.emplace_back(m->name());
  cmd->add_option("--cpu", a.cpu,
                  "CPU model the guest sees: " + CpuModel::names() +
                      " (default: the first of these the backend provides on this host)")
      ->check(CLI::IsMember(models));
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

Result<SessionOptions> to_session(const RunArgs& a) {
  SessionOptions o;
  auto mem = parse_size(a.mem);
  if (!mem) return std::unexpected(Error{ErrorKind::kInvalidArgument, "--mem: " + mem.error().message});
  o.machine.memory_bytes = *mem;
  o.machine.cmdline = a.cmdline;
  if (!a.progress.empty()) {
    auto progress = parse_progress(a.progress);
    if (!progress) return std::unexpected(progress.error());
    o.progress = *progress;
  }
  // An emulated PMU exists only on the software CPU, so asking for one picks it.
  std::string requested = a.backend.empty() && o.progress.emulated_skid ? "interp" : a.backend;
  if (o.progress.emulated_skid && requested != "interp") {
    return fail(ErrorKind::kInvalidArgument, "--progress {} emulates a PMU on the software CPU: use --backend interp",
                a.progress);
  }
  auto choice = choose_backend(requested, "kvm", a.cpu.empty() ? nullptr : CpuModel::find(a.cpu));
  if (!choice) return std::unexpected(choice.error());
  o.machine.backend = choice->backend;
  o.machine.cpu_model = choice->model;
  o.progress.automatic = a.progress.empty() && o.machine.backend == "kvm";
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

int run_or_record(const SessionOptions& options, Mode mode) {
  install_stop_signal_handlers();
  auto inputs = read_guest_inputs(options.image_path, options.load);
  if (!inputs) return report_error(inputs.error());

  MachineConfig config = options.machine;
  int64_t start_unix_ns = host_unix_time_ns();
  config.rtc_epoch_unix_seconds = start_unix_ns / 1'000'000'000;

  ProgressChoice progress = options.progress;
  if (progress.automatic) {
    // A plain run places nothing, so only a recording needs the self-test.
    progress.mode = ProgressMode::kExitSync;
    if (mode == Mode::kRecord) {
      PmuSelftest pmu = run_pmu_selftest();
      if (pmu.usable()) {
        progress.mode = ProgressMode::kExact;
      } else {
        say("warning: no precise interrupt timing on this host ({}); recording exit-synchronously (see `deja "
            "selftest`)",
            pmu.first_failure());
      }
    }
  }
  Session session(mode, progress.mode);
  std::unique_ptr<FdInput> input;
  if (!options.serial_in.empty()) {
    auto in = FdInput::open(options.serial_in);
    if (!in) return report_error(in.error());
    input = std::move(*in);
  }
  if (auto built = session.build(config, options.serial_out, inputs->image, options.image_path, options.load,
                                 inputs->modules);
      !built) {
    return report_error(built.error());
  }
  if (auto r = session.setup_progress(progress); !r) return report_error(r.error());
  session.attach_input(std::move(input));
  session.set_digest_interval(options.digest_interval);

  if (mode == Mode::kRecord) {
    trace::Header header;
    header.set_format_version(kTraceFormatVersion);
    header.set_cpu_model(std::string(config.cpu_model->name()));
    header.set_cpu_model_version(config.cpu_model->version());
    header.set_device_model_version(kDeviceModelVersion);
    header.set_build_id(build_id());
    header.set_deja_version(deja_version());
    header.set_host(host_description());
    header.set_start_unix_ns(start_unix_ns);
    *header.add_inputs() = input_file("image", options.image_path, inputs->image);
    for (size_t i = 0; i < options.load.modules.size(); ++i) {
      auto* f = header.add_inputs();
      *f = input_file("module", options.load.modules[i].path, inputs->modules[i]);
    }
    if (!options.serial_in.empty() && options.serial_in != "-") {
      if (auto sha = sha256_file(options.serial_in)) {
        auto* f = header.add_inputs();
        f->set_role("serial-in");
        f->set_path(options.serial_in);
        f->set_sha256(sha->data(), sha->size());
      }
    }
    auto* c = header.mutable_config();
    c->set_memory_bytes(config.memory_bytes);
    c->set_cmdline(config.cmdline);
    c->set_vcpus(1);
    c->set_backend(config.backend);
    c->set_progress_mode(std::string(progress_mode_name(progress.mode)));
    if (progress.mode == ProgressMode::kExact) c->set_progress_counter(session.counter_description());
    c->set_serial_input(!options.serial_in.empty());
    for (const auto& m : options.load.modules) c->add_module_args(m.args);
    c->set_rdtsc_trapped(session.machine().backend().traps_rdtsc());
    c->set_tsc_hz(CpuModel::kTscHz);
    c->set_device_semantics(config.device_semantics);
    auto writer = TraceWriter::create(options.trace_path, header);
    if (!writer) return report_error(writer.error());
    session.engine().attach_writer(std::move(*writer));
  }

  auto outcome = session.run();
  if (!outcome) {
    int status = report_error(outcome.error());
    if (mode == Mode::kRecord) {
      trace::End end;
      end.set_exit_status(status);
      end.set_reason("host failure: " + outcome.error().message);
      (void)session.engine().finish_record(end, trace::Footer{});
    }
    return status;
  }
  finish_outcome_message(*outcome);
  if (options.stats) session.print_stats();
  if (options.print_digest) say("digest {}", session.final_cpu_ram_digest().hex());

  if (mode == Mode::kRecord) {
    Digest full = session.final_machine_digest();
    auto& backend = session.machine().backend();
    trace::End end;
    *end.mutable_at() = to_proto(session.current_position());
    end.set_exit_status(outcome->status);
    end.set_digest(full.bytes.data(), full.bytes.size());
    end.set_instructions(backend.instruction_count().value_or(0));
    end.set_reason(outcome->reason);
    trace::Footer footer;
    footer.set_final_digest(full.bytes.data(), full.bytes.size());
    footer.set_instructions(backend.instruction_count().value_or(0));
    footer.set_branches(backend.branch_count().value_or(0));
    footer.set_wall_ns(session.wall_ns());
    footer.set_exit_status(outcome->status);
    if (auto r = session.engine().finish_record(std::move(end), std::move(footer)); !r) return report_error(r.error());
    say("recorded {} events to {} (backend {}, CPU model {}, {} progress)", session.engine().events_processed(),
        options.trace_path, config.backend, config.cpu_model->name(), progress_mode_name(progress.mode));
  }
  return outcome->status;
}


}  // namespace

std::vector<Subcommand> add_run_and_record_commands(CLI::App& app) {
  auto run_args = std::make_shared<RunArgs>();
  auto* run = app.add_subcommand("run", "run a guest");
  add_run_options(run, *run_args);

  auto record_args = std::make_shared<RunArgs>();
  auto* record = app.add_subcommand("record", "run a guest and record every nondeterministic input to a trace");
  record->add_option("-o,--output", record_args->output, "trace file to write (mode 0600)")->required();
  add_run_options(record, *record_args);

  auto start = [](const RunArgs& a, Mode mode) {
    auto options = to_session(a);
    if (!options) return report_error(options.error());
    options->trace_path = a.output;
    return run_or_record(*options, mode);
  };
  return {{run, [run_args, start] { return start(*run_args, Mode::kRun); }},
          {record, [record_args, start] { return start(*record_args, Mode::kRecord); }}};
}

}  // namespace deja
