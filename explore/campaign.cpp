// Running a campaign's seeds in child processes and summarising what they found.
#include "explore/campaign.h"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <deque>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace deja::explore {

namespace {
Result<uint64_t> parse_u64(std::string_view text, const std::string& what) {
  uint64_t v = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size()) {
    return fail(ErrorKind::kInvalidArgument, "{}: '{}' is not a number", what, text);
  }
  return v;
}
}  // namespace

Result<SeedRange> parse_seed_range(const std::string& text) {
  const size_t dots = text.find("..");
  auto first = parse_u64(std::string_view(text).substr(0, dots), "--seeds " + text);
  if (!first) return std::unexpected(first.error());
  SeedRange r{*first, *first};
  if (dots != std::string::npos) {
    auto last = parse_u64(std::string_view(text).substr(dots + 2), "--seeds " + text);
    if (!last) return std::unexpected(last.error());
    r.last = *last;
  }
  if (r.last < r.first) return fail(ErrorKind::kInvalidArgument, "--seeds {}: the range is empty (A..B with A <= B)", text);
  if (r.last - r.first >= (uint64_t{1} << 32)) {
    return fail(ErrorKind::kInvalidArgument, "--seeds {}: at most 2^32 seeds a campaign (split it with --shard)", text);
  }
  return r;
}

Result<Shard> parse_shard(const std::string& text) {
  const size_t slash = text.find('/');
  if (slash == std::string::npos) return fail(ErrorKind::kInvalidArgument, "--shard {}: give I/N", text);
  auto index = parse_u64(std::string_view(text).substr(0, slash), "--shard " + text);
  auto count = parse_u64(std::string_view(text).substr(slash + 1), "--shard " + text);
  if (!index) return std::unexpected(index.error());
  if (!count) return std::unexpected(count.error());
  if (*count == 0 || *count > 1'000'000 || *index >= *count) {
    return fail(ErrorKind::kInvalidArgument, "--shard {}: I from 0 to N-1, N from 1 to 1000000", text);
  }
  return Shard{uint32_t(*index), uint32_t(*count)};
}

std::vector<uint64_t> shard_seeds(const SeedRange& range, const Shard& shard) {
  std::vector<uint64_t> seeds;
  for (uint64_t k = shard.index; k < range.size(); k += shard.count) seeds.push_back(range.first + k);
  return seeds;
}

std::string SeedResult::outcome_class() const {
  if (error) return "error";
  if (failed()) return "fail: " + met.front();
  if (reason == "guest exit") return fmt::format("exit {}", status);
  if (reason.starts_with("hang: ")) return "hang";
  if (reason.starts_with("limit: ")) return "limit";
  return reason;
}

