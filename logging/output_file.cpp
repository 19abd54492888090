// New files only (O_EXCL|O_NOFOLLOW, 0600), and replacing a regular file by renaming a .partial one over it.
#include "logging/output_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace deja {

namespace {

// What kind of non-regular file `st` is, for messages.
const char* file_kind(const struct stat& st) {
  if (S_ISLNK(st.st_mode)) return "a symbolic link";
  if (S_ISDIR(st.st_mode)) return "a directory";
  if (S_ISFIFO(st.st_mode)) return "a FIFO";
  if (S_ISSOCK(st.st_mode)) return "a socket";
  return "a device";
}

}  // namespace

Result<int> create_new_file(const std::string& path, std::string_view what) {
  // 0600: traces and captures carry guest input (keystrokes, network payloads) and must not be world-readable.
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) {
    int err = errno;
    if (err == EEXIST)
      return fail(ErrorKind::kInvalidArgument, "cannot create {} file {}: it exists already (deja does not write "
                  "over a file it did not create; move or remove it)", what, path);
    return fail(ErrorKind::kHost, "cannot create {} file {}: {}", what, path, std::strerror(err));
  }
  return fd;
}

Result<> check_replaceable(const std::string& path, std::string_view what) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return {};  // nothing there (or unreachable: creating the .partial says so)
  if (S_ISREG(st.st_mode)) return {};
  return fail(ErrorKind::kInvalidArgument,
              "refusing to write the {} to {}: it is {}; deja writes a {} only as a new or regular file", what, path,
              file_kind(st), what);
}

Result<int> create_partial_file(const std::string& path, std::string_view what) {
  if (auto ok = check_replaceable(path, what); !ok) return std::unexpected(ok.error());
  const std::string partial = path + ".partial";
  auto fd = create_new_file(partial, what);
  if (!fd && fd.error().message.find("exists already") != std::string::npos) {
    return fail(ErrorKind::kInvalidArgument,
                "{} exists: the prefix of an earlier {} written to {} that was interrupted (or one still being "
                "written); move or remove it",
                partial, what, path);
  }
  return fd;
}

Result<std::unique_ptr<ReplacingFile>> ReplacingFile::create(const std::string& path, std::string what) {
  auto fd = create_partial_file(path, what);
  if (!fd) return std::unexpected(fd.error());
  return std::unique_ptr<ReplacingFile>(new ReplacingFile(*fd, path, std::move(what)));
}

ReplacingFile::~ReplacingFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink((path_ + ".partial").c_str());  // created by us with O_EXCL: ours to remove
}

Result<> ReplacingFile::write(std::span<const uint8_t> bytes) {
  if (fd_ < 0) return fail(ErrorKind::kInvalidArgument, "{} file {} is already closed", what_, path_);
  const uint8_t* p = bytes.data();
  size_t left = bytes.size();
  while (left > 0) {
    ssize_t n = ::write(fd_, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      return fail(ErrorKind::kHost, "cannot write {} file {}.partial at byte {}: {}", what_, path_, offset_,
                  n < 0 ? std::strerror(errno) : "nothing written");
    }
    p += n;
    left -= size_t(n);
    offset_ += uint64_t(n);
  }
  return {};
}

Result<> ReplacingFile::skip(uint64_t bytes) {
  if (fd_ < 0) return fail(ErrorKind::kInvalidArgument, "{} file {} is already closed", what_, path_);
  if (::lseek(fd_, off_t(bytes), SEEK_CUR) < 0)
    return fail(ErrorKind::kHost, "cannot seek in {} file {}.partial: {}", what_, path_, std::strerror(errno));
  offset_ += bytes;
  skipped_ = true;
  return {};
}

Result<> ReplacingFile::commit() {
  const std::string partial = path_ + ".partial";
  if (fd_ < 0) return fail(ErrorKind::kInvalidArgument, "{} file {} is already closed", what_, path_);
  if (skipped_ && ::ftruncate(fd_, off_t(offset_)) != 0)
    return fail(ErrorKind::kHost, "cannot size {}: {}", partial, std::strerror(errno));
  int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) return fail(ErrorKind::kHost, "cannot close {}: {}", partial, std::strerror(errno));
  // Checked again right before: the target may have been replaced by a symlink or device meanwhile.
  if (auto ok = check_replaceable(path_, what_); !ok) return ok;
  if (::rename(partial.c_str(), path_.c_str()) != 0)
    return fail(ErrorKind::kHost, "cannot rename {} to {}: {}", partial, path_, std::strerror(errno));
  committed_ = true;
  return {};
}

}  // namespace deja
