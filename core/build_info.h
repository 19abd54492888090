// deja's version and build id (the git commit it was built from), recorded in every trace header.
#pragma once

namespace deja {
const char* build_id();
const char* deja_version();
}  // namespace deja
