// The Slurm executor: an array job for the items, a dependent merge job, task states from sacct or scontrol, retries.
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <linux/magic.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <csignal>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/exit_status.h"
#include "core/messages.h"
#include "segments/executor.h"
#include "segments/files.h"
#include "segments/merge.h"

namespace deja {
namespace {

double now_unix() {
  return double(std::chrono::duration_cast<std::chrono::microseconds>(
                    std::chrono::system_clock::now().time_since_epoch())
                    .count()) /
         1e6;
}

std::string quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

bool terminal(const std::string& state) {
  static const std::set<std::string> kTerminal{"COMPLETED", "FAILED",   "CANCELLED",     "TIMEOUT",  "NODE_FAIL",
                                               "PREEMPTED", "BOOT_FAIL", "OUT_OF_MEMORY", "DEADLINE", "REVOKED"};
  return kTerminal.contains(state.substr(0, state.find(' ')));
}

// "3", "2-5", "[0-3,7]" or "0-7%2": the array indices listed.
std::vector<uint32_t> indices(std::string text) {
  std::vector<uint32_t> out;
  if (const size_t pct = text.find('%'); pct != std::string::npos) text.resize(pct);
  for (char& c : text) {
    if (c == '[' || c == ']') c = ' ';
  }
  std::stringstream parts(text);
  for (std::string part; std::getline(parts, part, ',');) {
    unsigned long first = 0, last = 0;
    if (std::sscanf(part.c_str(), " %lu-%lu", &first, &last) == 2) {
      for (unsigned long i = first; i <= last && i < first + 1'000'000; ++i) out.push_back(uint32_t(i));
    } else if (std::sscanf(part.c_str(), " %lu", &first) == 1) {
      out.push_back(uint32_t(first));
    }
  }
  return out;
}

// A key=value field of `scontrol -o show job` output.
std::string field(const std::string& line, const std::string& key) {
  const size_t at = line.find(" " + key + "=");
  if (at == std::string::npos) return line.starts_with(key + "=") ? line.substr(key.size() + 1, line.find(' ') - key.size() - 1) : "";
  const size_t from = at + key.size() + 2;
  return line.substr(from, line.find(' ', from) - from);
}

// SIGINT, SIGTERM or SIGHUP while the jobs run: the executor cancels them and returns.
std::atomic<bool> g_interrupted{false};
void on_interrupt(int) { g_interrupted.store(true); }

class InterruptHandlers {
 public:
  InterruptHandlers() {
    g_interrupted.store(false);
    struct sigaction action {};
    action.sa_handler = on_interrupt;
    sigemptyset(&action.sa_mask);
    for (size_t i = 0; i < kSignals.size(); ++i) ::sigaction(kSignals[i], &action, &saved_[i]);
  }
  ~InterruptHandlers() {
    for (size_t i = 0; i < kSignals.size(); ++i) ::sigaction(kSignals[i], &saved_[i], nullptr);
  }
  InterruptHandlers(const InterruptHandlers&) = delete;
  InterruptHandlers& operator=(const InterruptHandlers&) = delete;

 private:
  static constexpr std::array<int, 3> kSignals{SIGINT, SIGTERM, SIGHUP};
  std::array<struct sigaction, 3> saved_{};
};

// What a client command said when it failed: its error output, else its output, else its status.
std::string said(const CommandOutput& out) {
  std::string text = out.err.empty() ? out.out : out.err;
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  return text.empty() ? fmt::format("exit status {}", out.status) : text;
}

class Slurm {
 public:
  Slurm(const LoadedManifest& loaded, const ExecutorOptions& options)
      : loaded_(loaded), m_(loaded.manifest), options_(options) {}

  // Whatever ends the run early (an error, an interrupt, a timeout) leaves no job of it behind.
  ~Slurm() {
    if (!finished_ && !jobs_.empty()) {
      auto out = run_command([&] {
        std::vector<std::string> argv{"scancel"};
        argv.insert(argv.end(), jobs_.begin(), jobs_.end());
        return argv;
      }());
      if (out && out->status == 0) {
        say("slurm: cancelled jobs {}", fmt::join(jobs_, " "));
      } else {
        say("slurm: could not cancel jobs {} ({}): cancel them with scancel", fmt::join(jobs_, " "),
             out ? said(*out) : out.error().message);
      }
    }
  }
  Slurm(const Slurm&) = delete;
  Slurm& operator=(const Slurm&) = delete;

