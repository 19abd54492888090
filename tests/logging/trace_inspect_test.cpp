// inspect_trace output: provenance, duration, counts, serial output, timeline, JSON validity, truncated traces.
#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>

#include "logging/trace_inspect.h"
#include "trace_test_support.h"

namespace deja {
namespace {

using testing::capture;
using testing::TempDir;

std::string expected_serial(const std::vector<trace::Event>& events, size_t limit = SIZE_MAX) {
  std::string serial;
  for (size_t i = 0; i < events.size() && i < limit; ++i)
    if (events[i].has_serial_output()) serial += events[i].serial_output().data();
  return serial;
}

size_t count_lines_starting_with_index(const std::string& text) {
  size_t lines = 0, pos = 0;
  while ((pos = text.find('\n', pos)) != std::string::npos) {
    ++pos;
    size_t digits = text.find_first_not_of(' ', pos);
    if (digits != std::string::npos && std::isdigit(static_cast<unsigned char>(text[digits]))) ++lines;
  }
  return lines;
}

TEST(TraceInspect, TextShowsProvenanceDurationCountsSerialAndTimeline) {
  TempDir dir;
  std::string path = dir.file("t.trace");
  auto events = testing::sample_events(100);
  testing::write_trace(path, events);
  std::string text = capture(path, InspectOptions{.events = true, .serial = true});
  for (const char* want : {"status       complete", "deja 0.1.0 (build test-build-1234)", "Linux testhost",
                           "2025-11-29T", "machine      pc backend=interp vcpus=1 memory=256 MiB progress=exact",
                           "image guests/hello.elf (12345 bytes) sha256=abababab", "10000 instructions, 1000 branches",
                           "wall time 1.500 s", "exit status 0 (guest wrote SUCCESS and halted)", "100 total",
                           "port_read        11", "end              1"})
    EXPECT_NE(text.find(want), std::string::npos) << "missing \"" << want << "\" in:\n" << text;
  EXPECT_NE(text.find(expected_serial(events)), std::string::npos);
  EXPECT_EQ(count_lines_starting_with_index(text), events.size());
  EXPECT_NE(text.find("        99 end cpu"), std::string::npos);
  std::string brief = capture(path, InspectOptions{});
  EXPECT_EQ(brief.find("timeline"), std::string::npos);
  EXPECT_EQ(brief.find("--- serial"), std::string::npos);
}

TEST(TraceInspect, JsonIsValidAndCarriesTheSameFacts) {
  TempDir dir;
  std::string path = dir.file("t.trace");
  auto events = testing::sample_events(50);
  events[8].mutable_serial_output()->set_data("caf\xc3\xa9 \"quoted\"\n\x01");
  testing::write_trace(path, events);
  std::string json = capture(path, InspectOptions{.events = true, .serial = true, .json = true});
  google::protobuf::Struct parsed;
  auto status = google::protobuf::util::JsonStringToMessage(json, &parsed);
  ASSERT_TRUE(status.ok()) << status.ToString() << "\n" << json;
  const auto& f = parsed.fields();
  EXPECT_EQ(f.at("status").string_value(), "complete");
  EXPECT_EQ(f.at("total_events").number_value(), 50);
  EXPECT_EQ(f.at("events").list_value().values_size(), 50);
  EXPECT_EQ(f.at("events_by_kind").struct_value().fields().at("end").number_value(), 1);
  EXPECT_EQ(f.at("header").struct_value().fields().at("build_id").string_value(), "test-build-1234");
  EXPECT_EQ(f.at("inputs").list_value().values(0).struct_value().fields().at("sha256").string_value(),
            hex(std::string(32, '\xab')));
  EXPECT_EQ(f.at("duration").struct_value().fields().at("instructions").number_value(), 5000);
  std::string serial = f.at("serial").string_value();
  EXPECT_NE(serial.find("\"quoted\"\n\x01"), std::string::npos);
  EXPECT_EQ(serial, expected_serial(events));  // valid UTF-8 (é) comes out as it went in (issue 11, item 14)
}

TEST(TraceInspect, TruncatedTraceIsDescribedUpToItsEnd) {
  TempDir dir;
  std::string path = dir.file("t.trace");
  auto events = testing::sample_events(200);
  trace::Footer footer = testing::write_trace(path, events, 300);
  ASSERT_GE(footer.chunks_size(), 3);
  std::string cut = dir.file("cut.trace");
  const trace::ChunkIndex& chunk = footer.chunks(2);
  testing::write_bytes(cut, testing::read_bytes(path).substr(0, chunk.offset() + 20));
  std::string text = capture(cut, InspectOptions{.events = true, .serial = true});
  EXPECT_NE(text.find("TRUNCATED: trace ends after chunk 1"), std::string::npos) << text;
  EXPECT_NE(text.find(fmt::format("(event {})", chunk.first_event())), std::string::npos) << text;
  EXPECT_NE(text.find("at least"), std::string::npos) << text;
  EXPECT_EQ(count_lines_starting_with_index(text), chunk.first_event());
  EXPECT_NE(text.find(expected_serial(events, chunk.first_event())), std::string::npos);
  EXPECT_NE(text.find("(trace ends early)"), std::string::npos);
}

TEST(TraceInspect, CorruptTraceIsDescribedThenReported) {
  TempDir dir;
  std::string path = dir.file("t.trace");
  trace::Footer footer = testing::write_trace(path, testing::sample_events(200), 300);
  std::string bytes = testing::read_bytes(path);
  bytes[footer.chunks(1).offset() + 60] ^= 1;
  testing::write_bytes(path, bytes);
  Result<> result;
  std::string text = capture(path, InspectOptions{.events = true}, &result);
  ASSERT_FALSE(result.has_value());
  EXPECT_EQ(result.error().kind, ErrorKind::kBadTrace);
  EXPECT_NE(text.find("CORRUPT"), std::string::npos) << text;
  EXPECT_EQ(count_lines_starting_with_index(text), footer.chunks(1).first_event());
}

TEST(TraceInspect, NotATraceFailsWithoutOutput) {
  TempDir dir;
  testing::write_bytes(dir.file("x"), "hello");
  Result<> result;
  std::string text = capture(dir.file("x"), InspectOptions{}, &result);
  ASSERT_FALSE(result.has_value());
  EXPECT_NE(result.error().message.find("not a deja trace"), std::string::npos);
  EXPECT_TRUE(text.empty());
}

}  // namespace
}  // namespace deja
