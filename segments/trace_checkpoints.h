// The checkpoints that travel with a trace (TRACE.ckpt/): taken while recording or in one replay, restored where a segment starts.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "replay/session.h"
#include "segments/state_digest.h"
#include "snapshot/trace_checkpoint.h"

namespace deja {

// TRACE.ckpt, and its files NNNNNN.ckpt in trace order.
std::string checkpoint_directory(const std::string& trace);
std::string checkpoint_file_name(uint64_t number);

// How far apart checkpoints are, in guest instructions. "5G", "5Ginstr", "250000000instr": instructions;
// "60s", "500ms", "2m", "1h": guest time, at the recording's derived-time rate (1 ns an instruction by default).
Result<uint64_t> parse_checkpoint_interval(const std::string& text, uint64_t ps_per_instruction);

// Writes checkpoints of one session into a directory: the first full, then the pages and disk blocks that changed
// since the one before, with a full one every `full_every` (so that a segment late in a long trace reads a bounded
// chain of files), each zstd-compressed and named by its trace, position and state digest.
class CheckpointWriter {
 public:
  // Starts tracking RAM and the disks' writes now: before the session runs (recording) or replays (`deja index`).
  static Result<std::unique_ptr<CheckpointWriter>> create(Session& session, const CheckpointIdentity& identity,
                                                          std::string directory, uint64_t full_every);
  // The next checkpoint, here: where Session::capture_state() works (between run_until() calls, or in a recording's
  // turn hook).
  Result<TraceCheckpointMeta> take();
  uint64_t checkpoints() const { return number_; }
  uint64_t bytes_written() const { return bytes_; }
  // CPU time the calling thread spent taking checkpoints (create() and take()): what they cost a recording.
  double cpu_seconds() const { return cpu_seconds_; }
  static constexpr uint64_t kDefaultFullEvery = 16;

 private:
  CheckpointWriter(Session& session, CheckpointIdentity identity, std::string directory, uint64_t full_every)
      : session_(session), identity_(std::move(identity)), directory_(std::move(directory)), full_every_(full_every) {}
  Session& session_;
  CheckpointIdentity identity_;
  std::string directory_;
  uint64_t full_every_;
  uint64_t number_ = 0;
  StateSha previous_digest_{};
  uint64_t bytes_ = 0;
  RamPageHashes ram_hashes_;  // RAM's page hashes as of the last checkpoint (or create())
  double cpu_seconds_ = 0;
};

// A checkpoint directory is replaced whole: written as DIR.partial and renamed over DIR once complete. What is
// there already may only be deja's checkpoint files (deja removes nothing else): checked up front, and again when
// committing.
Result<> check_checkpoint_directory(const std::string& directory);
std::string partial_checkpoint_directory(const std::string& directory);
Result<> commit_checkpoint_directory(const std::string& directory);
void discard_partial_checkpoint_directory(const std::string& directory);

// `deja index`: replays the whole trace from the start taking a checkpoint every `every` instructions into DIR
// (replaced when complete), and checks the End as `deja replay` does. A replay that diverges leaves no directory.
struct IndexReport {
  uint64_t checkpoints = 0, bytes = 0, instructions = 0;
};
Result<IndexReport> index_trace(Session& session, const CheckpointIdentity& identity, const std::string& directory,
                                uint64_t every, uint64_t full_every);

// The checks a replay makes at the recording's End (its exit status, guest exits, instructions, state digest, the
// serial output), after run_until() returned kEnd with `outcome`: a divergence or a trace that ends early is an
// error (kDivergence, kBadTrace) with the report.
Result<> check_recording_end(Session& session, const Outcome& outcome);

// A checkpoint file as a manifest names it.
struct CheckpointFileRef {
  uint64_t number = 0;
  uint64_t parent = 0;
  std::string path;
  StateSha sha256{};
  StateSha digest{};
};
// The largest checkpoint file a machine of this identity with these disks can have.
uint64_t max_checkpoint_bytes(const CheckpointIdentity& identity, Session& session);

// Restores the last checkpoint of `chain` (a full one, then each checkpoint stored relative to the one before) into a
// replay session that has not run yet: every file checked (checksum, identity, its SHA-256 and number as the manifest
// names them, its parent's digest), RAM and the disks' writes put back, then the machine, the loop state and the trace
// cursor; finally the state digest of the machine as restored is compared with the one the checkpoint names. Returns
// that digest. A failure names the file and what is wrong.
Result<StateDigest> restore_trace_checkpoint(Session& session, const CheckpointIdentity& identity,
                                             std::span<const CheckpointFileRef> chain);

}  // namespace deja
