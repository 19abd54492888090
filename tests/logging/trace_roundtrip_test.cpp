// Round trip, writer behaviour (chunking, flush, mode 0600, kill mid-way) and the shared helpers.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>

#include "logging/trace_format.h"
#include "logging/trace_verify.h"
#include "trace_test_support.h"

namespace deja {
namespace {

using testing::TempDir;

TEST(TraceRoundTrip, ManyEventsAcrossManySmallChunks) {
  TempDir dir;
  std::string path = dir.file("t.trace");
  auto events = testing::sample_events(3000);
  trace::Footer footer = testing::write_trace(path, events, 200);
  EXPECT_GT(footer.chunks_size(), 50);

  testing::ReadOutcome out = testing::read_all(path);
  ASSERT_FALSE(out.error) << out.message;
  EXPECT_TRUE(out.complete);
  EXPECT_FALSE(out.truncated);
  ASSERT_EQ(out.events.size(), events.size());
  for (size_t i = 0; i < events.size(); ++i)
    ASSERT_TRUE(testing::same_event(out.events[i], events[i])) << "event " << i;

  // The writer fills the index itself; every entry must agree with the chunk sizes it reports.
  EXPECT_EQ(footer.total_events(), events.size());
  uint64_t next_first = 0;
  uint64_t previous_offset = 0;
  for (const auto& chunk : footer.chunks()) {
    EXPECT_EQ(chunk.first_event(), next_first);
    EXPECT_GT(chunk.offset(), previous_offset);
    previous_offset = chunk.offset();
    next_first += chunk.events();
  }
  EXPECT_EQ(next_first, events.size());
  EXPECT_EQ(footer.events_by_kind().at("port_read"), 334u);
  EXPECT_EQ(footer.events_by_kind().at("end"), 1u);
  EXPECT_EQ(footer.exit_status(), 0);
  EXPECT_EQ(footer.wall_ns(), 1500000000u);

  VerifyReport report = verify_trace(path);
  EXPECT_TRUE(report.ok) << report.first_problem;
  EXPECT_TRUE(report.complete);
  EXPECT_EQ(report.events, events.size());
  EXPECT_EQ(report.chunks, static_cast<uint64_t>(footer.chunks_size()));
  EXPECT_NE(report.summary.find("OK"), std::string::npos);
}

TEST(TraceRoundTrip, HeaderSurvivesAndVersionIsStamped) {
  TempDir dir;
  std::string path = dir.file("t.trace");
  testing::write_trace(path, testing::sample_events(10));
  auto reader = TraceReader::open(path);
  ASSERT_TRUE(reader.has_value()) << reader.error().message;
  trace::Header expected = testing::sample_header();
  expected.set_format_version(kTraceFormatVersion);
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals((*reader)->header(), expected));
}

TEST(TraceRoundTrip, FooterRecordsSerialOutputAndFirstCoordinates) {
  TempDir dir;
  std::string path = dir.file("t.trace");
  auto events = testing::sample_events(400);
  trace::Footer footer = testing::write_trace(path, events, 300);
  std::string serial;
  for (const auto& e : events)
    if (e.has_serial_output()) serial += e.serial_output().data();
  EXPECT_EQ(footer.serial_output_bytes(), serial.size());
  auto digest = sha256_bytes(std::span(reinterpret_cast<const uint8_t*>(serial.data()), serial.size()));
  EXPECT_EQ(footer.serial_output_sha256(), std::string(digest.begin(), digest.end()));
  for (const auto& chunk : footer.chunks()) {
    const trace::Coordinate* want = nullptr;
    for (uint64_t i = chunk.first_event(); i < chunk.first_event() + chunk.events() && !want; ++i)
      want = event_coordinate(events[i]);
    ASSERT_EQ(chunk.has_first_at(), want != nullptr);
    if (want) {
      EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(chunk.first_at(), *want));
    }
  }
}

TEST(TraceWriter, ReplacesAnExistingTraceWithAMode0600FileOnlyWhenComplete) {
  TempDir dir;
  std::string path = dir.file("t.trace");
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT, 0644);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::write(fd, "old", 3), 3);
  ::fchmod(fd, 0644);
  ::close(fd);
  auto writer = TraceWriter::create_replacing(path, testing::sample_header());
  ASSERT_TRUE(writer.has_value()) << writer.error().message;
  EXPECT_EQ((*writer)->path(), TraceWriter::partial_path(path));
  for (const auto& e : testing::sample_events(5)) ASSERT_TRUE((*writer)->append(e).has_value());
  ASSERT_TRUE((*writer)->flush().has_value());
  EXPECT_EQ(testing::read_bytes(path), "old");  // untouched until the trace is complete
  ASSERT_TRUE((*writer)->finish(trace::Footer{}).has_value());
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u);
  EXPECT_NE(::access(TraceWriter::partial_path(path).c_str(), F_OK), 0);
}

