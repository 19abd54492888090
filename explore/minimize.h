// Delta debugging (ddmin) over a failing run's perturbations, for `deja explore --minimize`: the fewest that fail.
#pragma once

#include <cstddef>
#include <functional>
#include <vector>

namespace deja::explore {

// A set of the items that may be taken away: removed[i] says item i is.
using Removal = std::vector<bool>;

struct Minimized {
  Removal removed;     // what the failure does not need: every item left is needed (1-minimal)
  unsigned tests = 0;  // calls of still_fails (each removal once: the answers are kept)
};

// Zeller and Hildebrandt's ddmin (IEEE TSE 28(2), 2002) over `items` items, with the run with none removed known to
// fail: it tries subsets and their complements of what is left, at a granularity that doubles while neither fails, and
// ends when taking away any one item left makes the run pass (the run with all removed included). `still_fails` must
// be deterministic; it is called at most (n^2 + 3n) / 2 + 1 times, about 2 k log2(n) when k items are needed. The
// removal returned is the last one still_fails said yes to (none removed when it said yes to none), so a caller need
// keep only the latest failing run.
Minimized minimize_failure(size_t items, const std::function<bool(const Removal&)>& still_fails);

}  // namespace deja::explore
