// `deja inspect --html`: one self-contained page (inline SVG, script and style; nothing fetched) showing a recording
// on a guest-time axis: asynchronous events and interrupts per vCPU, disk and network traffic, connections, serial
// output, state digests, the divergence point of a failed replay, and a table of the same points with the
// `deja query` command that stops at each.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "logging/linux_trace.h"
#include "logging/output_file.h"

namespace deja {

// Gathers what the page shows during inspect's one streaming pass, in bounded memory: per-interval sums in a fixed
// number of bins whose width doubles as the trace goes on, and at most kMaxRows table rows.
class HtmlTimeline {
 public:
  static constexpr size_t kBins = 600;
  static constexpr size_t kMaxRows = 4000;
  static constexpr size_t kMaxSerialBytes = 256 * 1024;

  // `divergence_event`: the event number a failed replay reported ("replay diverged at event N": replay counts
  // every event but serial output and disk I/O records), marked on the page.
  HtmlTimeline(const trace::Header& header, std::optional<uint64_t> divergence_event);

  // After `view` has seen event `index` (as inspect --events numbers it).
  void add(uint64_t index, const trace::Event& e, const LinuxTraceView& view);

  // What the page says of the trace as a whole.
  struct Summary {
    std::string path;
    std::string status;  // "complete", "truncated: ...", "corrupt: ..."
    uint64_t events = 0;
    uint64_t file_size = 0;
    std::map<std::string, uint64_t> by_kind;
    std::string kernel;  // Linux: its version, or ""
  };
  // The page, written to `out` (committed by the caller).
  Result<> write(const Summary& summary, const LinuxTraceView& view, ProductFile& out) const;

 private:
  struct Series {
    std::vector<double> values = std::vector<double>(kBins, 0.0);
  };
  void add_to(const std::string& series, uint64_t ns, double amount);

  const trace::Header& header_;
  std::optional<uint64_t> divergence_event_;
  uint64_t bin_ns_ = 1000;  // doubles while the trace goes on: it ends between kBins / 2 and kBins bins
  uint64_t last_ns_ = 0;
  uint64_t replay_events_ = 0;  // events a replay counts, before the current one
  std::map<std::string, Series> series_;
  struct Row {
    uint64_t event, replay_event, ns;
    std::string kind, text;
  };
  std::vector<Row> rows_;  // digests and the divergence; the Linux view's entries are added at write()
  std::optional<Row> divergence_;
  uint64_t digests_ = 0;
  size_t entries_seen_ = 0;  // view.timeline_entry_count() at the last add()
  std::map<uint64_t, uint64_t> replay_event_at_;  // the view's entries: event -> the replay's event number
  std::string serial_;
  std::vector<std::pair<uint64_t, uint64_t>> serial_marks_;  // (offset in serial_, guest ns) at each output event
};

}  // namespace deja
