// The progress line: a redrawn terminal line (\r, erase to end of line) or JSON lines, with a smoothed rate.
#include "tools/progress_line.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>

#include <fmt/format.h>

#include "logging/trace_reader.h"
#include "replay/session.h"
#include "vmm/host_io.h"

namespace deja {
namespace {

constexpr uint64_t kTerminalIntervalNs = 100'000'000;
constexpr uint64_t kJsonIntervalNs = 1'000'000'000;
constexpr double kRateSmoothingSeconds = 2.0;

// 1234567 -> "1.23 M": three significant digits.
std::string short_number(double v) {
  static const char* const kUnits[] = {"", " k", " M", " G", " T", " P"};
  int unit = 0;
  while (v >= 999.5 && unit < 5) {
    v /= 1000;
    ++unit;
  }
  if (unit == 0) return fmt::format("{:.0f}", v);
  const int decimals = v < 9.995 ? 2 : v < 99.95 ? 1 : 0;
  return fmt::format("{:.{}f}{}", v, decimals, kUnits[unit]);
}

std::string duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const uint64_t s = uint64_t(seconds + 0.5);
  if (s < 60) return fmt::format("{} s", s);
  if (s < 3600) return fmt::format("{}:{:02} min", s / 60, s % 60);
  return fmt::format("{}:{:02}:{:02} h", s / 3600, s / 60 % 60, s % 60);
}

const ProgressMeasure* leading(std::span<const ProgressMeasure> counters) {
  for (const auto& c : counters)
    if (c.total && *c.total > 0) return &c;
  return counters.empty() ? nullptr : &counters[0];
}

}  // namespace

void add_progress_display_options(CLI::App* cmd, ProgressDisplay& display, bool with_quiet) {
  if (with_quiet) cmd->add_flag("--quiet", display.quiet, "no progress line");
  cmd->add_flag("--progress-json", display.json,
                "progress as JSON lines on stderr, the first at once, then one a second (for wrappers; the line on a terminal is shown "
                "without it)");
}

ProgressLine::ProgressLine(std::string task, const ProgressDisplay& display)
    : task_(std::move(task)), tty_(!display.quiet && !display.json && ::isatty(STDERR_FILENO)), json_(display.json) {
  started_ns_ = HostClock::monotonic_ns();
  last_ns_ = started_ns_;
}

ProgressLine::~ProgressLine() { finish(); }

void ProgressLine::update(std::span<const ProgressMeasure> counters) {
  if (!active() || finished_) return;
  const uint64_t now = HostClock::monotonic_ns();
  // A wrapper gets its first JSON line (the position and the totals) at once, however short the work; a terminal
  // line waits out the interval so that short work does not flash one.
  const bool first_json = json_ && !shown_;
  if (!first_json && now - last_ns_ < (json_ ? kJsonIntervalNs : kTerminalIntervalNs)) return;
  const ProgressMeasure* lead = leading(counters);
  if (!lead) return;
  const double dt = double(now - last_ns_) / 1e9;
  const double instant = lead->value >= last_value_ && dt > 0 ? double(lead->value - last_value_) / dt : 0;
  const double weight = 1 - std::exp(-dt / kRateSmoothingSeconds);
  rate_ = shown_ ? rate_ + (instant - rate_) * weight : instant;
  last_ns_ = now;
  last_value_ = lead->value;
  last_.assign(counters.begin(), counters.end());
  std::optional<double> left;
  if (lead->total && rate_ > 0) left = double(*lead->total > lead->value ? *lead->total - lead->value : 0) / rate_;
  if (json_) {
    std::fputs((json(counters, rate_, left, false) + "\n").c_str(), stderr);
  } else {
    std::string line = text(counters, rate_, left);
    winsize ws{};
    if (::ioctl(STDERR_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 1 && line.size() >= ws.ws_col)
      line.resize(ws.ws_col - 1);
    std::fputs(("\r\033[K" + line).c_str(), stderr);
  }
  std::fflush(stderr);
  shown_ = true;
}

void ProgressLine::finish() {
  if (finished_) return;
  finished_ = true;
  if (source_ && active()) last_ = source_();
  if (tty_ && shown_) std::fputs("\r\033[K", stderr);
  if (json_) std::fputs((json(last_, rate_, 0.0, true) + "\n").c_str(), stderr);
  std::fflush(stderr);
}

std::string ProgressLine::text(std::span<const ProgressMeasure> counters, double rate,
                               std::optional<double> left) const {
  const ProgressMeasure* lead = leading(counters);
  std::string line = "deja: " + task_;
  if (lead && lead->total && *lead->total > 0)
    line += fmt::format(" {:3.0f}%", std::min(100.0, 100.0 * double(lead->value) / double(*lead->total)));
  const char* sep = " ";
  for (const auto& c : counters) {
    line += sep + short_number(double(c.value));
    if (c.total) line += "/" + short_number(double(*c.total));
    line += " " + c.name;
    sep = ", ";
  }
  if (lead) line += fmt::format(", {} {}/s", short_number(rate), lead->name);
  if (left) line += ", " + duration(*left) + " left";
  return line;
}

std::string ProgressLine::json(std::span<const ProgressMeasure> counters, double rate, std::optional<double> left,
                               bool done) const {
  std::string out = fmt::format("{{\"progress\": \"{}\", \"elapsed_s\": {:.3f}", task_,
                                double(HostClock::monotonic_ns() - started_ns_) / 1e9);
  for (const auto& c : counters) {
    out += fmt::format(", \"{}\": {}", c.name, c.value);
    if (c.total) out += fmt::format(", \"{}_total\": {}", c.name, *c.total);
  }
  if (const ProgressMeasure* lead = leading(counters)) {
    if (lead->total && *lead->total > 0)
      out += fmt::format(", \"fraction\": {:.4f}", std::min(1.0, double(lead->value) / double(*lead->total)));
    out += fmt::format(", \"rate_per_s\": {:.1f}, \"rate_of\": \"{}\"", rate, lead->name);
  }
  if (left) out += fmt::format(", \"seconds_left\": {:.1f}", *left);
  if (done) out += ", \"done\": true";
  return out + "}";
}

ReplayTotals replay_totals(const std::string& trace_path) {
  ReplayTotals totals;
  auto reader = TraceReader::open(trace_path);
  if (!reader) return totals;
  auto footer = (*reader)->read_index();
  if (!footer) return totals;
  // Records a replay reads past without counting them (Engine::peek), and the End, which a replay reaches (and then
  // checks) rather than passes.
  uint64_t skipped = 0;
  for (const char* kind : {"serial_output", "disk_io", "end"}) {
    auto it = footer->events_by_kind().find(kind);
    if (it != footer->events_by_kind().end()) skipped += it->second;
  }
  totals.events = footer->total_events() >= skipped ? footer->total_events() - skipped : 0;
  if (footer->instructions()) totals.instructions = footer->instructions();
  return totals;
}

void follow_replay(Session& session, ProgressLine& line, const ReplayTotals& totals) {
  if (!line.active()) return;
  line.set_source([&session, totals] {
    std::vector<ProgressMeasure> counters;
    if (auto n = session.machine().backend().instruction_count())
      counters.push_back({"instructions", *n, totals.instructions});
    counters.push_back({"events", session.engine().events_processed(), totals.events});
    return counters;
  });
  session.set_progress_hook([&line] { line.poll(); });
}

}  // namespace deja
