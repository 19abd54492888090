// Human-readable and JSON description of a trace (`deja inspect`): provenance, duration, counts, serial, timeline, pcap.
#pragma once

#include <cstdio>
#include <optional>
#include <string>

#include "logging/output_file.h"
#include "logging/trace_format.h"

namespace deja {

struct InspectOptions {
  bool events = false;  // print the timeline, one line per event
  bool serial = false;  // print the guest's serial output
  bool json = false;    // one JSON object instead of text
  std::string pcap;     // also write the NICs' frames to this file (classic pcap, LINKTYPE_ETHERNET); "" = none
  std::string html;     // also write the page of logging/trace_html.h to this file; "" = none
  std::optional<uint64_t> divergence_event;  // marked on the page: where a failed replay said it diverged
};

// Truncated traces are described up to where they end, saying so; a corrupt trace is described up to the
// corruption and the error is returned after the description is written (a pcap then holds the frames before it).
// For a Linux trace (a "kernel" input) it adds the kernel's version, the first user-space event, the connections in
// the frames and a timeline (logging/linux_trace.h).
Result<> inspect_trace(const std::string& path, const InspectOptions& options, std::FILE* out);

}  // namespace deja
