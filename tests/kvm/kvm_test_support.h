// What every KVM-backend test needs to know about the host: whether deja can use its KVM (else the test skips, or fails under DEJA_REQUIRE_KVM).
#pragma once

#include <cstdlib>
#include <optional>
#include <string>

#include "kvm/kvm_usability.h"

namespace deja {

// Set by the kvm.nested CTest tests, so that an unusable KVM there is a failure rather than a skip.
inline bool kvm_required() { return std::getenv("DEJA_REQUIRE_KVM") != nullptr; }

// Why KVM tests cannot run here ("" when they can): no /dev/kvm, or one that fails deja's usability check
// (kvm-pvm and the like). Such hosts run them inside scripts/kvm-nested.sh instead.
inline std::optional<std::string> kvm_unusable_reason() {
  const KvmUsability& kvm = kvm_usability();
  if (kvm.usable()) return std::nullopt;
  return "KVM is not usable here (" + kvm.summary() + ")";
}

// The CPU model the tests present: the richest this host's KVM runs.
inline const CpuModel& kvm_test_model() {
  const CpuModel* m = kvm_usability().default_model();
  return m ? *m : CpuModel::x86_64_v1();
}

}  // namespace deja

// In SetUp() or a TEST body: skip (or fail, under DEJA_REQUIRE_KVM) where deja cannot use KVM.
#define DEJA_REQUIRE_USABLE_KVM()                                                                    \
  do {                                                                                               \
    if (auto why = ::deja::kvm_unusable_reason()) {                                                  \
      if (::deja::kvm_required()) FAIL() << "DEJA_REQUIRE_KVM is set but " << *why;                  \
      GTEST_SKIP() << *why << "; these tests run inside scripts/kvm-nested.sh";                      \
    }                                                                                                \
  } while (0)
