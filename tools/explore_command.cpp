// `deja explore`: run a guest under many seeds (schedules, timer jitter, faults), keep the trace of every run that fails.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <string>
#include <tuple>
#include <vector>

#include <fmt/ranges.h>

#include "core/exit_status.h"
#include "core/messages.h"
#include "core/seeded_random.h"
#include "explore/campaign.h"
#include "explore/minimize.h"
#include "explore/predicates.h"
#include "explore/symbols.h"
#include "logging/trace_format.h"
#include "logging/trace_reader.h"
#include "logging/output_file.h"
#include "segments/executor.h"
#include "segments/manifest.h"
#include "segments/merge.h"
#include "segments/tasks.h"
#include "tools/command_support.h"
#include "tools/job_support.h"
#include "tools/progress_line.h"
#include "tools/run_options.h"
#include "vmm/host_io.h"

namespace deja {
namespace {

using explore::Predicate;
using explore::SeedResult;

struct ExploreArgs {
  RunArgs run;
  std::string seeds;
  std::optional<uint64_t> seed;
  unsigned jobs = 1;
  std::vector<std::string> until;
  std::string directory;
  std::string schedule = "pct:2";
  std::string timer_jitter = "10us";
  std::string faults;
  std::string inputs_from;
  std::string serial_pace;
  uint64_t max_instructions = 20'000'000'000;
  bool json = false;
  ProgressDisplay display;
  std::string shard;
  // A campaign in shards run by an executor (segments/): plan, run, merge.
  uint32_t shards = 0;
  std::string workdir;
  std::string executor = "local";
  // --minimize TRACE: the fewest perturbations of a failing run that still fail.
  std::string minimize;
  std::string symbols;
};

// What every seed of the campaign shares, resolved once.
struct Campaign {
  SessionOptions session;
  std::vector<Predicate> predicates;
  std::string directory;
  std::string policy;  // pct, random, none
  uint32_t depth = 2;
  uint64_t change_window = 10'000;
  std::optional<uint64_t> quantum;
  uint64_t max_timer_delay_ns = 0;
  FaultPlan faults;  // (its seed is each run's)
  std::optional<RecordedInput> inputs_from;  // --inputs-from: the trace, and its serial input by guest time
  std::vector<ScriptedInput::Arrival> scripted_serial;
  // --serial-pace: the file's bytes, typed in pieces at gaps drawn from each run's seed.
  std::string paced_serial;
  uint64_t pace_min_ns = 0, pace_max_ns = 0;
  uint64_t max_instructions = 0;
  std::vector<std::string> args;  // the campaign's own arguments, recorded in each trace (Header.exploration)
  std::string file_prefix = "seed-";
  // --minimize: the perturbations taken away.
  uint64_t dropped_change_points = 0;
  std::vector<uint64_t> suppressed_faults, suppressed_net_faults;
  std::optional<uint32_t> schedule_version;  // the trace's, where it is minimized (else this deja's)
};

constexpr uint64_t kMaxPacedBytes = 1u << 20;

Result<uint64_t> parse_duration_ns(const std::string& text) {
  static const std::pair<const char*, uint64_t> units[] = {{"ns", 1}, {"us", 1'000}, {"ms", 1'000'000}, {"s", 1'000'000'000}};
  for (const auto& [suffix, scale] : units) {
    if (!text.ends_with(suffix)) continue;
    const std::string number = text.substr(0, text.size() - std::strlen(suffix));
    if (number.empty() || !std::all_of(number.begin(), number.end(), ::isdigit) || number.size() > 12) break;
    return std::stoull(number) * scale;
  }
  if (text == "0") return 0;
  return fail(ErrorKind::kInvalidArgument, "--timer-jitter {}: give a duration (0, 500ns, 20us, 1ms)", text);
}

// --faults disk-eio:RATE,disk-torn:RATE,net-drop:RATE,net-dup:RATE,net-reorder:RATE (RATE a fraction of requests or
// frames, 0.01, or a percentage, 1%).
Result<FaultPlan> parse_faults(const std::string& text) {
  FaultPlan plan;
  std::string_view rest = text;
  while (!rest.empty()) {
    const std::string item(rest.substr(0, std::min(rest.find(','), rest.size())));
    rest.remove_prefix(std::min(item.size() + 1, rest.size()));
    const size_t colon = item.find(':');
    const std::string name = item.substr(0, colon), rate = colon == std::string::npos ? "" : item.substr(colon + 1);
    char* end = nullptr;
    double value = rate.empty() ? -1 : std::strtod(rate.c_str(), &end);
    if (end && *end == '%') value /= 100, ++end;
    if (!end || *end || !(value >= 0 && value <= 1)) {
      return fail(ErrorKind::kInvalidArgument, "--faults {}: give KIND:RATE, RATE a fraction (0.01) or a percentage", item);
    }
    const uint32_t ppm = uint32_t(value * 1'000'000 + 0.5);
    if (name == "disk-eio") {
      plan.disk_eio_ppm = ppm;
    } else if (name == "disk-torn") {
      plan.disk_torn_ppm = ppm;
    } else if (name == "net-drop") {
      plan.net_drop_ppm = ppm;
    } else if (name == "net-dup") {
      plan.net_dup_ppm = ppm;
    } else if (name == "net-reorder") {
      plan.net_reorder_ppm = ppm;
    } else {
      return fail(ErrorKind::kInvalidArgument,
                  "--faults {}: the faults are disk-eio, disk-torn, net-drop, net-dup and net-reorder", name);
    }
  }
  if (plan.disk_eio_ppm + uint64_t(plan.disk_torn_ppm) > 1'000'000 ||
      uint64_t(plan.net_drop_ppm) + plan.net_dup_ppm + plan.net_reorder_ppm > 1'000'000) {
    return fail(ErrorKind::kInvalidArgument, "--faults {}: the rates of the disk's or the network's faults add up to "
                "more than one", text);
  }
  return plan;
}

// --schedule pct:D[:K] | random | none.
Result<> parse_schedule(const std::string& text, Campaign& c) {
  if (text == "random" || text == "none") {
    c.policy = text;
    return {};
  }
  if (text.starts_with("pct")) {
    c.policy = "pct";
    std::string rest = text.substr(3);
    unsigned long long depth = 2, window = c.change_window;
    int used = 0;
    const bool parsed = rest.empty() ||
                        (std::sscanf(rest.c_str(), ":%llu%n", &depth, &used) == 1 && size_t(used) == rest.size()) ||
                        (std::sscanf(rest.c_str(), ":%llu:%llu%n", &depth, &window, &used) == 2 &&
                         size_t(used) == rest.size());
    if (parsed) {
      if (depth >= 1 && depth <= 64 && window >= 1 && window <= (1ull << 40)) {
        c.depth = uint32_t(depth);
        c.change_window = window;
        return {};
      }
    }
  }
  return fail(ErrorKind::kInvalidArgument,
              "--schedule {}: pct[:D[:K]] (bug depth D from 1 to 64, K scheduling events), random, or none", text);
}

// The schedule of `seed`'s run (several vCPUs).
ScheduleConfig schedule_for(const Campaign& c, uint64_t seed) {
  // "none": the same schedule whatever the seed.
  ScheduleConfig s = default_schedule(SliceUnit::kInstructions, c.policy == "none" ? 0 : seed);
  if (c.schedule_version) s.version = *c.schedule_version;
  if (c.policy == "none") {
    if (c.quantum) s.quantum = *c.quantum;
    return s;
  }
  s.policy = c.policy;
  if (c.policy == "pct") {
    s.depth = c.depth;
    s.change_window = c.change_window;
    s.dropped_change_points = c.dropped_change_points;
    s.lock_events = true;  // (a lock taken or released is where another vCPU's turn matters)
    s.quantum = c.quantum.value_or(1'000'000);  // a vCPU runs until it blocks, spins or a change point: re-decided
  } else {
    s.quantum = c.quantum.value_or(10'000);     // random: short slices, uniform in [1, 2 quantum]
  }
  return s;
}

std::string seed_file(const Campaign& c, uint64_t seed, const char* suffix) {
  return fmt::format("{}/{}{}{}", c.directory, c.file_prefix, seed, suffix);
}

// --serial-pace: `text` typed as a person or a terminal program would, in pieces of 1 to 16 bytes (never across a
// newline), each a gap after the one before drawn uniformly from [min, max] of guest time; a function of the seed.
std::vector<ScriptedInput::Arrival> paced_arrivals(const std::string& text, uint64_t min_ns, uint64_t max_ns,
                                                   uint64_t seed) {
  std::vector<ScriptedInput::Arrival> arrivals;
  SplitMix64 draws(seed ^ 0x7061636564ull);  // ("paced": apart from the run's other draws)
  uint64_t at = 0;
  for (size_t i = 0; i < text.size();) {
    size_t length = 1 + draws.next() % 16;
    const size_t newline = text.find('\n', i);
    if (newline != std::string::npos) length = std::min(length, newline + 1 - i);
    length = std::min(length, text.size() - i);
    at += min_ns + draws.next() % (max_ns - min_ns + 1);
    arrivals.push_back(ScriptedInput::Arrival{at, text.substr(i, length)});
    i += length;
  }
  return arrivals;
}

// "MAX" or "MIN..MAX", durations.
Result<std::pair<uint64_t, uint64_t>> parse_pace(const std::string& text) {
  const size_t dots = text.find("..");
  auto low = parse_duration_ns(dots == std::string::npos ? "0" : text.substr(0, dots));
  auto high = parse_duration_ns(dots == std::string::npos ? text : text.substr(dots + 2));
  if (!low || !high || *low > *high || *high > 3'600'000'000'000ull) {
    return fail(ErrorKind::kInvalidArgument, "--serial-pace {}: give MAX or MIN..MAX, durations up to an hour (2ms, "
                "1ms..20ms)", text);
  }
  return std::pair(*low, *high);
}

// One seed's run, in its own process: a recording whose inputs all come from the seed. Its messages go to
// DIR/seed-S.log, the guest's serial output to DIR/seed-S.serial; a run that meets no predicate leaves nothing.
SeedResult run_seed(const Campaign& c, uint64_t seed) {
  SeedResult result;
  result.seed = seed;
  const auto started = std::chrono::steady_clock::now();
  const std::string trace = seed_file(c, seed, ".trace"), serial = seed_file(c, seed, ".serial"),
                    log = seed_file(c, seed, ".log");
  if (auto console = open_console_file(log, "the run's log"); console) {
    ::dup2(console->fd, STDOUT_FILENO);
    ::dup2(console->fd, STDERR_FILENO);
    if (console->owned) ::close(console->fd);
  }
  explore::SerialWatch watch(c.predicates);
  SeededRecording recording;
  recording.seed = seed;
  if (c.session.machine.vcpus > 1) recording.schedule = schedule_for(c, seed);
  recording.max_timer_delay_ns = c.max_timer_delay_ns;
  recording.faults = c.faults;
  recording.faults.seed = seed;
  recording.faults.suppressed = c.suppressed_faults;
  recording.faults.net_suppressed = c.suppressed_net_faults;
  recording.inputs_from = c.inputs_from;
  recording.scripted_serial = c.paced_serial.empty() ? c.scripted_serial
                                                      : paced_arrivals(c.paced_serial, c.pace_min_ns, c.pace_max_ns, seed);
  for (const std::string& arg : c.args) recording.provenance.add_args(arg);
  recording.provenance.set_seed(seed);
  recording.limits.max_steps = c.max_instructions;
  recording.limits.hang_steps = explore::hang_instructions(c.predicates);
  // Asleep in HLT for 10 s of guest time with nothing to wake it (a timer that fires into a masked line): a hang, and
  // the end of the run either way (a simulated host's waits cost no host time, so nothing else would end it).
  recording.limits.max_idle_ns = 10'000'000'000;
  recording.serial_tap = [&watch](std::span<const uint8_t> bytes) { watch.feed(bytes); };
  recording.limits.stop = [&watch]() { return watch.matched(); };
  SessionOptions options = c.session;
  options.trace_path = trace;
  options.serial_out = serial;
  options.seeded = &recording;
  const int status = run_or_record(options, Mode::kRecord);
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  if (!recording.outcome) {
    result.error = true;
    result.status = status;
    result.reason = fmt::format("the run failed (status {}): see {}", status, log);
    return result;  // (its files are kept, to say why)
  }
  const Outcome& o = *recording.outcome;
  result.status = o.status;
  result.reason = o.reason;
  result.digest = recording.digest;
  result.instructions = recording.instructions;
  result.schedule_events = recording.schedule_events;
  result.faults = recording.faults_injected;
  result.perturbations = recording.perturbations;
  explore::RunEnd end;
  end.guest_exit = o.guest_exit;
  end.status = o.status;
  end.hang = o.reason.starts_with(Session::kHangReason) ||
             (o.status == exit_status::kGuestStopped && o.reason.find("halted") != std::string::npos);
  end.digest = recording.digest;
  result.met = explore::met_predicates(c.predicates, end, watch.matched());
  if (result.failed()) {
    result.trace = trace;
  } else {
    std::error_code ec;
    for (const std::string& f : {trace, serial, log}) std::filesystem::remove(f, ec);
  }
  return result;
}

// Serial input a seeded run can have: a regular file's bytes, typed ahead as `deja record` types them (--serial-in),
// or typed in pieces at seeded gaps (--serial-pace), or a recording's serial input at the guest times it arrived
// (--inputs-from). Nothing read from the host as it runs.
Result<> resolve_serial_input(ExploreArgs& a, Campaign& c) {
  if (!a.run.serial_in.empty()) {
    if (!a.inputs_from.empty()) return fail(ErrorKind::kInvalidArgument, "give --serial-in or --inputs-from, not both");
    struct stat st{};
    if (a.run.serial_in == "-" || ::stat(a.run.serial_in.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) {
      return fail(ErrorKind::kInvalidArgument,
                  "--serial-in {}: deja explore reads nothing from the host while a seed runs, so its serial input is "
                  "a regular file (its bytes typed ahead), or --inputs-from TRACE",
                  a.run.serial_in);
    }
    if (a.serial_pace.empty()) return {};
    auto pace = parse_pace(a.serial_pace);
    if (!pace) return std::unexpected(pace.error());
    if (uint64_t(st.st_size) > kMaxPacedBytes) {
      return fail(ErrorKind::kInvalidArgument, "--serial-in {}: {} bytes; --serial-pace types at most {} (typed ahead, "
                  "without --serial-pace, a file may be larger)", a.run.serial_in, st.st_size, kMaxPacedBytes);
    }
    auto bytes = read_file(a.run.serial_in);
    if (!bytes) return std::unexpected(bytes.error());
    if (bytes->size() > kMaxPacedBytes) {
      return fail(ErrorKind::kInvalidArgument, "--serial-in {}: it grew past {} bytes while read", a.run.serial_in,
                  kMaxPacedBytes);
    }
    c.paced_serial.assign(bytes->begin(), bytes->end());
    const auto hash = sha256_bytes(*bytes);
    c.inputs_from = RecordedInput{"serial-in", a.run.serial_in, std::string(hash.begin(), hash.end()), c.paced_serial.size()};
    std::tie(c.pace_min_ns, c.pace_max_ns) = *pace;
    a.run.serial_in.clear();  // (typed by the run's ScriptedInput, not read as a file)
    return {};
  }
  if (!a.serial_pace.empty()) return fail(ErrorKind::kInvalidArgument, "--serial-pace paces --serial-in FILE: give one");
  if (a.inputs_from.empty()) return {};
  auto from = ScriptedInput::read_trace(a.inputs_from);
  if (!from) return fail(ErrorKind::kInvalidArgument, "--inputs-from {}: {}", a.inputs_from, from.error().message);
  if (!from->damage.empty()) {
    say("note: --inputs-from {}: the serial input before the damage is used ({})", a.inputs_from, from->damage);
  }
  if (from->net_frames > 0) {
    say("note: --inputs-from {}: its {} network frames are left out (a seeded run's network is its own: --net user, "
        "whose answers follow what the guest sends)", a.inputs_from, from->net_frames);
  }
  auto hashed = sha256_file(a.inputs_from);
  if (!hashed) return std::unexpected(hashed.error());
  std::error_code ec;
  const uint64_t size = std::filesystem::file_size(a.inputs_from, ec);
  c.inputs_from = RecordedInput{"serial-in", a.inputs_from, std::string(hashed->begin(), hashed->end()), ec ? 0 : size};
  c.scripted_serial = std::move(from->arrivals);
  return {};
}

// A seeded run's networks are libslirp's own (DHCP, ARP, ping and TFTP at 10.0.2.2) and nothing of the host's:
// restricted, with no host forwards (whose peers would be host programs, answering in host time).
Result<> restrict_networks(RunArgs& run) {
  for (std::string& net : run.nets) {
    auto parsed = parse_net_option(net);
    if (!parsed) return std::unexpected(parsed.error());
    if (!parsed->forwards.empty()) {
      return fail(ErrorKind::kInvalidArgument,
                  "--net {}: a seeded run's network reaches nothing of the host's, so no hostfwd= (serve files to the "
                  "guest with tftp=DIR)", net);
    }
    if (!parsed->restricted) net += ",restrict=on";
  }
  return {};
}

Result<Campaign> resolve(ExploreArgs& a) {
  Campaign c;
  if (a.run.backend == "kvm") {
    return fail(ErrorKind::kInvalidArgument,
                "deja explore runs on the software CPU (--backend interp): a seed's run must count every instruction");
  }
  a.run.backend = "interp";
  if (!a.run.progress.empty() && a.run.progress != "exact") {
    return fail(ErrorKind::kInvalidArgument, "deja explore needs exact progress (--progress exact, the default)");
  }
  if (a.run.schedule_seed) {
    return fail(ErrorKind::kInvalidArgument, "deja explore draws each run's schedule from its seed: drop --schedule-seed");
  }
  if (auto r = restrict_networks(a.run); !r) return std::unexpected(r.error());
  if (auto r = resolve_serial_input(a, c); !r) return std::unexpected(r.error());
  if (a.until.empty()) return fail(ErrorKind::kInvalidArgument, "give at least one --until PREDICATE");
  for (const std::string& u : a.until) {
    auto p = explore::parse_predicate(u);
    if (!p) return std::unexpected(p.error());
    c.predicates.push_back(*p);
  }
  if (auto r = parse_schedule(a.schedule, c); !r) return std::unexpected(r.error());
  c.quantum = a.run.schedule_quantum;
  a.run.schedule_quantum.reset();  // (ours: run/record would refuse it with one vCPU)
  auto jitter = parse_duration_ns(a.timer_jitter);
  if (!jitter) return std::unexpected(jitter.error());
  c.max_timer_delay_ns = *jitter;
  c.max_instructions = a.max_instructions;
  if (!a.faults.empty()) {
    auto faults = parse_faults(a.faults);
    if (!faults) return std::unexpected(faults.error());
    c.faults = *faults;
    if ((c.faults.disk_eio_ppm || c.faults.disk_torn_ppm) && a.run.disks.empty() && a.run.libvirt_xml.empty() &&
        a.run.libvirt_domain.empty()) {
      return fail(ErrorKind::kInvalidArgument, "--faults {}: the machine has no disk (--disk)", a.faults);
    }
    if (c.faults.any_network() && a.run.nets.empty()) {
      return fail(ErrorKind::kInvalidArgument, "--faults {}: the machine has no network (--net user)", a.faults);
    }
  }
  auto session = to_session(a.run);
  if (!session) return std::unexpected(session.error());
  c.session = std::move(*session);
  // What every run reads, checked once here rather than failing in every seed's process.
  for (const std::string& input : {c.session.image_path, c.session.load.initrd_path}) {
    if (!input.empty() && ::access(input.c_str(), R_OK) != 0) {
      return fail(ErrorKind::kInvalidArgument, "{}: cannot read it ({})", input, strerror(errno));
    }
  }
  if (a.directory.empty()) return fail(ErrorKind::kInvalidArgument, "give the directory for failing runs' traces: -o DIR");
  // (Shards of one campaign start together and share DIR: whichever makes it, the others find it made.)
  struct stat st{};
  if (::mkdir(a.directory.c_str(), 0700) != 0 && errno != EEXIST) {
    return fail(ErrorKind::kHost, "-o {}: cannot make the directory ({})", a.directory, strerror(errno));
  }
  if (::lstat(a.directory.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return fail(ErrorKind::kInvalidArgument, "-o {}: not a directory", a.directory);
  }
  c.directory = a.directory;
  return c;
}

// The campaign's arguments without those that choose seeds, jobs, outputs and shards (`with_values` take one value):
// what each shard runs, and what a trace records of its campaign.
std::vector<std::string> without_options(const std::vector<std::string>& args, std::initializer_list<const char*> with_values,
                                         std::initializer_list<const char*> flags = {}) {
  std::vector<std::string> out;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& s = args[i];
    auto named = [&s](const char* name) { return s == name || s.starts_with(std::string(name) + "="); };
    if (std::any_of(flags.begin(), flags.end(), named)) continue;
    const auto valued = std::find_if(with_values.begin(), with_values.end(), named);
    if (valued != with_values.end()) {
      if (s == *valued) ++i;  // "--name value" (not "--name=value")
      continue;
    }
    out.push_back(s);
  }
  return out;
}

std::vector<std::string> campaign_arguments(const std::vector<std::string>& args) {
  return without_options(args, {"--seeds", "--seed", "-o", "--output", "-j", "--jobs", "--shard", "--shards", "--workdir",
                                "--executor", "--minimize", "--symbols"},
                         {"--json", "--progress-json", "--quiet"});
}

// Runs the campaign's seeds (its shard's, with --shard); each result goes to `records` as a JSON line when given,
// else to the output. Returns the exit status: 0 nothing found, kFound a run failed, else an error's.
int run_campaign(ExploreArgs& a, const std::vector<std::string>& args, std::vector<std::string>* records) {
  if (a.seed && !a.seeds.empty()) return report_error({ErrorKind::kInvalidArgument, "give --seed or --seeds, not both"});
  if (!a.seed && a.seeds.empty()) return report_error({ErrorKind::kInvalidArgument, "give --seeds A..B or --seed S"});
  auto range = explore::parse_seed_range(a.seed ? std::to_string(*a.seed) : a.seeds);
  if (!range) return report_error(range.error());
  explore::Shard shard;
  if (!a.shard.empty()) {
    auto s = explore::parse_shard(a.shard);
    if (!s) return report_error(s.error());
    shard = *s;
  }
  auto campaign = resolve(a);
  if (!campaign) return report_error(campaign.error());
  campaign->args = campaign_arguments(args);
  const std::vector<uint64_t> seeds = explore::shard_seeds(*range, shard);

  ProgressLine line("explore", a.display);
  uint64_t done = 0, failures = 0;
  line.set_source([&] {
    return std::vector<ProgressMeasure>{{"seeds", done, seeds.size()}, {"failures", failures, std::nullopt}};
  });
  line.poll();
  const auto started = std::chrono::steady_clock::now();
  auto results = explore::run_seeds(
      seeds, a.jobs, [&](uint64_t seed) { return run_seed(*campaign, seed); },
      [&](const SeedResult& r) {
        ++done;
        failures += r.failed();
        if (records) {
          records->push_back(explore::to_json(r));
        } else if (a.json) {
          std::printf("%s\n", explore::to_json(r).c_str());
          std::fflush(stdout);
        } else if (r.failed() || r.error) {
          line.finish();  // (cleared, drawn again by the next poll)
          say("seed {}: {} ({}){}", r.seed, r.outcome_class(), r.reason, r.trace.empty() ? "" : ": " + r.trace);
        }
        line.poll();
      });
  line.finish();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  const explore::Summary summary = explore::summarize(results, seconds);
  if (!records) {
    if (a.json) std::printf("%s\n", explore::summary_json(summary).c_str());
    else std::printf("%s\n", explore::summary_text(summary).c_str());
  }
  if (summary.failures) return exit_status::kFound;
  return summary.errors ? exit_status::kHostFailure : 0;
}

void add_explore_options(CLI::App* cmd, ExploreArgs& a) {
  add_run_options(cmd, a.run);
  cmd->add_option("--seeds", a.seeds, "the seeds to run: A..B (both included)");
  cmd->add_option("--seed", a.seed, "one seed (its trace is a function of the seed: run it again, get the same bytes)");
  cmd->add_option("-j,--jobs", a.jobs, "seeds run at a time, each in a process of its own (default 1)")
      ->check(CLI::Range(1u, 1024u));
  cmd->add_option("--until", a.until,
                  "what makes a run a failure, whose trace is kept: exit:N[,N...] or exit:!N (deja's exit status for "
                  "the run), serial:REGEX (a line of serial output), digest:HEX (the final --digest starts with it), "
                  "hang[:N] (no serial output in N instructions, default 1G, or every vCPU halted for good); repeatable: "
                  "any one")
      ->allow_extra_args(false);
  cmd->add_option("-o,--output", a.directory, "the directory that keeps failing runs: seed-S.trace, .serial, .log");
  cmd->add_option("--schedule", a.schedule,
                  "several vCPUs: pct[:D[:K]] (PCT priorities with D-1 change points among the first K scheduling "
                  "events: PAUSEs, port and MMIO accesses, interrupts; default pct:2:10000), random (uniform random "
                  "slices and next vCPU), none (the default schedule, the same for every seed)");
  cmd->add_option("--timer-jitter", a.timer_jitter,
                  "device deadlines (timers, completions) are met up to this late, by a delay drawn from the seed "
                  "(default 10us; 0: on time)");
  cmd->add_option("--faults", a.faults,
                  "faults drawn from the seed: disk-eio:RATE (a read or write answered VIRTIO_BLK_S_IOERR), "
                  "disk-torn:RATE (a write cut short: a prefix of its sectors written, then IOERR), net-drop:RATE, "
                  "net-dup:RATE, net-reorder:RATE (a frame either way lost, delivered twice, or 1-10 ms late past "
                  "later ones; --net user); RATE a fraction of requests or frames (0.01) or a percentage (1%); "
                  "comma-separated");
  cmd->add_option("--inputs-from", a.inputs_from,
                  "a trace whose serial input each run gets, at the guest times it arrived there (instead of "
                  "--serial-in FILE, whose bytes are typed ahead)");
  cmd->add_option("--serial-pace", a.serial_pace,
                  "with --serial-in FILE: type it in pieces of 1 to 16 bytes (never across a newline), each after a gap "
                  "of guest time drawn from the seed: MAX or MIN..MAX (1ms..20ms); at most 1 MiB");
  cmd->add_option("--max-instructions", a.max_instructions,
                  "a run stops after this many instructions (a limit, not a failure; default 20G)")
      ->check(CLI::Range(uint64_t{1}, uint64_t{1} << 50));
  cmd->add_flag("--json", a.json, "a JSON line per seed and a last one with the summary, on standard output");
  add_progress_display_options(cmd, a.display);
  cmd->add_option("--minimize", a.minimize,
                  "a failing run's trace (kept by deja explore): run it again taking away its perturbations one by one "
                  "(timer jitter, PCT change points, faults), keep what it still fails without, report the critical "
                  "events and write the minimized trace into -o DIR");
  cmd->add_option("--symbols", a.symbols, "with --minimize: an ELF or System.map naming the critical events' RIPs");
  cmd->add_option("--shard", a.shard, "run only shard I of N of the seeds (every N-th from the I-th): I/N");
  cmd->add_option("--shards", a.shards,
                  "split the campaign into N shards run by an executor (--executor) through a job's manifest in "
                  "--workdir, then merge their results (docs/segments.md)")
      ->check(CLI::Range(1u, 1'000'000u));
  cmd->add_option("--workdir", a.workdir, "with --shards: where the manifest, results and logs go");
  cmd->add_option("--executor", a.executor, "with --shards: local (processes here, -j at a time) or slurm")
      ->check(CLI::IsMember({"local", "slurm"}));
}

int run_sharded(const ExploreArgs& a) {
  if (a.workdir.empty()) return report_error({ErrorKind::kInvalidArgument, "--shards needs --workdir DIR"});
  const std::vector<std::string> args =
      without_options(command_line_arguments(), {"--shards", "--workdir", "--executor", "-j", "--jobs", "--shard"});
  auto manifest = plan_shards("explore", args, a.shards, a.workdir);
  if (!manifest) return report_error(manifest.error());
  auto path = write_manifest(*manifest);
  if (!path) return report_error(path.error());
  auto loaded = read_manifest(*path);
  if (!loaded) return report_error(loaded.error());
  ExecutorOptions executor;
  executor.kind = a.executor;
  executor.jobs = a.jobs;
  return run_job(*loaded, executor, a.json);
}

// --minimize TRACE: the failing run again, from the campaign and seed its header records, then delta debugging
// (explore/minimize.h) over its perturbations (each PCT change point, each injected fault, the timer jitter): the fewest that still fail, where taking away any one more makes the run pass.
int run_minimize(const ExploreArgs& given) {
  if (given.directory.empty()) return report_error({ErrorKind::kInvalidArgument, "--minimize needs -o DIR"});
  auto reader = TraceReader::open(given.minimize);
  if (!reader) return report_error(reader.error());
  const trace::Header& header = (*reader)->header();
  if (!header.has_exploration()) {
    return report_error({ErrorKind::kInvalidArgument,
                         fmt::format("{} was not recorded by deja explore (its header names no campaign)", given.minimize)});
  }
  std::optional<explore::Symbols> symbols;
  if (!given.symbols.empty()) {
    auto loaded = explore::Symbols::load(given.symbols);
    if (!loaded) return report_error(loaded.error());
    symbols = std::move(*loaded);
  }
  const uint64_t seed = header.exploration().seed();
  const std::vector<std::string> args(header.exploration().args().begin(), header.exploration().args().end());
  CLI::App app;
  ExploreArgs a;
  add_explore_options(&app, a);
  try {
    app.parse(std::vector<std::string>(args.rbegin(), args.rend()));
  } catch (const CLI::ParseError& e) {
    return report_error({ErrorKind::kBadTrace, fmt::format("{}: its campaign's arguments: {}", given.minimize, e.what())});
  }
  a.directory = given.directory;
  auto campaign = resolve(a);
  if (!campaign) return report_error(campaign.error());
  Campaign& c = *campaign;
  c.args = args;
  if (header.config().has_faults()) {
    const auto& f = header.config().faults();
    c.suppressed_faults.assign(f.suppressed().begin(), f.suppressed().end());
    c.suppressed_net_faults.assign(f.net_suppressed().begin(), f.net_suppressed().end());
  }
  if (header.config().has_schedule()) {
    c.dropped_change_points = header.config().schedule().dropped_change_points();
    c.schedule_version = header.config().schedule().version();
  }

  unsigned attempt = 0;
  auto try_run = [&](const Campaign& variant) {
    Campaign v = variant;
    v.file_prefix = fmt::format("minimize-{}-seed-", attempt++);
    std::vector<SeedResult> r = explore::run_seeds({seed}, 1, [&v](uint64_t s) { return run_seed(v, s); },
                                                   [](const SeedResult&) {});
    return r.front();
  };
  SeedResult last = try_run(c);
  if (!last.failed()) {
    return report_error({ErrorKind::kInvalidArgument,
                         fmt::format("seed {} does not fail again ({}): another deja build or guest image?", seed,
                                     last.reason)});
  }
  // What the run was perturbed by, each with the way to take it away (what is already left out stays out). A new kind
  // of perturbation is one more case here. Every change point drawn (one that did not fire here may fire once others
  // are gone), by its draw; the timer jitter last: ddmin tries the first part alone first, and a race found by a
  // schedule needs its change points more often than its timing.
  struct Step {
    std::string what;
    std::function<void(Campaign&)> take_away;
  };
  std::vector<Step> steps;
  if (c.policy == "pct" && c.session.machine.vcpus > 1) {
    for (uint32_t i = 0; i + 1 < c.depth && i < 64; ++i) {
      if (!(c.dropped_change_points >> i & 1)) {
        steps.push_back({fmt::format("change point {}", i),
                         [i](Campaign& v) { v.dropped_change_points |= uint64_t{1} << i; }});
      }
    }
  }
  for (const explore::Perturbation& p : last.perturbations) {
    if (p.kind == "fault") {
      steps.push_back(
          {fmt::format("fault {}", p.index), [i = p.index](Campaign& v) { v.suppressed_faults.push_back(i); }});
    } else if (p.kind == "net-fault") {
      steps.push_back({fmt::format("network fault {}", p.index),
                       [i = p.index](Campaign& v) { v.suppressed_net_faults.push_back(i); }});
    }
  }
  if (c.max_timer_delay_ns) steps.push_back({"timer jitter", [](Campaign& v) { v.max_timer_delay_ns = 0; }});

  auto named = [&](const explore::Removal& removed) {
    std::vector<std::string> names;
    for (size_t i = 0; i < steps.size(); ++i) {
      if (removed[i]) names.push_back(steps[i].what);
    }
    constexpr size_t kNamed = 8;
    const size_t more = names.size() > kNamed ? names.size() - kNamed : 0;
    names.resize(names.size() - more);
    return fmt::format("{}{}", fmt::join(names, ", "), more ? fmt::format(" and {} more", more) : "");
  };
  // The last failing run is the one ddmin ends with (minimize.h): it becomes the minimized trace, and each failing run
  // before it is removed when the next fails (passing runs leave nothing).
  const explore::Minimized minimized = explore::minimize_failure(steps.size(), [&](const explore::Removal& removed) {
    Campaign variant = c;
    for (size_t i = 0; i < steps.size(); ++i) {
      if (removed[i]) steps[i].take_away(variant);
    }
    SeedResult r = try_run(variant);
    say("without {}: {}", named(removed), r.failed() ? "still fails" : "passes (" + r.outcome_class() + ")");
    if (!r.failed()) return false;
    std::error_code ignored;
    for (const char* suffix : {".trace", ".serial", ".log"}) {
      std::filesystem::remove(last.trace.substr(0, last.trace.size() - 6) + suffix, ignored);
    }
    last = std::move(r);
    return true;
  });
  const size_t removed = std::count(minimized.removed.begin(), minimized.removed.end(), true);

  const std::string kept = fmt::format("{}/minimized-seed-{}.trace", c.directory, seed);
  std::error_code ec;
  const std::string base = last.trace.substr(0, last.trace.size() - 6);
  std::filesystem::rename(last.trace, kept, ec);
  if (ec) {
    return report_error({ErrorKind::kHost, fmt::format("cannot rename {} to {}: {}", last.trace, kept, ec.message())});
  }
  for (const char* suffix : {".serial", ".log"}) {
    std::filesystem::rename(base + suffix, kept.substr(0, kept.size() - 6) + suffix, ec);
  }
  std::printf("seed %llu: %zu of %zu perturbations taken away, still %s (ddmin: %u runs besides the first)\n",
              (unsigned long long)seed, removed, steps.size(), last.outcome_class().c_str(), minimized.tests);
  std::printf("critical events:\n");
  for (const explore::Perturbation& p : last.perturbations) {
    const std::string symbol = symbols ? symbols->describe(p.rip) : std::string();
    std::printf("  %s %llu: vCPU %u rip %#llx%s (%s)\n", p.kind.c_str(), (unsigned long long)p.index, p.vcpu,
                (unsigned long long)p.rip, symbol.empty() ? "" : (" " + symbol).c_str(), p.detail.c_str());
  }
  if (last.perturbations.empty()) std::printf("  none: the seed's schedule and inputs fail without any\n");
  std::printf("minimized trace: %s\n", kept.c_str());
  return exit_status::kFound;
}

// The campaign as shards of a job (segments/tasks.h): each shard runs its seeds; the merge sums them up.
class ExploreShardTask : public ShardTask {
 public:
  Result<int> run_shard(std::span<const std::string> args, uint32_t index, uint32_t count,
                        std::vector<std::string>& records) override {
    CLI::App app;
    ExploreArgs a;
    add_explore_options(&app, a);
    std::vector<std::string> reversed(args.rbegin(), args.rend());
    try {
      app.parse(reversed);
    } catch (const CLI::ParseError& e) {
      return fail(ErrorKind::kInvalidArgument, "the campaign's arguments: {}", e.what());
    }
    a.shard = fmt::format("{}/{}", index, count);
    a.display.quiet = true;
    const int status = run_campaign(a, std::vector<std::string>(args.begin(), args.end()), &records);
    // A campaign refused before any seed ran fails its shard: merged as an empty shard, its seeds would be lost.
    if (status != 0 && status != exit_status::kFound && records.empty()) {
      return fail(ErrorKind::kHost, "the campaign ran no seed (exit status {}; the reason is in the shard's log)", status);
    }
    return status;
  }

  int merge(std::span<const std::string>, const std::vector<std::vector<std::string>>& records) override {
    std::vector<SeedResult> results;
    for (const auto& shard : records) {
      for (const std::string& line : shard) {
        auto r = explore::seed_result_from_json(line);
        if (!r) return report_error(r.error());
        if (r->failed()) say("seed {}: {} ({}): {}", r->seed, r->outcome_class(), r->reason, r->trace);
        results.push_back(std::move(*r));
      }
    }
    const explore::Summary summary = explore::summarize(results, 0);
    std::printf("%s\n", explore::summary_text(summary).c_str());
    return summary.failures ? exit_status::kFound : 0;
  }
};

}  // namespace

Subcommand add_explore_command(CLI::App& app) {
  register_shard_task("explore", [] { return std::make_unique<ExploreShardTask>(); });
  auto a = std::make_shared<ExploreArgs>();
  auto* cmd = app.add_subcommand("explore",
                                 "run a guest under many seeds (vCPU schedules, timer jitter) and keep the trace of "
                                 "every run that fails (docs/explore.md)");
  add_explore_options(cmd, *a);
  return {cmd, [a] {
            if (!a->minimize.empty()) return run_minimize(*a);
            return a->shards ? run_sharded(*a) : run_campaign(*a, command_line_arguments(), nullptr);
          }};
}

}  // namespace deja