  Result<int> run() {
    if (auto r = check(); !r) return std::unexpected(r.error());
    const uint32_t items = item_count(m_);
    const std::string deja = options_.deja.empty() ? this_binary() : absolute_path(options_.deja);
    const std::string dir = m_.workdir() + "/slurm";
    if (auto r = make_directories(dir); !r) return std::unexpected(r.error());
    items_script_ = dir + "/items.sh";
    const std::string manifest = absolute_path(loaded_.path);  // the tasks run in the work directory
    std::string merge_command = quote(deja) + " merge " + quote(manifest);
    for (const auto& a : options_.merge_args) merge_command += " " + quote(a);
    if (auto r = write_work_file(items_script_,
                                 fmt::format("#!/bin/sh\n# deja: one item of {}\nexec {} segment {} --index "
                                             "\"$SLURM_ARRAY_TASK_ID\"\n",
                                             manifest, quote(deja), quote(manifest)),
                                 "batch script");
        !r) {
      return std::unexpected(r.error());
    }
    merge_script_ = dir + "/merge.sh";
    if (auto r = write_work_file(merge_script_, fmt::format("#!/bin/sh\n# deja: the merge of {}\nexec {}\n",
                                                            manifest, merge_command),
                                 "batch script");
        !r) {
      return std::unexpected(r.error());
    }
    std::vector<uint32_t> all;
    for (uint32_t i = 0; i < items; ++i) all.push_back(i);
    if (auto r = clear_results(loaded_, all); !r) return std::unexpected(r.error());
    auto array = submit_items(all);
    if (!array) return std::unexpected(array.error());
    auto merge_job = submit_merge("afterok:" + *array);
    if (!merge_job) return std::unexpected(merge_job.error());
    merge_job_ = *merge_job;
    say("slurm: submitted {} tasks as array job {}, merge job {}", items, *array, merge_job_);

    std::map<uint32_t, std::string> pending_jobs;  // item -> the array job it last ran in
    for (uint32_t i : all) pending_jobs[i] = *array;
    std::vector<std::string> arrays{*array};
    for (unsigned attempt = 0;; ++attempt) {
      auto states = wait_for_tasks(arrays.back(), pending_jobs);
      if (!states) return std::unexpected(states.error());
      std::vector<uint32_t> retry, unshared;
      bool definitive_failure = false;
      for (const auto& [index, state] : *states) {
        if (state.starts_with("COMPLETED")) continue;
        if (read_result(loaded_, index, nullptr)) {
          definitive_failure = true;  // the item ran and says what failed: running it again would say the same
          continue;
        }
        struct stat st {};
        if (::stat(log_path(m_.workdir(), index).c_str(), &st) != 0) unshared.push_back(index);
        retry.push_back(index);
      }
      if (!unshared.empty() && unshared.size() == states->size()) {
        return fail(ErrorKind::kInvalidArgument,
                    "slurm: the tasks of job {} ended ({}) without writing anything into {}: the work directory is "
                    "not shared with the nodes that ran them; give --workdir on a file system every node mounts",
                    arrays.back(), states->begin()->second, m_.workdir());
      }
      if (retry.empty() && !definitive_failure) break;  // every task completed: the merge job runs by itself
      if (!retry.empty() && attempt < options_.retries) {
        say("slurm: tasks {} ended without a result ({}); submitting them again", fmt::join(retry, ","),
            states->at(retry.front()));
        auto again = submit_items(retry);
        if (!again) return std::unexpected(again.error());
        arrays.push_back(*again);
        pending_jobs.clear();
        for (uint32_t i : retry) pending_jobs[i] = *again;
        if (auto r = depend("afterany:" + *again); !r) return std::unexpected(r.error());
        continue;
      }
      // Nothing more to run: the merge job reports what failed.
      if (auto r = depend("afterany:" + arrays.back()); !r) return std::unexpected(r.error());
      break;
    }
    auto merged = wait_for_job(merge_job_);
    if (!merged) return std::unexpected(merged.error());
    finished_ = true;
    report_overhead();
    // The merge job's output and messages, as `deja merge` here would print them.
    for (auto [name, stream] : {std::pair{"merge.out", stdout}, std::pair{"merge.err", stderr}}) {
      auto log = read_small_file(m_.workdir() + "/logs/" + name, "merge job's output", uint64_t{1} << 30);
      if (!log) {
        return fail(ErrorKind::kHost, "slurm: merge job {} ended ({}) without its output: {}", merge_job_,
                    merged->first, log.error().message);
      }
      std::fputs(log->c_str(), stream);
      std::fflush(stream);
    }
    if (!merged->first.starts_with("COMPLETED") && merged->second == 0) return exit_status::kHostFailure;
    return merged->second;
  }

