// The state digest that chains segments: SHA-256 over every part of the machine a replay from a point depends on.
#pragma once

#include <map>
#include <span>
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

// RAM's part: SHA-256 over the (page number, SHA-256 of the page) of every non-zero page, ascending. Hashing pages one
// by one lets a writer that knows which pages changed keep the others' hashes: a recording's checkpoint then hashes the
// pages dirtied since the one before, not all of RAM; a replay computes the same value from scratch.
class RamPageHashes {
 public:
  // Rehashes `pages` (each page written since the last update; every page the first time) as RAM holds them now.
  void update(const GuestMemory& memory, std::span<const uint64_t> pages);
  // Every page of RAM that holds data (the memfd's holes skipped without faulting them in).
  void update_all(const GuestMemory& memory);
  StateSha digest() const;
  // The non-zero pages, ascending.
  std::vector<uint64_t> pages() const;

 private:
  std::map<uint64_t, StateSha> hashes_;  // non-zero pages only
};

// At a point where a checkpoint can be taken; `state` is what Session::capture_state() returned there. `ram`: the
// page hashes of RAM as it is now, kept by the caller (else computed here).
Result<StateDigest> state_digest(Session& session, const MachineCheckpoint& state, const RamPageHashes* ram = nullptr);
// The pages of RAM that hold data (the memfd's holes skipped), ascending.
std::vector<uint64_t> data_pages(const GuestMemory& memory);
bool all_zero_page(const uint8_t* page);
// The parts that differ between two part lists, named ("RAM, device uart"); "" when none differs by name.
std::string differing_parts(const std::vector<std::pair<std::string, StateSha>>& a,
                            const std::vector<std::pair<std::string, StateSha>>& b);

}  // namespace deja
