// trace_same: whether two recordings are the same trace but for when, where and by which build they were made (tests only).
//
//   trace_same A B      exit 0: same; 1: they differ (the first difference on stderr); 2: unreadable
//
// Compared: the header without build_id, deja_version, host and start_unix_ns; every event, in order, byte for byte
// as serialized; the footer's summary (event counts, final digest, instruction and branch counts, exit status,
// serial output). Not compared: chunk boundaries and the footer's index (chunks are sealed by wall time) and
// wall_ns; and the state digests' device part (the End's, the StateDigest events' and the footer's final digest),
// since the RTC's state holds start_unix_ns, the machine's start in wall time: the registers and RAM parts
// of StateDigest events are compared. A recording whose guest waited for host time (a heartbeat, an idle HLT) differs in those events.
#include <cstdio>
#include <map>
#include <string>

#include "logging/trace_reader.h"

namespace {

std::string normalized_header(deja::trace::Header h) {
  h.clear_build_id();
  h.clear_deja_version();
  h.clear_host();
  h.clear_start_unix_ns();
  return h.SerializeAsString();
}

// (events_by_kind is a map, which protobuf serializes in no fixed order: compared as one.)
std::string footer_summary(deja::trace::Footer f) {
  std::string counts;
  for (const auto& [kind, n] : std::map<std::string, uint64_t>(f.events_by_kind().begin(), f.events_by_kind().end()))
    counts += kind + "=" + std::to_string(n) + ";";
  f.clear_chunks();
  f.clear_wall_ns();
  f.clear_final_digest();
  f.clear_events_by_kind();
  return f.SerializeAsString() + counts;
}

// An event without what depends on the start time: full digests hash the RTC, whose epoch is the start.
std::string comparable_event(deja::trace::Event e) {
  if (e.has_end()) e.mutable_end()->clear_digest();
  if (e.has_digest()) {
    e.mutable_digest()->clear_digest();
    e.mutable_digest()->mutable_parts()->clear_devices();
  }
  return e.SerializeAsString();
}

}  // namespace

int main(int argc, char** argv) {
  using namespace deja;
  if (argc != 3) {
    std::fprintf(stderr, "usage: trace_same A B\n");
    return 2;
  }
  auto a = TraceReader::open(argv[1]);
  auto b = TraceReader::open(argv[2]);
  if (!a || !b) {
    std::fprintf(stderr, "trace_same: %s\n", (!a ? a.error() : b.error()).message.c_str());
    return 2;
  }
  if (normalized_header((*a)->header()) != normalized_header((*b)->header())) {
    std::fprintf(stderr, "the headers differ:\n--- %s\n%s\n--- %s\n%s\n", argv[1], (*a)->header().DebugString().c_str(),
                 argv[2], (*b)->header().DebugString().c_str());
    return 1;
  }
  for (uint64_t index = 0;; ++index) {
    auto ea = (*a)->next();
    auto eb = (*b)->next();
    if (!ea || !eb) {
      std::fprintf(stderr, "trace_same: %s\n", (!ea ? ea.error() : eb.error()).message.c_str());
      return 2;
    }
    if (!*ea || !*eb) {
      if (*ea || *eb) {
        std::fprintf(stderr, "%s ends after %llu events, the other goes on\n", *ea ? argv[2] : argv[1],
                     (unsigned long long)index);
        return 1;
      }
      break;
    }
    if (comparable_event(**ea) != comparable_event(**eb)) {
      std::fprintf(stderr, "event %llu differs:\n--- %s\n%s--- %s\n%s", (unsigned long long)index, argv[1],
                   (*ea)->DebugString().c_str(), argv[2], (*eb)->DebugString().c_str());
      return 1;
    }
  }
  const trace::Footer* fa = (*a)->footer();
  const trace::Footer* fb = (*b)->footer();
  if (!fa || !fb || footer_summary(*fa) != footer_summary(*fb)) {
    std::fprintf(stderr, "the footers differ (or one is missing)\n");
    return 1;
  }
  return 0;
}