 private:
  Result<> check() {
    for (const char* tool : {"sbatch", "scontrol", "scancel"}) {
      if (find_on_path(tool).empty()) {
        return fail(ErrorKind::kUnsupported,
                    "--executor slurm needs Slurm's client commands, and {} is not on PATH: install slurm-client (and "
                    "point it at your cluster), or use --executor local",
                    tool);
      }
    }
    if (!m_.workdir().starts_with("/")) return fail(ErrorKind::kInvalidArgument, "slurm: the work directory must be absolute");
    // Slurm's commands retry a missing configuration for a minute before they say so.
    if (const char* conf = std::getenv("SLURM_CONF"); conf && ::access(conf, R_OK) != 0) {
      return fail(ErrorKind::kInvalidArgument, "slurm: SLURM_CONF names {}, which cannot be read: {}", conf,
                  std::strerror(errno));
    }
    auto config = run_command({"scontrol", "show", "config"});
    if (!config) return std::unexpected(config.error());
    if (config->status != 0) {
      return fail(ErrorKind::kHost,
                  "slurm: the cluster's controller does not answer (scontrol show config: {}): is slurmctld running, "
                  "and does SLURM_CONF or /etc/slurm/slurm.conf name it?",
                  said(*config));
    }
    accounting_ = config->out.find("accounting_storage/none") == std::string::npos && !find_on_path("sacct").empty();
    // A work directory in memory (tmpfs) is this host's alone: refuse it when the cluster has other hosts.
    struct statfs fs {};
    if (::statfs(m_.workdir().c_str(), &fs) == 0 && (fs.f_type == TMPFS_MAGIC || fs.f_type == RAMFS_MAGIC)) {
      auto nodes = run_command({"sinfo", "-h", "-N", "-o", "%n"});
      char self[256] = {};
      ::gethostname(self, sizeof self - 1);
      if (nodes && nodes->status == 0) {
        std::stringstream lines(nodes->out);
        for (std::string host; std::getline(lines, host);) {
          if (!host.empty() && host != self && host != "localhost" && host != "127.0.0.1") {
            return fail(ErrorKind::kInvalidArgument,
                        "slurm: the work directory {} is in this host's memory (tmpfs), which node {} cannot see: give "
                        "--workdir on a file system every node mounts",
                        m_.workdir(), host);
          }
        }
      }
    }
    return {};
  }

  Result<std::string> sbatch(std::vector<std::string> argv, const std::string& script) {
    if (!options_.partition.empty()) argv.push_back("--partition=" + options_.partition);
    argv.push_back(script);
    auto out = run_command(argv);
    if (!out) return std::unexpected(out.error());
    std::string id = out->out.substr(0, out->out.find_first_of(";\n"));
    if (out->status != 0 || id.empty()) {
      return fail(ErrorKind::kHost, "slurm: the cluster refused the job ({}): {}", fmt::join(argv, " "), said(*out));
    }
    jobs_.push_back(id);
    return id;
  }

  Result<std::string> submit_items(const std::vector<uint32_t>& which) {
    const double submitted = now_unix();
    auto id = sbatch({"sbatch", "--parsable", "--job-name=deja-items", fmt::format("--array={}", fmt::join(which, ",")),
                      "--output=" + m_.workdir() + "/logs/item-%a.log", "--chdir=" + m_.workdir()},
                     items_script_);
    if (id) {
      for (uint32_t i : which) submitted_[i] = submitted;
    }
    return id;
  }

