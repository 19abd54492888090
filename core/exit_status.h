// deja's own process exit statuses. Guest statuses from isa-debug-exit are always odd ((v << 1) | 1), so deja's are even.
#pragma once

#include "core/error.h"

namespace deja::exit_status {
constexpr int kUsage = 2;          // bad option, image, trace argument or configuration
constexpr int kGuestStopped = 4;   // the guest stopped abnormally: triple fault, internal error, halted forever
constexpr int kDivergence = 6;     // replay diverged from the recording
constexpr int kTraceEnded = 8;     // replay ran out of trace (truncated recording) or hit a corrupt chunk
constexpr int kHostFailure = 10;   // a host facility failed (KVM ioctl, file write, ...)
constexpr int kInterrupted = 12;   // stopped by SIGINT/SIGTERM (the recording is finished properly)
constexpr int kFound = 14;         // deja explore: a run met an --until predicate (its trace is kept)

// The status an error of this kind ends deja with.
constexpr int of(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kInvalidArgument:
    case ErrorKind::kBadImage:
    case ErrorKind::kBadTrace:
    case ErrorKind::kUnsupported:
      return kUsage;
    case ErrorKind::kDivergence:
      return kDivergence;
    case ErrorKind::kGuest:
      return kGuestStopped;
    case ErrorKind::kHost:
      return kHostFailure;
  }
  return kHostFailure;
}
}  // namespace deja::exit_status
