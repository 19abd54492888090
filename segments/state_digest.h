// The state digest that chains segments: SHA-256 over every part of the machine a replay from a point depends on.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "replay/session.h"
#include "snapshot/trace_checkpoint.h"

namespace deja {

// Parts: the vCPU ("cpu"), the backend's internal state ("backend"), each device ("device NAME"), the loop state
// every replay that gets here shares ("loop", Session::shared_loop_state), RAM ("ram": the non-zero pages with their
// numbers) and each disk's writes and verified blocks ("disk N"); the digest is SHA-256 over the parts' names and
// digests. SHA-256 rather than the XXH3 of trace digests: segments prove to `deja merge` that one worker's end state
// is the next one's start, and a checkpoint file is not trusted to say so.
struct StateDigest {
  StateSha value{};
  std::vector<std::pair<std::string, StateSha>> parts;
};

// At a point where a checkpoint can be taken; `state` is what Session::capture_state() returned there.
Result<StateDigest> state_digest(Session& session, const MachineCheckpoint& state);
// The parts that differ between two part lists, named ("RAM, device uart"); "" when none differs by name.
std::string differing_parts(const std::vector<std::pair<std::string, StateSha>>& a,
                            const std::vector<std::pair<std::string, StateSha>>& b);

}  // namespace deja
