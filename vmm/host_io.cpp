// Host clock, entropy, description and file-backed serial I/O.
#include "vmm/host_io.h"

#include "logging/output_file.h"
#include "logging/trace_format.h"

#include <fcntl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <fstream>

namespace deja {

uint64_t HostClock::monotonic_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1'000'000'000ull + uint64_t(ts.tv_nsec);
}

HostClock::HostClock() : origin_(monotonic_ns()) {}

uint64_t HostClock::elapsed_ns() const { return monotonic_ns() - origin_; }

int64_t host_unix_time_ns() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return int64_t(ts.tv_sec) * 1'000'000'000ll + ts.tv_nsec;
}

uint64_t host_random64(bool* ok) {
  uint64_t value = 0;
  *ok = getrandom(&value, sizeof(value), GRND_NONBLOCK) == sizeof(value);
  return *ok ? value : 0;
}

std::string host_description() {
  utsname u{};
  uname(&u);
  std::string cpu = "unknown CPU";
  std::ifstream info("/proc/cpuinfo");
  for (std::string line; std::getline(info, line);) {
    if (line.rfind("model name", 0) == 0) {
      auto colon = line.find(':');
      if (colon != std::string::npos) cpu = line.substr(colon + 2);
      break;
    }
  }
  return fmt::format("{} {} {} {}; {}", u.sysname, u.release, u.version, u.machine, cpu);
}

Result<std::unique_ptr<FdInput>> FdInput::open(const std::string& path) {
  if (path == "-") {
    int flags = fcntl(0, F_GETFL);
    if (flags >= 0) fcntl(0, F_SETFL, flags | O_NONBLOCK);
    struct stat st{};
    return std::unique_ptr<FdInput>(new FdInput(0, false, fstat(0, &st) == 0 && S_ISREG(st.st_mode)));
  }
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) return fail(ErrorKind::kInvalidArgument, "cannot open serial input '{}': {}", path, strerror(errno));
  struct stat st{};
  if (fstat(fd, &st) != 0 || S_ISDIR(st.st_mode)) {
    close(fd);
    return fail(ErrorKind::kInvalidArgument, "serial input '{}' is a directory: give a file, a FIFO or a terminal",
                path);
  }
  return std::unique_ptr<FdInput>(new FdInput(fd, true, S_ISREG(st.st_mode)));
}

Result<std::pair<std::array<uint8_t, 32>, uint64_t>> FdInput::content_hash() const {
  if (!regular_) return fail(ErrorKind::kInvalidArgument, "serial input is not a regular file: it is not hashed");
  trace_detail::Sha256Stream sha;
  uint8_t buffer[64 * 1024];
  uint64_t offset = 0;
  for (;;) {
    ssize_t n = ::pread(fd_, buffer, sizeof buffer, off_t(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return fail(ErrorKind::kHost, "cannot read serial input: {}", strerror(errno));
    if (n == 0) break;
    sha.update(buffer, size_t(n));
    offset += uint64_t(n);
  }
  return std::pair{sha.finish(), offset};
}

FdInput::~FdInput() {
  if (owned_) close(fd_);
}

size_t FdInput::read_available(std::span<uint8_t> out, uint64_t /*now_ns: bytes come when the host has them*/) {
  if (eof_ || out.empty()) return 0;
  ssize_t n = ::read(fd_, out.data(), out.size());
  if (n > 0) return size_t(n);
  if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) eof_ = true;
  return 0;
}

Result<std::unique_ptr<FileSink>> FileSink::open(const std::string& path) {
  auto file = open_console_file(path, "serial output");
  if (!file) return std::unexpected(file.error());
  return std::unique_ptr<FileSink>(new FileSink(file->fd, file->owned, file->name));
}

FileSink::~FileSink() {
  if (owned_) close(fd_);
}

void FileSink::write(std::span<const uint8_t> bytes) {
  const uint8_t* p = bytes.data();
  size_t left = bytes.size();
  while (left > 0) {
    if (closed_ || !error_.empty()) return;
    ssize_t n = ::write(fd_, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EPIPE) {
      closed_ = true;  // a pipe's reader left: the guest keeps running, as with a closed terminal
      return;
    }
    if (n <= 0) {
      error_ = fmt::format("cannot write serial output {}: {}", path_, n < 0 ? strerror(errno) : "nothing written");
      return;
    }
    p += n;
    left -= size_t(n);
  }
}

Result<std::vector<uint8_t>> read_file(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return fail(ErrorKind::kInvalidArgument, "cannot open '{}': {}", path, strerror(errno));
  struct stat st{};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return fail(ErrorKind::kInvalidArgument, "'{}' is not a regular file", path);
  }
  std::vector<uint8_t> data(size_t(st.st_size));
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = ::read(fd, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      close(fd);
      return fail(ErrorKind::kHost, "cannot read '{}': {}", path, n < 0 ? strerror(errno) : "unexpected end of file");
    }
    done += size_t(n);
  }
  close(fd);
  return data;
}

}  // namespace deja
