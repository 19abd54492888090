// The output-file rule: a command's files checked up front; consoles opened; products written, checked, renamed.
#include "logging/output_file.h"

#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>

namespace deja {

namespace {

// What kind of non-regular file `st` is, for messages.
const char* file_kind(const struct stat& st) {
  if (S_ISLNK(st.st_mode)) return "a symbolic link";
  if (S_ISDIR(st.st_mode)) return "a directory";
  if (S_ISFIFO(st.st_mode)) return "a FIFO";
  if (S_ISSOCK(st.st_mode)) return "a socket";
  if (S_ISBLK(st.st_mode)) return "a block device";
  return "a device";
}

std::string canonical_path(const std::string& path) {
  std::error_code ec;
  std::filesystem::path absolute = std::filesystem::absolute(path, ec);
  if (ec) return path;
  std::filesystem::path canonical = std::filesystem::weakly_canonical(absolute, ec);
  return ec ? absolute.lexically_normal().string() : canonical.string();
}

// deja's own standard output or error, named as a console path.
std::optional<int> standard_stream(const std::string& path) {
  if (path == "-" || path == "/dev/stdout") return 1;
  if (path == "/dev/stderr") return 2;
  return std::nullopt;
}

std::string partial_exists_message(const std::string& partial, const std::string& what, const std::string& path) {
  return fmt::format("{} exists: the prefix of an earlier {} written to {} that was interrupted (or one still being "
                     "written); move or remove it",
                     partial, what, path);
}

// Whether `canonical` names a member of PREFIX.N SUFFIX, or its .partial.
bool numbered_member(const std::string& canonical, const std::pair<std::string, std::string>& pattern) {
  const auto& [prefix, suffix] = pattern;
  if (!canonical.starts_with(prefix)) return false;
  std::string_view rest = std::string_view(canonical).substr(prefix.size());
  if (rest.ends_with(".partial")) rest.remove_suffix(8);
  if (!rest.ends_with(suffix)) return false;
  rest.remove_suffix(suffix.size());
  return !rest.empty() && rest.find_first_not_of("0123456789") == std::string_view::npos;
}

// The checks of rule 2 for `kind`.
Result<> check_kind(const std::string& what, const std::string& path, OutputKind kind) {
  if (kind == OutputKind::kConsole && standard_stream(path)) return {};
  struct stat st {};
  if (kind == OutputKind::kProduct) {
    const std::string partial = path + ".partial";
    if (::lstat(partial.c_str(), &st) == 0) {
      return fail(ErrorKind::kInvalidArgument, "{}", partial_exists_message(partial, what, path));
    }
  }
  // Absent (to be created; a missing directory is reported when it is), or a regular file.
  if (::lstat(path.c_str(), &st) != 0 || S_ISREG(st.st_mode)) return {};
  if (kind == OutputKind::kConsole) {
    struct stat target {};
    const bool to_stream = S_ISLNK(st.st_mode) && ::stat(path.c_str(), &target) == 0 &&
                           (S_ISCHR(target.st_mode) || S_ISFIFO(target.st_mode) || S_ISSOCK(target.st_mode));
    if (S_ISCHR(st.st_mode) || S_ISFIFO(st.st_mode) || S_ISSOCK(st.st_mode) || to_stream) return {};
    if (S_ISLNK(st.st_mode)) {
      return fail(ErrorKind::kInvalidArgument,
                  "refusing to write {} to {}: it is a symbolic link to a file; deja follows a symbolic link only to a "
                  "terminal, pipe or device (give the path of the file itself)",
                  what, path);
    }
    return fail(ErrorKind::kInvalidArgument,
                "refusing to write {} to {}: it is {}; give a file, a terminal, a pipe or a character device", what,
                path, file_kind(st));
  }
  return fail(ErrorKind::kInvalidArgument,
              "refusing to write {} to {}: it is {}; deja writes {} only as a new or regular file", what, path,
              file_kind(st), what);
}

}  // namespace

OutputPlan::Entry OutputPlan::describe(std::string what, const std::string& path, std::optional<OutputKind> output) {
  Entry e;
  e.what = std::move(what);
  e.path = path;
  e.output = output;
  struct stat st {};
  const auto stream = output == OutputKind::kConsole ? standard_stream(path) : std::nullopt;
  if (stream ? ::fstat(*stream, &st) == 0 : ::stat(path.c_str(), &st) == 0) {
    // A terminal, FIFO or device is a stream, not a file whose contents deja could destroy: never compared.
    e.comparable = S_ISREG(st.st_mode);
    e.exists = true;
    e.dev = st.st_dev;
    e.ino = st.st_ino;
  }
  if (!stream) e.canonical = canonical_path(path);
  return e;
}

bool OutputPlan::same_file(const Entry& a, const Entry& b) {
  auto in_numbered = [](const Entry& numbered, const Entry& other) {
    if (!numbered.numbered || !other.comparable) return false;
    if (!other.canonical.empty() && numbered_member(other.canonical, *numbered.numbered)) return true;
    for (const auto& [dev, ino] : numbered.members) {
      if (other.exists && other.dev == dev && other.ino == ino) return true;
    }
    return false;
  };
  if (a.numbered || b.numbered) return in_numbered(a, b) || in_numbered(b, a);
  if (!a.comparable || !b.comparable || a.exists != b.exists) return false;
  if (a.exists) return a.dev == b.dev && a.ino == b.ino;
  return !a.canonical.empty() && a.canonical == b.canonical;
}

void OutputPlan::add_input(std::string what, const std::string& path) {
  if (path.empty() || path == "-") return;
  entries_.push_back(describe(std::move(what), path, std::nullopt));
}

void OutputPlan::add_output(std::string what, const std::string& path, OutputKind kind) {
  if (path.empty()) return;  // an output not asked for
  entries_.push_back(describe(what, path, kind));
  // The file a product is written to first must be no other file either (`record -o T --serial-out T.partial`).
  if (kind == OutputKind::kProduct) {
    entries_.push_back(describe(std::move(what), path + ".partial", kind));
    entries_.back().partial = true;
  }
}

void OutputPlan::add_numbered_output(std::string what, const std::string& prefix, const std::string& suffix) {
  Entry entry;
  entry.what = std::move(what);
  entry.path = prefix + "N" + suffix;
  entry.output = OutputKind::kProduct;
  // The members' directory made canonical, and the prefix of their names as they are spelt.
  const std::filesystem::path p(prefix);
  const std::string directory = canonical_path(p.has_parent_path() ? p.parent_path().string() : ".");
  entry.numbered = std::pair{(std::filesystem::path(directory) / p.filename()).string(), suffix};
  for (uint64_t n = 0;; ++n) {
    struct stat st {};
    if (::stat(fmt::format("{}{}{}", prefix, n, suffix).c_str(), &st) != 0) break;
    if (S_ISREG(st.st_mode)) entry.members.emplace_back(st.st_dev, st.st_ino);
  }
  entries_.push_back(std::move(entry));
}

Result<> OutputPlan::check() const {
  for (size_t j = 0; j < entries_.size(); ++j) {
    for (size_t i = 0; i < j; ++i) {
      const Entry& a = entries_[i];
      const Entry& b = entries_[j];
      if ((!a.output && !b.output) || !same_file(a, b)) continue;
      // Named from the output's side (the later one when both are outputs).
      const Entry& mine = b.output ? b : a;
      const Entry& other = b.output ? a : b;
      const std::string where = other.path == mine.path ? "" : fmt::format(" ({})", other.path);
      return fail(ErrorKind::kInvalidArgument,
                  "{} {} is also {}{}: deja never writes over a file it {} (give {} a file of its own)", mine.what,
                  standard_stream(mine.path) ? "(standard output)" : mine.path, other.what, where,
                  other.output ? "writes for another purpose" : "reads", mine.what);
    }
  }
  for (const Entry& e : entries_) {
    // A product's .partial (added with it) is checked with its product.
    if (!e.output || e.numbered || e.partial) continue;
    if (auto ok = check_kind(e.what, e.path, *e.output); !ok) return ok;
  }
  return {};
}

Result<ConsoleFile> open_console_file(const std::string& path, std::string_view what) {
  if (auto stream = standard_stream(path)) {
    return ConsoleFile{*stream, false, *stream == 1 ? "standard output" : "standard error"};
  }
  struct stat st {};
  const bool link = ::lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode);
  // Through a symbolic link only to what is not a regular file (checked below); a regular file is made or opened
  // without following one, and truncated only once opened.
  const int flags = O_WRONLY | O_CLOEXEC | O_NOCTTY;
  int fd = link ? ::open(path.c_str(), flags) : ::open(path.c_str(), flags | O_CREAT | O_NOFOLLOW, 0644);
  if (fd < 0) {
    const int err = errno;
    if (err == EISDIR) return fail(ErrorKind::kInvalidArgument, "{} '{}' is a directory", what, path);
    return fail(ErrorKind::kInvalidArgument, "cannot create {} '{}': {}", what, path, std::strerror(err));
  }
  if (::fstat(fd, &st) != 0 || S_ISDIR(st.st_mode) || S_ISBLK(st.st_mode) || (link && S_ISREG(st.st_mode))) {
    ::close(fd);
    return fail(ErrorKind::kInvalidArgument,
                "refusing to write {} to {}: it is {}; give a file, a terminal, a pipe or a character device", what,
                path, link ? "a symbolic link to a file" : file_kind(st));
  }
  if (S_ISREG(st.st_mode) && ::ftruncate(fd, 0) != 0) {
    const int err = errno;
    ::close(fd);
    return fail(ErrorKind::kHost, "cannot truncate {} '{}': {}", what, path, std::strerror(err));
  }
  return ConsoleFile{fd, true, path};
}

