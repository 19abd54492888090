// Strong types for guest addresses, so a guest-physical address is never confused with a host pointer.
#pragma once

#include <compare>
#include <cstdint>

namespace deja {

// Guest-physical address.
struct Gpa {
  uint64_t value = 0;
  constexpr auto operator<=>(const Gpa&) const = default;
  constexpr Gpa operator+(uint64_t offset) const { return Gpa{value + offset}; }
};

// Guest-virtual (linear) address.
struct Gva {
  uint64_t value = 0;
  constexpr auto operator<=>(const Gva&) const = default;
  constexpr Gva operator+(uint64_t offset) const { return Gva{value + offset}; }
};

constexpr uint64_t kPageSize = 4096;

}  // namespace deja