  Result<std::string> submit_merge(const std::string& dependency) {
    return sbatch({"sbatch", "--parsable", "--job-name=deja-merge", "--output=" + m_.workdir() + "/logs/merge.out",
                   "--error=" + m_.workdir() + "/logs/merge.err",
                   "--chdir=" + m_.workdir(), "--dependency=" + dependency},
                  merge_script_);
  }

  // Points the merge job at `dependency`; a cluster that cancelled it already (kill_invalid_depend, once a task
  // failed) gets a new one.
  Result<> depend(const std::string& dependency) {
    auto out = run_command({"scontrol", "update", "JobId=" + merge_job_, "Dependency=" + dependency});
    if (!out) return std::unexpected(out.error());
    if (out->status == 0) return {};
    auto again = submit_merge(dependency);
    if (!again) {
      return fail(ErrorKind::kHost, "slurm: cannot make merge job {} wait for {} ({}), nor submit it again: {}",
                  merge_job_, dependency, said(*out), again.error().message);
    }
    say("slurm: merge job {} could not wait for {} ({}): merge job {} does", merge_job_, dependency, said(*out), *again);
    merge_job_ = *again;
    return {};
  }

  // The state and reason of every array task of `job` (sacct with accounting, else scontrol); an error when the
  // controller does not answer.
  struct TaskState {
    std::string state, reason;
  };
  Result<std::map<uint32_t, TaskState>> task_states(const std::string& job) {
    std::map<uint32_t, TaskState> states;
    if (accounting_) {
      auto out = run_command({"sacct", "-n", "-P", "-X", "-j", job, "-o", "JobID,State,Reason"});
      if (out && out->status == 0) {
        std::stringstream lines(out->out);
        for (std::string line; std::getline(lines, line);) {
          const size_t bar = line.find('|'), under = line.find('_');
          if (bar == std::string::npos || under == std::string::npos || under > bar) continue;
          const size_t bar2 = line.find('|', bar + 1);
          const TaskState state{line.substr(bar + 1, bar2 - bar - 1),
                                bar2 == std::string::npos ? "" : line.substr(bar2 + 1)};
          for (uint32_t i : indices(line.substr(under + 1, bar - under - 1))) states[i] = state;
        }
        return states;
      }
    }
    auto out = run_command({"scontrol", "-o", "show", "job", job});
    if (!out) return std::unexpected(out.error());
    if (out->status != 0) return fail(ErrorKind::kHost, "scontrol show job {}: {}", job, said(*out));
    std::stringstream lines(out->out);
    for (std::string line; std::getline(lines, line);) {
      const std::string task = field(line, "ArrayTaskId");
      if (task.empty()) continue;
      for (uint32_t i : indices(task)) states[i] = {field(line, "JobState"), field(line, "Reason")};
    }
    return states;
  }

  // Waits a poll interval; an error when deja was interrupted, when the job has only waited (nothing `running`, every
  // task pending) for start_timeout (naming the job and why Slurm holds it), or when the controller has not answered
  // for as long (at most two minutes).
  Result<> pause(const std::string& job, bool running, const std::string& reason, const Result<void>& answered) {
    const auto now = std::chrono::steady_clock::now();
    if (running || last_progress_ == std::chrono::steady_clock::time_point{}) last_progress_ = now;
    if (answered) last_answer_ = now;
    const double idle = std::chrono::duration<double>(now - last_progress_).count();
    const double silent = std::chrono::duration<double>(now - last_answer_).count();
    if (!answered && silent > std::min(options_.start_timeout, 120.0)) {
      return fail(ErrorKind::kHost, "slurm: the controller has not answered for {:.0f} s about job {}: {}", silent,
                  job, answered.error().message);
    }
    if (idle > options_.start_timeout) {
      return fail(ErrorKind::kHost,
                  "slurm: job {} has not started in {:.0f} s (Slurm's reason: {}); giving up (--start-timeout)", job,
                  idle, reason.empty() ? "none given" : reason);
    }
    std::this_thread::sleep_for(std::chrono::duration<double>(options_.poll_seconds));
    if (g_interrupted.load()) return fail(ErrorKind::kHost, "slurm: interrupted while job {} ran", job);
    return {};
  }

