// What the commands that run a job over a trace's segments share (verify --replay, query --writes and --sample).
#pragma once

#include <string>

#include <CLI/CLI.hpp>

#include "segments/executor.h"
#include "segments/manifest.h"

namespace deja {

struct JobOptions {
  PlanOptions plan;
  ExecutorOptions executor;
  std::string every;  // --every SPEC, into plan.every_instructions
};

// --executor, -j, --partition, --retries, --start-timeout, --worker-deja.
void add_executor_options(CLI::App* cmd, ExecutorOptions& options);
// The executor's options and --segments, --every, --workdir, --store, --checkpoints.
void add_job_options(CLI::App* cmd, JobOptions& options);
// Runs a planned job's items on the executor and merges their results (on Slurm in the merge job, whose output is
// printed): the task's records and the merge's report; returns the exit status.
int run_job(const LoadedManifest& manifest, ExecutorOptions& executor, bool json);
// Plans the job (the trace cut at its checkpoints, TRACE.ckpt/), runs it on the executor and merges: prints the task's
// records and the merge's report; returns the exit status. A job of one segment on the local executor runs in this
// process; a local job of several in a temporary work directory unless --workdir is given.
int run_trace_job(JobOptions& options, bool json);

}  // namespace deja
