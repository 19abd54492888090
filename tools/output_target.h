// The files a command writes from its results (memory dumps, HTML timelines, domain XML): one place that applies
// deja's output-file rule (logging/output_file.h) and keeps them apart from the command's own inputs.
#pragma once

#include <memory>
#include <span>
#include <string>

#include "core/error.h"
#include "logging/output_file.h"

namespace deja {

// PATH written as PATH.partial and renamed over it on commit (never through a symbolic link, never a device), after
// checking that PATH is none of `inputs` (by path, hard link or symbolic link): a mistyped option must not replace a
// trace, an image or a disk. `what` names the file in messages ("memory dump").
Result<std::unique_ptr<ReplacingFile>> create_output_file(const std::string& path, const std::string& what,
                                                          std::span<const std::string> inputs);

}  // namespace deja