TEST(TraceWriter, NeverOpensAnExistingFileASymlinkOrADevice) {
  TempDir dir;
  std::string path = dir.file("t.trace");
  testing::write_trace(path, testing::sample_events(5));
  auto again = TraceWriter::create(path, testing::sample_header());
  ASSERT_FALSE(again.has_value());
  EXPECT_NE(again.error().message.find("exists already"), std::string::npos);
  std::string link = dir.file("link.trace");
  ASSERT_EQ(::symlink(path.c_str(), link.c_str()), 0);
  for (const std::string& target : {link, std::string("/dev/null")}) {
    auto w = TraceWriter::create_replacing(target, testing::sample_header());
    ASSERT_FALSE(w.has_value()) << target;
    EXPECT_NE(w.error().message.find("refusing"), std::string::npos) << w.error().message;
  }
}

TEST(TraceWriter, RefusesAHeaderThatWouldNotParseBack) {
  TempDir dir;
  trace::Header h = testing::sample_header();
  h.mutable_config()->set_cmdline("n=\xff");
  auto w = TraceWriter::create(dir.file("t.trace"), h);
  ASSERT_FALSE(w.has_value());
  EXPECT_NE(w.error().message.find("UTF-8"), std::string::npos);
}

TEST(TraceWriter, CreateFailureNamesThePathAndReason) {
  auto writer = TraceWriter::create("/nonexistent-dir-deja/t.trace", testing::sample_header());
  ASSERT_FALSE(writer.has_value());
  EXPECT_EQ(writer.error().kind, ErrorKind::kHost);
  EXPECT_NE(writer.error().message.find("/nonexistent-dir-deja/t.trace"), std::string::npos);
  EXPECT_NE(writer.error().message.find("No such file"), std::string::npos);
}

TEST(TraceWriter, SealsChunksBySizeFlushAndInterval) {
  TempDir dir;
  auto writer = TraceWriter::create(dir.file("t.trace"), testing::sample_header());
  ASSERT_TRUE(writer.has_value());
  TraceWriter& w = **writer;
  auto events = testing::sample_events(100);
  // Default 64 KiB chunks: 50 small events stay buffered.
  for (int i = 0; i < 50; ++i) ASSERT_TRUE(w.append(events[i]).has_value());
  EXPECT_EQ(w.chunks_written(), 0u);
  EXPECT_EQ(w.events_written(), 50u);
  ASSERT_TRUE(w.flush().has_value());
  EXPECT_EQ(w.chunks_written(), 1u);
  ASSERT_TRUE(w.flush().has_value());  // nothing buffered: no empty chunk
  EXPECT_EQ(w.chunks_written(), 1u);
  w.set_flush_interval(std::chrono::nanoseconds(0));  // every append is "a second later"
  ASSERT_TRUE(w.append(events[50]).has_value());
  ASSERT_TRUE(w.append(events[51]).has_value());
  EXPECT_EQ(w.chunks_written(), 3u);
  w.set_flush_interval(std::chrono::hours(1));
  w.set_chunk_bytes(1);
  ASSERT_TRUE(w.append(events[52]).has_value());
  EXPECT_EQ(w.chunks_written(), 4u);
  ASSERT_TRUE(w.finish(trace::Footer{}).has_value());
  EXPECT_FALSE(w.append(events[53]).has_value());
  EXPECT_FALSE(w.finish(trace::Footer{}).has_value());
}

TEST(TraceWriter, CopyBeforeFinishReadsAsTruncatedPrefix) {
  TempDir dir;
  std::string path = dir.file("t.trace");
  auto events = testing::sample_events(500);
  auto writer = TraceWriter::create(path, testing::sample_header());
  ASSERT_TRUE(writer.has_value());
  (*writer)->set_chunk_bytes(300);
  for (size_t i = 0; i < 400; ++i) ASSERT_TRUE((*writer)->append(events[i]).has_value());
  uint64_t on_disk = 0;
  {
    // Count what has been sealed: the copy must contain exactly those events.
    std::string copy = dir.file("copy.trace");
    testing::write_bytes(copy, testing::read_bytes(path));
    testing::ReadOutcome out = testing::read_all(copy);
    ASSERT_FALSE(out.error) << out.message;
    EXPECT_TRUE(out.truncated);
    EXPECT_FALSE(out.complete);
    on_disk = out.events.size();
    EXPECT_GT(on_disk, 300u);
    EXPECT_LE(on_disk, 400u);
    for (size_t i = 0; i < out.events.size(); ++i) ASSERT_TRUE(testing::same_event(out.events[i], events[i]));
    VerifyReport report = verify_trace(copy);
    EXPECT_FALSE(report.ok);
    EXPECT_NE(report.first_problem.find("recording was interrupted"), std::string::npos) << report.first_problem;
  }
  ASSERT_TRUE((*writer)->flush().has_value());
  std::string copy = dir.file("copy2.trace");
  testing::write_bytes(copy, testing::read_bytes(path));
  EXPECT_EQ(testing::read_all(copy).events.size(), 400u);
}

