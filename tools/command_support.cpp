// What the subcommands share: error reporting and reading a guest's input files.
#include "tools/command_support.h"

#include "interp/interp_backend.h"
#include "kvm/kvm_usability.h"
#include "logging/trace_format.h"
#include "vmm/exit_status.h"
#include "vmm/messages.h"

#include <fmt/format.h>

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

namespace {

// Why the software CPU cannot present `model`, or "".
std::string interp_lacks(const CpuModel& model) {
  auto missing = model.first_missing(interp_features());
  return missing ? fmt::format("the software CPU does not implement {}, which CPU model {} advertises",
                               missing->label(), model.name())
                 : std::string();
}

// Why KVM here cannot run the guest with `model` (nullptr: any model), or "".
std::string kvm_lacks(const CpuModel* model) {
  const KvmUsability& kvm = kvm_usability();
  if (!kvm.usable()) {
    const HostCheck& first = kvm.checks.front();
    if (!first.passed) return first.detail;  // no VM at all: /dev/kvm missing or inaccessible
    return "this host's KVM cannot run deja's guests: " + kvm.summary();
  }
  if (model) {
    if (auto ok = kvm.supports(*model); !ok) return ok.error().message;
  } else if (!kvm.default_model()) {
    return "no CPU model runs on this host's KVM";
  }
  return {};
}

const CpuModel* richest_for_interp() {
  for (const CpuModel* m : CpuModel::all()) {
    if (interp_lacks(*m).empty()) return m;
  }
  return nullptr;
}

}  // namespace

Result<BackendChoice> choose_backend(const std::string& requested, const std::string& preferred,
                                     const CpuModel* model) {
  std::string backend = requested;
  if (backend.empty()) {
    backend = preferred.empty() ? "kvm" : preferred;
    if (backend == "kvm") {
      if (std::string why = kvm_lacks(model); !why.empty()) {
        say("note: using the software CPU (--backend interp): {}", why);
        backend = "interp";
      } else {
        say("note: using KVM (--backend kvm): this host's KVM passed deja's usability check ({:.1f} ms)",
            double(kvm_usability().elapsed_ns) / 1e6);
      }
    }
  } else if (backend == "kvm") {
    if (std::string why = kvm_lacks(model); !why.empty()) {
      bool interp_can = !model || interp_lacks(*model).empty();
      return fail(ErrorKind::kUnsupported, "--backend kvm: {}{}", why, interp_can ? "; use --backend interp" : "");
    }
  }
  if (backend == "kvm") return BackendChoice{backend, model ? model : kvm_usability().default_model()};
  if (backend != "interp") return fail(ErrorKind::kInvalidArgument, "unknown backend '{}' (use kvm or interp)", backend);
  if (model) {
    if (std::string why = interp_lacks(*model); !why.empty()) return fail(ErrorKind::kUnsupported, "{}", why);
    return BackendChoice{backend, model};
  }
  const CpuModel* richest = richest_for_interp();
  if (!richest) return fail(ErrorKind::kUnsupported, "the software CPU implements none of the CPU models");
  return BackendChoice{backend, richest};
}

Result<GuestInputs> read_guest_inputs(const std::string& image_path, const LoadOptions& load, uint64_t max_bytes) {
  GuestInputs p;
  if (load.modules.size() > kMaxBootModules) {
    return fail(ErrorKind::kInvalidArgument, "{} boot modules: deja boots at most {}", load.modules.size(),
                kMaxBootModules);
  }
  auto image = load.linux_kernel ? read_boot_file(image_path, "Linux kernel", max_bytes)
                                 : read_guest_image(image_path, max_bytes);
  if (!image) return std::unexpected(image.error());
  p.image = std::move(*image);
  for (const auto& m : load.modules) {
    auto bytes = read_boot_file(m.path, "boot module", max_bytes);
    if (!bytes) return std::unexpected(bytes.error());
    p.modules.push_back(std::move(*bytes));
  }
  if (!load.initrd_path.empty()) {
    auto bytes = read_boot_file(load.initrd_path, "initrd", max_bytes);
    if (!bytes) return std::unexpected(bytes.error());
    p.initrd = std::move(*bytes);
  }
  return p;
}

std::optional<size_t> first_invalid_utf8(std::string_view text) {
  const auto* p = reinterpret_cast<const uint8_t*>(text.data());
  const size_t n = text.size();
  for (size_t i = 0; i < n;) {
    const uint8_t c = p[i];
    size_t length = c < 0x80 ? 1 : (c & 0xe0) == 0xc0 ? 2 : (c & 0xf0) == 0xe0 ? 3 : (c & 0xf8) == 0xf0 ? 4 : 0;
    if (length == 0 || i + length > n) return i;
    uint32_t code = length == 1 ? c : c & (0x7f >> length);
    for (size_t k = 1; k < length; ++k) {
      if ((p[i + k] & 0xc0) != 0x80) return i;
      code = (code << 6) | (p[i + k] & 0x3f);
    }
    // Overlong forms, UTF-16 surrogates and values past U+10FFFF are not UTF-8 either.
    static constexpr uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
    if (code < kMin[length] || (code >= 0xd800 && code <= 0xdfff) || code > 0x10ffff) return i;
    i += length;
  }
  return std::nullopt;
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
