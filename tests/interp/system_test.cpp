// Interp backend: paging faults, IDT delivery (IST, privilege change), SYSCALL/SYSRET, interrupts, mode switches.
#include <gtest/gtest.h>

#include "tests/interp/interp_test_util.h"

namespace deja::test {
namespace {
}  // namespace
}  // namespace deja::test
