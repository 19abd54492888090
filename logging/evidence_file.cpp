// write_evidence_file: the output-file rules of logging/output_file.h, plus no-clobber and the inputs check.
#include "logging/evidence_file.h"

#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "logging/output_file.h"

namespace deja {

Result<> write_evidence_file(const std::string& path, std::string_view bytes, std::string_view what,
                             const EvidenceFileRules& rules) {
  struct stat target {};
  if (::stat(path.c_str(), &target) == 0) {
    for (const std::string& input : rules.inputs) {
      struct stat st {};
      if (::stat(input.c_str(), &st) == 0 && st.st_dev == target.st_dev && st.st_ino == target.st_ino)
        return fail(ErrorKind::kInvalidArgument, "refusing to write the {} to {}: that file is {}, an input", what,
                    path, input);
    }
    if (!rules.replace)
      return fail(ErrorKind::kInvalidArgument, "cannot write the {} to {}: it exists already (deja does not replace "
                  "it; move or remove it)", what, path);
  }
  auto fd = create_partial_file(path, what);
  if (!fd) return std::unexpected(fd.error());
  const std::string partial = path + ".partial";
  auto failed = [&](std::string message) {
    ::close(*fd);
    ::unlink(partial.c_str());  // created by us with O_EXCL: ours to remove
    return std::unexpected(Error{ErrorKind::kHost, std::move(message)});
  };
  for (size_t done = 0; done < bytes.size();) {
    ssize_t n = ::write(*fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return failed(fmt::format("cannot write {}: {}", partial, n < 0 ? std::strerror(errno) : "no space"));
    done += size_t(n);
  }
  if (rules.mode != 0600 && ::fchmod(*fd, rules.mode) != 0)
    return failed(fmt::format("cannot set the mode of {}: {}", partial, std::strerror(errno)));
  if (::fsync(*fd) != 0) return failed(fmt::format("cannot sync {}: {}", partial, std::strerror(errno)));
  if (::close(*fd) != 0) {
    ::unlink(partial.c_str());
    return fail(ErrorKind::kHost, "cannot close {}: {}", partial, std::strerror(errno));
  }
  Result<> moved;
  if (!rules.replace) {
    if (::renameat2(AT_FDCWD, partial.c_str(), AT_FDCWD, path.c_str(), RENAME_NOREPLACE) != 0)
      moved = fail(errno == EEXIST ? ErrorKind::kInvalidArgument : ErrorKind::kHost, "cannot rename {} to {}: {}",
                   partial, path, std::strerror(errno));
  } else if (auto ok = check_replaceable(path, what); !ok) {  // again right before: it may have changed meanwhile
    moved = ok;
  } else if (::rename(partial.c_str(), path.c_str()) != 0) {
    moved = fail(ErrorKind::kHost, "cannot rename {} to {}: {}", partial, path, std::strerror(errno));
  }
  if (!moved) ::unlink(partial.c_str());
  return moved;
}

}  // namespace deja
