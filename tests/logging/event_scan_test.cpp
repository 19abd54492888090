// verify's fast pass (TraceReader::scan, scan_event) against the full parse: the scan is sure only of events the full
// parse accepts, with the kind it gives them, and a bad event inside an intact chain is named as next() names it.
#include <random>

#include <zstd.h>

#include "logging/event_scan.h"
#include "logging/trace_verify.h"
#include "trace_test_support.h"

namespace deja {
namespace {

using namespace trace_detail;

// Encoded events, and whether the scan should be sure of each as written.
std::vector<std::pair<std::string, bool>> encoded_sample_events() {
  std::vector<std::pair<std::string, bool>> out;
  for (const auto& e : testing::sample_events(400, 7)) out.emplace_back(e.SerializeAsString(), !e.has_end());
  trace::Event port;
  port.mutable_port_read()->set_port(0x3f8);
  out.emplace_back(port.SerializeAsString() + "\x98\x06\x05", false);  // field 99, unknown here: the full parse keeps it
  out.emplace_back("", true);  // an event with no kind
  return out;
}

TEST(EventScan, SureOnlyOfWhatTheFullParseAcceptsWithItsKind) {
  std::mt19937_64 rng(0x5ca7);
  size_t sure = 0, total = 0;
  for (const auto& [original, _] : encoded_sample_events()) {
    for (int round = 0; round < 200; ++round) {
      std::string s = original;
      if (round > 0) {  // round 0: the event as written
        const int edits = 1 + int(rng() % 3);
        for (int i = 0; i < edits; ++i) {
          const size_t at = s.empty() ? 0 : rng() % s.size();
          switch (rng() % 4) {
            case 0: if (!s.empty()) s[at] = char(s[at] ^ (1 << (rng() % 8))); break;
            case 1: s.resize(at); break;
            case 2: s.insert(at, 1, char(rng())); break;
            case 3: if (!s.empty()) s[at] = char(std::array<uint8_t, 5>{0x00, 0xff, 0x80, 0x7f, 0x01}[rng() % 5]); break;
          }
        }
      }
      const EventScan scan = scan_event(reinterpret_cast<const uint8_t*>(s.data()), s.size());
      trace::Event parsed;
      const bool parses = parsed.ParseFromString(s);
      ++total;
      if (!scan.sure) continue;
      ++sure;
      ASSERT_TRUE(parses) << "the scan was sure of an event the full parse refuses: " << hex(s);
      ASSERT_EQ(scan.kind_case, int(parsed.kind_case())) << hex(s);
    }
  }
  // The fast path is the common one: every written event but the End (text) and the unknown field.
  for (const auto& [original, expect_sure] : encoded_sample_events())
    EXPECT_EQ(scan_event(reinterpret_cast<const uint8_t*>(original.data()), original.size()).sure, expect_sure)
        << hex(original);
  EXPECT_GT(sure, total / 10);
}

// A chunk frame holding `events` (encoded as given), chained after `before`.
std::string chunk_frame(const std::vector<std::string>& events, Sha256& chain) {
  std::string raw;
  for (const std::string& e : events) {
    for (uint64_t n = e.size(); ; n >>= 7) {  // the length as a varint
      raw.push_back(char((n & 0x7f) | (n >= 0x80 ? 0x80 : 0)));
      if (n < 0x80) break;
    }
    raw += e;
  }
  std::string stored(ZSTD_compressBound(raw.size()), '\0');
  stored.resize(ZSTD_compress(stored.data(), stored.size(), raw.data(), raw.size(), 3));
  uint8_t frame[kFrameHeaderBytes];
  put_u32(frame, kChunkFrameMagic);
  put_u32(frame + 4, uint32_t(stored.size()));
  put_u32(frame + 8, uint32_t(raw.size()));
  put_u32(frame + 12, uint32_t(events.size()));
  chain = chain_next(chain, std::span(frame, kFrameFieldBytes),
                     std::span(reinterpret_cast<const uint8_t*>(stored.data()), stored.size()));
  std::memcpy(frame + kFrameFieldBytes, chain.data(), 32);
  return std::string(reinterpret_cast<char*>(frame), sizeof frame) + stored;
}

TEST(EventScan, VerifyNamesABadEventInAnIntactChainAsTheReaderDoes) {
  testing::TempDir dir;
  const std::string good_path = dir.file("good.trace");
  testing::write_trace(good_path, testing::sample_events(4), 1 << 16);
  const std::string good = testing::read_bytes(good_path);
  const uint64_t header_end = 16 + get_u32(reinterpret_cast<const uint8_t*>(good.data()) + 12) + 32;
  Sha256 chain;
  std::memcpy(chain.data(), good.data() + header_end - 32, 32);

  std::vector<std::string> events;
  for (const auto& e : testing::sample_events(6, 3)) events.push_back(e.SerializeAsString());
  struct Case {
    std::string bad;  // the sixth event's encoding
    std::string expect;
  };
  const std::vector<Case> cases = {
      {std::string("\xff\xff\xff"), "event 5 is not a valid Event protobuf"},  // a tag that runs off the end
      {std::string("\x12\x05\x08\x01"), "event 5 is not a valid Event protobuf"},  // a message longer than the event
      {std::string("\x5a\x03\x2a\x01\xff"), "event 5 is not a valid Event protobuf"},  // End.reason not UTF-8
      {std::string(), "event 5 has no kind"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.expect + " " + hex(c.bad));
    Sha256 running = chain;
    std::vector<std::string> second = {events[3], c.bad, events[5]};
    std::string bytes = good.substr(0, header_end);
    bytes += chunk_frame({events[0], events[1], events[2], events[3]}, running);
    bytes += chunk_frame(second, running);
    const std::string path = dir.file("bad.trace");
    testing::write_bytes(path, bytes);
    const VerifyReport report = verify_trace(path);
    EXPECT_FALSE(report.ok);
    EXPECT_EQ(report.failed_check(), "structure") << report.summary;
    EXPECT_NE(report.first_problem.find(c.expect), std::string::npos) << report.first_problem;
    const testing::ReadOutcome read = testing::read_all(path);
    if (read.error) {  // the reader's own error, word for word and at the same place
      EXPECT_TRUE(report.first_problem.starts_with(read.message + ";")) << report.first_problem << "\n" << read.message;
      EXPECT_EQ(read.events.size(), 5u);
      EXPECT_NE(read.message.find("chunk 2 ("), std::string::npos) << read.message;
    }
  }
}

}  // namespace
}  // namespace deja
