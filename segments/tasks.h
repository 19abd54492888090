// What the items of a job do: segment tasks over a slice of a trace (verify, writes, sample), and sharded campaigns (explore).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "replay/session.h"

namespace deja {

// A task a segment runs while it replays its slice of the trace. The segment has restored its start checkpoint;
// the task replays to `end` (its at_step or at_event is the segment's end checkpoint; neither: the recording's End),
// adding what it finds to `records` as JSON objects, in trace order. It must not stop anywhere else for good: the
// segment checks that the replay got to `end` and that the state there is the next checkpoint's.
class SegmentTask {
 public:
  virtual ~SegmentTask() = default;
  virtual Result<StopReason> run(Session& session, const StopRequest& end, std::vector<std::string>& records) = 0;
  // Prints every segment's records together, in trace order, as the sequential command prints them.
  virtual void print(const std::vector<std::string>& records, bool json) const = 0;
  // Needs a backend that counts steps (watchpoints, step positions).
  virtual bool needs_steps() const { return false; }
};

// "verify": only the exact replay of every event. "writes:ADDR:LEN": every write to guest-virtual [ADDR, ADDR+LEN)
// (`deja query --writes`). "sample:N" or "sample:N:ADDR:LEN": the registers (and guest-virtual memory) at every
// N-th step of the trace (`deja query --sample`).
Result<std::unique_ptr<SegmentTask>> make_segment_task(const std::string& spec);

// The registers `deja query --regs` shows, by name, and as its --json prints them at a point.
std::vector<std::pair<const char*, uint64_t>> named_registers(const CpuState& state);
std::string registers_json(const CpuState& state, const CheckpointPosition& at);

// A campaign split into shards rather than a trace into segments (`deja explore --shard I/N`, issue #24): each item
// runs one shard of the same command, and the merge summarises them. A campaign command registers its task under the
// manifest kind that names it; plan_shards() makes the manifest and the executors run it like segments.
class ShardTask {
 public:
  virtual ~ShardTask() = default;
  // Runs shard `index` of `count` of the campaign `args`, adding its findings (JSON objects) to `records`; returns the
  // shard's exit status (0: nothing found).
  virtual Result<int> run_shard(std::span<const std::string> args, uint32_t index, uint32_t count,
                                std::vector<std::string>& records) = 0;
  // Prints the campaign's summary from every shard's records; returns the campaign's exit status.
  virtual int merge(std::span<const std::string> args, const std::vector<std::vector<std::string>>& records) = 0;
};
using ShardTaskFactory = std::function<std::unique_ptr<ShardTask>()>;
// Built in: "sha256" (`deja plan --campaign sha256 --shards N -- FILE...`): the files hashed, shard I of N every N-th
// from the I-th; the merge prints them as sha256sum does, in argument order.
void register_shard_task(const std::string& kind, ShardTaskFactory factory);
std::unique_ptr<ShardTask> make_shard_task(const std::string& kind);

}  // namespace deja
