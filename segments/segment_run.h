// Running one item of a job: a segment (restore its start checkpoint, replay its slice with its task, check where it ends) or a shard.
#pragma once

#include <cstdint>
#include <string>

#include "segments/manifest.h"

namespace deja {

struct ItemOptions {
  std::string task;   // "" = the manifest's
  std::string store;  // "" = the manifest's
};

// Runs item `index`. Never fails as a call: what goes wrong is the result's error (naming the segment, its coordinates
// and the divergence) and status (deja's exit status for it).
segments::ItemResult run_item(const LoadedManifest& manifest, uint32_t index, const ItemOptions& options);

}  // namespace deja
