// Store layout, hashing, reflink-or-copy into the store, lookups.
#include "segments/store.h"

#include <fcntl.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <optional>

#include <fmt/format.h>

#include "logging/output_file.h"
#include "logging/trace_format.h"
#include "segments/files.h"

namespace deja {

std::string store_path(const std::string& store, const StateSha& sha256) {
  return fmt::format("{}/sha256/{}", store, hex(sha256));
}

Result<StateSha> file_sha256(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return fail(ErrorKind::kInvalidArgument, "cannot open {}: {}", path, std::strerror(errno));
  trace_detail::Sha256Stream h;
  std::vector<uint8_t> buffer(1 << 20);
  for (;;) {
    ssize_t n = ::read(fd, buffer.data(), buffer.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int e = errno;
      ::close(fd);
      return fail(ErrorKind::kHost, "cannot read {}: {}", path, std::strerror(e));
    }
    if (n == 0) break;
    h.update(buffer.data(), size_t(n));
  }
  ::close(fd);
  return h.finish();
}

Result<> store_put(const std::string& store, const std::string& path, const StateSha& sha256, const std::string& what) {
  const std::string target = store_path(store, sha256);
  if (::access(target.c_str(), F_OK) == 0) return {};
  if (auto r = make_directories(store + "/sha256"); !r) return r;
  int in = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (in < 0) return fail(ErrorKind::kInvalidArgument, "cannot open {} {}: {}", what, path, std::strerror(errno));
  // The store is deja's own content-addressed directory: a .partial left by an interrupted put is only ever that.
  const std::string partial = target + ".partial";
  ::unlink(partial.c_str());
  std::optional<int> out = ::open(partial.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (*out < 0) {
    int e = errno;
    ::close(in);
    return fail(ErrorKind::kHost, "cannot create store entry {}: {}", partial, std::strerror(e));
  }
  auto give_up = [&](Error e) {
    ::close(in);
    ::close(*out);
    ::unlink(partial.c_str());
    return std::unexpected(e);
  };
  trace_detail::Sha256Stream h;
  const bool cloned = ::ioctl(*out, FICLONE, in) == 0;
  std::vector<uint8_t> buffer(1 << 20);
  for (;;) {
    ssize_t n = ::read(in, buffer.data(), buffer.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return give_up(Error{ErrorKind::kHost, fmt::format("cannot read {}: {}", path, std::strerror(errno))});
    if (n == 0) break;
    h.update(buffer.data(), size_t(n));
    for (ssize_t done = 0; !cloned && done < n;) {
      ssize_t w = ::write(*out, buffer.data() + done, size_t(n - done));
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) {
        return give_up(Error{ErrorKind::kHost, fmt::format("cannot write {}: {}", partial, std::strerror(errno))});
      }
      done += w;
    }
  }
  if (h.finish() != sha256) {
    return give_up(Error{ErrorKind::kInvalidArgument,
                         fmt::format("{} {} changed: its SHA-256 is no longer the {} it was planned with", what, path,
                                     hex(sha256).substr(0, 16))});
  }
  ::close(in);
  if (::fsync(*out) != 0 || ::close(*out) != 0 || ::rename(partial.c_str(), target.c_str()) != 0) {
    int e = errno;
    ::unlink(partial.c_str());
    return fail(ErrorKind::kHost, "cannot finish store entry {}: {}", target, std::strerror(e));
  }
  return {};
}

Result<std::string> store_find(const std::string& store, const StateSha& sha256, const std::string& path,
                               const std::string& what) {
  if (store.empty()) return path;
  const std::string found = store_path(store, sha256);
  if (::access(found.c_str(), R_OK) != 0) {
    return fail(ErrorKind::kInvalidArgument, "the {} {} (SHA-256 {}) is missing from the store {}: {}", what, path,
                hex(sha256), store, std::strerror(errno));
  }
  return found;
}

}  // namespace deja
