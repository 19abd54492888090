// Unit tests of the one run loop: loops without a conditional branch recorded on the software CPU, then replayed
// through Session::run_until and ReplayTimeline to the end, to a step, to an event and backwards, in both progress
// modes; and every kind of stop run_until gives.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <thread>

#include "boot/loader.h"
#include "core/exit_status.h"
#include "logging/trace_reader.h"
#include "logging/trace_writer.h"
#include "replay/replay_setup.h"
#include "replay/replay_timeline.h"
#include "replay/session.h"
#include "replay/trace_config.h"

namespace deja {
namespace {

namespace fs = std::filesystem;

std::string hostile(const std::string& name) { return std::string(DEJA_HOSTILE_DIR) + "/" + name + ".elf"; }

struct Recording {
  std::string trace;
  std::string digest;  // the End's full state digest
  uint64_t instructions = 0;
  uint64_t events = 0;
};

class LoopTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / fmt::format("session-loop-{}-{}", ::getpid(), counter_++);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Records `image` on the software CPU for `run_for`, stopped as SIGINT stops it.
  Recording record(const std::string& image, ProgressMode progress,
                   std::chrono::milliseconds run_for = std::chrono::milliseconds(300)) {
    Recording rec;
    rec.trace = (dir_ / fmt::format("{}.trace", counter_++)).string();
    auto bytes = read_guest_image(image, 16 << 20);
    EXPECT_TRUE(bytes.has_value()) << image;
    if (!bytes) return rec;
    MachineConfig config;
    config.backend = "interp";
    config.memory_bytes = 16 << 20;
    Session session(Mode::kRecord, progress);
    const LoadOptions load;
    auto built = session.build(config, "/dev/null", *bytes, image, load, {});
    EXPECT_TRUE(built.has_value()) << (built ? "" : built.error().message);
    if (!built) return rec;
    EXPECT_TRUE(session.setup_progress(ProgressChoice{.mode = progress}).has_value());
    session.count_rdtsc_as_guest_exits(true);
    session.complete_mmio_write_exits(true);
    if (progress == ProgressMode::kExact) {
      EXPECT_TRUE(session.derive_time(Engine::TimeRates{}).has_value());
    }
    TraceConfig recorded = recording_config(session, config, load, progress);
    recorded.inputs.push_back(recorded_input("image", image, *bytes));
    auto writer = TraceWriter::create_replacing(rec.trace, to_header(recorded));
    EXPECT_TRUE(writer.has_value());
    if (!writer) return rec;
    session.engine().attach_writer(std::move(*writer));
    install_stop_signal_handlers();
    std::thread stopper([run_for] {
      std::this_thread::sleep_for(run_for);
      request_stop();
    });
    auto outcome = session.run();
    stopper.join();
    EXPECT_TRUE(outcome.has_value());
    if (!outcome) return rec;
    EXPECT_EQ(outcome->status, exit_status::kInterrupted) << outcome->reason;
    rec.digest = hex_of(session.final_machine_digest());
    rec.instructions = session.machine().backend().instruction_count().value_or(0);
    EXPECT_TRUE(session.finish_recording(*outcome).has_value());
    rec.events = session.engine().events_written();
    return rec;
  }

  static std::string hex_of(const Digest& d) { return d.hex(); }

  // A replay of `trace` that can step and go back (deja debug's, deja query's).
  std::unique_ptr<Session> open(const std::string& trace) {
    install_stop_signal_handlers();  // clears the stop the recording was given
    auto setup = open_replay(ReplaySetupOptions{.trace_path = trace, .serial_out = "/dev/null", .rewind = true});
    EXPECT_TRUE(setup.has_value()) << (setup ? "" : setup.error().message);
    return setup ? std::move(setup->session) : nullptr;
  }

  // Copies `from` to `to` event by event through `change` (which may drop an event); `finish` false leaves the
  // copy cut short, as a killed recorder leaves its trace.
  void rewrite(const std::string& from, const std::string& to,
               const std::function<bool(trace::Event&, uint64_t index)>& change, bool finish = true) {
    auto reader = TraceReader::open(from);
    ASSERT_TRUE(reader.has_value());
    auto writer = TraceWriter::create(to, (*reader)->header());
    ASSERT_TRUE(writer.has_value());
    for (uint64_t i = 0;; ++i) {
      auto e = (*reader)->next();
      ASSERT_TRUE(e.has_value());
      if (!*e) break;
      trace::Event event = **e;
      if (change(event, i)) {
        ASSERT_TRUE((*writer)->append(event).has_value());
      }
    }
    if (finish) {
      ASSERT_TRUE((*writer)->finish(trace::Footer{}).has_value());
    } else {
      ASSERT_TRUE((*writer)->flush().has_value());
    }
  }

  static CpuState state(Session& s) {
    auto st = s.machine().backend().get_state();
    EXPECT_TRUE(st.has_value());
    return st ? *st : CpuState{};
  }

