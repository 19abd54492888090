// Merging: read results, check the chain of positions, state digests and trace hash values, gather the tasks' records.
#include "segments/merge.h"

#include <fmt/format.h>

#include "core/exit_status.h"
#include "core/messages.h"
#include "logging/trace_format.h"
#include "logging/trace_reader.h"
#include "segments/files.h"
#include "segments/store.h"
#include "segments/tasks.h"

namespace deja {
namespace {

constexpr uint64_t kMaxResultBytes = uint64_t{1} << 30;

std::string short_hex(const std::string& bytes) { return hex(bytes).substr(0, 16); }

std::string describe(const segments::Position& p) {
  return fmt::format("steps {} instructions {} events {} guest exits {}", p.steps(), p.instructions(), p.events(),
                     p.guest_exits());
}

bool same(const segments::Position& a, const segments::Position& b) { return from_proto(a) == from_proto(b); }

bool same(const segments::ChainLink& a, const segments::ChainLink& b) {
  return a.chunk() == b.chunk() && a.first_event() == b.first_event() && a.chain_before() == b.chain_before() &&
         a.chain_before().size() == 32;
}

}  // namespace

std::optional<segments::ItemResult> read_result(const LoadedManifest& loaded, uint32_t index, std::string* why) {
  const std::string path = result_path(loaded.manifest.workdir(), index);
  auto text = read_small_file(path, "result", kMaxResultBytes);
  if (!text) {
    if (why) *why = text.error().message;
    return std::nullopt;
  }
  segments::ItemResult r;
  if (auto ok = from_json(*text, r, "result " + path); !ok) {
    if (why) *why = ok.error().message;
    return std::nullopt;
  }
  if (r.index() != index || r.manifest_sha256() != std::string(loaded.sha256.begin(), loaded.sha256.end())) {
    if (why) *why = fmt::format("result {} belongs to another plan or item", path);
    return std::nullopt;
  }
  return r;
}

MergeReport merge_results(const LoadedManifest& loaded) {
  const uint32_t items = item_count(loaded.manifest);
  std::vector<std::optional<segments::ItemResult>> results(items);
  std::vector<std::string> why(items);
  for (uint32_t i = 0; i < items; ++i) results[i] = read_result(loaded, i, &why[i]);
  return merge_results(loaded, std::move(results), why);
}

MergeReport merge_results(const LoadedManifest& loaded, std::vector<std::optional<segments::ItemResult>> results,
                          const std::vector<std::string>& missing_why) {
  const segments::Manifest& m = loaded.manifest;
  MergeReport report;
  report.items = item_count(m);
  auto problem = [&](int status, std::string what) {
    if (report.problems.empty()) report.status = status;
    report.problems.push_back(std::move(what));
  };
  results.resize(report.items);
  const bool segments = m.kind() == "segments";
  for (uint32_t i = 0; i < report.items; ++i) {
    const std::string why = i < missing_why.size() ? missing_why[i] : std::string();
    const std::string name = segments ? fmt::format("segment {} (from {} to {})", i,
                                                    describe_boundary(m, m.segments(int(i)).start_checkpoint(), false),
                                                    describe_boundary(m, m.segments(int(i)).end_checkpoint(), true))
                                      : fmt::format("shard {}/{}", i, m.shards());
    if (!results[i]) {
      ++report.missing;
      problem(exit_status::kTraceEnded,
              fmt::format("{} has no result: it did not run, or its worker failed before writing one ({}; its log: {})",
                          name, why.empty() ? "none" : why, log_path(m.workdir(), i)));
      continue;
    }
    const segments::ItemResult& r = *results[i];
    report.seconds_max = std::max(report.seconds_max, r.seconds());
    report.seconds_sum += r.seconds();
    if (report.task.empty()) report.task = r.task();
    if (r.task() != report.task) {
      problem(exit_status::kUsage, fmt::format("{} ran task {}, segment 0 ran {}", name, r.task(), report.task));
    }
    if (!r.ok()) problem(r.status() ? r.status() : exit_status::kDivergence, r.error());
    for (const auto& line : r.records()) report.records.push_back(line);
  }

  if (!segments) {
    auto task = make_shard_task(m.kind());
    std::vector<std::vector<std::string>> records;
    for (const auto& r : results) records.emplace_back(r ? std::vector<std::string>(r->records().begin(), r->records().end())
                                                         : std::vector<std::string>{});
    if (!task) problem(exit_status::kUsage, fmt::format("this deja has no sharded task '{}'", m.kind()));
    else if (report.problems.empty()) {
      const std::vector<std::string> args(m.shard_args().begin(), m.shard_args().end());
      report.status = task->merge(args, records);
    }
    report.summary = fmt::format("{}: {} shards, {} problems", m.kind(), report.items, report.problems.size());
    return report;
  }

  // The chain: where each segment starts is where the one before it ended, with the same state digest, which is
  // the checkpoint's; each segment's trace hash chain starts from the value the one before computed for that chunk.
  auto header_link = [&]() -> std::optional<segments::ChainLink> {
    StateSha sha{};
    std::copy(m.trace().sha256().begin(), m.trace().sha256().end(), sha.begin());
    auto path = m.trace().sha256().size() == 32 ? store_find(m.store(), sha, m.trace().path(), "trace")
                                                : Result<std::string>(m.trace().path());
    if (!path) return std::nullopt;
    auto reader = TraceReader::open(*path);
    if (!reader) return std::nullopt;
    auto point = (*reader)->chain_point(0);
    if (!point) return std::nullopt;
    segments::ChainLink l;
    l.set_chunk(point->chunk);
    l.set_first_event(point->first_event);
    l.set_chain_before(std::string(point->chain_before.begin(), point->chain_before.end()));
    return l;
  }();
  uint64_t events = 0;
  for (uint32_t i = 0; i < report.items; ++i) {
    if (!results[i] || !results[i]->ok()) continue;
    const segments::ItemResult& r = *results[i];
    const segments::Segment& s = m.segments(int(i));
    events += r.events();
    if (i == 0) {
      if (!header_link || !same(r.chain_start(), *header_link)) {
        problem(exit_status::kTraceEnded, "segment 0 did not start from the trace header's hash chain value");
      }
    }
    if (s.start_checkpoint() != 0) {
      const auto& c = *std::find_if(m.checkpoints().begin(), m.checkpoints().end(),
                                    [&](const auto& c) { return c.number() == s.start_checkpoint(); });
      if (!same(r.start(), c.at()) || r.start_digest() != c.digest()) {
        problem(exit_status::kDivergence,
                fmt::format("segment {} started at {} with digest {}, not at checkpoint {}'s {} with digest {}", i,
                            describe(r.start()), short_hex(r.start_digest()), c.number(), describe(c.at()),
                            short_hex(c.digest())));
      }
    }
    if (i + 1 < report.items) {
      if (!results[i + 1] || !results[i + 1]->ok()) continue;
      const segments::ItemResult& next = *results[i + 1];
      if (!same(r.end(), next.start()) || r.end_digest() != next.start_digest() || r.end_digest().size() != 32) {
        problem(exit_status::kDivergence,
                fmt::format("segments {} and {} do not chain: segment {} ended at {} with state digest {}, segment {} "
                            "started at {} with {}",
                            i, i + 1, i, describe(r.end()), short_hex(r.end_digest()), i + 1, describe(next.start()),
                            short_hex(next.start_digest())));
      }
      if (!same(r.chain_next(), next.chain_start())) {
        problem(exit_status::kTraceEnded,
                fmt::format("segments {} and {} do not chain over the trace: segment {} computed {} before chunk {}, "
                            "segment {} started from {} before chunk {} (the trace was altered there)",
                            i, i + 1, i, short_hex(r.chain_next().chain_before()), r.chain_next().chunk(), i + 1,
                            short_hex(next.chain_start().chain_before()), next.chain_start().chunk()));
      }
    } else if (!r.reached_end() || !r.trace_complete()) {
      problem(exit_status::kTraceEnded,
              fmt::format("segment {} did not check the recording's End and the trace's footer", i));
    }
  }
  const std::string& trace = m.trace().path();
  if (report.problems.empty()) {
    const segments::ItemResult& last = *results.back();
    report.summary = fmt::format(
        "OK: {} replayed in {} segments ({} events, task {}): every event exact; state digests chain from the "
        "recording's start through {} checkpoints to its End (guest exit status {}); the trace's hash chain checked "
        "from its header to its trailer",
        trace, report.items, events, report.task, report.items - 1, last.exit_status());
  } else {
    report.summary = fmt::format("FAILED: {}: {} of {} segments did not replay or chain", trace,
                                 report.problems.size(), report.items);
  }
  return report;
}

int print_merge(const MergeReport& report, const LoadedManifest& loaded, bool json) {
  if (loaded.manifest.kind() == "segments" && report.problems.empty()) {
    if (auto task = make_segment_task(report.task)) (*task)->print(report.records, json);
  }
  for (const auto& p : report.problems) say("{}", p);
  // A single segment's query prints what the sequential command always printed; anything cut in segments says how
  // the segments chained.
  if (loaded.manifest.kind() == "segments" && (report.task == "verify" || report.items > 1 || report.status != 0)) {
    say("{}", report.summary);
  }
  return report.status;
}

}  // namespace deja