  Result<std::map<uint32_t, std::string>> wait_for_tasks(const std::string& job,
                                                         const std::map<uint32_t, std::string>& items) {
    std::map<uint32_t, std::string> done;
    std::map<uint32_t, std::string> shown;
    last_progress_ = {};
    for (;;) {
      auto states = task_states(job);
      bool running = false;  // a task not waiting: the job is not stuck
      std::string reason;
      for (const auto& [index, unused] : items) {
        if (done.contains(index)) continue;
        auto it = states ? states->find(index) : std::map<uint32_t, TaskState>::iterator{};
        if (!states || it == states->end()) {
          // Purged from the controller's memory (MinJobAge) or not listed yet: a result means it ran.
          if (auto r = read_result(loaded_, index, nullptr); r && states && states->empty()) {
            done[index] = r->ok() ? "COMPLETED" : "FAILED";
            running = true;
          }
          continue;
        }
        const TaskState& task = it->second;
        running |= task.state != "PENDING";
        if (shown[index] != task.state) {
          shown[index] = task.state;
          if (terminal(task.state)) say("slurm: task {} of job {}: {}", index, job, task.state);
        }
        if (task.state == "PENDING" && reason.empty()) reason = task.reason;
        if (terminal(task.state)) done[index] = task.state;
      }
      if (done.size() == items.size()) return done;
      if (auto r = pause(job, running, reason, states ? Result<void>{} : std::unexpected(states.error())); !r) {
        return std::unexpected(r.error());
      }
    }
  }

  // The merge job's final state and exit status.
  Result<std::pair<std::string, int>> wait_for_job(const std::string& job) {
    last_progress_ = {};
    for (;;) {
      std::string state, code, reason;
      Result<void> answered;
      if (accounting_) {
        auto out = run_command({"sacct", "-n", "-P", "-X", "-j", job, "-o", "State,ExitCode,Reason"});
        if (out && out->status == 0 && !out->out.empty()) {
          std::stringstream line(out->out.substr(0, out->out.find('\n')));
          std::getline(line, state, '|');
          std::getline(line, code, '|');
          std::getline(line, reason, '|');
        }
      }
      if (state.empty()) {
        auto out = run_command({"scontrol", "-o", "show", "job", job});
        if (!out) {
          answered = std::unexpected(out.error());
        } else if (out->status != 0) {
          answered = fail(ErrorKind::kHost, "scontrol show job {}: {}", job, said(*out));
        } else {
          state = field(out->out, "JobState");
          code = field(out->out, "ExitCode");
          reason = field(out->out, "Reason");
        }
      }
      if (terminal(state)) return std::pair{state, std::atoi(code.c_str())};
      if (auto r = pause(job, !state.empty() && state != "PENDING", reason, answered); !r) {
        return std::unexpected(r.error());
      }
    }
  }

  // Submit to start, per task, from the results' start times.
  void report_overhead() {
    double sum = 0, max = 0;
    unsigned n = 0;
    for (const auto& [index, submitted] : submitted_) {
      if (auto r = read_result(loaded_, index, nullptr); r && r->started_unix() > 0) {
        const double wait = r->started_unix() - submitted;
        sum += wait;
        max = std::max(max, wait);
        ++n;
      }
    }
    if (n) say("slurm: {} tasks, submit to start {:.2f} s on average, {:.2f} s at most", n, sum / n, max);
  }

  const LoadedManifest& loaded_;
  const segments::Manifest& m_;
  const ExecutorOptions& options_;
  InterruptHandlers interrupt_handlers_;
  std::string items_script_, merge_script_, merge_job_;
  std::vector<std::string> jobs_;  // every job submitted, cancelled unless the run finished
  bool finished_ = false;
  bool accounting_ = false;
  std::map<uint32_t, double> submitted_;
  std::chrono::steady_clock::time_point last_progress_, last_answer_ = std::chrono::steady_clock::now();
};

}  // namespace

Result<int> run_slurm(const LoadedManifest& loaded, const ExecutorOptions& options) {
  auto status = Slurm(loaded, options).run();
  if (!status && g_interrupted.load()) {
    say("{}", status.error().message);
    return exit_status::kInterrupted;
  }
  return status;
}

}  // namespace deja
