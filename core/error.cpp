// Always-on assertion failure reporting.
#include "core/error.h"

#include <cstdio>
#include <cstdlib>

namespace deja {

void assertion_failed(const char* expr, const char* file, int line, const std::string& context) {
  std::fprintf(stderr, "deja: internal error: assertion '%s' failed at %s:%d%s%s\n", expr, file, line,
               context.empty() ? "" : ": ", context.c_str());
  std::abort();
}

}  // namespace deja
