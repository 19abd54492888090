// The local executor: a worker process per item, `-j` at a time; and running the cluster's client commands.
#include <fcntl.h>
#include <sched.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>
#include <sstream>

#include <fmt/format.h>

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
  int pipe_fds[2];
  if (::pipe2(pipe_fds, O_CLOEXEC) != 0) return fail(ErrorKind::kHost, "pipe: {}", std::strerror(errno));
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], 1);
  auto args = c_argv(argv);
  pid_t pid = 0;
  const int spawned = ::posix_spawnp(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  ::close(pipe_fds[1]);
  if (spawned != 0) {
    ::close(pipe_fds[0]);
    return fail(ErrorKind::kHost, "cannot run {}: {}", argv[0], std::strerror(spawned));
  }
  CommandOutput out;
  char buffer[4096];
  for (;;) {
    const ssize_t n = ::read(pipe_fds[0], buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    out.out.append(buffer, size_t(n));
  }
  ::close(pipe_fds[0]);
  out.status = wait_for(pid);
  return out;
}

Result<> run_local(const LoadedManifest& loaded, const ExecutorOptions& options) {
  const segments::Manifest& m = loaded.manifest;
  const uint32_t items = item_count(m);
  const unsigned jobs = options.jobs ? options.jobs : available_cores();
  const std::string deja = options.deja.empty() ? this_binary() : options.deja;
  std::map<pid_t, uint32_t> running;
  uint32_t next = 0;
  auto spawn = [&](uint32_t index) -> Result<> {
    const std::string log = log_path(m.workdir(), index);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW, 0600);
    posix_spawn_file_actions_adddup2(&actions, 1, 2);
    const std::vector<std::string> argv{deja, "segment", loaded.path, "--index", std::to_string(index)};
    auto args = c_argv(argv);
    pid_t pid = 0;
    const int spawned = ::posix_spawn(&pid, deja.c_str(), &actions, nullptr, args.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    if (spawned != 0) return fail(ErrorKind::kHost, "cannot run {}: {}", deja, std::strerror(spawned));
    running[pid] = index;
    return {};
  };
  Result<> failure;
  while (next < items || !running.empty()) {
    while (failure && running.size() < jobs && next < items) failure = spawn(next++);
    if (running.empty()) break;
    int status = 0;
    const pid_t pid = ::waitpid(-1, &status, 0);
    if (pid < 0) {
      if (errno == EINTR) continue;
      return fail(ErrorKind::kHost, "waiting for workers: {}", std::strerror(errno));
    }
    running.erase(pid);
  }
  return failure;
}

}  // namespace deja
