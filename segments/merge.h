// `deja merge`: every item's result together, and the proof that the segments replayed the whole trace.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "segments/manifest.h"

namespace deja {

struct MergeReport {
  int status = 0;                     // 0: every check passed; else deja's exit status for the first problem
  std::vector<std::string> problems;  // each names its segment (or shard), its coordinates and what failed
  std::string summary;                // one line
  std::string task;                   // the task every item ran
  std::vector<std::string> records;   // every item's records, in trace order
  uint32_t items = 0, missing = 0;
  double seconds_max = 0, seconds_sum = 0;
};

// The result of item `index` in the manifest's work directory, if it wrote one (a result of another plan, or one
// that does not parse, is reported as missing with the reason in `why`).
std::optional<segments::ItemResult> read_result(const LoadedManifest& manifest, uint32_t index, std::string* why);
// Segments: every result present and exact; positions and state digests chain from the recording's start through
// every checkpoint to its End, which the last segment checked as `deja replay` does; the hash chain each segment
// computed over its part of the trace links to the next one's, from the header's digest to the trailer.
// Shards: the sharded task's own merge.
MergeReport merge_results(const LoadedManifest& manifest);
// The same over results at hand (an item run in this process); a missing one is `nullopt` with its reason.
MergeReport merge_results(const LoadedManifest& manifest, std::vector<std::optional<segments::ItemResult>> results,
                          const std::vector<std::string>& missing_why);
// Prints the task's records (stdout) and the report (problems and summary, stderr); returns its status.
int print_merge(const MergeReport& report, const LoadedManifest& manifest, bool json);

}  // namespace deja
