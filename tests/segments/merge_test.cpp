// deja merge: segments that chain pass; every way of not chaining (state, position, trace hash, End) is named; shards plug in.
#include <gtest/gtest.h>

#include <filesystem>

#include "../logging/trace_test_support.h"
#include "segments/merge.h"
#include "segments/segment_run.h"
#include "segments/tasks.h"

namespace deja {
namespace {

std::string sha(char c) { return std::string(32, c); }

segments::Position position(uint64_t n) {
  segments::Position p;
  p.set_steps(n * 10);
  p.set_events(n);
  p.set_instructions(n * 9);
  return p;
}

segments::ChainLink link(uint64_t chunk, uint64_t first_event, const std::string& value) {
  segments::ChainLink l;
  l.set_chunk(chunk);
  l.set_first_event(first_event);
  l.set_chain_before(value);
  return l;
}

class MergeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    trace_ = dir_.file("t.trace");
    std::filesystem::remove(trace_);  // SetUp() again in a test starts over
    results_.clear();
    loaded_ = {};
    testing::write_trace(trace_, testing::sample_events(50), 300);
    auto reader = TraceReader::open(trace_);
    ASSERT_TRUE(reader.has_value());
    const auto start = (*reader)->chain_point(0);
    header_chain_ = std::string(start->chain_before.begin(), start->chain_before.end());
    segments::Manifest& m = loaded_.manifest;
    m.set_version(kManifestVersion);
    m.set_kind("segments");
    m.set_task("verify");
    m.set_workdir(dir_.file("work"));
    m.mutable_trace()->set_path(trace_);
    for (uint64_t n : {1, 2}) {
      auto* c = m.add_checkpoints();
      c->set_number(n);
      *c->mutable_at() = position(n * 100);
      c->set_digest(sha(char('0' + n)));
    }
    for (uint32_t i = 0; i < 3; ++i) {
      auto* s = m.add_segments();
      s->set_index(i);
      s->set_start_checkpoint(i);
      s->set_end_checkpoint(i == 2 ? 0 : i + 1);
    }
    loaded_.sha256[0] = 1;
    for (uint32_t i = 0; i < 3; ++i) {
      segments::ItemResult r;
      r.set_index(i);
      r.set_manifest_sha256(std::string(loaded_.sha256.begin(), loaded_.sha256.end()));
      r.set_task("verify");
      r.set_ok(true);
      *r.mutable_start() = position(i * 100);
      if (i > 0) r.set_start_digest(sha(char('0' + i)));
      *r.mutable_chain_start() = i == 0 ? link(0, 0, header_chain_) : link(i * 3, i * 20, sha(char('a' + i)));
      if (i < 2) {
        *r.mutable_end() = position((i + 1) * 100);
        r.set_end_digest(sha(char('0' + i + 1)));
        *r.mutable_chain_next() = link((i + 1) * 3, (i + 1) * 20, sha(char('a' + i + 1)));
      } else {
        r.set_reached_end(true);
        r.set_trace_complete(true);
      }
      results_.push_back(r);
    }
  }
  MergeReport merge() {
    std::vector<std::optional<segments::ItemResult>> results(results_.begin(), results_.end());
    return merge_results(loaded_, results, {});
  }
  void expect_problem(const std::string& what) {
    MergeReport report = merge();
    ASSERT_NE(report.status, 0) << what;
    ASSERT_FALSE(report.problems.empty());
    EXPECT_NE(report.problems.front().find(what), std::string::npos) << report.problems.front();
  }

  testing::TempDir dir_;
  std::string trace_, header_chain_;
  LoadedManifest loaded_;
  std::vector<segments::ItemResult> results_;
};

TEST_F(MergeTest, SegmentsThatChainProveTheWholeTrace) {
  MergeReport report = merge();
  EXPECT_EQ(report.status, 0) << (report.problems.empty() ? "" : report.problems.front());
  EXPECT_NE(report.summary.find("OK"), std::string::npos);
}

TEST_F(MergeTest, AStateDigestThatDoesNotChainNamesBothSegments) {
  results_[1].set_end_digest(sha('x'));
  expect_problem("segments 1 and 2 do not chain");
}

TEST_F(MergeTest, AStartOtherThanTheCheckpointIsNamed) {
  *results_[2].mutable_start() = position(201);
  *results_[1].mutable_end() = position(201);
  expect_problem("segment 2 started at");
}

TEST_F(MergeTest, ATraceHashChainThatDoesNotLinkIsNamed) {
  results_[1].mutable_chain_start()->set_chain_before(sha('z'));
  expect_problem("segments 0 and 1 do not chain over the trace");
  SetUp();
  results_[0].mutable_chain_start()->set_chain_before(sha('z'));
  expect_problem("segment 0 did not start from the trace header");
}

TEST_F(MergeTest, MissingFailedOrEndlessSegmentsAreNamed) {
  std::vector<std::optional<segments::ItemResult>> results(results_.begin(), results_.end());
  results[1].reset();
  MergeReport report = merge_results(loaded_, results, {"", "no such file", ""});
  ASSERT_NE(report.status, 0);
  EXPECT_NE(report.problems.front().find("segment 1 (from checkpoint 1"), std::string::npos) << report.problems.front();
  EXPECT_NE(report.problems.front().find("has no result"), std::string::npos);
  results_[1].set_ok(false);
  results_[1].set_status(6);
  results_[1].set_error("segment 1 (from checkpoint 1 to checkpoint 2): replay diverged at event 7");
  MergeReport failed = merge();
  EXPECT_EQ(failed.status, 6);
  EXPECT_NE(failed.problems.front().find("replay diverged"), std::string::npos);
  SetUp();
  results_[2].set_trace_complete(false);
  expect_problem("segment 2 did not check the recording's End");
}

// A sharded campaign (what `deja explore --shard I/N` plugs in as): every shard runs, the task's merge sums them up.
class CountingShards : public ShardTask {
 public:
  Result<int> run_shard(std::span<const std::string> args, uint32_t index, uint32_t count,
                        std::vector<std::string>& records) override {
    records.push_back(fmt::format("{{\"shard\": {}, \"of\": {}, \"args\": {}}}", index, count, args.size()));
    return 0;
  }
  int merge(std::span<const std::string>, const std::vector<std::vector<std::string>>& records) override {
    merged_shards = records.size();
    return 0;
  }
  static inline size_t merged_shards = 0;
};

TEST(ShardTasks, ACampaignRunsShardByShardAndMergesThroughItsTask) {
  register_shard_task("test-campaign", [] { return std::make_unique<CountingShards>(); });
  auto m = plan_shards("test-campaign", {"--seeds", "0..99"}, 4, "/tmp/unused");
  ASSERT_TRUE(m.has_value());
  LoadedManifest loaded{*m, {}, ""};
  std::vector<std::optional<segments::ItemResult>> results;
  for (uint32_t i = 0; i < item_count(*m); ++i) {
    results.push_back(run_item(loaded, i, {}));
    ASSERT_TRUE(results.back()->ok()) << results.back()->error();
    EXPECT_EQ(results.back()->records_size(), 1);
  }
  MergeReport report = merge_results(loaded, results, {});
  EXPECT_EQ(report.status, 0);
  EXPECT_EQ(CountingShards::merged_shards, 4u);
  EXPECT_EQ(report.records.size(), 4u);
  EXPECT_FALSE(plan_shards("no-such-campaign", {}, 2, "/tmp/unused").has_value());
}

}  // namespace
}  // namespace deja
