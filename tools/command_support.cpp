// What the subcommands share: error reporting and reading a guest's input files.
#include "tools/command_support.h"

#include "logging/trace_format.h"
#include "core/exit_status.h"
#include "core/messages.h"

#include <fmt/format.h>

namespace deja {

int report_error(const Error& e) {
  say("{}", e.message);
  switch (e.kind) {
    case ErrorKind::kInvalidArgument:
    case ErrorKind::kBadImage:
    case ErrorKind::kBadTrace:
    case ErrorKind::kUnsupported:
      return exit_status::kUsage;
    case ErrorKind::kDivergence:
      return exit_status::kDivergence;
    case ErrorKind::kGuest:
      return exit_status::kGuestStopped;
    case ErrorKind::kHost:
      return exit_status::kHostFailure;
  }
  return exit_status::kHostFailure;
}

void finish_outcome_message(const Outcome& o) {
  if (!o.guest_exit && o.status != exit_status::kDivergence && o.status != exit_status::kTraceEnded) {
    // Backends put the register dump and the last exits into the reason of a stopped vCPU.
    say("{}", o.reason);
  }
}

std::optional<size_t> first_invalid_utf8(std::string_view text) {
  const auto* p = reinterpret_cast<const uint8_t*>(text.data());
  const size_t n = text.size();
  for (size_t i = 0; i < n;) {
    const uint8_t c = p[i];
    size_t length = c < 0x80 ? 1 : (c & 0xe0) == 0xc0 ? 2 : (c & 0xf0) == 0xe0 ? 3 : (c & 0xf8) == 0xf0 ? 4 : 0;
    if (length == 0 || i + length > n) return i;
    uint32_t code = length == 1 ? c : c & (0x7f >> length);
    for (size_t k = 1; k < length; ++k) {
      if ((p[i + k] & 0xc0) != 0x80) return i;
      code = (code << 6) | (p[i + k] & 0x3f);
    }
    // Overlong forms, UTF-16 surrogates and values past U+10FFFF are not UTF-8 either.
    static constexpr uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
    if (code < kMin[length] || (code >= 0xd800 && code <= 0xdfff) || code > 0x10ffff) return i;
    i += length;
  }
  return std::nullopt;
}



}  // namespace deja
