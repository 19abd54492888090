// Integrity and completeness audit of a trace file (`deja verify`).
#pragma once

#include <cstdint>
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
// End event last). Never throws or crashes on bad input.
VerifyReport verify_trace(const std::string& path);

}  // namespace deja
