// deja's own messages: one line each on stderr, prefixed "deja:" (the guest's serial output owns stdout).
#pragma once

#include <cstdio>
#include <string>
#include <utility>

#include <fmt/format.h>

namespace deja {

template <typename... Args>
void say(fmt::format_string<Args...> format, Args&&... args) {
  std::string line = "deja: " + fmt::format(format, std::forward<Args>(args)...) + "\n";
  std::fputs(line.c_str(), stderr);
}

}  // namespace deja
