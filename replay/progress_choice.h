// ProgressChoice: which progress mode places asynchronous events, and in exact mode what counts (the --progress option).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "replay/engine.h"

namespace deja {

struct ProgressChoice {
  ProgressMode mode = ProgressMode::kExact;
  bool automatic = false;                 // KVM record: exact with a usable PMU, else exit-sync
  std::optional<uint64_t> emulated_skid;  // interp: emulate a PMU whose overflow lands up to N branches late
  std::optional<uint64_t> emulated_seed;  // its random generator's seed (default: fresh)
};

// Parses --progress: "exact", "exit-sync", "emulated-pmu:SKID" or "emulated-pmu:SKID:SEED".
Result<ProgressChoice> parse_progress(const std::string& spec);

}  // namespace deja