TEST(TraceWriter, ProcessKilledWithSigkillLeavesValidPrefix) {
  TempDir dir;
  std::string path = dir.file("killed.trace");
  auto events = testing::sample_events(1000);
  pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto writer = TraceWriter::create(path, testing::sample_header());
    if (!writer) ::_exit(2);
    (*writer)->set_chunk_bytes(500);
    for (size_t i = 0; i < 700; ++i)
      if (!(*writer)->append(events[i])) ::_exit(3);
    ::raise(SIGKILL);
    ::_exit(4);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << status;
  testing::ReadOutcome out = testing::read_all(path);
  ASSERT_FALSE(out.error) << out.message;
  EXPECT_TRUE(out.truncated);
  EXPECT_GT(out.events.size(), 600u);
  EXPECT_LE(out.events.size(), 700u);
  for (size_t i = 0; i < out.events.size(); ++i) ASSERT_TRUE(testing::same_event(out.events[i], events[i]));
  EXPECT_NE(out.message.find("recording was interrupted"), std::string::npos) << out.message;
}

TEST(TraceWriter, DestroyedWithoutFinishKeepsBufferedEvents) {
  TempDir dir;
  std::string path = dir.file("t.trace");
  auto events = testing::sample_events(30);
  {
    auto writer = TraceWriter::create(path, testing::sample_header());
    ASSERT_TRUE(writer.has_value());
    for (const auto& e : events) ASSERT_TRUE((*writer)->append(e).has_value());
  }
  testing::ReadOutcome out = testing::read_all(path);
  ASSERT_FALSE(out.error) << out.message;
  EXPECT_EQ(out.events.size(), events.size());
  EXPECT_TRUE(out.truncated);
}

TEST(TraceHelpers, Sha256KnownAnswerAndHex) {
  std::string abc = "abc";
  auto digest = sha256_bytes(std::span(reinterpret_cast<const uint8_t*>(abc.data()), abc.size()));
  EXPECT_EQ(hex(digest), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  TempDir dir;
  testing::write_bytes(dir.file("abc"), abc);
  auto from_file = sha256_file(dir.file("abc"));
  ASSERT_TRUE(from_file.has_value());
  EXPECT_EQ(*from_file, digest);
  auto missing = sha256_file(dir.file("missing"));
  ASSERT_FALSE(missing.has_value());
  EXPECT_NE(missing.error().message.find("missing"), std::string::npos);
  uint8_t bytes[] = {0x00, 0x0f, 0xa5, 0xff};
  EXPECT_EQ(hex(bytes), "000fa5ff");
}

TEST(TraceHelpers, KindNamesAndDescriptions) {
  trace::Event e;
  EXPECT_EQ(event_kind_name(e), "none");
  e.set_vcpu(1);
  auto* p = e.mutable_port_read();
  p->set_port(0x3fd);
  p->set_size(1);
  p->set_value(0x60);
  p->set_rip(0x100234);
  EXPECT_EQ(event_kind_name(e), "port_read");
  EXPECT_EQ(describe_event(e), "port_read cpu1 port=0x3fd size=1 value=0x60 rip=0x100234");
  trace::Event s;
  s.mutable_serial_output()->set_data("hi\n\x01");
  EXPECT_EQ(describe_event(s), "serial_output cpu0 data=\"hi\\n\\x01\"");
  trace::Event a;
  *a.mutable_async()->mutable_at() = testing::coordinate(70, 0x1000);
  a.mutable_async()->set_input_closed(true);
  EXPECT_EQ(event_kind_name(a), "async");
  EXPECT_NE(describe_event(a).find("br=70 rip=0x1000"), std::string::npos) << describe_event(a);
  EXPECT_NE(describe_event(a).find("input_closed"), std::string::npos);
  ASSERT_NE(event_coordinate(a), nullptr);
  EXPECT_EQ(event_coordinate(a)->branches(), 70u);
  EXPECT_EQ(event_coordinate(e), nullptr);
  for (const auto& ev : testing::sample_events(20)) {
    EXPECT_NE(event_kind_name(ev), "none");
    EXPECT_EQ(describe_event(ev).find('\n'), std::string::npos);
  }
}

}  // namespace
}  // namespace deja
