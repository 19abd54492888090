// What the subcommands share: the subcommand table entry, error-to-exit-status mapping, and reading a guest's input files.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "logging/signing.h"
#include "logging/trace.pb.h"
#include "core/cpu_model.h"
#include "core/error.h"
#include "core/text.h"
#include "boot/loader.h"
#include "replay/backend_choice.h"
#include "replay/session.h"

namespace deja {

struct ProgressDisplay;  // tools/progress_line.h

// One row of the git-style subcommand table: its CLI11 parser and what runs when it was parsed.
struct Subcommand {
  CLI::App* cli = nullptr;
  std::function<int()> run;
};

// tools/*_command.cpp: each adds its subcommand(s) to `app`.
std::vector<Subcommand> add_run_and_record_commands(CLI::App& app);
Subcommand add_replay_command(CLI::App& app);
Subcommand add_inspect_command(CLI::App& app);
Subcommand add_verify_command(CLI::App& app);
Subcommand add_selftest_command(CLI::App& app);
Subcommand add_debug_command(CLI::App& app);
Subcommand add_query_command(CLI::App& app);
Subcommand add_index_command(CLI::App& app);
Subcommand add_plan_command(CLI::App& app);
Subcommand add_segment_command(CLI::App& app);
Subcommand add_merge_command(CLI::App& app);
Subcommand add_keygen_command(CLI::App& app);
Subcommand add_sign_command(CLI::App& app);
Subcommand add_custody_command(CLI::App& app);
Subcommand add_export_libvirt_command(CLI::App& app);
Subcommand add_explore_command(CLI::App& app);

// The command line's arguments after the subcommand's name (main() keeps them): what a sharded campaign hands on.
void remember_command_line(int argc, char** argv);
const std::vector<std::string>& command_line_arguments();

// `deja verify --replay`: replays TRACE (serial output discarded), showing progress as `display` says; 0 when every
// event and digest matched, else deja's status for what went wrong (tools/replay_command.cpp).
int replay_for_verify(const std::string& trace_path, const ProgressDisplay& display);

// `--tsa-request FILE` of record and sign: an RFC 3161 request for the signature's time-stamp (tools/sign_command.cpp).
Result<> write_timestamp_request(const std::string& path, const DsseEnvelope& signed_trace,
                                 const std::vector<std::string>& inputs);

// Prints the error ("deja: ...") and returns the exit status for its kind.
int report_error(const Error& e);
// Prints why a run ended, unless the guest ended it itself or replay already reported it.
void finish_outcome_message(const Outcome& o);

}  // namespace deja