std::string to_json(const SeedResult& r) {
  nlohmann::ordered_json j;
  j["seed"] = r.seed;
  j["outcome"] = r.outcome_class();
  j["failed"] = r.failed();
  j["status"] = r.status;
  j["reason"] = r.reason;
  j["met"] = r.met;
  if (!r.trace.empty()) j["trace"] = r.trace;
  j["digest"] = r.digest;
  j["instructions"] = r.instructions;
  j["schedule_events"] = r.schedule_events;
  j["faults"] = r.faults;
  j["seconds"] = r.seconds;
  if (r.error) j["error"] = true;
  if (!r.perturbations.empty()) {
    auto& list = j["perturbations"] = nlohmann::ordered_json::array();
    for (const Perturbation& p : r.perturbations) {
      list.push_back({{"kind", p.kind}, {"index", p.index}, {"vcpu", p.vcpu}, {"rip", p.rip}, {"detail", p.detail}});
    }
  }
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

Result<SeedResult> seed_result_from_json(const std::string& line) {
  auto j = nlohmann::json::parse(line, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("seed")) {
    return fail(ErrorKind::kInvalidArgument, "not a seed's result: {}", line.substr(0, 200));
  }
  try {
    SeedResult r;
    r.seed = j.at("seed").get<uint64_t>();
    r.status = j.value("status", 0);
    r.reason = j.value("reason", std::string());
    r.met = j.value("met", std::vector<std::string>{});
    r.trace = j.value("trace", std::string());
    r.digest = j.value("digest", std::string());
    r.instructions = j.value("instructions", uint64_t{0});
    r.schedule_events = j.value("schedule_events", uint64_t{0});
    r.faults = j.value("faults", uint64_t{0});
    r.seconds = j.value("seconds", 0.0);
    r.error = j.value("error", false);
    if (j.contains("perturbations")) {
      for (const auto& p : j.at("perturbations")) {
        r.perturbations.push_back(Perturbation{p.at("kind").get<std::string>(), p.at("index").get<uint64_t>(),
                                               p.at("vcpu").get<uint32_t>(), p.at("rip").get<uint64_t>(),
                                               p.at("detail").get<std::string>()});
      }
    }
    return r;
  } catch (const nlohmann::json::exception& e) {
    return fail(ErrorKind::kInvalidArgument, "a seed's result is malformed ({})", e.what());
  }
}

std::vector<SeedResult> run_seeds(const std::vector<uint64_t>& seeds, unsigned jobs, const SeedRunner& run,
                                  const std::function<void(const SeedResult&)>& done) {
  struct Child {
    pid_t pid;
    uint64_t seed;
    int pipe;
    std::string out;
  };
  std::vector<SeedResult> results;
  std::vector<Child> running;
  size_t next = 0;
  jobs = std::max(1u, jobs);
  auto failed_result = [](uint64_t seed, std::string why) {
    SeedResult r;
    r.seed = seed;
    r.error = true;
    r.reason = std::move(why);
    return r;
  };
  while (next < seeds.size() || !running.empty()) {
    while (next < seeds.size() && running.size() < jobs) {
      const uint64_t seed = seeds[next++];
      int fds[2];
      if (::pipe2(fds, O_CLOEXEC) != 0) {
        SeedResult r = failed_result(seed, fmt::format("pipe: {}", strerror(errno)));
        done(r);
        results.push_back(r);
        continue;
      }
      std::fflush(nullptr);
      const pid_t pid = ::fork();
      if (pid == 0) {
        ::close(fds[0]);
        const std::string line = to_json(run(seed)) + "\n";
        for (size_t off = 0; off < line.size();) {
          const ssize_t n = ::write(fds[1], line.data() + off, line.size() - off);
          if (n < 0 && errno == EINTR) continue;
          if (n <= 0) break;
          off += size_t(n);
        }
        std::fflush(nullptr);
        ::_exit(0);
      }
      ::close(fds[1]);
      if (pid < 0) {
        ::close(fds[0]);
        SeedResult r = failed_result(seed, fmt::format("fork: {}", strerror(errno)));
        done(r);
        results.push_back(r);
        continue;
      }
      running.push_back(Child{pid, seed, fds[0], {}});
    }
    if (running.empty()) continue;
    // A child's result is one short line, written just before it exits: read it whole once the child is gone.
    int wstatus = 0;
    const pid_t pid = ::waitpid(-1, &wstatus, 0);
    if (pid < 0) {
      if (errno == EINTR) continue;
      break;  // (no child left to wait for: cannot happen while `running` has some)
    }
    auto it = std::find_if(running.begin(), running.end(), [pid](const Child& c) { return c.pid == pid; });
    if (it == running.end()) continue;
    char buf[4096];
    for (;;) {
      const ssize_t n = ::read(it->pipe, buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      it->out.append(buf, size_t(n));
    }
    ::close(it->pipe);
    auto parsed = seed_result_from_json(it->out);
    SeedResult r = parsed ? *parsed
                          : failed_result(it->seed, WIFSIGNALED(wstatus)
                                                        ? fmt::format("the run was killed by signal {}", WTERMSIG(wstatus))
                                                        : fmt::format("the run gave no result (exit status {})",
                                                                      WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : -1));
    running.erase(it);
    done(r);
    results.push_back(std::move(r));
  }
  std::sort(results.begin(), results.end(), [](const SeedResult& a, const SeedResult& b) { return a.seed < b.seed; });
  return results;
}

Summary summarize(const std::vector<SeedResult>& results, double wall_seconds) {
  Summary s;
  s.seconds = wall_seconds;
  for (const SeedResult& r : results) {
    ++s.seeds;
    ++s.outcomes[r.outcome_class()];
    s.run_seconds += r.seconds;
    if (r.error) ++s.errors;
    if (r.failed()) {
      ++s.failures;
      if (!s.first_failing_seed || r.seed < *s.first_failing_seed) s.first_failing_seed = r.seed;
    }
  }
  return s;
}

std::string summary_text(const Summary& s) {
  std::string text = fmt::format("{} seeds, {} failing, {} errors", s.seeds, s.failures, s.errors);
  if (s.first_failing_seed) text += fmt::format("; first failing seed {}", *s.first_failing_seed);
  if (s.seconds > 0) text += fmt::format("; {:.2f} s, {:.2f} seeds/s", s.seconds, double(s.seeds) / s.seconds);
  text += "\noutcomes:";
  for (const auto& [outcome, n] : s.outcomes) text += fmt::format("\n  {:>8}  {}", n, outcome);
  return text;
}

std::string summary_json(const Summary& s) {
  nlohmann::ordered_json j;
  j["summary"] = true;
  j["seeds"] = s.seeds;
  j["failures"] = s.failures;
  j["errors"] = s.errors;
  j["first_failing_seed"] = s.first_failing_seed ? nlohmann::ordered_json(*s.first_failing_seed) : nlohmann::ordered_json();
  j["outcomes"] = s.outcomes;
  if (s.seconds > 0) {
    j["seconds"] = s.seconds;
    j["seeds_per_second"] = double(s.seeds) / s.seconds;
  }
  j["run_seconds"] = s.run_seconds;
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace deja::explore
