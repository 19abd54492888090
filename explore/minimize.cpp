// ddmin over a failing run's perturbations (minimize.h): subsets, then complements, at growing granularity.
#include "explore/minimize.h"

#include <algorithm>
#include <iterator>
#include <map>
#include <numeric>

namespace deja::explore {

Minimized minimize_failure(size_t items, const std::function<bool(const Removal&)>& still_fails) {
  Minimized result;
  // Every removal tried, with its answer: ddmin comes back to the same sets (at granularity 2 a chunk's complement is
  // the other chunk), and each answer here is a whole run of the guest.
  std::map<Removal, bool> answers{{Removal(items, false), true}};
  auto fails_keeping = [&](const std::vector<size_t>& kept) {
    Removal removed(items, true);
    for (size_t i : kept) removed[i] = false;
    auto [at, fresh] = answers.try_emplace(std::move(removed), false);
    if (fresh) {
      ++result.tests;
      at->second = still_fails(at->first);
    }
    return at->second;
  };

  std::vector<size_t> kept(items);
  std::iota(kept.begin(), kept.end(), size_t{0});
  size_t granularity = 2;
  while (!kept.empty()) {
    // n chunks of what is left, as even as can be; one chunk when one item is left, whose complement is none at all.
    const size_t n = std::min(granularity, kept.size());
    std::vector<std::vector<size_t>> chunks(n);
    for (size_t c = 0; c < n; ++c) {
      chunks[c].assign(kept.begin() + c * kept.size() / n, kept.begin() + (c + 1) * kept.size() / n);
    }
    const auto fails_alone = std::find_if(chunks.begin(), chunks.end(), [&](const std::vector<size_t>& chunk) {
      return chunk.size() < kept.size() && fails_keeping(chunk);
    });
    if (fails_alone != chunks.end()) {
      kept = *fails_alone;
      granularity = 2;
      continue;
    }
    bool reduced = false;
    for (const std::vector<size_t>& chunk : chunks) {
      std::vector<size_t> complement;
      std::set_difference(kept.begin(), kept.end(), chunk.begin(), chunk.end(), std::back_inserter(complement));
      if (fails_keeping(complement)) {
        kept = std::move(complement);
        granularity = std::max<size_t>(n - 1, 2);
        reduced = true;
        break;
      }
    }
    if (reduced) continue;
    if (n == kept.size()) break;  // no single item can go: 1-minimal
    granularity = std::min(2 * n, kept.size());
  }
  result.removed.assign(items, true);
  for (size_t i : kept) result.removed[i] = false;
  return result;
}

}  // namespace deja::explore
