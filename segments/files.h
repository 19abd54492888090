// How segments/ reads and writes its files: products go through one function, so that deja's output-file rule applies in one place.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "core/error.h"

namespace deja {

// Writes a product (a checkpoint file, a manifest, a result, a batch script) as PATH.partial renamed over PATH
// (logging/output_file.h): a reader never sees half of one, and an older file at PATH survives a failure. `what` names
// it in messages.
Result<> write_product(const std::string& path, std::span<const uint8_t> bytes, std::string_view what);
Result<> write_product(const std::string& path, std::string_view text, std::string_view what);
// The same in a job's work directory, which is deja's own: a PATH.partial left by a worker that was killed (a task
// Slurm runs again) is removed first.
Result<> write_work_file(const std::string& path, std::string_view text, std::string_view what);
// A whole file of at most `max_bytes` (a manifest, a result).
Result<std::string> read_small_file(const std::string& path, std::string_view what, uint64_t max_bytes);
// mkdir -p, mode 0700 for what is created (results hold guest data).
Result<> make_directories(const std::string& path);
// `path` made absolute against the current directory (lexically normalised), for manifests other hosts read.
std::string absolute_path(const std::string& path);

}  // namespace deja
