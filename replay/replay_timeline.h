// ReplayTimeline: checkpoints over a steppable replay, and reverse execution as restore-then-replay-forward (rr's ReplayTimeline).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "snapshot/checkpoint.h"
#include "snapshot/cow_memory.h"
#include "replay/session.h"

namespace deja {

struct TimelineOptions {
  // Distance between automatic checkpoints: in steps where the backend counts them (interp), else in
  // trace events (KVM).
  uint64_t interval_steps = 1'000'000;
  uint64_t interval_events = 1'000;
  // Bound on the memory automatic checkpoints take; beyond it old ones are thinned out logarithmically
  // (dense near the current position, sparse far from it). 0 = no automatic checkpoints.
  uint64_t memory_limit = uint64_t{512} << 20;
  // Use trace events as the time axis even where the backend counts steps (tests the KVM path on interp).
  bool by_events = false;
};

class ReplayTimeline {
 public:
  // Takes the first checkpoint where `session` stands now (the start of the replay).
  static Result<std::unique_ptr<ReplayTimeline>> create(Session& session, const TimelineOptions& options);

  // The time axis: Backend::step_count() where there is one, else trace events.
  bool counts_steps() const { return counts_steps_; }
  uint64_t now();
  uint64_t start_time() const { return start_time_; }
  Session& session() { return session_; }

  // Forward until `stop` (at_step / at_event absolute), taking automatic checkpoints on the way.
  Result<StopReason> forward(StopRequest stop);
  // Exactly to time `t`, forwards or backwards (restoring the nearest checkpoint before it).
  Result<StopReason> seek(uint64_t t);
  // To the first point where `events` trace events have been processed.
  Result<StopReason> seek_event(uint64_t events);
  // One step back (at the start: stays, at_start() is true).
  Result<StopReason> reverse_step();
  // Back to the last breakpoint hit or watched access before now (a watched access stops before the
  // accessing instruction), or to the start (at_start()). `interrupted` polled now and then.
  Result<StopReason> reverse_continue(const std::vector<uint64_t>& breakpoints,
                                      const std::vector<Watchpoint>& watchpoints,
                                      const std::function<bool()>& interrupted);
  bool at_start() { return now() == start_time_; }

  // A write to [address, address+length) before now: the last one, with the step it happened in.
  struct WriteHit {
    uint64_t time;  // the point just before the writing instruction
    uint64_t rip;
  };
  Result<std::optional<WriteHit>> last_write(uint64_t address, uint64_t length,
                                             const std::function<bool()>& interrupted);

  // Checkpoints the user named (monitor checkpoint / restart); never thinned out.
  Result<uint64_t> add_named_checkpoint();
  Result<StopReason> restart(uint64_t id);
  std::string describe_checkpoints();

  // Checkpoint files beside the trace: writes every named checkpoint and the automatic ones to
  // PREFIX.N.ckpt; loads those that match (a damaged or mismatched file is refused with a warning
  // naming it, and the replay uses the trace instead), within the memory limit: pages shared between
  // consecutive files are held once, and checkpoints beyond the limit are thinned out as they are loaded.
  // `accept`, when given, must pass each file first (a signed trace's checkpoints must be signed by its signer:
  // logging/trace_signature.h).
  Result<uint64_t> save_files(const std::string& prefix, const CheckpointIdentity& identity);
  uint64_t load_files(const std::string& prefix, const CheckpointIdentity& identity,
                      std::vector<std::string>& warnings,
                      const std::function<Result<>(const std::string&)>& accept = {});

  struct Stats {
    uint64_t checkpoints = 0;
    uint64_t memory_bytes = 0;  // page copies plus state
    uint64_t restores = 0;
    uint64_t thinned = 0;
  };
  Stats stats() const;
  CheckpointMemory& memory() { return *memory_; }

  // Drops every automatic checkpoint except the first (tests: a checkpoint is only a cache).
  void drop_automatic_checkpoints();
  // Time of every checkpoint held, ascending.
  std::vector<uint64_t> checkpoint_times() const;
  // Restores the checkpoint at exactly time `t` (tests).
  Result<> restore_at(uint64_t t);

 private:
  ReplayTimeline(Session& session, const TimelineOptions& options, std::unique_ptr<CheckpointMemory> memory);
  uint64_t time_of(const CheckpointPosition& at) const { return counts_steps_ ? at.steps : at.events; }
  Result<> take_checkpoint();
  // How far the next automatic checkpoint lies from one at `at`: the interval, in steps times the steps an
  // instruction has taken so far (each REP iteration is a step: a `rep stosb` loop is about 800 steps an
  // instruction), so that checkpoints stay about an interval of instructions, of replay time, apart however the
  // guest loops. A function of the position alone: restored to a checkpoint, the replay places the next ones where
  // the first pass did.
  uint64_t checkpoint_stride(const CheckpointPosition& at) const;
  Result<> restore(const MachineCheckpoint& cp);
  // The latest checkpoint at or before `t` (strictly before with `strict`).
  const MachineCheckpoint* checkpoint_before(uint64_t t, bool strict) const;
  // Restores the latest checkpoint before `t` that restores cleanly; one that does not (a loaded file
  // whose trace position lies past a truncated trace, say) is dropped with a warning, and the one before
  // it is used: a checkpoint is only a cache. Returns its time, or nullopt when there is none.
  Result<std::optional<uint64_t>> restore_before(uint64_t t, bool strict);
  void forget(const MachineCheckpoint* cp);
  void thin_out();
  // The last breakpoint hit or watched access in [start, end): its time and what it was.
  struct Hit {
    uint64_t time;
    StopReason reason;
  };
  Result<std::optional<Hit>> scan_back(uint64_t end, const std::vector<uint64_t>& breakpoints,
                                       const std::vector<Watchpoint>& watchpoints,
                                       const std::function<bool()>& interrupted, bool& was_interrupted);
  uint64_t memory_in_use() const;

  Session& session_;
  TimelineOptions options_;
  std::unique_ptr<CheckpointMemory> memory_;
  bool counts_steps_;
  uint64_t start_time_ = 0;
  std::map<uint64_t, MachineCheckpoint> automatic_;  // by time
  std::map<uint64_t, MachineCheckpoint> named_;      // by id
  uint64_t next_named_ = 1;
  uint64_t next_auto_at_ = 0;
  uint64_t restores_ = 0;
  uint64_t thinned_ = 0;
};

}  // namespace deja
