// Parses the --progress option into a ProgressChoice.
#include "replay/progress_choice.h"

#include <charconv>
#include <string_view>

namespace deja {

Result<ProgressChoice> parse_progress(const std::string& spec) {
  ProgressChoice c;
  if (spec == "exact") return c;
  if (spec == "exit-sync") {
    c.mode = ProgressMode::kExitSync;
    return c;
  }
  constexpr std::string_view kEmulated = "emulated-pmu:";
  if (spec.starts_with(kEmulated)) {
    std::string rest = spec.substr(kEmulated.size());
    std::string skid_text = rest.substr(0, rest.find(':'));
    auto number = [&](const std::string& text, const char* what) -> Result<uint64_t> {
      uint64_t v = 0;
      auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
      if (text.empty() || ec != std::errc() || end != text.data() + text.size()) {
        return fail(ErrorKind::kInvalidArgument, "--progress {}: the {} '{}' is not a non-negative integer", spec,
                    what, text);
      }
      return v;
    };
    auto skid = number(skid_text, "skid");
    if (!skid) return std::unexpected(skid.error());
    c.emulated_skid = *skid;
    if (rest.find(':') != std::string::npos) {
      auto seed = number(rest.substr(rest.find(':') + 1), "seed");
      if (!seed) return std::unexpected(seed.error());
      c.emulated_seed = *seed;
    }
    return c;
  }
  return fail(ErrorKind::kInvalidArgument,
              "--progress '{}' is not one of exact, exit-sync, emulated-pmu:SKID or emulated-pmu:SKID:SEED", spec);
}


}  // namespace deja
