// Writing the files of an audit trail (signatures, custody records, keys, time-stamp requests) by deja's one
// output-file rule (logging/output_file.h).
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

// Writes `bytes` as a product of the one output-file rule (logging/output_file.h: an OutputPlan of `rules.inputs` and
// PATH, then a ProductFile): PATH.partial, synced and renamed over PATH, which must be absent or a regular file and
// none of the inputs; `what` names the file in messages ("signature"). A failure removes the .partial file and
// leaves PATH as it was. A command with more outputs checks them all in its own plan first.
Result<> write_evidence_file(const std::string& path, std::string_view bytes, std::string_view what,
                             const EvidenceFileRules& rules = {});

}  // namespace deja
