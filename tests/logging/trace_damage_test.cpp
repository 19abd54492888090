// Damaged traces: truncation at every byte, flipped bytes in every region, swapped/dropped chunks, bad files.
#include <algorithm>
#include <cstring>
#include <functional>
#include <set>

#include "logging/trace_format.h"
#include "logging/trace_verify.h"
#include "trace_test_support.h"

namespace deja {
namespace {

using testing::TempDir;

// A small multi-chunk trace so exhaustive byte-level tests stay fast.
struct SmallTrace {
  TempDir dir;
  std::string path = dir.file("small.trace");
  std::vector<trace::Event> events = testing::sample_events(60);
  trace::Footer footer = testing::write_trace(path, events, 150);
  std::string bytes = testing::read_bytes(path);
  // The trailer holds the footer frame offset.
  uint64_t trailer_footer_offset() const {
    return trace_detail::get_u64(reinterpret_cast<const uint8_t*>(bytes.data()) + bytes.size() - kTrailerBytes + 8);
  }
};

// What part of the file a byte offset belongs to, for failure messages.
std::string region_of(const SmallTrace& t, uint64_t offset) {
  uint64_t footer = t.trailer_footer_offset();
  if (offset < 8) return "file magic";
  if (offset < 12) return "format version";
  if (offset < 16) return "header length";
  if (t.footer.chunks_size() > 0 && offset < t.footer.chunks(0).offset()) return "header or header SHA-256";
  if (offset >= t.bytes.size() - kTrailerBytes) return "trailer";
  if (offset >= footer) return offset < footer + kFrameHeaderBytes ? "footer frame header" : "footer payload";
  for (int i = t.footer.chunks_size() - 1; i >= 0; --i) {
    uint64_t start = t.footer.chunks(i).offset();
    if (offset >= start)
      return fmt::format("chunk {} {}", i, offset < start + kFrameHeaderBytes ? "frame header" : "payload");
  }
  return "?";
}

TEST(TraceTruncation, EveryByteOffsetGivesErrorOrValidPrefix) {
  SmallTrace t;
  ASSERT_GE(t.footer.chunks_size(), 4);
  std::string cut = t.dir.file("cut.trace");
  for (size_t length = 0; length < t.bytes.size(); ++length) {
    testing::write_bytes(cut, t.bytes.substr(0, length));
    testing::ReadOutcome out = testing::read_all(cut);
    if (out.error) {
      // Only a file cut inside its preamble/header may fail; after the header, truncation is never an error.
      EXPECT_LT(length, t.footer.chunks(0).offset()) << "length " << length << ": " << out.message;
      continue;
    }
    EXPECT_TRUE(out.truncated) << "length " << length;
    EXPECT_FALSE(out.complete) << "length " << length;
    ASSERT_LE(out.events.size(), t.events.size());
    for (size_t i = 0; i < out.events.size(); ++i)
      ASSERT_TRUE(testing::same_event(out.events[i], t.events[i])) << "length " << length << " event " << i;
    EXPECT_FALSE(verify_trace(cut).ok) << "length " << length;
  }
  testing::write_bytes(cut, t.bytes);
  EXPECT_TRUE(testing::read_all(cut).complete);
}

TEST(TraceTruncation, AtEachChunkBoundaryYieldsExactPrefix) {
  SmallTrace t;
  std::string cut = t.dir.file("cut.trace");
  std::vector<std::pair<uint64_t, uint64_t>> boundaries;  // (file length, events before it)
  for (const auto& chunk : t.footer.chunks()) boundaries.emplace_back(chunk.offset(), chunk.first_event());
  boundaries.emplace_back(t.trailer_footer_offset(), t.events.size());
  for (auto [length, events] : boundaries) {
    testing::write_bytes(cut, t.bytes.substr(0, length));
    auto reader = TraceReader::open(cut);
    ASSERT_TRUE(reader.has_value()) << reader.error().message;
    uint64_t n = 0;
    while (true) {
      auto e = (*reader)->next();
      ASSERT_TRUE(e.has_value()) << "cut at " << length << ": " << e.error().message;
      if (!*e) break;
      ++n;
    }
    EXPECT_EQ(n, events) << "cut at " << length;
    EXPECT_EQ((*reader)->events_read(), events);
    EXPECT_TRUE((*reader)->truncated());
    EXPECT_FALSE((*reader)->complete());
    EXPECT_EQ((*reader)->valid_bytes(), length);
    std::string why = (*reader)->end_description();
    EXPECT_NE(why.find(fmt::format("(event {}) at byte {}", events, length)), std::string::npos) << why;
    EXPECT_NE(why.find("recording was interrupted"), std::string::npos) << why;
  }
}

TEST(TraceCorruption, FlippedByteInEveryRegionIsDetected) {
  SmallTrace t;
  std::string bad = t.dir.file("bad.trace");
  std::set<std::string> regions;
  for (size_t offset = 0; offset < t.bytes.size(); ++offset) {
    std::string damaged = t.bytes;
    damaged[offset] = static_cast<char>(damaged[offset] ^ (1 << (offset % 8)));
    testing::write_bytes(bad, damaged);
    std::string region = region_of(t, offset);
    regions.insert(region);
    VerifyReport report = verify_trace(bad);
    EXPECT_FALSE(report.ok) << "flip at " << offset << " (" << region << ") not detected by verify";
    EXPECT_FALSE(report.first_problem.empty());
    testing::ReadOutcome out = testing::read_all(bad);
    EXPECT_TRUE(out.error) << "flip at " << offset << " (" << region << ") not detected by the reader: " << out.message;
    for (size_t i = 0; i < out.events.size(); ++i)
      ASSERT_TRUE(testing::same_event(out.events[i], t.events[i])) << "flip at " << offset << " leaked a bad event";
  }
  // Make sure the loop really covered every region named in the brief.
  for (const char* r : {"file magic", "format version", "header length", "header or", "trailer", "footer frame",
                        "footer payload", "chunk 0", "chunk 3"})
    EXPECT_TRUE(std::any_of(regions.begin(), regions.end(), [&](const std::string& s) { return s.starts_with(r); }))
        << r;
}

TEST(TraceCorruption, CorruptChunkErrorNamesChunkOffsetAndCheck) {
  SmallTrace t;
  std::string bad = t.dir.file("bad.trace");
  const trace::ChunkIndex& chunk = t.footer.chunks(2);
  std::string damaged = t.bytes;
  damaged[chunk.offset() + kFrameHeaderBytes + 3] ^= 0x40;
  testing::write_bytes(bad, damaged);
  testing::ReadOutcome out = testing::read_all(bad);
  ASSERT_TRUE(out.error);
  EXPECT_EQ(out.events.size(), chunk.first_event());
  EXPECT_NE(out.message.find(fmt::format("chunk 2 (byte {}", chunk.offset())), std::string::npos) << out.message;
  EXPECT_NE(out.message.find("hash chain"), std::string::npos) << out.message;
}

std::string without_range(const std::string& s, size_t from, size_t to) { return s.substr(0, from) + s.substr(to); }

TEST(TraceChain, SwappedChunksAreDetected) {
  SmallTrace t;
  std::string bad = t.dir.file("bad.trace");
  uint64_t a = t.footer.chunks(1).offset(), b = t.footer.chunks(2).offset(), c = t.footer.chunks(3).offset();
  std::string swapped = t.bytes.substr(0, a) + t.bytes.substr(b, c - b) + t.bytes.substr(a, b - a) + t.bytes.substr(c);
  ASSERT_EQ(swapped.size(), t.bytes.size());
  testing::write_bytes(bad, swapped);
  VerifyReport report = verify_trace(bad);
  EXPECT_FALSE(report.ok);
  EXPECT_NE(report.first_problem.find("hash chain"), std::string::npos) << report.first_problem;
  EXPECT_EQ(report.chunks, 1u);
  testing::ReadOutcome out = testing::read_all(bad);
  EXPECT_TRUE(out.error);
  EXPECT_EQ(out.events.size(), t.footer.chunks(1).first_event());
}

TEST(TraceChain, DroppedChunkIsDetected) {
  SmallTrace t;
  std::string bad = t.dir.file("bad.trace");
  for (int i : {0, 2, t.footer.chunks_size() - 1}) {
    uint64_t from = t.footer.chunks(i).offset();
    uint64_t to = i + 1 < t.footer.chunks_size() ? t.footer.chunks(i + 1).offset() : t.trailer_footer_offset();
    testing::write_bytes(bad, without_range(t.bytes, from, to));
    VerifyReport report = verify_trace(bad);
    EXPECT_FALSE(report.ok) << "dropping chunk " << i;
    EXPECT_TRUE(testing::read_all(bad).error) << "dropping chunk " << i;
  }
}

TEST(TraceChain, DuplicatedChunkIsDetected) {
  SmallTrace t;
  std::string bad = t.dir.file("bad.trace");
  uint64_t from = t.footer.chunks(1).offset(), to = t.footer.chunks(2).offset();
  std::string doubled = t.bytes.substr(0, to) + t.bytes.substr(from, to - from) + t.bytes.substr(to);
  testing::write_bytes(bad, doubled);
  EXPECT_FALSE(verify_trace(bad).ok);
  EXPECT_TRUE(testing::read_all(bad).error);
}

TEST(TraceChain, ChunkFromAnotherRecordingIsDetected) {
  // Same header, different events: a chunk transplanted between recordings breaks the chain.
  SmallTrace t;
  std::string other = t.dir.file("other.trace");
  auto other_footer = testing::write_trace(other, testing::sample_events(60, 99), 150);
  std::string other_bytes = testing::read_bytes(other);
  uint64_t a = t.footer.chunks(1).offset(), b = t.footer.chunks(2).offset();
  uint64_t oa = other_footer.chunks(1).offset(), ob = other_footer.chunks(2).offset();
  std::string mixed = t.bytes.substr(0, a) + other_bytes.substr(oa, ob - oa) + t.bytes.substr(b);
  std::string bad = t.dir.file("bad.trace");
  testing::write_bytes(bad, mixed);
  EXPECT_FALSE(verify_trace(bad).ok);
}

// Rewrites the footer with a consistent chain and trailer, as a buggy writer (or a tamperer who recomputes the
// chain) would: only the index cross-checks can catch it.
std::string with_rechained_footer(const SmallTrace& t, const std::function<void(trace::Footer&)>& edit) {
  using namespace trace_detail;
  const uint8_t* base = reinterpret_cast<const uint8_t*>(t.bytes.data());
  uint64_t footer_at = t.trailer_footer_offset();
  uint32_t stored = get_u32(base + footer_at + 4);
  trace::Footer footer;
  EXPECT_TRUE(footer.ParseFromArray(base + footer_at + kFrameHeaderBytes, static_cast<int>(stored)));
  edit(footer);
  std::string payload = footer.SerializeAsString();
  const trace::ChunkIndex& last = t.footer.chunks(t.footer.chunks_size() - 1);
  Sha256 previous;
  std::memcpy(previous.data(), base + last.offset() + kFrameFieldBytes, 32);
  uint8_t frame[kFrameHeaderBytes];
  std::memcpy(frame, base + footer_at, kFrameFieldBytes);
  put_u32(frame + 4, static_cast<uint32_t>(payload.size()));
  put_u32(frame + 8, static_cast<uint32_t>(payload.size()));
  Sha256 chain = chain_next(previous, std::span(frame, kFrameFieldBytes),
                            std::span(reinterpret_cast<const uint8_t*>(payload.data()), payload.size()));
  std::memcpy(frame + kFrameFieldBytes, chain.data(), 32);
  uint8_t trailer[kTrailerBytes];
  std::memcpy(trailer, kTrailerMagic.data(), 8);
  put_u64(trailer + 8, footer_at);
  std::memcpy(trailer + 16, chain.data(), 32);
  return t.bytes.substr(0, footer_at) + std::string(reinterpret_cast<char*>(frame), sizeof frame) + payload +
         std::string(reinterpret_cast<char*>(trailer), sizeof trailer);
}

TEST(TraceIndex, RechainedFooterThatDisagreesWithChunksIsDetected) {
  SmallTrace t;
  std::string path = t.dir.file("tampered.trace");
  // Control: an unedited rewrite must still verify, so the failures below come from the edits alone.
  testing::write_bytes(path, with_rechained_footer(t, [](trace::Footer&) {}));
  ASSERT_TRUE(verify_trace(path).ok) << verify_trace(path).first_problem;
  struct Case {
    const char* name;
    std::function<void(trace::Footer&)> edit;
    const char* expect;
  };
  std::vector<Case> cases = {
      {"total", [](trace::Footer& f) { f.set_total_events(f.total_events() + 1); }, "footer says"},
      {"offset", [](trace::Footer& f) { f.mutable_chunks(1)->set_offset(f.chunks(1).offset() + 1); }, "index entry 1"},
      {"count", [](trace::Footer& f) { f.mutable_chunks(2)->set_events(f.chunks(2).events() + 1); }, "index entry 2"},
      {"first_at", [](trace::Footer& f) { f.mutable_chunks(0)->mutable_first_at()->set_rip(1); }, "first coordinate"},
      {"dropped entry", [](trace::Footer& f) { f.mutable_chunks()->RemoveLast(); }, "lists"},
      {"kinds", [](trace::Footer& f) { (*f.mutable_events_by_kind())["end"] = 2; }, "events_by_kind"},
      {"serial", [](trace::Footer& f) { f.set_serial_output_bytes(1); }, "serial output"},
  };
  for (const Case& c : cases) {
    testing::write_bytes(path, with_rechained_footer(t, c.edit));
    VerifyReport report = verify_trace(path);
    EXPECT_FALSE(report.ok) << c.name;
    EXPECT_NE(report.first_problem.find(c.expect), std::string::npos) << c.name << ": " << report.first_problem;
    EXPECT_NE(report.first_problem.find("at the footer"), std::string::npos) << c.name << ": " << report.first_problem;
  }
}

TEST(TraceIndex, ReadIndexSeeksToTheFooter) {
  SmallTrace t;
  auto reader = TraceReader::open(t.path);
  ASSERT_TRUE(reader.has_value());
  auto index = (*reader)->read_index();
  ASSERT_TRUE(index.has_value()) << index.error().message;
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(*index, t.footer));
  EXPECT_EQ((*reader)->events_read(), 0u);  // seeking did not consume the stream
  std::string cut = t.dir.file("cut.trace");
  testing::write_bytes(cut, t.bytes.substr(0, t.bytes.size() - 1));
  auto cut_reader = TraceReader::open(cut);
  ASSERT_TRUE(cut_reader.has_value());
  auto missing = (*cut_reader)->read_index();
  ASSERT_FALSE(missing.has_value());
  EXPECT_NE(missing.error().message.find("no trailer"), std::string::npos) << missing.error().message;
}

TEST(TraceOpen, EmptyFileIsAClearError) {
  TempDir dir;
  testing::write_bytes(dir.file("empty"), "");
  auto reader = TraceReader::open(dir.file("empty"));
  ASSERT_FALSE(reader.has_value());
  EXPECT_EQ(reader.error().kind, ErrorKind::kBadTrace);
  EXPECT_NE(reader.error().message.find("is empty"), std::string::npos) << reader.error().message;
  EXPECT_NE(reader.error().message.find(dir.file("empty")), std::string::npos);
  VerifyReport report = verify_trace(dir.file("empty"));
  EXPECT_FALSE(report.ok);
  EXPECT_NE(report.first_problem.find("is empty"), std::string::npos);
}

TEST(TraceOpen, NotATraceIsAClearError) {
  TempDir dir;
  testing::write_bytes(dir.file("notes.txt"), "these are not the bytes you are looking for\n");
  auto reader = TraceReader::open(dir.file("notes.txt"));
  ASSERT_FALSE(reader.has_value());
  EXPECT_NE(reader.error().message.find("is not a deja trace"), std::string::npos) << reader.error().message;
  auto missing = TraceReader::open(dir.file("missing.trace"));
  ASSERT_FALSE(missing.has_value());
  EXPECT_EQ(missing.error().kind, ErrorKind::kHost);
  EXPECT_NE(missing.error().message.find("missing.trace"), std::string::npos);
}

TEST(TraceOpen, WrongVersionSaysNewerOrOlder) {
  SmallTrace t;
  std::string bad = t.dir.file("v.trace");
  std::string newer = t.bytes;
  newer[8] = 7;
  testing::write_bytes(bad, newer);
  auto reader = TraceReader::open(bad);
  ASSERT_FALSE(reader.has_value());
  EXPECT_NE(reader.error().message.find("trace format version 7"), std::string::npos) << reader.error().message;
  EXPECT_NE(reader.error().message.find(fmt::format("is newer than this deja ({})", kTraceFormatVersion)),
            std::string::npos)
      << reader.error().message;
  std::string older = t.bytes;
  older[8] = 0;
  testing::write_bytes(bad, older);
  reader = TraceReader::open(bad);
  ASSERT_FALSE(reader.has_value());
  EXPECT_NE(reader.error().message.find(fmt::format("older than this deja reads (1 to {})", kTraceFormatVersion)),
            std::string::npos)
      << reader.error().message;
  // Version 1 is still read; a preamble that says 1 over a header that says 3 is a mismatch, not an old trace.
  std::string relabelled = t.bytes;
  relabelled[8] = 1;
  testing::write_bytes(bad, relabelled);
  reader = TraceReader::open(bad);
  ASSERT_FALSE(reader.has_value());
  EXPECT_EQ(reader.error().message.find("older than this deja"), std::string::npos) << reader.error().message;
}

TEST(TraceOpen, CutInsideHeaderIsAnErrorNamingTheCut) {
  SmallTrace t;
  std::string cut = t.dir.file("cut.trace");
  testing::write_bytes(cut, t.bytes.substr(0, 40));
  auto reader = TraceReader::open(cut);
  ASSERT_FALSE(reader.has_value());
  EXPECT_NE(reader.error().message.find("truncated inside its header"), std::string::npos) << reader.error().message;
}

TEST(TraceVerify, MalformedInputHashIsReported) {
  TempDir dir;
  trace::Header header = testing::sample_header();
  header.mutable_inputs(0)->set_sha256("short");
  auto writer = TraceWriter::create(dir.file("t.trace"), header);
  ASSERT_TRUE(writer.has_value());
  for (const auto& e : testing::sample_events(5)) ASSERT_TRUE((*writer)->append(e).has_value());
  ASSERT_TRUE((*writer)->finish(trace::Footer{}).has_value());
  VerifyReport report = verify_trace(dir.file("t.trace"));
  EXPECT_FALSE(report.ok);
  EXPECT_NE(report.first_problem.find("guests/hello.elf (image) has a 5-byte SHA-256"), std::string::npos)
      << report.first_problem;
}

TEST(TraceVerify, MissingOrMisplacedEndEventIsReported) {
  TempDir dir;
  auto events = testing::sample_events(40);
  std::vector<trace::Event> no_end(events.begin(), events.end() - 1);
  testing::write_trace(dir.file("noend.trace"), no_end);
  VerifyReport report = verify_trace(dir.file("noend.trace"));
  EXPECT_FALSE(report.ok);
  EXPECT_TRUE(report.complete);
  EXPECT_NE(report.first_problem.find("no End event"), std::string::npos) << report.first_problem;

  std::vector<trace::Event> end_first = events;
  std::rotate(end_first.begin(), end_first.end() - 1, end_first.end());
  testing::write_trace(dir.file("endfirst.trace"), end_first);
  report = verify_trace(dir.file("endfirst.trace"));
  EXPECT_FALSE(report.ok);
  EXPECT_NE(report.first_problem.find("event 0 is an End event but events follow"), std::string::npos)
      << report.first_problem;
}

}  // namespace
}  // namespace deja
