// What the subcommands share: the subcommand table entry, error-to-exit-status mapping, and reading a guest's input files.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "logging/trace.pb.h"
#include "vmm/cpu_model.h"
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
Subcommand add_debug_command(CLI::App& app);
Subcommand add_query_command(CLI::App& app);

// Prints the error ("deja: ...") and returns the exit status for its kind.
int report_error(const Error& e);
// Prints why a run ended, unless the guest ended it itself or replay already reported it.
void finish_outcome_message(const Outcome& o);

// Which backend runs the guest and which CPU model it presents.
struct BackendChoice {
  std::string backend;  // "kvm" or "interp"
  const CpuModel* model = nullptr;
};
// Resolves --backend and --cpu. An explicit backend that cannot run here (KVM failing the usability check,
// kvm/kvm_usability.h) or cannot provide `model` is refused, naming why; without one, `preferred` ("kvm" for a
// new run, the recorded backend for a replay) is used when it can, else the software CPU, saying why in one
// line. `model` nullptr: the richest model the chosen backend provides.
Result<BackendChoice> choose_backend(const std::string& requested, const std::string& preferred,
                                     const CpuModel* model);

// The guest image and boot modules (or the Linux kernel and its initrd), read whole.
struct GuestInputs {
  std::vector<uint8_t> image;
  std::vector<std::vector<uint8_t>> modules;
  std::vector<uint8_t> initrd;
};
// Nothing larger than `max_bytes` (the guest's RAM) is read: it could not be loaded.
Result<GuestInputs> read_guest_inputs(const std::string& image_path, const LoadOptions& load, uint64_t max_bytes);

// The offset of the first byte that is not part of valid UTF-8, or none.
std::optional<size_t> first_invalid_utf8(std::string_view text);

// A trace header's description of one input file (role, path, SHA-256, size).
trace::InputFile input_file(const std::string& role, const std::string& path, std::span<const uint8_t> bytes);

}  // namespace deja
