// What the subcommands share: error reporting and reading a guest's input files.
#include "tools/command_support.h"

#include "logging/trace_format.h"
#include "core/exit_status.h"
#include "core/messages.h"

#include <fmt/format.h>

namespace deja {

int report_error(const Error& e) {
  say("{}", e.message);
  return exit_status::of(e.kind);
}

void finish_outcome_message(const Outcome& o) {
  if (!o.guest_exit && o.status != exit_status::kDivergence && o.status != exit_status::kTraceEnded) {
    // Backends put the register dump and the last exits into the reason of a stopped vCPU; a replay's reason for
    // where the recording stopped is the trace's, printed as the trace's strings are (core/text.h).
    say("{}", o.recorded_end ? printable(o.reason) : o.reason);
  }
}

namespace {
std::vector<std::string>& remembered_arguments() {
  static std::vector<std::string> args;
  return args;
}
}  // namespace

void remember_command_line(int argc, char** argv) {
  remembered_arguments().assign(argv + std::min(argc, 2), argv + argc);
}
const std::vector<std::string>& command_line_arguments() { return remembered_arguments(); }

}  // namespace deja
