// A status line on stderr while long work runs (replay, verify, query, debug --verify-checkpoints): how far it is in
// instructions and events, the rate and the time left; or one JSON object a line for wrappers (--progress-json).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace deja {

class Session;

// How a command shows progress. Not the --progress option of run/record/replay, which chooses where asynchronous
// events land (exact, exit-sync, emulated-pmu): these options only say what is printed.
struct ProgressDisplay {
  bool quiet = false;  // --quiet: no progress line
  bool json = false;   // --progress-json: JSON lines on stderr instead, terminal or not
};
// Adds --progress-json, and --quiet unless the command has its own (`with_quiet` false).
void add_progress_display_options(CLI::App* cmd, ProgressDisplay& display, bool with_quiet = true);

// One measure of progress: "instructions" 1.2e9 of 2.9e9.
struct ProgressMeasure {
  std::string name;
  uint64_t value = 0;
  std::optional<uint64_t> total;
};

// Shown on a terminal only (stderr a tty, no --quiet), at most every 100 ms; with --progress-json always, as JSON
// lines. The first counter that has a total gives the fraction done, the rate and the time left.
class ProgressLine {
 public:
  ProgressLine(std::string task, const ProgressDisplay& display);
  ~ProgressLine();
  ProgressLine(const ProgressLine&) = delete;
  ProgressLine& operator=(const ProgressLine&) = delete;

  bool active() const { return tty_ || json_; }
  void update(std::span<const ProgressMeasure> counters);
  // Where the counters come from, for poll() and for the last JSON line.
  using Source = std::function<std::vector<ProgressMeasure>()>;
  void set_source(Source source) { source_ = std::move(source); }
  void poll() { if (source_) update(source_()); }
  // Clears the line (a terminal) or writes the last JSON line with "done": true. Said before the command's result.
  void finish();

 private:
  std::string text(std::span<const ProgressMeasure> counters, double rate, std::optional<double> left) const;
  std::string json(std::span<const ProgressMeasure> counters, double rate, std::optional<double> left, bool done) const;

  std::string task_;
  bool tty_ = false;
  bool json_ = false;
  bool shown_ = false;
  bool finished_ = false;
  uint64_t started_ns_ = 0;
  uint64_t last_ns_ = 0;     // last update that drew
  uint64_t last_value_ = 0;  // the leading counter then
  double rate_ = 0;          // the leading counter's smoothed rate, a second
  std::vector<ProgressMeasure> last_;
  Source source_;
};

// What a replay of a trace goes through, from its index (the footer; none for a trace cut short): instructions, and
// the events the replay consumes on the way to the End (serial output and disk I/O records are not among them).
struct ReplayTotals {
  std::optional<uint64_t> events, instructions;
};
ReplayTotals replay_totals(const std::string& trace_path);

// Shows `session`'s replay on `line` (through Session::set_progress_hook): instructions where the backend counts
// them, and events.
void follow_replay(Session& session, ProgressLine& line, const ReplayTotals& totals);

}  // namespace deja
