// Integrity and completeness audit of a trace file (`deja verify`).
#pragma once

#include <cstdint>
#include <functional>
#include <string>

namespace deja {

struct VerifyReport {
  bool ok = false;             // every check passed and the trace is complete
  bool opened = false;         // the file is a deja trace whose header could be read
  std::string first_problem;   // empty when ok
  uint64_t chunks = 0;         // chunks that verified
  uint64_t events = 0;         // events in those chunks
  bool complete = false;       // footer + trailer present and consistent
  std::string summary;         // one paragraph for humans
};

// Checksums, hash chain, index consistency (offsets, counts, first coordinates), completeness (footer present,
// End event last). Never throws or crashes on bad input. `progress` (optional) hears after each chunk how far the
// check has read: bytes of the file and events.
using VerifyProgress = std::function<void(uint64_t bytes, uint64_t file_bytes, uint64_t events)>;
VerifyReport verify_trace(const std::string& path, const VerifyProgress& progress = {});

}  // namespace deja
