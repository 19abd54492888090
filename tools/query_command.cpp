// `deja query`: registers or memory at a point of a trace (or all of memory as a core file), or every write to a range.
#include <charconv>
#include <cstdio>

#include <fmt/format.h>

#include "tools/command_support.h"
#include "tools/job_support.h"
#include "segments/tasks.h"
#include "replay/replay_setup.h"
#include "core/exit_status.h"
#include "core/messages.h"
#include "core/page_walker.h"
#include "replay/replay_timeline.h"
#include "snapshot/memory_dump.h"
#include "tools/progress_line.h"

namespace deja {
namespace {

struct QueryOptions {
  ReplaySetupOptions replay{.rewind = true};
  std::string at;
  bool regs = false;
  std::string mem;
  std::string dump;                // --dump FILE: all of guest memory and the registers there
  std::string dump_format = "elf";
  std::string writes;
  bool physical = false;
  bool json = false;
  std::optional<uint32_t> cpu;  // --at: the vCPU to read (default: the one the schedule runs there)
  uint64_t interval = 0;
  std::string checkpoint_memory = "512M";
  uint64_t sample = 0;
  JobOptions job;
  ProgressDisplay display;
};

std::string bytes_hex(std::span<const uint8_t> bytes) {
  std::string s;
  for (uint8_t b : bytes) s += fmt::format("{:02x}", b);
  return s;
}

// WHEN: a step count ("1234"), an event index ("event:56"), or "end".
struct When {
  enum class Kind { kStep, kEvent, kEnd } kind;
  uint64_t value = 0;
};
Result<When> parse_when(const std::string& text) {
  auto number = [](std::string_view s) -> std::optional<uint64_t> {
    uint64_t v = 0;
    auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (s.empty() || ec != std::errc() || ptr != s.data() + s.size()) return std::nullopt;
    return v;
  };
  if (text == "end") return When{When::Kind::kEnd};
  if (text.starts_with("event:")) {
    if (auto n = number(std::string_view(text).substr(6))) return When{When::Kind::kEvent, *n};
  } else if (auto n = number(text)) {
    return When{When::Kind::kStep, *n};
  }
  return fail(ErrorKind::kInvalidArgument, "--at '{}': expected a step count, event:N or end", text);
}

// `vcpu`: the vCPU read, named when the machine has several (nullopt: one, output as before several).
void print_registers(const CpuState& st, const CheckpointPosition& at, std::optional<uint32_t> vcpu, bool json) {
  if (json) {
    std::string out = registers_json(st, at);
    if (vcpu) out.insert(1, fmt::format("\"vcpu\": {}, ", *vcpu));
    std::printf("%s\n", out.c_str());
    return;
  }
  std::printf("steps %llu instructions %llu events %llu%s\n", (unsigned long long)at.steps,
              (unsigned long long)at.instructions, (unsigned long long)at.events,
              vcpu ? fmt::format(" vcpu {}", *vcpu).c_str() : "");
  // 0x and 16 digits for every value (printf's %#x drops the 0x of a zero).
  for (const auto& [name, value] : named_registers(st)) fmt::print("{:<8} 0x{:016x}\n", name, value);
}

// --dump: RAM and every vCPU's registers into `file`, then the file is renamed into place.
int write_dump(Session& session, const QueryOptions& o, ProductFile& file) {
  auto format = parse_dump_format(o.dump_format);
  if (!format) return report_error(format.error());
  std::vector<CpuState> cpus;
  for (uint32_t v = 0; v < session.machine().vcpu_count(); ++v) {
    auto st = session.machine().backend(v).get_state();
    if (!st) return report_error(st.error());
    cpus.push_back(*st);
  }
  const uint64_t started = HostClock::monotonic_ns();
  auto stats = write_memory_dump(session.machine().memory(), cpus, *format, file);
  if (!stats) return report_error(stats.error());
  if (auto r = file.commit(); !r) return report_error(r.error());
  const double seconds = double(HostClock::monotonic_ns() - started) / 1e9;
  say("wrote {} ({}, {} MiB of RAM{}) in {:.3f} s", o.dump, o.dump_format == "raw" ? "raw physical memory"
      : "ELF core: PT_LOAD at guest-physical 0, NT_PRSTATUS and QEMU CPU notes",
      stats->ram_bytes >> 20, stats->hole_bytes ? fmt::format(", {} MiB of zeros left as holes",
                                                               stats->hole_bytes >> 20) : "", seconds);
  return 0;
}

int query_at(ReplayTimeline& timeline, const QueryOptions& o, ProductFile* dump, ProgressLine& progress) {
  auto when = parse_when(o.at);
  if (!when) return report_error(when.error());
  Session& session = timeline.session();
  Result<StopReason> r;
  switch (when->kind) {
    case When::Kind::kStep:
      if (!timeline.counts_steps()) {
        return report_error({ErrorKind::kUnsupported, "--at COUNT needs a backend that counts steps (--backend interp); "
                                                      "use --at event:N"});
      }
      r = timeline.seek(when->value);
      break;
    case When::Kind::kEvent: r = timeline.seek_event(when->value); break;
    case When::Kind::kEnd: r = timeline.forward(StopRequest{}); break;
  }
  progress.finish();
  if (!r) return report_error(r.error());
  if (r->kind == StopReason::Kind::kEnd && when->kind != When::Kind::kEnd) {
    return report_error({ErrorKind::kInvalidArgument,
                         fmt::format("--at {}: the trace ends before it ({})", o.at, printable(r->outcome.reason))});
  }
  CheckpointPosition at = session.checkpoint_position();
  const uint32_t vcpus = uint32_t(session.machine().vcpu_count());
  const uint32_t vcpu = o.cpu.value_or(session.current_vcpu());
  if (vcpu >= vcpus) {
    return report_error({ErrorKind::kInvalidArgument,
                         fmt::format("--cpu {}: the trace's machine has {} vCPU{}", vcpu, vcpus, vcpus == 1 ? "" : "s")});
  }
  auto st = session.machine().backend(vcpu).get_state();
  if (!st) return report_error(st.error());
  if (o.regs) print_registers(*st, at, vcpus > 1 ? std::optional(vcpu) : std::nullopt, o.json);
  if (dump) {
    if (int status = write_dump(session, o, *dump); status != 0) return status;
  }
  if (!o.mem.empty()) {
    auto range = parse_range(o.mem, 1 << 20);
    if (!range) return report_error(range.error());
    std::vector<uint8_t> buf(range->second);
    size_t got = 0;
    if (o.physical) {
      auto span = session.machine().memory().span(Gpa{range->first}, range->second);
      // A range the query names outside RAM is a bad argument, not a guest that stopped (kGuest).
      if (!span) return report_error({ErrorKind::kInvalidArgument, fmt::format("--mem {}: {}", o.mem, span.error().message)});
      std::copy(span->begin(), span->end(), buf.begin());
      got = buf.size();
    } else {
      got = read_gva(*st, session.machine().memory(), range->first, buf);
    }
    if (got < buf.size()) {
      return report_error({ErrorKind::kInvalidArgument,
                           fmt::format("--mem {}: guest-virtual {:#x} is not mapped at this point", o.mem,
                                       range->first + got)});
    }
    if (o.json) {
      std::printf("{\"steps\": %llu, \"events\": %llu, \"address\": \"%#llx\", \"bytes\": \"%s\"}\n",
                  (unsigned long long)at.steps, (unsigned long long)at.events, (unsigned long long)range->first,
                  bytes_hex(buf).c_str());
    } else {
      for (size_t i = 0; i < buf.size(); i += 16) {
        std::string line = fmt::format("{:#014x}:", range->first + i);
        for (size_t j = i; j < std::min(buf.size(), i + 16); ++j) line += fmt::format(" {:02x}", buf[j]);
        std::printf("%s\n", line.c_str());
      }
    }
  }
  return 0;
}

int run_query(QueryOptions& o) {
  if (int(!o.writes.empty()) + int(!o.at.empty()) + int(o.sample != 0) != 1) {
    return report_error({ErrorKind::kInvalidArgument,
                         "give one of --at WHEN (with --regs or --mem), --writes ADDR:LEN or --sample N"});
  }
  if (!o.at.empty() && !o.regs && o.mem.empty() && o.dump.empty()) {
    return report_error({ErrorKind::kInvalidArgument, "--at needs --regs, --mem ADDR:LEN or --dump FILE"});
  }
  if (o.at.empty()) {
    // Over the whole trace: a job of segments (in parallel where the trace has checkpoints).
    if (auto bad = parse_range(o.writes.empty() ? (o.mem.empty() ? "0:1" : o.mem) : o.writes, 4096); !bad) {
      return report_error(bad.error());
    }
    o.job.plan.trace = o.replay.trace_path;
    o.job.plan.backend = o.replay.backend;
    o.job.plan.interp_mode = o.replay.interp_mode;
    o.job.plan.image_path = o.replay.image_path;
    o.job.plan.task = !o.writes.empty() ? "writes:" + o.writes
                                        : fmt::format("sample:{}{}", o.sample, o.mem.empty() ? "" : ":" + o.mem);
    return run_trace_job(o.job, o.json);
  }
  if (auto format = parse_dump_format(o.dump_format); !format) return report_error(format.error());
  ReplaySetupOptions replay = o.replay;
  replay.files.add_output("the memory dump", o.dump, OutputKind::kProduct);
  auto setup = open_replay(replay);
  if (!setup) return report_error(setup.error());
  // Created before the replay runs, so that a path that cannot be written is said at once, not after it.
  std::unique_ptr<ProductFile> dump;
  if (!o.dump.empty()) {
    auto file = ProductFile::create_replacing(o.dump, "memory dump", ProductFile::Unfinished::kRemove);
    if (!file) return report_error(file.error());
    dump = std::move(*file);
  }
  TimelineOptions topt;
  auto limit = parse_size(o.checkpoint_memory);
  if (!limit) return report_error(limit.error());
  topt.memory_limit = *limit;
  if (o.interval) topt.interval_steps = topt.interval_events = o.interval;
  auto timeline = ReplayTimeline::create(*setup->session, topt);
  if (!timeline) return report_error(timeline.error());
  // The progress of the replay towards the point asked for (the whole trace for --at end).
  ProgressLine progress("query", o.display);
  ReplayTotals totals = replay_totals(o.replay.trace_path);
  auto when = parse_when(o.at);
  if (when && when->kind == When::Kind::kEvent) totals = {when->value, std::nullopt};
  follow_replay(*setup->session, progress, totals);
  if (when && when->kind == When::Kind::kStep) {
    Session& session = *setup->session;
    progress.set_source([&session, target = when->value] {
      return std::vector<ProgressMeasure>{{"steps", session.machine().backend().step_count().value_or(0), target},
                                          {"events", session.engine().events_processed(), std::nullopt}};
    });
  }
  return query_at(**timeline, o, dump.get(), progress);
}

}  // namespace

Subcommand add_query_command(CLI::App& app) {
  auto o = std::make_shared<QueryOptions>();
  auto* cmd = app.add_subcommand("query", "registers or memory at a point of a trace, or every write to a range");
  cmd->add_option("TRACE", o->replay.trace_path, "trace file")->required();
  cmd->add_option("--at", o->at, "where: a step count (interp), event:N, or end");
  cmd->add_flag("--regs", o->regs, "print the registers there");
  cmd->add_option("--cpu", o->cpu, "--at: the vCPU whose registers and page tables to read (default: the one running "
                                    "there)");
  cmd->add_option("--mem", o->mem, "print guest-virtual memory ADDR:LEN there");
  cmd->add_flag("--phys", o->physical, "--mem reads guest-physical memory");
  cmd->add_option("--dump", o->dump,
                  "write all of guest-physical memory and the registers there to FILE (written as FILE.partial, then "
                  "renamed; never one of the replay's inputs)")
      ->type_name("FILE");
  cmd->add_option("--format", o->dump_format,
                  "--dump's format: elf (default: an ELF64 core as QEMU's dump-guest-memory writes it, for crash, gdb "
                  "and Volatility) or raw (physical memory only, from address 0)")
      ->check(CLI::IsMember({"elf", "raw"}));
  cmd->add_option("--writes", o->writes, "every write to guest-virtual ADDR:LEN over the whole trace");
  cmd->add_option("--sample", o->sample,
                  "the registers (and --mem) at every N-th step over the whole trace (interp)");
  cmd->add_flag("--json", o->json, "machine-readable output");
  cmd->add_option("--checkpoint-interval", o->interval, "steps or events between automatic checkpoints");
  cmd->add_option("--checkpoint-memory", o->checkpoint_memory, "memory for checkpoints (0: none; default 512M)");
  cmd->add_option("--backend", o->replay.backend, "interp or kvm")->check(CLI::IsMember({"kvm", "interp"}));
  cmd->add_option("--interp-mode", o->replay.interp_mode, "the software CPU's executor: jit (default), threaded or reference")
      ->check(CLI::IsMember({"reference", "threaded", "jit"}));
  cmd->add_option("--image", o->replay.image_path, "guest image (default: the path in the trace)");
  add_job_options(cmd, o->job);
  add_progress_display_options(cmd, o->display);
  return {cmd, [o] { return run_query(*o); }};
}

}  // namespace deja
