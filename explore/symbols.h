// Symbols for the addresses `deja explore --minimize` reports: from an ELF's symbol table or a System.map.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "core/error.h"

namespace deja::explore {

class Symbols {
 public:
  // An ELF (32- or 64-bit, its .symtab: functions and objects) or a System.map ("ADDRESS TYPE NAME" lines).
  static Result<Symbols> load(const std::string& path);
  // "name+0xOFFSET" for the symbol at or below `address`, or "" when none is.
  std::string describe(uint64_t address) const;
  size_t size() const { return by_address_.size(); }

 private:
  std::map<uint64_t, std::string> by_address_;
};

}  // namespace deja::explore
