// The local executor: a worker process per item, `-j` at a time; and running the cluster's client commands.
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <sstream>

#include <fmt/format.h>

#include "core/exit_status.h"
#include "core/messages.h"
#include "segments/executor.h"

extern char** environ;

namespace deja {
namespace {

std::vector<char*> c_argv(const std::vector<std::string>& argv) {
  std::vector<char*> out;
  for (const auto& a : argv) out.push_back(const_cast<char*>(a.c_str()));
  out.push_back(nullptr);
  return out;
}

int wait_for(pid_t pid) {
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return -1;
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

}  // namespace

unsigned available_cores() {
  cpu_set_t set;
  if (::sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
  const long n = ::sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? unsigned(n) : 1;
}

std::string this_binary() {
  char path[4096];
  const ssize_t n = ::readlink("/proc/self/exe", path, sizeof path - 1);
  return n > 0 ? std::string(path, size_t(n)) : std::string("deja");
}

std::string find_on_path(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path ? path : "/usr/local/bin:/usr/bin:/bin");
  for (std::string dir; std::getline(dirs, dir, ':');) {
    const std::string candidate = (dir.empty() ? "." : dir) + "/" + name;
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

Result<CommandOutput> run_command(const std::vector<std::string>& argv) {
  int out_pipe[2], err_pipe[2];
  if (::pipe2(out_pipe, O_CLOEXEC) != 0) return fail(ErrorKind::kHost, "pipe: {}", std::strerror(errno));
  if (::pipe2(err_pipe, O_CLOEXEC) != 0) {
    ::close(out_pipe[0]);
    ::close(out_pipe[1]);
    return fail(ErrorKind::kHost, "pipe: {}", std::strerror(errno));
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out_pipe[1], 1);
  posix_spawn_file_actions_adddup2(&actions, err_pipe[1], 2);
  auto args = c_argv(argv);
  pid_t pid = 0;
  const int spawned = ::posix_spawnp(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  ::close(out_pipe[1]);
  ::close(err_pipe[1]);
  CommandOutput out;
  if (spawned == 0) {
    // Both pipes at once: a command that fills one while deja waits on the other would never end.
    pollfd fds[2] = {{out_pipe[0], POLLIN, 0}, {err_pipe[0], POLLIN, 0}};
    std::string* into[2] = {&out.out, &out.err};
    for (int open = 2; open > 0;) {
      if (::poll(fds, 2, -1) < 0) {
        if (errno == EINTR) continue;
        break;
      }
      for (int i = 0; i < 2; ++i) {
        if (fds[i].fd < 0 || !fds[i].revents) continue;
        char buffer[4096];
        const ssize_t n = ::read(fds[i].fd, buffer, sizeof buffer);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
          fds[i].fd = -1;
          --open;
        } else {
          into[i]->append(buffer, size_t(n));
        }
      }
    }
  }
  ::close(out_pipe[0]);
  ::close(err_pipe[0]);
  if (spawned != 0) return fail(ErrorKind::kHost, "cannot run {}: {}", argv[0], std::strerror(spawned));
  out.status = wait_for(pid);
  return out;
}

Result<> clear_results(const LoadedManifest& loaded, const std::vector<uint32_t>& items) {
  for (uint32_t index : items) {
    const std::string path = result_path(loaded.manifest.workdir(), index);
    if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
      return fail(ErrorKind::kHost, "cannot remove the earlier result {}: {}", path, std::strerror(errno));
    }
  }
  return {};
}

namespace {

// While workers run, SIGCHLD and the signals that stop deja are blocked and taken with sigtimedwait, so that a signal
// arriving between two checks is never lost; workers start with the mask deja had.
class WorkerSignals {
 public:
  WorkerSignals() {
    sigemptyset(&waited_);
    for (int s : {SIGCHLD, SIGINT, SIGTERM, SIGHUP}) sigaddset(&waited_, s);
    ::pthread_sigmask(SIG_BLOCK, &waited_, &saved_);
  }
  ~WorkerSignals() {
    // A SIGCHLD for a worker already reaped is taken here; a signal that stops deja, arriving after the last worker
    // ended, is delivered when the mask is restored.
    sigset_t child;
    sigemptyset(&child);
    sigaddset(&child, SIGCHLD);
    const timespec now{0, 0};
    while (::sigtimedwait(&child, nullptr, &now) > 0) {
    }
    ::pthread_sigmask(SIG_SETMASK, &saved_, nullptr);
  }
  WorkerSignals(const WorkerSignals&) = delete;
  WorkerSignals& operator=(const WorkerSignals&) = delete;

  const sigset_t& saved() const { return saved_; }
  // The next signal (SIGCHLD included), or 0 once `deadline` has passed.
  int wait(std::optional<std::chrono::steady_clock::time_point> deadline) {
    while (true) {
      int s = 0;
      if (!deadline) {
        s = ::sigwaitinfo(&waited_, nullptr);
      } else {
        const auto left = std::max(std::chrono::nanoseconds(*deadline - std::chrono::steady_clock::now()),
                                   std::chrono::nanoseconds(0));
        const timespec t{time_t(left.count() / 1'000'000'000), long(left.count() % 1'000'000'000)};
        s = ::sigtimedwait(&waited_, nullptr, &t);
        if (s < 0 && errno == EAGAIN) return 0;
      }
      if (s > 0) return s;
      // EINTR: a signal outside the set (SIGSTOP and SIGCONT, say); wait again.
    }
  }

 private:
  sigset_t waited_{}, saved_{};
};

}  // namespace

Result<int> run_local(const LoadedManifest& loaded, const ExecutorOptions& options) {
  const segments::Manifest& m = loaded.manifest;
  const uint32_t items = item_count(m);
  const unsigned jobs = options.jobs ? options.jobs : available_cores();
  const std::string deja = options.deja.empty() ? this_binary() : options.deja;
  std::vector<uint32_t> all(items);
  for (uint32_t i = 0; i < items; ++i) all[i] = i;
  if (auto r = clear_results(loaded, all); !r) return std::unexpected(r.error());
  WorkerSignals signals;
  std::map<pid_t, uint32_t> running;
  uint32_t next = 0;
  auto spawn = [&](uint32_t index) -> Result<> {
    const std::string log = log_path(m.workdir(), index);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW, 0600);
    posix_spawn_file_actions_adddup2(&actions, 1, 2);
    posix_spawnattr_t attributes;
    posix_spawnattr_init(&attributes);
    posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETSIGMASK);
    posix_spawnattr_setsigmask(&attributes, &signals.saved());
    const std::vector<std::string> argv{deja, "segment", loaded.path, "--index", std::to_string(index)};
    auto args = c_argv(argv);
    pid_t pid = 0;
    const int spawned = ::posix_spawn(&pid, deja.c_str(), &actions, &attributes, args.data(), environ);
    posix_spawnattr_destroy(&attributes);
    posix_spawn_file_actions_destroy(&actions);
    if (spawned != 0) return fail(ErrorKind::kHost, "cannot run {}: {}", deja, std::strerror(spawned));
    running[pid] = index;
    return {};
  };
  auto signal_workers = [&](int signal) {
    for (const auto& [pid, index] : running) ::kill(pid, signal);
  };
  // SIGINT, SIGTERM or SIGHUP: forwarded to every worker (a replay stops at its next check and says so), no item
  // started after it, every worker waited for. A second signal, or workers still running kKillAfter seconds later,
  // end them with SIGKILL.
  constexpr std::chrono::seconds kKillAfter{10};
  int interrupted_by = 0;
  std::optional<std::chrono::steady_clock::time_point> kill_at;  // from the first signal until SIGKILL was sent
  Result<> failure;
  while (true) {
    int status = 0;
    for (pid_t pid; (pid = ::waitpid(-1, &status, WNOHANG)) > 0;) running.erase(pid);
    while (failure && !interrupted_by && running.size() < jobs && next < items) failure = spawn(next++);
    if (running.empty()) break;  // every item ran, or none may start (a signal, a failed spawn)
    if (kill_at && std::chrono::steady_clock::now() >= *kill_at) {
      say("{} workers still running {} s after the signal: killing them", running.size(), kKillAfter.count());
      signal_workers(SIGKILL);
      kill_at.reset();
    }
    const int signal = signals.wait(kill_at);
    if (signal == SIGCHLD || signal == 0) continue;
    if (interrupted_by) {
      signal_workers(SIGKILL);
      kill_at.reset();
      continue;
    }
    interrupted_by = signal;
    kill_at = std::chrono::steady_clock::now() + kKillAfter;
    say("{}: stopping {} workers ({} of {} items not started)", strsignal(signal), running.size(), items - next,
        items);
    signal_workers(signal);
  }
  if (!failure) return std::unexpected(failure.error());
  if (interrupted_by) {
    say("interrupted ({}): every worker has ended; the job's results are incomplete", strsignal(interrupted_by));
    return exit_status::kInterrupted;
  }
  return 0;
}

}  // namespace deja
