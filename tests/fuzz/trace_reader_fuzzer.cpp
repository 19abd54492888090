// libFuzzer target: any bytes as a trace file through the reader, verify and inspect: errors, never a crash or unbounded memory.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <string>

#include "logging/trace_inspect.h"
#include "logging/trace_reader.h"
#include "logging/trace_verify.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // A memfd is a regular file the reader can pread and fstat, with no disk in the loop.
  static const int fd = memfd_create("deja-fuzz-trace", MFD_CLOEXEC);
  static const std::string path = "/proc/self/fd/" + std::to_string(fd);
  if (ftruncate(fd, 0) != 0 || pwrite(fd, data, size, 0) != ssize_t(size)) return 0;
  if (auto reader = deja::TraceReader::open(path)) {
    for (int i = 0; i < 1'000'000; ++i) {
      auto e = (*reader)->next();
      if (!e || !*e) break;
    }
    (void)(*reader)->read_index();
    (void)(*reader)->end_description();
  }
  (void)deja::verify_trace(path);
  static std::FILE* null = std::fopen("/dev/null", "w");
  deja::InspectOptions options;
  options.events = options.serial = true;
  (void)deja::inspect_trace(path, options, null);
  options.json = true;
  (void)deja::inspect_trace(path, options, null);
  return 0;
}