  fs::path dir_;
  static inline int counter_ = 0;
};

// Replays to the end: the End of the interrupted recording, reached with the recorded state.
void expect_replays_to_end(Session& s, const Recording& rec) {
  auto r = s.run_until(StopRequest{});
  ASSERT_TRUE(r.has_value()) << r.error().message;
  ASSERT_EQ(r->kind, StopReason::Kind::kEnd);
  EXPECT_TRUE(r->outcome.recorded_end) << r->outcome.reason;
  EXPECT_EQ(r->outcome.status, exit_status::kInterrupted) << r->outcome.reason;
  const trace::End* end = s.engine().expect_end("the recording's end");
  ASSERT_NE(end, nullptr);
  Digest d = s.check_replay_end(*end, r->outcome);
  EXPECT_FALSE(s.engine().divergence().has_value()) << s.engine().divergence()->report;
  EXPECT_EQ(d.hex(), rec.digest);
  EXPECT_EQ(s.machine().backend().instruction_count().value_or(0), rec.instructions);
}

struct Shape {
  const char* name;
  const char* guest;
};
const Shape kShapes[] = {
    {"IncqJmp", "cli-spin"},   {"JmpSelf", "jmp-self"},       {"PauseJmp", "pause-spin"},
    {"RepStosb", "stosb-loop"}, {"StiHltFastPit", "pit-hlt"}, {"JmpSelfUnderTimer", "timer-jmp-self"},
};

class LoopShapeTest : public LoopTest, public ::testing::WithParamInterface<std::tuple<Shape, ProgressMode>> {};

TEST_P(LoopShapeTest, ReplaysToTheEndToAStepToAnEventAndBackwards) {
  const auto& [shape, progress] = GetParam();
  const Recording rec = record(hostile(shape.guest), progress);
  ASSERT_GT(rec.instructions, 1000u);

  // To the end, as `deja replay` and `deja query --at end` go.
  {
    auto s = open(rec.trace);
    ASSERT_TRUE(s);
    expect_replays_to_end(*s, rec);
    // Asked again, it stays at the end.
    auto again = s->run_until(StopRequest{.at_step = 1});
    ASSERT_TRUE(again.has_value());
    EXPECT_EQ(again->kind, StopReason::Kind::kEnd);
  }

  // To a step, straight: the reference for the timeline's moves below.
  const uint64_t mid = rec.instructions / 2;
  CpuState at_mid;
  uint64_t mid_instructions = 0;
  {
    auto s = open(rec.trace);
    ASSERT_TRUE(s);
    auto r = s->run_until(StopRequest{.at_step = mid});
    ASSERT_TRUE(r.has_value());
    ASSERT_EQ(r->kind, StopReason::Kind::kStep);
    EXPECT_EQ(s->machine().backend().step_count(), mid);
    at_mid = state(*s);
    mid_instructions = s->checkpoint_position().instructions;
  }

  // Through the timeline: forward to the end, back to the middle, to an event, to step 10, to the end again.
  auto s = open(rec.trace);
  ASSERT_TRUE(s);
  auto timeline = ReplayTimeline::create(*s, TimelineOptions{.interval_steps = std::max<uint64_t>(1, mid / 3)});
  ASSERT_TRUE(timeline.has_value());
  ReplayTimeline& t = **timeline;
  auto end = t.forward(StopRequest{});
  ASSERT_TRUE(end.has_value());
  EXPECT_EQ(end->kind, StopReason::Kind::kEnd);
  EXPECT_TRUE(end->outcome.recorded_end);
  auto back = t.seek(mid);
  ASSERT_TRUE(back.has_value()) << back.error().message;
  EXPECT_EQ(back->kind, StopReason::Kind::kStep);
  EXPECT_EQ(t.now(), mid);
  const CpuState here = state(*s);
  EXPECT_EQ(here.rip, at_mid.rip);
  EXPECT_EQ(here.gpr, at_mid.gpr);
  EXPECT_EQ(s->checkpoint_position().instructions, mid_instructions);
  const uint64_t events = s->checkpoint_position().events;
  if (events > 0) {
    auto ev = t.seek_event(events - 1);
    ASSERT_TRUE(ev.has_value()) << ev.error().message;
    EXPECT_EQ(ev->kind, StopReason::Kind::kEvent);
    // The first point where that many events are processed: exit-sync applies an exit's events together.
    EXPECT_GE(s->checkpoint_position().events, events - 1);
    EXPECT_LE(s->checkpoint_position().events, events + 3);
  }
  auto ten = t.seek(10);
  ASSERT_TRUE(ten.has_value());
  EXPECT_EQ(t.now(), 10u);
  auto again = t.forward(StopRequest{});
  ASSERT_TRUE(again.has_value());
  EXPECT_EQ(again->kind, StopReason::Kind::kEnd);
  EXPECT_TRUE(again->outcome.recorded_end);
  EXPECT_EQ(s->machine().backend().instruction_count().value_or(0), rec.instructions);
}

INSTANTIATE_TEST_SUITE_P(Shapes, LoopShapeTest,
                         ::testing::Combine(::testing::ValuesIn(kShapes),
                                            ::testing::Values(ProgressMode::kExact, ProgressMode::kExitSync)),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param).name) +
                                  (std::get<1>(info.param) == ProgressMode::kExact ? "Exact" : "ExitSync");
                         });

