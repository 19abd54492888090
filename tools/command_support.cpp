// What the subcommands share: error reporting and reading a guest's input files.
#include "tools/command_support.h"

#include "logging/trace_format.h"
#include "vmm/exit_status.h"
#include "vmm/messages.h"

namespace deja {

int report_error(const Error& e) {
  say("{}", e.message);
  switch (e.kind) {
    case ErrorKind::kInvalidArgument:
    case ErrorKind::kBadImage:
    case ErrorKind::kBadTrace:
    case ErrorKind::kUnsupported:
      return exit_status::kUsage;
    case ErrorKind::kDivergence:
      return exit_status::kDivergence;
    case ErrorKind::kGuest:
      return exit_status::kGuestStopped;
    case ErrorKind::kHost:
      return exit_status::kHostFailure;
  }
  return exit_status::kHostFailure;
}

void finish_outcome_message(const Outcome& o) {
  if (!o.guest_exit && o.status != exit_status::kDivergence && o.status != exit_status::kTraceEnded) {
    // Backends put the register dump and the last exits into the reason of a stopped vCPU.
    say("{}", o.reason);
  }
}

Result<GuestInputs> read_guest_inputs(const std::string& image_path, const LoadOptions& load) {
  GuestInputs p;
  auto image = read_boot_file(image_path, load.linux_kernel ? "Linux kernel" : "guest image");
  if (!image) return std::unexpected(image.error());
  p.image = std::move(*image);
  for (const auto& m : load.modules) {
    auto bytes = read_boot_file(m.path, "boot module");
    if (!bytes) return std::unexpected(bytes.error());
    p.modules.push_back(std::move(*bytes));
  }
  if (!load.initrd_path.empty()) {
    auto bytes = read_boot_file(load.initrd_path, "initrd");
    if (!bytes) return std::unexpected(bytes.error());
    p.initrd = std::move(*bytes);
  }
  return p;
}

trace::InputFile input_file(const std::string& role, const std::string& path, std::span<const uint8_t> bytes) {
  trace::InputFile f;
  f.set_role(role);
  f.set_path(path);
  auto sha = sha256_bytes(bytes);
  f.set_sha256(sha.data(), sha.size());
  f.set_size(bytes.size());
  return f;
}


}  // namespace deja
