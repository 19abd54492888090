// One line of a host self-test (`deja selftest`): the KVM usability check and the PMU check both report these.
#pragma once

#include <string>
#include <vector>

namespace deja {

struct HostCheck {
  std::string name;    // e.g. "guest code runs natively", "counts guest only"
  bool passed = false;
  bool skipped = false;
  std::string detail;  // measured values, or why it failed
};

// "name: detail" of every failed (not skipped) check, joined by "; ".
std::string failed_checks(const std::vector<HostCheck>& checks);

}  // namespace deja
