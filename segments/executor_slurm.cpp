// The Slurm executor: an array job for the items, a dependent merge job, task states from sacct or scontrol, retries.
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <linux/magic.h>

#include <chrono>
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

class Slurm {
 public:
  Slurm(const LoadedManifest& loaded, const ExecutorOptions& options)
      : loaded_(loaded), m_(loaded.manifest), options_(options) {}

  Result<int> run() {
    if (auto r = check(); !r) return std::unexpected(r.error());
    const uint32_t items = item_count(m_);
    const std::string deja = options_.deja.empty() ? this_binary() : options_.deja;
    const std::string dir = m_.workdir() + "/slurm";
    if (auto r = make_directories(dir); !r) return std::unexpected(r.error());
    items_script_ = dir + "/items.sh";
    std::string merge_command = quote(deja) + " merge " + quote(loaded_.path);
    for (const auto& a : options_.merge_args) merge_command += " " + quote(a);
    if (auto r = write_work_file(items_script_,
                                 fmt::format("#!/bin/sh\n# deja: one item of {}\nexec {} segment {} --index "
                                             "\"$SLURM_ARRAY_TASK_ID\"\n",
                                             loaded_.path, quote(deja), quote(loaded_.path)),
                                 "batch script");
        !r) {
      return std::unexpected(r.error());
    }
    const std::string merge_script = dir + "/merge.sh";
    if (auto r = write_work_file(merge_script, fmt::format("#!/bin/sh\n# deja: the merge of {}\nexec {}\n",
                                                           loaded_.path, merge_command),
                                 "batch script");
        !r) {
      return std::unexpected(r.error());
    }
    std::vector<uint32_t> all;
    for (uint32_t i = 0; i < items; ++i) all.push_back(i);
    auto array = submit_items(all);
    if (!array) return std::unexpected(array.error());
    std::vector<std::string> merge{"sbatch", "--parsable", "--job-name=deja-merge",
                                   "--output=" + m_.workdir() + "/logs/merge.log", "--chdir=" + m_.workdir(),
                                   "--dependency=afterok:" + *array};
    if (!options_.partition.empty()) merge.push_back("--partition=" + options_.partition);
    merge.push_back(merge_script);
    auto merge_job = sbatch(merge);
    if (!merge_job) return std::unexpected(merge_job.error());
    say("slurm: submitted {} tasks as array job {}, merge job {}", items, *array, *merge_job);

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
        std::string why;
        auto result = read_result(loaded_, index, &why);
        if (result) {
          definitive_failure = true;  // the item ran and says what failed: running it again would say the same
          continue;
        }
        struct stat st {};
        if (::stat(log_path(m_.workdir(), index).c_str(), &st) != 0) unshared.push_back(index);
        retry.push_back(index);
      }
      if (!unshared.empty() && unshared.size() == states->size()) {
        (void)run_command({"scancel", *merge_job});
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
        if (auto r = depend(*merge_job, "afterany:" + *again); !r) return std::unexpected(r.error());
        continue;
      }
      // Nothing more to run: the merge job reports what failed.
      if (auto r = depend(*merge_job, "afterany:" + arrays.back()); !r) return std::unexpected(r.error());
      break;
    }
    auto merged = wait_for_job(*merge_job);
    if (!merged) return std::unexpected(merged.error());
    report_overhead();
    auto log = read_small_file(m_.workdir() + "/logs/merge.log", "merge log", uint64_t{1} << 30);
    if (!log) return fail(ErrorKind::kHost, "slurm: merge job {} ended ({}) without its log: {}", *merge_job,
                          merged->first, log.error().message);
    std::fputs(log->c_str(), stdout);
    std::fflush(stdout);
    if (!merged->first.starts_with("COMPLETED") && merged->second == 0) return exit_status::kHostFailure;
    return merged->second;
  }

 private:
  Result<> check() {
    for (const char* tool : {"sbatch", "scontrol"}) {
      if (find_on_path(tool).empty()) {
        return fail(ErrorKind::kUnsupported,
                    "--executor slurm needs Slurm's client commands, and {} is not on PATH: install slurm-client (and "
                    "point it at your cluster), or use --executor local",
                    tool);
      }
    }
    if (!m_.workdir().starts_with("/")) return fail(ErrorKind::kInvalidArgument, "slurm: the work directory must be absolute");
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
    auto config = run_command({"scontrol", "show", "config"});
    accounting_ = config && config->status == 0 && config->out.find("accounting_storage/none") == std::string::npos &&
                  !find_on_path("sacct").empty();
    return {};
  }

  Result<std::string> sbatch(const std::vector<std::string>& argv) {
    auto out = run_command(argv);
    if (!out) return std::unexpected(out.error());
    std::string id = out->out.substr(0, out->out.find_first_of(";\n"));
    if (out->status != 0 || id.empty()) {
      return fail(ErrorKind::kHost, "slurm: {} failed (exit status {}): {}", fmt::join(argv, " "), out->status,
                  out->out);
    }
    return id;
  }

  Result<std::string> submit_items(const std::vector<uint32_t>& which) {
    std::vector<std::string> argv{"sbatch", "--parsable", "--job-name=deja-items",
                                  "--array=" + fmt::format("{}", fmt::join(which, ",")),
                                  "--output=" + m_.workdir() + "/logs/item-%a.log", "--chdir=" + m_.workdir()};
    if (!options_.partition.empty()) argv.push_back("--partition=" + options_.partition);
    argv.push_back(items_script_);
    const double submitted = now_unix();
    auto id = sbatch(argv);
    if (id) {
      for (uint32_t i : which) submitted_[i] = submitted;
    }
    return id;
  }

  Result<> depend(const std::string& job, const std::string& dependency) {
    auto out = run_command({"scontrol", "update", "JobId=" + job, "Dependency=" + dependency});
    if (!out) return std::unexpected(out.error());
    if (out->status != 0) return fail(ErrorKind::kHost, "slurm: cannot make merge job {} wait for {}", job, dependency);
    return {};
  }

  // The state of every array task of `job` ("" where not known yet): sacct with accounting, else scontrol.
  std::map<uint32_t, std::string> task_states(const std::string& job) {
    std::map<uint32_t, std::string> states;
    if (accounting_) {
      auto out = run_command({"sacct", "-n", "-P", "-X", "-j", job, "-o", "JobID,State,ExitCode"});
      if (out && out->status == 0) {
        std::stringstream lines(out->out);
        for (std::string line; std::getline(lines, line);) {
          const size_t bar = line.find('|'), under = line.find('_');
          if (bar == std::string::npos || under == std::string::npos || under > bar) continue;
          const std::string state = line.substr(bar + 1, line.find('|', bar + 1) - bar - 1);
          for (uint32_t i : indices(line.substr(under + 1, bar - under - 1))) states[i] = state;
        }
        return states;
      }
    }
    auto out = run_command({"scontrol", "-o", "show", "job", job});
    if (!out || out->status != 0) return states;
    std::stringstream lines(out->out);
    for (std::string line; std::getline(lines, line);) {
      const std::string task = field(line, "ArrayTaskId");
      if (task.empty()) continue;
      for (uint32_t i : indices(task)) states[i] = field(line, "JobState");
    }
    return states;
  }

  Result<std::map<uint32_t, std::string>> wait_for_tasks(const std::string& job,
                                                         const std::map<uint32_t, std::string>& items) {
    std::map<uint32_t, std::string> done;
    std::map<uint32_t, std::string> shown;
    for (;;) {
      auto states = task_states(job);
      for (const auto& [index, unused] : items) {
        auto it = states.find(index);
        if (it == states.end()) {
          // Purged from the controller's memory (MinJobAge) or not listed yet: a result means it ran.
          std::string why;
          if (auto r = read_result(loaded_, index, &why); r && states.empty()) done[index] = r->ok() ? "COMPLETED" : "FAILED";
          continue;
        }
        if (shown[index] != it->second) {
          shown[index] = it->second;
          if (terminal(it->second)) say("slurm: task {} of job {}: {}", index, job, it->second);
        }
        if (terminal(it->second)) done[index] = it->second;
      }
      if (done.size() == items.size()) return done;
      std::this_thread::sleep_for(std::chrono::duration<double>(options_.poll_seconds));
    }
  }

  // The merge job's final state and exit status.
  Result<std::pair<std::string, int>> wait_for_job(const std::string& job) {
    for (;;) {
      std::string state, code;
      if (accounting_) {
        auto out = run_command({"sacct", "-n", "-P", "-X", "-j", job, "-o", "State,ExitCode"});
        if (out && out->status == 0 && !out->out.empty()) {
          const std::string line = out->out.substr(0, out->out.find('\n'));
          state = line.substr(0, line.find('|'));
          code = line.substr(line.find('|') + 1);
        }
      }
      if (state.empty()) {
        auto out = run_command({"scontrol", "-o", "show", "job", job});
        if (out && out->status == 0) {
          state = field(out->out, "JobState");
          code = field(out->out, "ExitCode");
        }
      }
      if (state.empty()) return fail(ErrorKind::kHost, "slurm: job {} is not known to the controller", job);
      if (terminal(state)) return std::pair{state, std::atoi(code.c_str())};
      std::this_thread::sleep_for(std::chrono::duration<double>(options_.poll_seconds));
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
  std::string items_script_;
  bool accounting_ = false;
  std::map<uint32_t, double> submitted_;
};

}  // namespace

Result<int> run_slurm(const LoadedManifest& loaded, const ExecutorOptions& options) {
  return Slurm(loaded, options).run();
}

}  // namespace deja
