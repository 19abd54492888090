// A reader that starts part-way (segments): the same events from there, and hash-chain points that link to a full read's.
#include <fstream>

#include "logging/trace_format.h"
#include "trace_test_support.h"

namespace deja {
namespace {

using testing::TempDir;

TEST(TraceSegmentRead, StartsAtAnyEventWithTheChainValuesAFullReadComputes) {
  TempDir dir;
  const std::string path = dir.file("t.trace");
  auto events = testing::sample_events(2000);
  trace::Footer footer = testing::write_trace(path, events, 300);
  ASSERT_GT(footer.chunks_size(), 20);
  auto full = TraceReader::open(path);
  ASSERT_TRUE(full.has_value());
  while (true) {
    auto e = (*full)->next();
    ASSERT_TRUE(e.has_value());
    if (!*e) break;
  }
  ASSERT_TRUE((*full)->complete());
  for (uint64_t start : {uint64_t{0}, uint64_t{1}, uint64_t{299}, uint64_t{777}, footer.chunks(5).first_event(),
                         uint64_t{1999}}) {
    auto part = TraceReader::open(path);
    ASSERT_TRUE(part.has_value());
    ASSERT_TRUE((*part)->start_at_event(start).has_value()) << start;
    // Its start value is the full read's value before that chunk, and so is every later one it computes.
    auto mine = (*part)->chain_point(start);
    auto theirs = (*full)->chain_point(start);
    ASSERT_TRUE(mine && theirs) << start;
    EXPECT_EQ(mine->chunk, theirs->chunk);
    EXPECT_EQ(mine->first_event, theirs->first_event);
    EXPECT_EQ(mine->chain_before, theirs->chain_before);
    for (uint64_t i = start; i < events.size(); ++i) {
      auto e = (*part)->next();
      ASSERT_TRUE(e.has_value() && *e) << start << " " << i;
      ASSERT_TRUE(testing::same_event(**e, events[i])) << "event " << i;
    }
    auto end = (*part)->next();
    ASSERT_TRUE(end.has_value());
    EXPECT_FALSE(*end);
    EXPECT_TRUE((*part)->complete()) << (*part)->end_description();
    const uint64_t later = (start + events.size()) / 2;
    EXPECT_EQ((*part)->chain_point(later)->chain_before, (*full)->chain_point(later)->chain_before);
  }
}

TEST(TraceSegmentRead, AlteredChunkAfterTheStartIsCaughtAndTheStartValueIsWhatTheFileSays) {
  TempDir dir;
  const std::string path = dir.file("t.trace");
  trace::Footer footer = testing::write_trace(path, testing::sample_events(1500), 300);
  const uint64_t start = footer.chunks(4).first_event();
  std::string bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  // A byte in the payload of chunk 6: a reader from chunk 4 on finds the chain broken there.
  bytes[footer.chunks(6).offset() + kFrameHeaderBytes + 3] ^= 0x40;
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << bytes;
  }
  auto part = TraceReader::open(path);
  ASSERT_TRUE(part.has_value());
  ASSERT_TRUE((*part)->start_at_event(start).has_value());
  Result<std::optional<trace::Event>> e;
  do {
    e = (*part)->next();
  } while (e && *e);
  ASSERT_FALSE(e.has_value());
  EXPECT_NE(e.error().message.find("chunk 6"), std::string::npos) << e.error().message;
}

TEST(TraceSegmentRead, RefusesEventsPastTheEndAndAReaderThatHasRead) {
  TempDir dir;
  const std::string path = dir.file("t.trace");
  testing::write_trace(path, testing::sample_events(100), 300);
  auto r = TraceReader::open(path);
  ASSERT_TRUE(r.has_value());
  EXPECT_FALSE((*r)->start_at_event(100).has_value());
  auto r2 = TraceReader::open(path);
  ASSERT_TRUE((*r2)->next().has_value());
  EXPECT_FALSE((*r2)->start_at_event(5).has_value());
}

}  // namespace
}  // namespace deja
