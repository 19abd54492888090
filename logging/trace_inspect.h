// Human-readable and JSON description of a trace (`deja inspect`): provenance, duration, counts, serial, timeline.
#pragma once

#include <cstdio>
#include <string>

#include "logging/trace_format.h"

namespace deja {

struct InspectOptions {
  bool events = false;  // print the timeline, one line per event
  bool serial = false;  // print the guest's serial output
  bool json = false;    // one JSON object instead of text
};

// Truncated traces are described up to where they end, saying so; a corrupt trace is described up to the
// corruption and the error is returned after the description is written.
Result<> inspect_trace(const std::string& path, const InspectOptions& options, std::FILE* out);

}  // namespace deja
