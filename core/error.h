// Typed, user-actionable errors returned up the stack (no exit() in library code).
#pragma once

#include <expected>
#include <string>
#include <utility>

#include <fmt/format.h>

namespace deja {

// What kind of failure, so callers (and the CLI's exit status) can tell them apart.
enum class ErrorKind {
  kInvalidArgument,  // a CLI option or configuration value is wrong
  kBadImage,         // a guest image is malformed or does not fit
  kBadTrace,         // a trace file is malformed, truncated or tampered with
  kHost,             // a host facility failed (open, mmap, ioctl, ...)
  kUnsupported,      // the host or backend lacks something required
  kGuest,            // the guest did something that stops the VM
  kDivergence,       // replay diverged from the recording
};

struct Error {
  ErrorKind kind = ErrorKind::kHost;
  std::string message;
};

template <typename T = void>
using Result = std::expected<T, Error>;

template <typename... Args>
std::unexpected<Error> fail(ErrorKind kind, fmt::format_string<Args...> format, Args&&... args) {
  return std::unexpected(Error{kind, fmt::format(format, std::forward<Args>(args)...)});
}

// Always-on invariant check: violations are bugs in deja, never guest- or input-caused.
[[noreturn]] void assertion_failed(const char* expr, const char* file, int line, const std::string& context);

}  // namespace deja

#define DEJA_ASSERT(expr, ...)                                                       \
  do {                                                                               \
    if (!(expr)) [[unlikely]]                                                        \
      ::deja::assertion_failed(#expr, __FILE__, __LINE__, ::fmt::format("" __VA_ARGS__)); \
  } while (0)
