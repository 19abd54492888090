// The only code that touches the host's clock, entropy and input files; the engine decides when it is consulted.
#pragma once

#include <array>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <span>
#include <string>

#include "devices/device.h"
#include "core/error.h"

namespace deja {

// Nanoseconds of host monotonic time since this object was created.
class HostClock {
 public:
  HostClock();
  uint64_t elapsed_ns() const;
  // Host monotonic time (absolute), for sleeping until a deadline.
  static uint64_t monotonic_ns();
  uint64_t origin_ns() const { return origin_; }
  // The clock leaves out `ns` of host time just spent (elapsed_ns() from now on is that much less).
  void skip(uint64_t ns) { origin_ += ns; }

 private:
  uint64_t origin_;
};

int64_t host_unix_time_ns();
uint64_t host_random64(bool* ok);
std::string host_description();

// Serial input from a file or stdin, read without blocking.
class FdInput : public HostInput {
 public:
  static Result<std::unique_ptr<FdInput>> open(const std::string& path);  // "-" = stdin
  ~FdInput() override;
  size_t read_available(std::span<uint8_t> out, uint64_t now_ns) override;
  bool at_end() const override { return eof_; }
  int fd() const override { return fd_; }
  // A regular file can be hashed up front (its bytes are also recorded as they arrive); a FIFO, a
  // terminal or a device such as /dev/zero is streamed like a real terminal, never read ahead.
  bool regular() const { return regular_; }
  // Regular files: SHA-256 and size of the whole content, read with pread (the input still starts at 0).
  Result<std::pair<std::array<uint8_t, 32>, uint64_t>> content_hash() const;

 private:
  FdInput(int fd, bool owned, bool regular) : fd_(fd), owned_(owned), regular_(regular) {}
  int fd_;
  bool owned_;
  bool regular_;
  bool eof_ = false;
};

// Serial output to stdout or a file, unbuffered so output interleaves correctly with deja's messages.
class FileSink : public ByteSink {
 public:
  // As logging/output_file.h's rule for a console: "-" (or /dev/stdout) is stdout; the caller's OutputPlan has
  // checked `path` against the command's other files.
  static Result<std::unique_ptr<FileSink>> open(const std::string& path);
  ~FileSink() override;
  void write(std::span<const uint8_t> bytes) override;
  // The first write error other than a reader that went away (a full disk, /dev/full, a file-size
  // limit): the session stops with a host failure instead of dropping output silently.
  const std::string& error() const { return error_; }

 private:
  explicit FileSink(int fd, bool owned, std::string path) : fd_(fd), owned_(owned), path_(std::move(path)) {}
  int fd_;
  bool owned_;
  std::string path_;
  std::string error_;
  bool closed_ = false;  // the reader of a pipe left: output is dropped, the guest keeps running
};

// Reads a whole file (guest images, modules); errors name the path.
Result<std::vector<uint8_t>> read_file(const std::string& path);

}  // namespace deja
