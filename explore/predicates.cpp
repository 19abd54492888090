// Parsing and evaluating `deja explore --until` predicates.
#include "explore/predicates.h"

#include <algorithm>
#include <charconv>

namespace deja::explore {

namespace {
constexpr size_t kMaxLine = 4096;
constexpr uint64_t kDefaultHang = 1'000'000'000;

Result<uint64_t> parse_count(std::string_view text, const std::string& spec) {
  // Plain digits, or with a k/M/G suffix (hang:50M).
  uint64_t scale = 1;
  if (!text.empty()) {
    switch (text.back()) {
      case 'k': case 'K': scale = 1'000; break;
      case 'M': scale = 1'000'000; break;
      case 'G': scale = 1'000'000'000; break;
      default: break;
    }
    if (scale != 1) text.remove_suffix(1);
  }
  uint64_t v = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size() || v == 0 || v > (UINT64_MAX / scale)) {
    return fail(ErrorKind::kInvalidArgument, "--until {}: '{}' is not a positive count", spec, text);
  }
  return v * scale;
}
}  // namespace

Result<Predicate> parse_predicate(const std::string& spec) {
  Predicate p;
  p.text = spec;
  const size_t colon = spec.find(':');
  const std::string name = spec.substr(0, colon);
  const std::string arg = colon == std::string::npos ? std::string() : spec.substr(colon + 1);
  if (name == "exit") {
    p.kind = Predicate::Kind::kExit;
    std::string_view rest = arg;
    if (rest.starts_with('!')) p.negated = true, rest.remove_prefix(1);
    while (!rest.empty()) {
      const size_t comma = std::min(rest.find(','), rest.size());
      int v = 0;
      auto [end, ec] = std::from_chars(rest.data(), rest.data() + comma, v);
      if (ec != std::errc() || end != rest.data() + comma || v < 0 || v > 255) {
        return fail(ErrorKind::kInvalidArgument, "--until {}: exit statuses are 0 to 255", spec);
      }
      p.statuses.push_back(v);
      rest.remove_prefix(std::min(comma + 1, rest.size()));
    }
    if (p.statuses.empty()) return fail(ErrorKind::kInvalidArgument, "--until {}: give a status (exit:1, exit:!0)", spec);
  } else if (name == "serial") {
    p.kind = Predicate::Kind::kSerial;
    if (arg.empty()) return fail(ErrorKind::kInvalidArgument, "--until serial: give a regular expression");
    try {
      p.pattern = std::make_shared<const std::regex>(arg, std::regex::ECMAScript | std::regex::optimize);
    } catch (const std::regex_error& e) {
      return fail(ErrorKind::kInvalidArgument, "--until {}: not a regular expression ({})", spec, e.what());
    }
  } else if (name == "digest") {
    p.kind = Predicate::Kind::kDigest;
    if (arg.empty() || arg.size() > 64 || !std::all_of(arg.begin(), arg.end(), [](char c) { return std::isxdigit(uint8_t(c)); })) {
      return fail(ErrorKind::kInvalidArgument, "--until {}: give the digest (or its start) in hexadecimal", spec);
    }
    p.digest_prefix = arg;
    std::transform(p.digest_prefix.begin(), p.digest_prefix.end(), p.digest_prefix.begin(), ::tolower);
  } else if (name == "hang") {
    p.kind = Predicate::Kind::kHang;
    p.hang_instructions = kDefaultHang;
    if (colon != std::string::npos) {
      auto n = parse_count(arg, spec);
      if (!n) return std::unexpected(n.error());
      p.hang_instructions = *n;
    }
  } else {
    return fail(ErrorKind::kInvalidArgument,
                "--until {}: not a predicate (exit:N, exit:!N, serial:REGEX, digest:HEX, hang[:N])", spec);
  }
  return p;
}

SerialWatch::SerialWatch(std::span<const Predicate> predicates) {
  for (const Predicate& p : predicates) {
    if (p.kind == Predicate::Kind::kSerial) serial_.push_back(&p);
  }
}

void SerialWatch::feed(std::span<const uint8_t> bytes) {
  if (serial_.empty() || matched_) return;
  for (uint8_t b : bytes) {
    if (b == '\n' || line_.size() >= kMaxLine) {
      check_line();
      line_.clear();
      if (matched_) return;
      if (b == '\n') continue;
    }
    line_.push_back(char(b));
  }
  check_line();  // a line still being written (a prompt, a panic without its newline yet)
}

void SerialWatch::check_line() {
  for (const Predicate* p : serial_) {
    if (std::regex_search(line_, *p->pattern)) {
      matched_ = p->text;
      return;
    }
  }
}

std::vector<std::string> met_predicates(std::span<const Predicate> predicates, const RunEnd& end,
                                        const std::optional<std::string>& serial) {
  std::vector<std::string> met;
  for (const Predicate& p : predicates) {
    bool hit = false;
    switch (p.kind) {
      case Predicate::Kind::kExit:
        if (end.guest_exit) {
          const bool listed = std::find(p.statuses.begin(), p.statuses.end(), end.status) != p.statuses.end();
          hit = listed != p.negated;
        }
        break;
      case Predicate::Kind::kSerial:
        hit = serial == p.text;
        break;
      case Predicate::Kind::kDigest:
        hit = end.digest.starts_with(p.digest_prefix);
        break;
      case Predicate::Kind::kHang:
        hit = end.hang;
        break;
    }
    if (hit) met.push_back(p.text);
  }
  return met;
}

uint64_t hang_instructions(std::span<const Predicate> predicates) {
  uint64_t n = 0;
  for (const Predicate& p : predicates) {
    if (p.kind == Predicate::Kind::kHang) n = n == 0 ? p.hang_instructions : std::min(n, p.hang_instructions);
  }
  return n;
}

}  // namespace deja::explore
