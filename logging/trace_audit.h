// `deja inspect --audit`: one page for an auditor: what was recorded, where, when and by whom, what the guest did
// across the machine boundary, and whether everything verifies.
#pragma once

#include <cstdio>
#include <string>

#include "logging/trace_verify.h"

namespace deja {

// Text (strings from the trace escaped: control characters never reach the terminal) or, with `json`, one JSON
// object with the same content. Returns an error only when the trace cannot be opened at all; a trace that fails
// verification is described, with the failure, and `failed` is set.
Result<> audit_trace(const std::string& path, const VerifyOptions& options, bool json, std::FILE* out, bool& failed);

}  // namespace deja
