// Names of backend exits, for stats and diagnostics.
#include "core/backend.h"

namespace deja {

std::string_view exit_kind_name(ExitKind kind) {
  switch (kind) {
    case ExitKind::kIoIn: return "io-in";
    case ExitKind::kIoOut: return "io-out";
    case ExitKind::kMmioRead: return "mmio-read";
    case ExitKind::kMmioWrite: return "mmio-write";
    case ExitKind::kHlt: return "hlt";
    case ExitKind::kRdtsc: return "rdtsc";
    case ExitKind::kRdrand: return "rdrand";
    case ExitKind::kMsrRead: return "msr-read";
    case ExitKind::kMsrWrite: return "msr-write";
    case ExitKind::kInterruptWindow: return "interrupt-window";
    case ExitKind::kKicked: return "kicked";
    case ExitKind::kCoordinateReached: return "coordinate-reached";
    case ExitKind::kCoordinateMissed: return "coordinate-missed";
    case ExitKind::kDebug: return "debug";
    case ExitKind::kShutdown: return "shutdown";
    case ExitKind::kFault: return "fault";
    case ExitKind::kPause: return "pause";
    case ExitKind::kLocked: return "locked";
  }
  return "unknown";
}

}  // namespace deja
