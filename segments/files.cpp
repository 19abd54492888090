// Products through logging/output_file's ProductFile, small reads, directories.
#include "segments/files.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "logging/output_file.h"

namespace deja {

Result<> write_product(const std::string& path, std::span<const uint8_t> bytes, std::string_view what) {
  auto file = ProductFile::create_replacing(path, std::string(what), ProductFile::Unfinished::kRemove);
  if (!file) return std::unexpected(file.error());
  if (auto r = (*file)->write(bytes); !r) return r;
  return (*file)->commit();
}

Result<> write_product(const std::string& path, std::string_view text, std::string_view what) {
  return write_product(path, std::span(reinterpret_cast<const uint8_t*>(text.data()), text.size()), what);
}

Result<> write_work_file(const std::string& path, std::string_view text, std::string_view what) {
  ::unlink((path + ".partial").c_str());
  return write_product(path, text, what);
}

Result<std::string> read_small_file(const std::string& path, std::string_view what, uint64_t max_bytes) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return fail(ErrorKind::kInvalidArgument, "cannot open {} {}: {}", what, path,
                                                   std::strerror(errno));
  if (!S_ISREG(st.st_mode)) return fail(ErrorKind::kInvalidArgument, "{} {} is not a regular file", what, path);
  if (uint64_t(st.st_size) > max_bytes) {
    return fail(ErrorKind::kInvalidArgument, "{} {} is {} bytes, more than the {} a {} can be", what, path, st.st_size,
                max_bytes, what);
  }
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  if (!in && !in.eof()) return fail(ErrorKind::kHost, "cannot read {} {}", what, path);
  return text.str();
}

Result<> make_directories(const std::string& path) {
  std::error_code ec;
  std::filesystem::path p(path);
  std::filesystem::path built;
  for (const auto& part : p) {
    built /= part;
    if (std::filesystem::exists(built, ec)) continue;
    if (::mkdir(built.c_str(), 0700) != 0 && errno != EEXIST) {
      return fail(ErrorKind::kHost, "cannot create directory {}: {}", built.string(), std::strerror(errno));
    }
  }
  if (!std::filesystem::is_directory(path, ec)) return fail(ErrorKind::kInvalidArgument, "{} is not a directory", path);
  return {};
}

std::string absolute_path(const std::string& path) {
  std::error_code ec;
  return std::filesystem::absolute(path, ec).lexically_normal().string();
}

}  // namespace deja
