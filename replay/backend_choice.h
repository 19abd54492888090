// Which backend runs a guest and which CPU model it presents (--backend, --cpu, and a replay's recorded choice).
#pragma once

#include <string>

#include "core/cpu_model.h"
#include "core/error.h"

namespace deja {

// Which backend runs the guest and which CPU model it presents.
struct BackendChoice {
  std::string backend;  // "kvm" or "interp"
  const CpuModel* model = nullptr;
};
// Resolves --backend and --cpu. An explicit backend that cannot run here (KVM failing the usability check,
// kvm/kvm_usability.h) or cannot provide `model` is refused, naming why; without one, `preferred` ("kvm" for a
// new run, the recorded backend for a replay) is used when it can, else the software CPU, saying why in one
// line. `model` nullptr: the richest model the chosen backend provides.
Result<BackendChoice> choose_backend(const std::string& requested, const std::string& preferred,
                                     const CpuModel* model);

}  // namespace deja
