// create_output_file: deja's output-file rule plus "never one of the command's inputs".
#include "tools/output_target.h"

#include <sys/stat.h>

#include <filesystem>

namespace deja {
namespace {

// The same file, whatever the name: (device, inode) when it exists (symbolic links followed, hard links equal),
// else the normalized absolute path.
std::string identity(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) return fmt::format("inode {}:{}", st.st_dev, st.st_ino);
  std::error_code ec;
  return "path " + std::filesystem::weakly_canonical(std::filesystem::absolute(path, ec), ec).string();
}

}  // namespace

Result<std::unique_ptr<ReplacingFile>> create_output_file(const std::string& path, const std::string& what,
                                                          std::span<const std::string> inputs) {
  if (path.empty()) return fail(ErrorKind::kInvalidArgument, "no file named for the {}", what);
  const std::string target = identity(path);
  for (const std::string& input : inputs) {
    if (!input.empty() && identity(input) == target) {
      return fail(ErrorKind::kInvalidArgument, "refusing to write the {} to {}: that is {}, one of this command's "
                  "inputs; name a file of its own", what, path, input);
    }
  }
  return ReplacingFile::create(path, what);
}

}  // namespace deja
