// scan_event: a wire-level look at one encoded Event (its kind, and whether its encoding is plainly sound) without
// building the message, for the verifier's pass over every event; anything it is not sure of goes to the full parse.
#pragma once

#include <cstddef>
#include <cstdint>

namespace deja {

struct EventScan {
  // The encoding is one that Event::ParseFromArray accepts: every field is one the schema declares, with its own wire
  // type, lengths inside their message, nested messages likewise. False means "not sure" (an unknown field, a text
  // field, a packed list, a malformed encoding...), never "invalid": the caller asks the full parse then.
  bool sure = false;
  int kind_case = 0;  // Event::kind_case() as the full parse would set it (the last oneof field wins)
};

EventScan scan_event(const uint8_t* data, size_t size);

}  // namespace deja
