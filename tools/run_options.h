// The options of `deja run` and `deja record`, and the run or recording they start: shared with `deja explore`.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "explore/campaign.h"
#include "logging/signing.h"
#include "logging/trace_writer.h"
#include "replay/scheduler.h"
#include "replay/scripted_input.h"
#include "replay/session.h"
#include "segments/trace_checkpoints.h"
#include "tools/libvirt_options.h"
#include "vmm/disk_image.h"
#include "vmm/user_network.h"

namespace deja {

struct RunArgs {
  std::string backend;
  std::string interp_mode;
  std::string machine;  // "" = pc
  int64_t cpus = 1;
  std::optional<uint64_t> schedule_seed;
  std::optional<uint64_t> schedule_quantum;
  bool tso = false;  // x86-TSO store buffers (interp, reference executor)
  std::string mem;      // "" = 256M
  std::string cmdline;
  std::string serial_in;
  std::string serial_out = "-";
  std::vector<std::string> modules;
  std::string progress;
  std::string cpu;
  bool stats = false;
  bool digest = false;
  std::string image;
  std::string kernel;  // a Linux kernel (bzImage or vmlinux) instead of IMAGE
  std::string initrd;
  std::string boot_protocol = "auto";
  bool linux_guest = false;  // --linux: the bundled guest
  bool print_cmdline = false;
  std::vector<std::string> disks;  // --disk FILE[,overlay=FILE][,readonly][,hash=full|lazy]
  std::vector<std::string> nets;   // --net user[,hostfwd=...]
  bool rng = false;
  std::string libvirt_xml, libvirt_domain, libvirt_uri;  // the machine from a libvirt domain
  std::string output;            // record: the trace
  std::string sign;              // record: the private key that seals the trace and signs TRACE.sig
  double seal_every = 10;        // record --sign: seconds between seals (0: by chunks only)
  uint64_t seal_chunks = 0;      // record --sign: chunks between seals (0: by time only)
  std::string tsa_request;       // record --sign: write an RFC 3161 request for TRACE.sig here
  uint64_t digest_every = Session::kDefaultDigestInterval;  // record: a full state digest every N events
  std::string checkpoint_every;  // record: checkpoints beside the trace (TRACE.ckpt)
  uint64_t checkpoint_full_every = CheckpointWriter::kDefaultFullEvery;
};

// `deja explore` (tools/explore_command.cpp, docs/explore.md): a recording whose every input comes from a seed, with
// the schedule, timer jitter, faults and limits the campaign chose; run_or_record() fills in how it ended.
struct SeededRecording {
  static constexpr int64_t kStartUnixNs = 1'767'225'600'000'000'000;  // 2026-01-01T00:00:00Z: the RTC's start
  uint64_t seed = 0;
  std::optional<ScheduleConfig> schedule;  // several vCPUs: instead of the default schedule
  uint64_t max_timer_delay_ns = 0;
  FaultPlan faults;
  Session::RunLimits limits;
  std::function<void(std::span<const uint8_t>)> serial_tap;
  // --inputs-from TRACE: that recording's serial input, typed at the guest times it arrived (instead of --serial-in);
  // the trace is named among the recording's inputs.
  std::optional<RecordedInput> inputs_from;
  std::vector<ScriptedInput::Arrival> scripted_serial;
  std::optional<Outcome> outcome;
  std::string digest;  // the final CPU and RAM digest (`--digest`)
  uint64_t instructions = 0, schedule_events = 0, faults_injected = 0;
  std::vector<explore::Perturbation> perturbations;
  trace::Exploration provenance;  // into the trace header
};

// What a run or a recording needs, resolved from the options.
struct SessionOptions {
  MachineConfig machine;
  std::optional<uint64_t> schedule_seed;     // several vCPUs: the schedule's seed (default: random)
  std::optional<uint64_t> schedule_quantum;  // and its mean slice
  std::string image_path;
  LoadOptions load;
  std::string serial_in;         // "" = none, "-" = stdin, else a file
  std::string serial_out = "-";  // "-" = stdout
  bool stats = false;
  bool print_digest = false;
  ProgressChoice progress;
  std::vector<DiskOptions> disks;
  std::vector<NetOptions> nets;
  bool rng = false;
  std::string trace_path;            // record: output file
  std::shared_ptr<const SigningKey> signing_key;  // record --sign
  std::string signing_key_path;
  SealPolicy seals;
  std::string tsa_request;
  uint64_t digest_interval = Session::kDefaultDigestInterval;
  std::string checkpoint_every;
  uint64_t checkpoint_full_every = CheckpointWriter::kDefaultFullEvery;
  std::optional<RecordedDomain> libvirt_domain;  // the domain the machine came from
  SeededRecording* seeded = nullptr;             // deja explore: the seed's recording
};

// The options run and record share (and explore), added to `cmd`.
void add_run_options(CLI::App* cmd, RunArgs& a);
Result<SessionOptions> to_session(const RunArgs& a);
// Runs or records the guest `options` describe; returns deja's exit status (the guest's, or why it stopped).
int run_or_record(const SessionOptions& options, Mode mode);

}  // namespace deja
