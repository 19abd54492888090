// The executors that run a job's items: processes on this machine, or a Slurm array job with a dependent merge job.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "segments/manifest.h"

namespace deja {

struct ExecutorOptions {
  std::string kind = "local";   // local | slurm
  unsigned jobs = 0;            // local: workers at a time (0: one per core this process may run on)
  std::string partition;        // slurm: "" = the cluster's default
  unsigned retries = 1;         // slurm: times a task that ended without a result (a node failure) is submitted again
  std::string deja;             // the binary workers run ("" = this one; on Slurm the path every node has it at)
  std::vector<std::string> merge_args;  // slurm: added to the merge job's `deja merge MANIFEST` (e.g. --json)
  double poll_seconds = 0.5;    // slurm: how often job states are read
  double start_timeout = 3600;  // slurm: give up (cancelling the jobs) when every task has only waited this long
};

// The cores this process may run on.
unsigned available_cores();
// This binary's path (/proc/self/exe), for workers.
std::string this_binary();

// Local: runs `deja segment MANIFEST --index I` for every item, `jobs` at a time, each item's output in its log
// (WORKDIR/logs/item-I.log), and returns 0 when all have ended; the caller merges. SIGINT, SIGTERM or SIGHUP is
// forwarded to the running workers and every one waited for (SIGKILL after a second signal or 10 s): the status is
// then exit_status::kInterrupted, and no worker is left behind.
Result<int> run_local(const LoadedManifest& manifest, const ExecutorOptions& options);

// Slurm: submits the items as one array job (sbatch --array, each task `deja segment MANIFEST --index
// $SLURM_ARRAY_TASK_ID`) and `deja merge MANIFEST` as a job that depends on it (afterok), follows the tasks' states
// (sacct where accounting is enabled, else scontrol), submits again the tasks that ended without a result (up to
// `retries` times) and points the merge job at them, and when the merge job has ended prints its output and returns
// its exit status. Refuses up front, clearly, when sbatch is missing, the controller does not answer or the work
// directory cannot be shared, and says so when tasks ran but left nothing in the work directory (it is not shared with
// their nodes). Cancels every job it submitted (scancel) when it stops early: SIGINT, SIGTERM or SIGHUP (the status is
// then exit_status::kInterrupted), an error, or no job starting within `start_timeout` (the error names the job and
// the reason Slurm gives).
Result<int> run_slurm(const LoadedManifest& manifest, const ExecutorOptions& options);

// Removes the results items left by an earlier run in the same work directory, so that what the executor finds there
// afterwards is this run's.
Result<> clear_results(const LoadedManifest& manifest, const std::vector<uint32_t>& items);

// A command's exit status, standard output and standard error, for the cluster's client commands.
struct CommandOutput {
  int status = 0;
  std::string out, err;
};
Result<CommandOutput> run_command(const std::vector<std::string>& argv);
// The first `name` on PATH that can be executed, or "".
std::string find_on_path(const std::string& name);

}  // namespace deja