class StopTest : public LoopTest, public ::testing::WithParamInterface<ProgressMode> {};

TEST_P(StopTest, EveryKindOfStop) {
  const Recording rec = record(hostile("pit-hlt"), GetParam());
  ASSERT_GT(rec.events, 10u);
  auto s = open(rec.trace);
  ASSERT_TRUE(s);

  // A step.
  auto r = s->run_until(StopRequest{.at_step = 1000});
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->kind, StopReason::Kind::kStep);
  EXPECT_EQ(s->machine().backend().step_count(), 1000u);

  // An event.
  const uint64_t event = s->checkpoint_position().events + 5;
  r = s->run_until(StopRequest{.at_event = event});
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->kind, StopReason::Kind::kEvent);
  EXPECT_GE(s->checkpoint_position().events, event);
  EXPECT_LE(s->checkpoint_position().events, event + 4);

  // A breakpoint on the idle loop's HLT: where the replay stands now is not a hit, the next visit is.
  const uint64_t rip = state(*s).rip;
  const uint64_t step = *s->machine().backend().step_count();
  r = s->run_until(StopRequest{.breakpoints = {rip}});
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->kind, StopReason::Kind::kBreakpoint);
  EXPECT_EQ(state(*s).rip, rip);
  EXPECT_GT(*s->machine().backend().step_count(), step);

  // A watchpoint: the interrupt handler pushes RAX on the stack below 0x80000.
  r = s->run_until(StopRequest{.watchpoints = {Watchpoint{0x7f000, 0x1000, WatchKind::kWrite}}});
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->kind, StopReason::Kind::kWatchpoint);
  EXPECT_GE(r->watch_address, 0x7f000u);
  EXPECT_LT(r->watch_address, 0x80000u);

  // Interrupted: polled now and then.
  int polls = 0;
  r = s->run_until(StopRequest{.interrupted = [&polls] { return ++polls > 2; }});
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->kind, StopReason::Kind::kInterrupted);

  // The end.
  expect_replays_to_end(*s, rec);
}

TEST_P(StopTest, DivergenceAndATraceThatEndsEarly) {
  const Recording rec = record(hostile("pit-hlt"), GetParam());
  ASSERT_GT(rec.events, 10u);

  // An interrupt recorded with another vector: the replay stops there as diverged.
  const std::string forged = (dir_ / "forged.trace").string();
  uint64_t changed = 0;
  rewrite(rec.trace, forged, [&changed](trace::Event& e, uint64_t) {
    if (e.has_interrupt() && changed++ == 3) e.mutable_interrupt()->set_vector(0x21);
    return true;
  });
  ASSERT_GT(changed, 3u);
  auto s = open(forged);
  ASSERT_TRUE(s);
  auto r = s->run_until(StopRequest{});
  ASSERT_TRUE(r.has_value());
  ASSERT_EQ(r->kind, StopReason::Kind::kEnd);
  EXPECT_EQ(r->outcome.status, exit_status::kDivergence);
  EXPECT_TRUE(s->engine().divergence().has_value());

  // Half the events, no End: the replay stops where the trace does.
  const std::string cut = (dir_ / "cut.trace").string();
  rewrite(rec.trace, cut, [&rec](trace::Event&, uint64_t i) { return i < rec.events / 2; }, false);
  s = open(cut);
  ASSERT_TRUE(s);
  r = s->run_until(StopRequest{});
  ASSERT_TRUE(r.has_value());
  ASSERT_EQ(r->kind, StopReason::Kind::kEnd);
  EXPECT_EQ(r->outcome.status, exit_status::kTraceEnded);
  EXPECT_FALSE(r->outcome.recorded_end);
}

TEST_P(StopTest, RunIsTheSameLoop) {
  // Session::run() over the same trace ends where run_until does, with the same state.
  const Recording rec = record(hostile("cli-spin"), GetParam());
  auto s = open(rec.trace);
  ASSERT_TRUE(s);
  auto outcome = s->run();
  ASSERT_TRUE(outcome.has_value());
  EXPECT_TRUE(outcome->recorded_end);
  EXPECT_EQ(outcome->status, exit_status::kInterrupted);
  EXPECT_EQ(s->final_machine_digest().hex(), rec.digest);
  EXPECT_EQ(s->machine().backend().instruction_count().value_or(0), rec.instructions);
  EXPECT_GT(s->wall_ns(), 0u);
}

INSTANTIATE_TEST_SUITE_P(Modes, StopTest, ::testing::Values(ProgressMode::kExact, ProgressMode::kExitSync),
                         [](const auto& info) { return info.param == ProgressMode::kExact ? "Exact" : "ExitSync"; });

}  // namespace
}  // namespace deja
