// A job's manifest: the trace cut into segments at its checkpoints (or a campaign cut into shards), every file named by SHA-256.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/error.h"
#include "segments/segments.pb.h"
#include "snapshot/trace_checkpoint.h"

namespace deja {

constexpr uint32_t kManifestVersion = 1;

struct PlanOptions {
  std::string trace;
  std::string task = "verify";
  uint32_t segments = 0;            // about this many segments of equal length (0: as `every`, else one per checkpoint)
  uint64_t every_instructions = 0;  // segments about this long
  std::string checkpoints;          // "" = TRACE.ckpt
  std::string store;                // put every file into this content-addressed store ("" = none)
  std::string workdir;              // "" = TRACE.segments
  std::string backend;              // "" = the recording's
  std::string interp_mode;
  std::string image_path, initrd_path;  // as `deja replay` takes them ("" = the recorded paths)
  std::vector<std::string> disk_paths;
};

// Reads the trace's header and index and its checkpoints (each file read whole and checked; one that fails is left
// out with a warning, and the checkpoints stored relative to it too: they are only a cache), and cuts the trace at
// checkpoints into segments. With a store, every file a worker reads goes into it first.
Result<segments::Manifest> plan_segments(const PlanOptions& options);
// A campaign of `shards` shards of the command `args`, run by the ShardTask registered as `kind`.
Result<segments::Manifest> plan_shards(const std::string& kind, const std::vector<std::string>& args, uint32_t shards,
                                       const std::string& workdir);

std::string manifest_path(const std::string& workdir);
std::string result_path(const std::string& workdir, uint32_t index);
std::string log_path(const std::string& workdir, uint32_t index);
// The number of items (segments or shards).
uint32_t item_count(const segments::Manifest& manifest);

// Writes WORKDIR/manifest.json (creating WORKDIR, results/ and logs/); returns its path.
Result<std::string> write_manifest(const segments::Manifest& manifest);
// Reads and checks a manifest (version, kind, every reference in range); also its SHA-256, which results name.
struct LoadedManifest {
  segments::Manifest manifest;
  StateSha sha256{};
  std::string path;
};
Result<LoadedManifest> read_manifest(const std::string& path);

std::string to_json(const google::protobuf::Message& message);
Result<> from_json(const std::string& text, google::protobuf::Message& message, const std::string& what);

// A position as the manifest holds it, and back.
segments::Position to_proto(const CheckpointPosition& at);
CheckpointPosition from_proto(const segments::Position& at);
// "checkpoint 3 (instructions 3000000000, events 123456)" / "the recording's start" / "the recording's End".
std::string describe_boundary(const segments::Manifest& manifest, uint64_t checkpoint, bool end);

}  // namespace deja
