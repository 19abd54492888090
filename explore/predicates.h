// What makes an explored run a failure (`deja explore --until`): exit status, serial output, state digest, hang.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <regex>
#include <span>
#include <string>
#include <vector>

#include "core/error.h"

namespace deja::explore {

// One --until predicate:
//   exit:N[,N...]   the guest exited (isa-debug-exit) with one of these statuses; exit:!N with any status but N
//   serial:REGEX    a line of the serial output matches REGEX (ECMAScript), e.g. serial:BUG:|Oops|panic
//   digest:HEX      the final CPU and RAM digest (`deja run --digest`) starts with HEX
//   hang[:N]        no serial output in N instructions (default 1e9), or every vCPU halted with nothing to wake it
struct Predicate {
  enum class Kind { kExit, kSerial, kDigest, kHang };
  Kind kind = Kind::kExit;
  std::string text;  // as given
  std::vector<int> statuses;
  bool negated = false;
  std::shared_ptr<const std::regex> pattern;
  std::string digest_prefix;
  uint64_t hang_instructions = 0;
};
Result<Predicate> parse_predicate(const std::string& spec);

// How a run ended, as the predicates see it.
struct RunEnd {
  bool guest_exit = false;  // through isa-debug-exit, with `status`
  int status = 0;           // the guest's status (isa-debug-exit's value), or deja's
  bool hang = false;        // ended as a hang (Session's limits, or no vCPU could ever run again)
  std::string digest;       // hex
};

// Watches the serial output line by line (lines longer than 4 KiB are matched in 4 KiB pieces) for every serial
// predicate; says which matched first.
class SerialWatch {
 public:
  explicit SerialWatch(std::span<const Predicate> predicates);
  void feed(std::span<const uint8_t> bytes);
  // The text of the first serial predicate that matched, if one did.
  const std::optional<std::string>& matched() const { return matched_; }

 private:
  void check_line();
  std::vector<const Predicate*> serial_;
  std::string line_;
  std::optional<std::string> matched_;
};

// The predicates a run met (their texts, in the order given); `serial` is SerialWatch's match.
std::vector<std::string> met_predicates(std::span<const Predicate> predicates, const RunEnd& end,
                                        const std::optional<std::string>& serial);

// The hang watchdog's length: the smallest hang:N given, 0 without a hang predicate.
uint64_t hang_instructions(std::span<const Predicate> predicates);

}  // namespace deja::explore
