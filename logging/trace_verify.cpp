// verify_trace: reads the whole trace through TraceReader and adds the semantic checks a reader does not need.
#include "logging/trace_verify.h"

#include "logging/trace_format.h"
#include "logging/trace_reader.h"

namespace deja {

VerifyReport verify_trace(const std::string& path, const VerifyProgress& progress) {
  VerifyReport report;
  auto opened = TraceReader::open(path);
  if (!opened) {
    report.first_problem = opened.error().message;
    report.summary = fmt::format("FAILED: {}", report.first_problem);
    return report;
  }
  TraceReader& reader = **opened;
  report.opened = true;
  uint64_t end_events = 0;
  uint64_t first_end_index = 0;
  bool last_is_end = false;
  uint64_t chunks_seen = 0;
  std::string end_reason;
  std::string problem;
  while (true) {
    auto event = reader.next();
    if (!event) {
      problem = event.error().message;
      break;
    }
    if (!*event) break;
    const trace::Event& e = **event;
    if (progress && reader.chunks_read() != chunks_seen) {
      chunks_seen = reader.chunks_read();
      progress(reader.valid_bytes(), reader.file_size(), reader.events_read());
    }
    if (e.kind_case() == trace::Event::KIND_NOT_SET && problem.empty())
      problem = fmt::format("event {} has no kind (unknown to this deja, or empty)", reader.events_read() - 1);
    if (e.has_end()) {
      if (end_events++ == 0) first_end_index = reader.events_read() - 1;
      end_reason = e.end().reason();
    }
    last_is_end = e.has_end();
  }
  if (progress) progress(reader.valid_bytes(), reader.file_size(), reader.events_read());
  report.chunks = reader.chunks_read();
  report.events = reader.events_read();
  report.complete = reader.complete();
  if (problem.empty()) {
    if (reader.truncated()) {
      problem = reader.end_description();
    } else if (!last_is_end) {
      problem = end_events == 0 ? "the trace has no End event (the recording did not finish cleanly)"
                                : fmt::format("event {} is an End event but events follow it", first_end_index);
    } else if (end_events > 1) {
      problem = fmt::format("{} End events; the first is event {} (only one, the last, is allowed)", end_events,
                            first_end_index);
    }
  }
  if (problem.empty()) {
    for (const auto& input : reader.header().inputs())
      if (!input.sha256().empty() && input.sha256().size() != 32) {
        problem = fmt::format("header input {} ({}) has a {}-byte SHA-256, not 32", input.path(), input.role(),
                              input.sha256().size());
        break;
      }
  }
  report.first_problem = problem;
  report.ok = problem.empty() && report.complete;
  const trace::Header& h = reader.header();
  if (report.ok) {
    report.summary = fmt::format(
        "OK: {} is complete and untampered: format v{}, {} chunks, {} events, {} bytes; recorded by deja {} "
        "(build {}), cpu model {} v{}, device model v{}, {} input file(s)",
        path, h.format_version(), report.chunks, report.events, reader.file_size(), h.deja_version(), h.build_id(),
        h.cpu_model().empty() ? "deja-v1" : h.cpu_model(), h.cpu_model_version(), h.device_model_version(), h.inputs_size());
    // Complete, but of a run that a host failure cut short (a disk overlay or the serial output could not be
    // written): it replays to where it stopped, and says so.
    if (end_reason.starts_with(kHostFailureReason)) report.summary += fmt::format("; the recording was {}", end_reason);
  } else {
    report.summary = fmt::format("FAILED: {}; {} chunks and {} events verified before that (valid through byte {} of {})",
                                 problem, report.chunks, report.events, reader.valid_bytes(), reader.file_size());
  }
  return report;
}

}  // namespace deja
