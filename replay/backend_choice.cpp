// Which backend runs a guest and which CPU model it presents: KVM where this host's KVM can, else the software CPU.
#include "replay/backend_choice.h"

#include <fmt/format.h>

#include "core/messages.h"
#include "interp/interp_backend.h"
#include "kvm/kvm_usability.h"

namespace deja {

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

}  // namespace deja
