// `deja debug`: a gdb remote-protocol server over a replayed trace, with reverse execution through checkpoints.
#include <sys/socket.h>
#include <unistd.h>

#include <charconv>
#include <cstdio>
#include <sstream>

#include <fmt/format.h>

#include "gdbstub/server.h"
#include "logging/trace_signature.h"
#include "logging/trace_inspect.h"
#include "tools/command_support.h"
#include "tools/progress_line.h"
#include "replay/replay_setup.h"
#include "core/exit_status.h"
#include "core/messages.h"
#include "core/page_walker.h"
#include "replay/replay_timeline.h"

namespace deja {
namespace {

struct DebugOptions {
  ReplaySetupOptions replay{.rewind = true};
  std::string gdb_address = "127.0.0.1:1234";
  uint64_t interval = 0;  // 0: the default for the backend's time axis
  std::string checkpoint_memory = "512M";
  bool save_checkpoints = false;
  std::string sign;  // --save-checkpoints: sign each file with this key
  bool verify_checkpoints = false;
  bool by_events = false;
  ProgressDisplay display;  // --verify-checkpoints
};

std::optional<uint64_t> parse_number(std::string_view s) {
  int base = 10;
  if (s.starts_with("0x") || s.starts_with("0X")) {
    s.remove_prefix(2);
    base = 16;
  }
  uint64_t v = 0;
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v, base);
  if (s.empty() || ec != std::errc() || ptr != s.data() + s.size()) return std::nullopt;
  return v;
}

std::vector<std::string> words(std::string_view text) {
  std::vector<std::string> out;
  std::istringstream in{std::string(text)};
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

// The replayed machine as gdb sees it: reads go to the current state; resumes go through the timeline.
class ReplayTarget final : public gdb::Target {
 public:
  explicit ReplayTarget(ReplayTimeline& timeline) : timeline_(timeline), session_(timeline.session()) {}

  uint32_t threads() override { return uint32_t(session_.machine().vcpu_count()); }
  uint32_t stopped_vcpu() override { return session_.current_vcpu(); }
  Result<CpuState> registers(uint32_t vcpu) override { return session_.machine().backend(vcpu).get_state(); }

  size_t read_virtual(uint32_t vcpu, uint64_t gva, std::span<uint8_t> out) override {
    auto st = registers(vcpu);
    if (!st) return 0;
    return read_gva(*st, session_.machine().memory(), gva, out);
  }

  gdb::StopInfo resume(const gdb::ResumeRequest& request, const std::function<bool()>& interrupted) override {
    using Why = gdb::StopInfo::Why;
    Result<StopReason> r;
    if (request.reverse) {
      if (timeline_.at_start()) return {Why::kHistoryBegin};
      if (request.single_step) {
        r = timeline_.reverse_step();
      } else {
        r = timeline_.reverse_continue(request.breakpoints, request.watchpoints, interrupted);
        if (r && r->kind == StopReason::Kind::kStep && timeline_.at_start()) return {Why::kHistoryBegin};
      }
    } else {
      StopRequest stop;
      stop.breakpoints = request.breakpoints;
      stop.watchpoints = request.watchpoints;
      stop.interrupted = interrupted;
      if (request.single_step) {
        if (!timeline_.counts_steps()) return {Why::kError, false, 0, WatchKind::kWrite, "single-stepping needs --backend interp"};
        stop.at_step = timeline_.now() + 1;
      }
      r = timeline_.forward(stop);
    }
    if (!r) {
      say("debug: {}", r.error().message);
      return {Why::kError, false, 0, WatchKind::kWrite, r.error().message};
    }
    switch (r->kind) {
      case StopReason::Kind::kStep:
      case StopReason::Kind::kEvent: return {Why::kStep};
      case StopReason::Kind::kBreakpoint: return {Why::kBreakpoint};
      case StopReason::Kind::kWatchpoint: return {Why::kWatchpoint, false, r->watch_address, r->watch_kind};
      case StopReason::Kind::kInterrupted: return {Why::kInterrupted};
      case StopReason::Kind::kEnd:
        if (r->outcome.status == exit_status::kDivergence) {
          const auto& d = session_.engine().divergence();
          say("debug: {}", d ? d->report : std::string("replay diverged"));
          return {Why::kError, false, 0, WatchKind::kWrite, "divergence"};
        }
        say("debug: the replay reached the end of the trace ({}); reverse execution goes back from here",
            printable(r->outcome.reason));
        return {Why::kHistoryEnd};
    }
    return {Why::kStep};
  }

  std::string monitor(std::string_view command, const std::function<bool()>& interrupted) override {
    auto w = words(command);
    if (w.empty() || w[0] == "help") return help();
    const std::string refresh = "(gdb still shows the old state: run `maintenance flush register-cache`)\n";
    if (w[0] == "when") return when();
    if (w[0] == "seek" && w.size() >= 2) {
      bool event = w[1] == "event" || w[1].starts_with("e");
      std::string number = w[1] == "event" ? (w.size() >= 3 ? w[2] : "") : (w[1].starts_with("e") ? w[1].substr(1) : w[1]);
      auto n = parse_number(number);
      if (!n) return "usage: seek COUNT | seek event N\n";
      auto r = event ? timeline_.seek_event(*n) : timeline_.seek(*n);
      if (!r) return "error: " + r.error().message + "\n";
      return when() + refresh;
    }
    if (w[0] == "checkpoint") {
      auto id = timeline_.add_named_checkpoint();
      if (!id) return "error: " + id.error().message + "\n";
      return fmt::format("checkpoint {} at {}", *id, when());
    }
    if (w[0] == "restart" && w.size() == 2) {
      auto n = parse_number(w[1]);
      if (!n) return "usage: restart N\n";
      auto r = timeline_.restart(*n);
      if (!r) return "error: " + r.error().message + "\n";
      return when() + refresh;
    }
    if (w[0] == "info" && w.size() >= 2 && w[1] == "checkpoints") return timeline_.describe_checkpoints();
    if (w[0] == "info" && w.size() >= 2 && w[1] == "events") return events_around();
    if (w[0] == "last" && (w.size() == 2 || w.size() == 3)) {
      auto addr = parse_number(w[1]);
      auto len = w.size() == 3 ? parse_number(w[2]) : std::optional<uint64_t>(8);
      if (!addr || !len || *len == 0 || *len > 4096) return "usage: last ADDR [LEN]  (LEN 1..4096, default 8)\n";
      auto before = read_bytes(*addr, *len);
      auto hit = timeline_.last_write(*addr, *len, interrupted);
      if (!hit) return "error: " + hit.error().message + "\n";
      if (!*hit) return fmt::format("no write to {:#x}+{} between the start of the trace and now\n", *addr, *len);
      // The value just before and just after that write: seek there and one step on, then come back.
      const uint64_t here = timeline_.now();
      std::string old_value, new_value;
      if (timeline_.seek((*hit)->time)) old_value = read_bytes(*addr, *len);
      if (timeline_.seek((*hit)->time + 1)) new_value = read_bytes(*addr, *len);
      timeline_.seek(here);
      return fmt::format("last write to {:#x}+{}: at step {} by the instruction at rip {:#x}: {} -> {} (now {}); "
                         "`monitor seek {}` goes there\n",
                         *addr, *len, (*hit)->time, (*hit)->rip, old_value, new_value, before, (*hit)->time);
    }
    if (w[0] == "phys" && (w.size() == 2 || w.size() == 3)) {
      auto addr = parse_number(w[1]);
      auto len = w.size() == 3 ? parse_number(w[2]) : std::optional<uint64_t>(16);
      if (!addr || !len || *len == 0 || *len > 4096) return "usage: phys ADDR [LEN]  (LEN 1..4096)\n";
      auto bytes = session_.machine().memory().span(Gpa{*addr}, *len);
      if (!bytes) return "error: " + bytes.error().message + "\n";
      std::string out;
      for (uint64_t i = 0; i < *len; i += 16) {
        out += fmt::format("{:#012x}:", *addr + i);
        for (uint64_t j = i; j < std::min(*len, i + 16); ++j) out += fmt::format(" {:02x}", (*bytes)[j]);
        out += "\n";
      }
      return out;
    }
    return "unknown monitor command; " + help();
  }

 private:
  std::string read_bytes(uint64_t addr, uint64_t len) {
    std::vector<uint8_t> buf(len);
    size_t got = read_virtual(session_.current_vcpu(), addr, buf);
    if (got != len) return "(unmapped)";
    std::string out = "0x";
    for (size_t i = len; i-- > 0;) out += fmt::format("{:02x}", buf[i]);  // little-endian value
    return out;
  }

  std::string when() {
    CheckpointPosition at = session_.checkpoint_position();
    auto st = session_.machine().backend(session_.current_vcpu()).get_state();
    const std::string vcpu =
        session_.machine().vcpu_count() > 1 ? fmt::format("vcpu {} ", session_.current_vcpu()) : std::string();
    return fmt::format("steps {} instructions {} events {} branches {} guest-exits {} {}rip {:#x}{}\n", at.steps,
                       at.instructions, at.events, at.branches, at.guest_exits, vcpu, st ? st->rip : 0,
                       session_.replay_ended() ? " (end of trace)" : "");
  }

  std::string events_around() {
    Engine& engine = session_.engine();
    const uint64_t done = engine.events_processed();
    std::string out = fmt::format("{} trace events replayed; the last ones and the next:\n", done);
    for (const auto& line : engine.recent_events()) out += "  " + line + "\n";
    const trace::Event* next = engine.peek();
    out += next ? fmt::format("> #{} {}\n", done, describe_event(*next)) : std::string("> (end of trace)\n");
    return out;
  }

  static std::string help() {
    return "deja monitor commands:\n"
           "  when                   steps, instructions, events, branches and RIP now\n"
           "  seek COUNT             go to step COUNT (instructions incl. REP iterations and faults)\n"
           "  seek event N           go to where N trace events have been replayed\n"
           "  checkpoint             name a checkpoint here;  restart N  goes back to it\n"
           "  info checkpoints       named and automatic checkpoints, memory in use\n"
           "  info events            the next trace event\n"
           "  last ADDR [LEN]        the last write to that (virtual) memory before now\n"
           "  phys ADDR [LEN]        guest-physical memory\n";
  }

  ReplayTimeline& timeline_;
  Session& session_;
};

// --verify-checkpoints: the state after restore-and-replay equals the straight replay's at every checkpoint,
// and dropping checkpoints changes nothing but speed.
int verify_checkpoints(ReplayTimeline& timeline, const DebugOptions& options) {
  Session& session = timeline.session();
  std::vector<std::pair<uint64_t, Digest>> straight;
  straight.emplace_back(timeline.now(), session.final_machine_digest());
  // Two phases shown: the straight replay taking checkpoints, then the checks from each checkpoint.
  ProgressLine replaying("verify-checkpoints: replay", options.display);
  follow_replay(session, replaying, replay_totals(options.replay.trace_path));
  for (;;) {
    auto r = timeline.forward(StopRequest{});
    if (!r) return report_error(r.error());
    if (r->kind == StopReason::Kind::kEnd) break;
  }
  replaying.finish();
  if (session.replay_ended()->status == exit_status::kDivergence) {
    std::fputs(("deja: " + session.engine().divergence()->report).c_str(), stderr);
    return exit_status::kDivergence;
  }
  const uint64_t end = timeline.now();
  Digest end_digest = session.final_machine_digest();
  std::vector<uint64_t> times = timeline.checkpoint_times();
  // The straight replay's digest at each checkpoint: restore it (a checkpoint is its own witness only
  // after the replay from the previous one reproduces it, checked next).
  std::vector<Digest> at_checkpoint;
  for (uint64_t t : times) {
    if (auto r = timeline.restore_at(t); !r) return report_error(r.error());
    at_checkpoint.push_back(session.final_machine_digest());
  }
  uint64_t mismatches = 0;
  ProgressLine checking("verify-checkpoints: check", options.display);
  size_t checked = 0;
  checking.set_source([&] { return std::vector<ProgressMeasure>{{"checkpoints", checked, times.size()}}; });
  session.set_progress_hook([&checking] { checking.poll(); });
  for (size_t i = 0; i + 1 < times.size(); ++i, checked = i) {
    if (auto r = timeline.restore_at(times[i]); !r) return report_error(r.error());
    auto r = timeline.counts_steps() ? timeline.seek(times[i + 1]) : timeline.seek_event(times[i + 1]);
    if (!r) return report_error(r.error());
    Digest d = session.final_machine_digest();
    if (timeline.now() != times[i + 1] || !(d == at_checkpoint[i + 1])) {
      say("checkpoint at {}: restore of {} and replay gives {} at {}, the straight replay {}", times[i + 1], times[i],
          d.hex(), timeline.now(), at_checkpoint[i + 1].hex());
      ++mismatches;
    }
  }
  // Dropping them: from the first checkpoint alone, the same states.
  timeline.drop_automatic_checkpoints();
  for (size_t i = 1; i < times.size(); i += std::max<size_t>(1, times.size() / 8)) {
    auto r = timeline.counts_steps() ? timeline.seek(times[i]) : timeline.seek_event(times[i]);
    if (!r) return report_error(r.error());
    if (!(session.final_machine_digest() == at_checkpoint[i])) {
      say("without checkpoints, the state at {} differs", times[i]);
      ++mismatches;
    }
  }
  // The end is not a point to stop at (the last instruction may be half-done): seek before it, run to it.
  auto r = timeline.counts_steps() ? timeline.seek(end) : timeline.seek_event(end);
  if (!r) return report_error(r.error());
  while (r->kind != StopReason::Kind::kEnd) {
    r = timeline.forward(StopRequest{});
    if (!r) return report_error(r.error());
  }
  checking.finish();
  if (!(session.final_machine_digest() == end_digest)) {
    say("the state at the end differs after seeking back to it");
    ++mismatches;
  }
  auto stats = timeline.stats();
  say("checkpoints verified: {} checkpoints over {} {}, {} mismatches, {} restores, {} thinned out, end digest {}",
      times.size(), end, timeline.counts_steps() ? "steps" : "events", mismatches, stats.restores, stats.thinned,
      end_digest.hex());
  return mismatches == 0 ? 0 : exit_status::kDivergence;
}

int debug_trace(const DebugOptions& options) {
  std::optional<SigningKey> signing_key;
  if (!options.sign.empty()) {
    auto key = SigningKey::load(options.sign);
    if (!key) return report_error(key.error());
    signing_key = std::move(*key);
  }
  ReplaySetupOptions replay = options.replay;
  // The checkpoint files beside the trace (and their signatures): read, and replaced with --save-checkpoints.
  replay.files.add_numbered_output("a checkpoint file", replay.trace_path + ".", ".ckpt");
  if (signing_key) replay.files.add_numbered_output("a checkpoint signature", replay.trace_path + ".", ".ckpt.sig");
  replay.files.add_input("the signing key", options.sign);
  auto setup = open_replay(replay);
  if (!setup) return report_error(setup.error());
  Session& session = *setup->session;
  TimelineOptions topt;
  auto limit = parse_size(options.checkpoint_memory);
  if (!limit) return report_error(limit.error());
  topt.memory_limit = *limit;
  if (options.interval) topt.interval_steps = topt.interval_events = options.interval;
  topt.by_events = options.by_events;
  auto timeline = ReplayTimeline::create(session, topt);
  if (!timeline) return report_error(timeline.error());
  if (options.verify_checkpoints) return verify_checkpoints(**timeline, options);

  // A signed trace's checkpoints are used only when its signer signed them too: a checksum anyone can recompute.
  std::function<Result<>(const std::string&)> accept;
  std::optional<VerifyKey> signer;
  if (TraceReader* reader = session.engine().reader()) signer = trace_signer(options.replay.trace_path, reader->header());
  if (signer) {
    accept = [signer, header = setup->identity.trace_header_sha256](const std::string& path) {
      return check_checkpoint_signature(path, header, *signer);
    };
  }
  std::vector<std::string> warnings;
  uint64_t loaded = (*timeline)->load_files(options.replay.trace_path, setup->identity, warnings, accept);
  for (const auto& w : warnings) say("warning: {}", w);
  if (loaded) {
    auto held = (*timeline)->stats();
    say("loaded {} checkpoints from {}.N.ckpt; {} checkpoints ({:.1f} MiB) held under --checkpoint-memory {}", loaded,
        options.replay.trace_path, held.checkpoints, double(held.memory_bytes) / (1 << 20), options.checkpoint_memory);
  }

  size_t colon = options.gdb_address.rfind(':');
  auto port = colon == std::string::npos ? std::nullopt : parse_number(options.gdb_address.substr(colon + 1));
  if (!port || *port > 65535) {
    return report_error({ErrorKind::kInvalidArgument, fmt::format("--gdb '{}' is not HOST:PORT", options.gdb_address)});
  }
  auto listener = gdb::listen_tcp(options.gdb_address.substr(0, colon), uint16_t(*port));
  if (!listener) return report_error(listener.error());
  say("debug: waiting for gdb on {}:{} (gdb -ex 'target remote {}:{}')", options.gdb_address.substr(0, colon),
      listener->second, options.gdb_address.substr(0, colon), listener->second);
  int connection = ::accept(listener->first, nullptr, nullptr);
  ::close(listener->first);
  if (connection < 0) return report_error({ErrorKind::kHost, "accepting the gdb connection failed"});
  ReplayTarget target(**timeline);
  gdb::Server server(target);
  auto served = gdb::serve(connection, server);
  ::close(connection);
  if (!served) return report_error(served.error());
  if (options.save_checkpoints) {
    auto n = (*timeline)->save_files(options.replay.trace_path, setup->identity);
    if (!n) return report_error(n.error());
    for (uint64_t i = 0; signing_key && i < *n; ++i) {
      const std::string path = fmt::format("{}.{}.ckpt", options.replay.trace_path, i);
      if (auto r = write_checkpoint_signature(path, setup->identity.trace_header_sha256, *signing_key); !r)
        return report_error(r.error());
    }
    say("saved {} checkpoints to {}.N.ckpt{}", *n, options.replay.trace_path, signing_key ? ", each signed (.sig)" : "");
    if (signer && (!signing_key || signing_key->id() != signer->id()))
      say("warning: the trace is signed by {}: a later debug session uses these checkpoints only when that key signs "
          "them (--sign KEY)", signer->short_id());
  }
  auto stats = (*timeline)->stats();
  say("debug: gdb detached; {} checkpoints ({:.1f} MiB), {} restores", stats.checkpoints,
      double(stats.memory_bytes) / (1 << 20), stats.restores);
  return 0;
}

}  // namespace

Subcommand add_debug_command(CLI::App& app) {
  auto o = std::make_shared<DebugOptions>();
  auto* cmd = app.add_subcommand("debug", "serve a replayed trace to gdb, with reverse execution (target remote)");
  cmd->add_option("TRACE", o->replay.trace_path, "trace file")->required();
  cmd->add_option("--gdb", o->gdb_address, "HOST:PORT to listen on (default 127.0.0.1:1234; port 0 picks one)");
  cmd->add_option("--interp-mode", o->replay.interp_mode, "the software CPU's executor: jit (default), threaded or reference")
      ->check(CLI::IsMember({"reference", "threaded", "jit"}));
  cmd->add_option("--backend", o->replay.backend, "interp or kvm (default: the recording's, if usable here)")
      ->check(CLI::IsMember({"kvm", "interp"}));
  cmd->add_option("--image", o->replay.image_path, "guest image (default: the path in the trace; hash-checked)");
  cmd->add_option("--serial-out", o->replay.serial_out, "where replayed serial output goes (default /dev/null)");
  cmd->add_option("--checkpoint-interval", o->interval,
                  "steps (interp) or trace events (kvm) between automatic checkpoints (default 1000000 / 1000)");
  cmd->add_option("--checkpoint-memory", o->checkpoint_memory,
                  "memory for automatic checkpoints, thinned out logarithmically beyond it (default 512M)");
  cmd->add_flag("--save-checkpoints", o->save_checkpoints, "write the checkpoints to TRACE.N.ckpt when gdb detaches");
  cmd->add_option("--sign", o->sign, "with --save-checkpoints: sign each checkpoint file (FILE.sig) with this key; a "
                                     "signed trace's checkpoints are used only when its signer signed them")
      ->type_name("KEY");
  cmd->add_flag("--verify-checkpoints", o->verify_checkpoints,
                "no gdb: replay to the end taking checkpoints, restore each and check the replay from it reproduces "
                "the next one's state digest");
  add_progress_display_options(cmd, o->display);
  // Tests: the trace-event time axis KVM uses, on the software CPU.
  cmd->add_flag("--checkpoint-by-events", o->by_events)->group("");
  return {cmd, [o] { return debug_trace(*o); }};
}

}  // namespace deja
