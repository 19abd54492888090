// Planning a job (segments at checkpoints, or shards), and the manifest's JSON form.
#include "segments/manifest.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>

#include <fmt/format.h>
#include <google/protobuf/util/json_util.h>

#include "core/messages.h"
#include "logging/trace_format.h"
#include "logging/trace_reader.h"
#include "replay/trace_config.h"
#include "segments/files.h"
#include "segments/store.h"
#include "segments/tasks.h"
#include "segments/trace_checkpoints.h"

namespace deja {
namespace {

constexpr uint64_t kMaxManifestBytes = uint64_t{256} << 20;

std::string bytes_of(const StateSha& sha) { return std::string(sha.begin(), sha.end()); }

segments::FileRef file_ref(const std::string& role, const std::string& path, const std::string& sha256, uint64_t size) {
  segments::FileRef f;
  f.set_role(role);
  f.set_path(path);
  f.set_sha256(sha256);
  f.set_size(size);
  return f;
}

// With a store, the file goes into it (hashed first where the trace does not name its hash).
Result<> store_file(const std::string& store, segments::FileRef& f) {
  if (store.empty()) return {};
  if (f.sha256().size() != 32) {
    auto sha = file_sha256(f.path());
    if (!sha) return std::unexpected(sha.error());
    f.set_sha256(bytes_of(*sha));
  }
  StateSha sha{};
  std::copy(f.sha256().begin(), f.sha256().end(), sha.begin());
  return store_put(store, f.path(), sha, f.role());
}

}  // namespace

std::string manifest_path(const std::string& workdir) { return workdir + "/manifest.json"; }
std::string result_path(const std::string& workdir, uint32_t index) {
  return fmt::format("{}/results/item-{}.json", workdir, index);
}
std::string log_path(const std::string& workdir, uint32_t index) {
  return fmt::format("{}/logs/item-{}.log", workdir, index);
}

uint32_t item_count(const segments::Manifest& m) {
  return m.kind() == "segments" ? uint32_t(m.segments_size()) : m.shards();
}

segments::Position to_proto(const CheckpointPosition& at) {
  segments::Position p;
  p.set_steps(at.steps);
  p.set_events(at.events);
  p.set_branches(at.branches);
  p.set_guest_exits(at.guest_exits);
  p.set_instructions(at.instructions);
  return p;
}

CheckpointPosition from_proto(const segments::Position& p) {
  return CheckpointPosition{p.steps(), p.events(), p.branches(), p.guest_exits(), p.instructions()};
}

std::string describe_boundary(const segments::Manifest& m, uint64_t checkpoint, bool end) {
  if (checkpoint == 0) return end ? "the recording's End" : "the recording's start";
  for (const auto& c : m.checkpoints()) {
    if (c.number() == checkpoint) {
      return fmt::format("checkpoint {} (instructions {}, events {}, steps {})", checkpoint, c.at().instructions(),
                         c.at().events(), c.at().steps());
    }
  }
  return fmt::format("checkpoint {}", checkpoint);
}

std::string to_json(const google::protobuf::Message& message) {
  std::string out;
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(message, &out, options);
  return out;
}

Result<> from_json(const std::string& text, google::protobuf::Message& message, const std::string& what) {
  google::protobuf::util::JsonParseOptions options;
  auto status = google::protobuf::util::JsonStringToMessage(text, &message, options);
  if (!status.ok()) return fail(ErrorKind::kInvalidArgument, "{} is not valid: {}", what, status.ToString());
  return {};
}

Result<segments::Manifest> plan_segments(const PlanOptions& o) {
  if (auto task = make_segment_task(o.task); !task) return std::unexpected(task.error());
  const std::string trace = absolute_path(o.trace);
  auto reader = TraceReader::open(trace);
  if (!reader) return fail(ErrorKind::kInvalidArgument, "{}", reader.error().message);
  auto index = (*reader)->read_index();
  if (!index) {
    return fail(ErrorKind::kInvalidArgument, "{}; segments need a complete trace (`deja verify {}` says why it is not)",
                index.error().message, o.trace);
  }
  const trace::Header header = (*reader)->header();
  auto recorded = from_header(header);
  if (!recorded) return fail(recorded.error().kind, "{}: {}", o.trace, recorded.error().message);
  const std::string serialized = header.SerializeAsString();
  const CheckpointIdentity identity{
      sha256_bytes(std::span(reinterpret_cast<const uint8_t*>(serialized.data()), serialized.size())),
      recorded->memory_bytes, o.backend.empty() ? recorded->backend : o.backend};

  segments::Manifest m;
  m.set_version(kManifestVersion);
  m.set_kind("segments");
  m.set_task(o.task);
  m.set_trace_header_sha256(bytes_of(identity.trace_header_sha256));
  m.set_backend(o.backend);
  m.set_interp_mode(o.interp_mode);
  m.set_workdir(absolute_path(o.workdir.empty() ? trace + ".segments" : o.workdir));
  if (!o.store.empty()) m.set_store(absolute_path(o.store));
  *m.mutable_trace() = file_ref("trace", trace, "", (*reader)->file_size());
  if (auto r = store_file(m.store(), *m.mutable_trace()); !r) return std::unexpected(r.error());

  // The inputs a replay reads, as `deja replay` finds them (the paths given, else the recorded ones), with the hashes
  // the trace names them by.
  for (const RecordedInput& in : recorded->inputs) {
    if (in.role == "serial-in" || in.role == "tftp") continue;  // its bytes are in the trace
    std::string path = in.path;
    if ((in.role == "image" || in.role == "kernel") && !o.image_path.empty()) path = o.image_path;
    if (in.role == "initrd" && !o.initrd_path.empty()) path = o.initrd_path;
    *m.add_inputs() = file_ref(in.role, absolute_path(path), in.sha256, in.size);
  }
  uint64_t disk_bytes = 0;
  for (size_t i = 0; i < recorded->disks.size(); ++i) {
    const RecordedDisk& d = recorded->disks[i];
    const std::string path = i < o.disk_paths.size() && !o.disk_paths[i].empty() ? o.disk_paths[i] : d.path;
    const bool full = d.identity.hash_block == 0;
    *m.add_inputs() = file_ref("disk", absolute_path(path), full ? bytes_of(d.identity.sha256) : "", d.identity.size);
    disk_bytes += d.identity.size;
  }
  for (auto& f : *m.mutable_inputs()) {
    if (auto r = store_file(m.store(), f); !r) return std::unexpected(r.error());
  }

  // The checkpoints: each file read whole and checked. A damaged one is only a cache lost: it is left out, with the
  // checkpoints stored relative to it.
  const std::string directory = o.checkpoints.empty() ? checkpoint_directory(trace) : absolute_path(o.checkpoints);
  const uint64_t max_bytes = identity.ram_bytes + identity.ram_bytes / 256 + disk_bytes + disk_bytes / 256 +
                             (uint64_t{64} << 20);
  uint64_t usable_parent = 0;  // the last checkpoint kept, which the next delta must be stored relative to
  StateSha usable_digest{};
  for (uint64_t number = 1;; ++number) {
    const std::string path = directory + "/" + checkpoint_file_name(number);
    if (::access(path.c_str(), F_OK) != 0) break;
    auto file = read_trace_checkpoint(path, identity, max_bytes);
    if (!file) {
      say("warning: {}; left out, with the checkpoints stored relative to it", file.error().message);
      usable_parent = 0;
      continue;
    }
    const TraceCheckpointMeta& meta = file->meta;
    const segments::CheckpointRef* previous = m.checkpoints().empty() ? nullptr : &*m.checkpoints().rbegin();
    std::string problem;
    if (meta.number != number) {
      problem = fmt::format("it says it is checkpoint {}", meta.number);
    } else if (!meta.full() && (meta.parent != usable_parent || usable_parent == 0 || meta.parent_digest != usable_digest)) {
      problem = fmt::format("it is stored relative to checkpoint {}, which is missing or was left out", meta.parent);
    } else if (previous && meta.at.instructions <= previous->at().instructions() && meta.at.events <= previous->at().events()) {
      problem = "it lies before the checkpoint before it";
    } else if (meta.at.instructions > index->instructions() && index->instructions() != 0) {
      problem = fmt::format("it lies at instruction {}, past the trace's end at {}", meta.at.instructions,
                            index->instructions());
    }
    if (!problem.empty()) {
      say("warning: checkpoint file {}: {}; left out", path, problem);
      usable_parent = 0;
      continue;
    }
    segments::CheckpointRef* c = m.add_checkpoints();
    c->set_number(meta.number);
    c->set_parent(meta.parent);
    *c->mutable_file() = file_ref("checkpoint", path, bytes_of(file->sha256), file->file_bytes);
    *c->mutable_at() = to_proto(meta.at);
    c->set_digest(bytes_of(meta.digest));
    c->set_next_raw_event(meta.next_raw_event);
    if (auto r = store_file(m.store(), *c->mutable_file()); !r) return std::unexpected(r.error());
    usable_parent = meta.number;
    usable_digest = meta.digest;
  }

  // Segment boundaries: checkpoints near equal shares of the trace's instructions, or all of them.
  std::vector<const segments::CheckpointRef*> cuts;
  const uint64_t total = index->instructions();
  auto nearest_after = [&](double target) -> const segments::CheckpointRef* {
    const segments::CheckpointRef* best = nullptr;
    const uint64_t after = cuts.empty() ? 0 : cuts.back()->at().instructions();
    for (const auto& c : m.checkpoints()) {
      if (c.at().instructions() <= after) continue;
      if (!best || std::abs(double(c.at().instructions()) - target) < std::abs(double(best->at().instructions()) - target)) {
        best = &c;
      }
    }
    return best;
  };
  if (o.every_instructions > 0 && total > 0) {
    for (uint64_t target = o.every_instructions; target < total; target += o.every_instructions) {
      if (const segments::CheckpointRef* c = nearest_after(double(target))) cuts.push_back(c);
    }
  } else if (o.segments > 1 && total > 0) {
    // N - 1 cuts, at k/N of the instructions (steps of total/N rounded down put an N-th cut just before the End: a
    // last segment of a few instructions, or the last checkpoint's tail as a segment of its own).
    for (uint32_t k = 1; k < o.segments; ++k) {
      if (const segments::CheckpointRef* c = nearest_after(double(total) * k / o.segments)) cuts.push_back(c);
    }
  } else if (o.segments != 1) {
    // Every checkpoint (a trace that counts no instructions, KVM's, is cut at all of them too).
    for (const auto& c : m.checkpoints()) cuts.push_back(&c);
  }
  uint64_t start = 0;
  for (size_t i = 0; i <= cuts.size(); ++i) {
    segments::Segment* s = m.add_segments();
    s->set_index(uint32_t(i));
    s->set_start_checkpoint(start);
    s->set_end_checkpoint(i < cuts.size() ? cuts[i]->number() : 0);
    start = s->end_checkpoint();
  }
  return m;
}

Result<segments::Manifest> plan_shards(const std::string& kind, const std::vector<std::string>& args, uint32_t shards,
                                       const std::string& workdir) {
  if (!make_shard_task(kind)) return fail(ErrorKind::kInvalidArgument, "this deja has no sharded task '{}'", kind);
  if (shards == 0) return fail(ErrorKind::kInvalidArgument, "a campaign needs at least one shard");
  segments::Manifest m;
  m.set_version(kManifestVersion);
  m.set_kind(kind);
  m.set_workdir(absolute_path(workdir));
  for (const auto& a : args) m.add_shard_args(a);
  m.set_shards(shards);
  return m;
}

Result<std::string> write_manifest(const segments::Manifest& m) {
  for (const char* sub : {"", "/results", "/logs"}) {
    if (auto r = make_directories(m.workdir() + sub); !r) return std::unexpected(r.error());
  }
  const std::string path = manifest_path(m.workdir());
  if (auto r = write_work_file(path, to_json(m), "manifest"); !r) return std::unexpected(r.error());
  return path;
}

Result<LoadedManifest> read_manifest(const std::string& path) {
  auto text = read_small_file(path, "manifest", kMaxManifestBytes);
  if (!text) return std::unexpected(text.error());
  LoadedManifest loaded;
  loaded.path = path;
  loaded.sha256 = sha256_bytes(std::span(reinterpret_cast<const uint8_t*>(text->data()), text->size()));
  segments::Manifest& m = loaded.manifest;
  if (auto r = from_json(*text, m, "manifest " + path); !r) return std::unexpected(r.error());
  auto bad = [&](std::string what) {
    return std::unexpected(Error{ErrorKind::kInvalidArgument, fmt::format("manifest {}: {}", path, what)});
  };
  if (m.version() != kManifestVersion) {
    return bad(fmt::format("version {}, this deja reads version {}", m.version(), kManifestVersion));
  }
  if (m.workdir().empty()) return bad("it names no work directory");
  if (m.kind() != "segments") {
    if (m.shards() == 0 || m.shards() > 1'000'000) return bad(fmt::format("{} shards", m.shards()));
    return loaded;
  }
  if (m.segments_size() == 0) return bad("it has no segments");
  if (m.trace_header_sha256().size() != 32) return bad("its trace header hash is not 32 bytes");
  auto known = [&](uint64_t number) {
    return std::any_of(m.checkpoints().begin(), m.checkpoints().end(),
                       [&](const segments::CheckpointRef& c) { return c.number() == number; });
  };
  uint64_t previous_end = 0;
  for (int i = 0; i < m.segments_size(); ++i) {
    const segments::Segment& s = m.segments(i);
    if (s.index() != uint32_t(i)) return bad(fmt::format("segment {} is listed as {}", i, s.index()));
    if (s.start_checkpoint() != previous_end) {
      return bad(fmt::format("segment {} starts at checkpoint {}, not where segment {} ends", i, s.start_checkpoint(),
                             i - 1));
    }
    for (uint64_t c : {s.start_checkpoint(), s.end_checkpoint()}) {
      if (c != 0 && !known(c)) return bad(fmt::format("segment {} names checkpoint {}, which it does not list", i, c));
    }
    if ((s.end_checkpoint() == 0) != (i + 1 == m.segments_size())) {
      return bad("only the last segment ends at the recording's End");
    }
    previous_end = s.end_checkpoint();
  }
  for (const auto& c : m.checkpoints()) {
    if (c.digest().size() != 32 || c.file().sha256().size() != 32) {
      return bad(fmt::format("checkpoint {} has no digest or file hash", c.number()));
    }
    if (c.parent() != 0 && !known(c.parent())) {
      return bad(fmt::format("checkpoint {} is stored relative to {}, which it does not list", c.number(), c.parent()));
    }
  }
  return loaded;
}

}  // namespace deja
