// Writing the files of an audit trail (signatures, custody records, keys, time-stamp requests) by deja's output-file
// rules, all through one function so the rules live in one place.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <sys/types.h>

#include "core/error.h"

namespace deja {

struct EvidenceFileRules {
  bool replace = true;               // false: refuse when PATH exists (a key is never replaced)
  mode_t mode = 0600;                // 0600 for private keys, custody logs and signatures; 0644 for a public key
  std::vector<std::string> inputs;   // the command's inputs: PATH may be none of them (by device and inode)
};

// Writes `bytes` to PATH.partial (a new file: never through a symlink, never into a device), syncs it and renames it
// over PATH, which must be absent or a regular file; `what` names the file in messages ("signature"). A failure
// removes the .partial file and leaves PATH as it was.
Result<> write_evidence_file(const std::string& path, std::string_view bytes, std::string_view what,
                             const EvidenceFileRules& rules = {});

}  // namespace deja
