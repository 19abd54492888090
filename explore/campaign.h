// An exploration campaign: seeds run in child processes, -j at a time, their results gathered into JSON lines and a summary.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "core/error.h"

namespace deja::explore {

// Seeds first..last, both included ("A..B", or "S" for one).
struct SeedRange {
  uint64_t first = 0, last = 0;
  uint64_t size() const { return last - first + 1; }
};
Result<SeedRange> parse_seed_range(const std::string& text);
// "I/N": shard I (from 0) of N.
struct Shard {
  uint32_t index = 0, count = 1;
};
Result<Shard> parse_shard(const std::string& text);
// The seeds of `shard`: every N-th from first + I, so that each shard covers the range evenly.
std::vector<uint64_t> shard_seeds(const SeedRange& range, const Shard& shard);

// A perturbation of a run that --minimize may take away: a PCT change point that preempted a vCPU, or an injected fault.
struct Perturbation {
  std::string kind;    // "change-point", "fault"
  uint64_t index = 0;  // change point: its number (bit of dropped_change_points); fault: its order among those drawn
  uint32_t vcpu = 0;
  uint64_t rip = 0;
  std::string detail;  // "scheduling event 97", "disk 0 read sector 5600 (I/O error)"
};

// What one seed's run came to.
struct SeedResult {
  uint64_t seed = 0;
  int status = 0;      // deja's exit status for the run (the guest's status where it exited)
  std::string reason;  // how it ended ("guest exit", "hang: ...", "limit: ...", "triple fault", an error)
  std::vector<std::string> met;  // the --until predicates it met: non-empty is a failure, whose trace is kept
  std::string trace;             // the kept trace (failures only)
  std::string digest;            // final CPU and RAM digest
  uint64_t instructions = 0, schedule_events = 0, faults = 0;
  std::vector<Perturbation> perturbations;  // those that happened (--minimize; not in --json's lines)
  double seconds = 0;  // host time of the run, for rates only (never part of the run)
  bool error = false;  // deja could not run the seed (the reason says why)
  bool failed() const { return !met.empty(); }
  // The outcome's class for the histogram: "fail: PREDICATE", "exit N", "hang", "limit", "error", or the reason.
  std::string outcome_class() const;
};
std::string to_json(const SeedResult& r);
Result<SeedResult> seed_result_from_json(const std::string& line);

// Runs `run` for every seed, each in a child process of its own (forked: a run owns its process's signal handlers
// and globals), at most `jobs` at a time; `done` sees each result as it comes, in completion order. The results are
// returned in seed order.
using SeedRunner = std::function<SeedResult(uint64_t seed)>;
std::vector<SeedResult> run_seeds(const std::vector<uint64_t>& seeds, unsigned jobs, const SeedRunner& run,
                                  const std::function<void(const SeedResult&)>& done);

// The campaign's summary, from every seed's result (several shards' together).
struct Summary {
  uint64_t seeds = 0, failures = 0, errors = 0;
  std::map<std::string, uint64_t> outcomes;  // outcome_class() -> seeds
  std::optional<uint64_t> first_failing_seed;
  double seconds = 0;  // wall time of the campaign (0: unknown, e.g. merged shards)
  double run_seconds = 0;  // the runs' own time, summed
};
Summary summarize(const std::vector<SeedResult>& results, double wall_seconds);
std::string summary_text(const Summary& s);
std::string summary_json(const Summary& s);

}  // namespace deja::explore
