// Creating the files deja writes for the user (traces, packet captures): never through a symlink, never into a device.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "core/error.h"

namespace deja {

// Creates `path` as a new file, mode 0600 (O_CREAT|O_EXCL|O_NOFOLLOW): no existing file, symlink target or device is
// ever opened for writing. `what` names the kind of file in messages ("trace"). Returns the descriptor.
Result<int> create_new_file(const std::string& path, std::string_view what);

// Whether a file may be renamed over `path`: nothing is there, or a regular file. `what` as above.
Result<> check_replaceable(const std::string& path, std::string_view what);

// The first half of writing PATH by renaming PATH.partial over it (the convention of `deja record -o`): `path` may be
// replaced (check_replaceable), and PATH.partial is created (create_new_file). A .partial already there is named as
// the prefix of an earlier write to PATH that was interrupted. Returns the .partial file's descriptor.
Result<int> create_partial_file(const std::string& path, std::string_view what);

// A file written as PATH.partial (create_new_file) and renamed over PATH by commit(), the convention of
// `deja record -o`: an earlier file at PATH survives a failed write, and PATH, when it exists, must be a regular
// file. Destroyed without commit(), it removes its .partial file (for derived files; a trace keeps its prefix).
class ReplacingFile {
 public:
  static Result<std::unique_ptr<ReplacingFile>> create(const std::string& path, std::string what);
  ~ReplacingFile();
  ReplacingFile(const ReplacingFile&) = delete;
  ReplacingFile& operator=(const ReplacingFile&) = delete;

  Result<> write(std::span<const uint8_t> bytes);
  // Leaves `bytes` zero bytes as a hole (a sparse file), for memory images.
  Result<> skip(uint64_t bytes);
  // Closes the .partial file and renames it over PATH (checked again right before).
  Result<> commit();
  const std::string& path() const { return path_; }
  uint64_t bytes_written() const { return offset_; }

 private:
  ReplacingFile(int fd, std::string path, std::string what) : fd_(fd), path_(std::move(path)), what_(std::move(what)) {}
  int fd_;
  std::string path_;
  std::string what_;
  uint64_t offset_ = 0;
  bool skipped_ = false;  // a hole may end the file: commit() sets its size
  bool committed_ = false;
};

}  // namespace deja
