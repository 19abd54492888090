// What the subcommands share: the subcommand table entry, error-to-exit-status mapping, and reading a guest's input files.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "logging/trace.pb.h"
#include "vmm/error.h"
#include "vmm/loader.h"
#include "vmm/session.h"

namespace deja {

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

// Prints the error ("deja: ...") and returns the exit status for its kind.
int report_error(const Error& e);
// Prints why a run ended, unless the guest ended it itself or replay already reported it.
void finish_outcome_message(const Outcome& o);

// The guest image and boot modules (or the Linux kernel and its initrd), read whole.
struct GuestInputs {
  std::vector<uint8_t> image;
  std::vector<std::vector<uint8_t>> modules;
  std::vector<uint8_t> initrd;
};
Result<GuestInputs> read_guest_inputs(const std::string& image_path, const LoadOptions& load);

// A trace header's description of one input file (role, path, SHA-256, size).
trace::InputFile input_file(const std::string& role, const std::string& path, std::span<const uint8_t> bytes);

}  // namespace deja
