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
    // Backends put the register dump and the last exits into the reason of a stopped vCPU; a replay's reason for
    // where the recording stopped is the trace's, printed as the trace's strings are (core/text.h).
    say("{}", o.recorded_end ? printable(o.reason) : o.reason);
  }
}

}  // namespace deja
