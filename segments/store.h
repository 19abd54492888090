// The content-addressed store: the files a job needs (images, kernels, initrds, disks, the trace and its checkpoints) by SHA-256.
#pragma once

#include <string>

#include "core/error.h"
#include "snapshot/trace_checkpoint.h"

namespace deja {

// DIR/sha256/HEX: a worker on another machine finds a file by the hash the trace or the manifest names it by, since a
// trace holds its inputs' hashes, not their bytes.
std::string store_path(const std::string& store, const StateSha& sha256);
// SHA-256 of a file (streamed).
Result<StateSha> file_sha256(const std::string& path);
// Puts `path` into the store unless it is there already: a reflink where the file system has them, else a copy, whose
// bytes are checked against `sha256` (a file that changed since it was hashed is refused, naming it). Never a hard
// link: a store entry must not change when the original is edited in place.
Result<> store_put(const std::string& store, const std::string& path, const StateSha& sha256, const std::string& what);
// Where a worker reads the file: the store's copy (which must be there: a missing one is an error naming `what` and
// its hash), or `path` without a store.
Result<std::string> store_find(const std::string& store, const StateSha& sha256, const std::string& path,
                               const std::string& what);

}  // namespace deja