Result<std::unique_ptr<ProductFile>> ProductFile::create_replacing(const std::string& path, std::string what,
                                                                   Unfinished unfinished) {
  return create(path, std::move(what), true, unfinished);
}

Result<std::unique_ptr<ProductFile>> ProductFile::create_new(const std::string& path, std::string what) {
  return create(path, std::move(what), false, Unfinished::kKeep);
}

Result<std::unique_ptr<ProductFile>> ProductFile::create(const std::string& path, std::string what, bool replacing,
                                                         Unfinished unfinished) {
  const std::string writing = replacing ? path + ".partial" : path;
  std::unique_ptr<ProductFile> f(new ProductFile(std::move(what), path, writing));
  f->unfinished_ = unfinished;
  const std::filesystem::path p(path);
  f->final_name_ = p.filename().string();
  f->writing_name_ = std::filesystem::path(writing).filename().string();
  f->directory_ = p.has_parent_path() ? p.parent_path().string() : ".";
  if (replacing) {
    if (auto ok = check_kind("the " + f->what_, path, OutputKind::kProduct); !ok) return std::unexpected(ok.error());
  }
  if (f->final_name_.empty() || f->final_name_ == "." || f->final_name_ == "..") {
    return fail(ErrorKind::kInvalidArgument, "refusing to write the {} to {}: it is a directory", f->what_, path);
  }
  // The directory is held open: the file is made, checked and renamed inside it, whatever its path comes to name.
  f->dir_fd_ = ::open(f->directory_.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (f->dir_fd_ < 0) {
    return fail(ErrorKind::kHost, "cannot create {} file {}: {}", f->what_, writing, std::strerror(errno));
  }
  // 0600: products carry guest input (keystrokes, network payloads, memory) and must not be world-readable.
  f->fd_ = ::openat(f->dir_fd_, f->writing_name_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (f->fd_ < 0) {
    const int err = errno;
    if (err == EEXIST && replacing) {
      return fail(ErrorKind::kInvalidArgument, "{}", partial_exists_message(writing, f->what_, path));
    }
    if (err == EEXIST) {
      return fail(ErrorKind::kInvalidArgument, "cannot create {} file {}: it exists already (deja does not write "
                  "over a file it did not create; move or remove it)", f->what_, path);
    }
    return fail(ErrorKind::kHost, "cannot create {} file {}: {}", f->what_, writing, std::strerror(err));
  }
  struct stat st {};
  ::fstat(f->fd_, &st);
  f->dev_ = st.st_dev;
  f->ino_ = st.st_ino;
  return f;
}

ProductFile::~ProductFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_ && unfinished_ == Unfinished::kRemove && dir_fd_ >= 0) {
    // Only the file deja made: one that replaced it meanwhile is someone else's.
    struct stat st {};
    if (::fstatat(dir_fd_, writing_name_.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && st.st_dev == dev_ &&
        st.st_ino == ino_) {
      ::unlinkat(dir_fd_, writing_name_.c_str(), 0);
    }
  }
  if (dir_fd_ >= 0) ::close(dir_fd_);
}

Result<> ProductFile::write(std::span<const uint8_t> bytes) {
  if (fd_ < 0) return fail(ErrorKind::kInvalidArgument, "{} file {} is already closed", what_, writing_path_);
  if (failed_) return fail(ErrorKind::kHost, "{} file {} had a write error earlier", what_, writing_path_);
  const uint8_t* p = bytes.data();
  size_t left = bytes.size();
  while (left > 0) {
    ssize_t n = ::write(fd_, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      failed_ = true;
      return fail(ErrorKind::kHost, "cannot write {} file {} at byte {}: {}", what_, writing_path_, offset_,
                  n < 0 ? std::strerror(errno) : "nothing written");
    }
    p += n;
    left -= size_t(n);
    offset_ += uint64_t(n);
  }
  written_end_ = offset_;
  return {};
}

Result<> ProductFile::skip(uint64_t bytes) {
  if (fd_ < 0) return fail(ErrorKind::kInvalidArgument, "{} file {} is already closed", what_, writing_path_);
  if (failed_) return fail(ErrorKind::kHost, "{} file {} had a write error earlier", what_, writing_path_);
  if (bytes > uint64_t(INT64_MAX) - offset_ || ::lseek(fd_, off_t(offset_ + bytes), SEEK_SET) < 0) {
    failed_ = true;
    return fail(ErrorKind::kHost, "cannot seek in {} file {} to byte {}: {}", what_, writing_path_, offset_ + bytes,
                std::strerror(errno ? errno : EOVERFLOW));
  }
  offset_ += bytes;
  return {};
}

Result<> ProductFile::sync() {
  if (fd_ >= 0 && ::fdatasync(fd_) != 0) {
    failed_ = true;
    return fail(ErrorKind::kHost, "cannot fdatasync {} file {}: {}", what_, writing_path_, std::strerror(errno));
  }
  return {};
}

Result<> ProductFile::set_mode(mode_t mode) {
  if (fd_ >= 0 && ::fchmod(fd_, mode) != 0) {
    return fail(ErrorKind::kHost, "cannot set the mode of {} file {}: {}", what_, writing_path_, std::strerror(errno));
  }
  return {};
}

Result<> ProductFile::check_intact() const {
  struct stat dir {}, by_path {}, file {};
  if (::fstat(dir_fd_, &dir) != 0 || dir.st_nlink == 0) {
    return fail(ErrorKind::kHost, "the directory {} was removed while deja wrote its {} {} there: the {} is lost",
                directory_, what_, writing_path_, what_);
  }
  if (::stat(directory_.c_str(), &by_path) != 0 || by_path.st_dev != dir.st_dev || by_path.st_ino != dir.st_ino) {
    return fail(ErrorKind::kHost,
                "the directory {} was moved or replaced while deja wrote its {} {} there: the {} is {} in the "
                "directory that was moved, not renamed to {}",
                directory_, what_, writing_path_, what_, writing_name_, final_name_);
  }
  if (::fstatat(dir_fd_, writing_name_.c_str(), &file, AT_SYMLINK_NOFOLLOW) != 0) {
    return fail(ErrorKind::kHost, "{} was removed while deja wrote it: the {} is lost", writing_path_, what_);
  }
  if (file.st_dev != dev_ || file.st_ino != ino_) {
    return fail(ErrorKind::kHost,
                "{} was replaced by another file while deja wrote it: that file is not deja's {} (which is lost), "
                "and deja does not rename it to {}",
                writing_path_, what_, final_path_);
  }
  // Its size is the end of the last bytes written, or the logical end once a final hole was sized (commit).
  if (fd_ >= 0 && ::fstat(fd_, &file) == 0 && uint64_t(file.st_size) != written_end_) {
    return fail(ErrorKind::kHost,
                "{} was changed by another program while deja wrote it ({} bytes, deja wrote {}): it is not the {} "
                "deja wrote, and deja does not rename it to {}",
                writing_path_, file.st_size, written_end_, what_, final_path_);
  }
  return {};
}

Result<> ProductFile::commit(Replace replace) {
  if (fd_ < 0) return fail(ErrorKind::kInvalidArgument, "{} file {} is already closed", what_, writing_path_);
  if (auto ok = check_intact(); !ok) return ok;
  // A file ending in a hole: its size is set now, once checked to be what deja wrote.
  if (written_end_ != offset_) {
    if (::ftruncate(fd_, off_t(offset_)) != 0) {
      failed_ = true;
      return fail(ErrorKind::kHost, "cannot size {} file {}: {}", what_, writing_path_, std::strerror(errno));
    }
    written_end_ = offset_;
  }
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) return fail(ErrorKind::kHost, "cannot close {}: {}", writing_path_, std::strerror(errno));
  if (writing_name_ != final_name_) {
    // Checked again right before: the target may have been replaced by a symlink or device meanwhile.
    struct stat st {};
    if (::fstatat(dir_fd_, final_name_.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && !S_ISREG(st.st_mode)) {
      return fail(ErrorKind::kInvalidArgument, "refusing to write the {} to {}: it is {} now; the complete {} is in {}",
                  what_, final_path_, file_kind(st), what_, writing_path_);
    }
    const unsigned flags = replace == Replace::kNever ? RENAME_NOREPLACE : 0;
    if (::renameat2(dir_fd_, writing_name_.c_str(), dir_fd_, final_name_.c_str(), flags) != 0) {
      if (errno == EEXIST) {
        return fail(ErrorKind::kInvalidArgument, "cannot write the {} to {}: it exists already (deja does not replace "
                    "it; move or remove it)", what_, final_path_);
      }
      return fail(ErrorKind::kHost, "cannot rename {} to {}: {}; the complete {} is in {}", writing_path_, final_path_,
                  std::strerror(errno), what_, writing_path_);
    }
  }
  committed_ = true;
  return {};
}

}  // namespace deja
