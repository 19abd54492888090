// One item: files found (store or paths), replay opened, start checkpoint restored, the task run to the end checkpoint or the End, and everything there checked.
#include "segments/segment_run.h"

#include <sys/resource.h>
#include <unistd.h>

#include <chrono>

#include <fmt/format.h>

#include "core/exit_status.h"
#include "logging/trace_format.h"
#include "replay/replay_setup.h"
#include "segments/store.h"
#include "segments/tasks.h"
#include "segments/trace_checkpoints.h"

namespace deja {
namespace {

std::string bytes_of(const StateSha& sha) { return std::string(sha.begin(), sha.end()); }
StateSha sha_of(const std::string& bytes) {
  StateSha sha{};
  if (bytes.size() == sha.size()) std::copy(bytes.begin(), bytes.end(), sha.begin());
  return sha;
}

std::string host_name() {
  char name[256] = {};
  ::gethostname(name, sizeof name - 1);
  return name;
}

segments::ChainLink to_proto(const TraceReader::ChainPoint& p) {
  segments::ChainLink l;
  l.set_chunk(p.chunk);
  l.set_first_event(p.first_event);
  l.set_chain_before(bytes_of(p.chain_before));
  return l;
}

const segments::CheckpointRef* find_checkpoint(const segments::Manifest& m, uint64_t number) {
  for (const auto& c : m.checkpoints()) {
    if (c.number() == number) return &c;
  }
  return nullptr;
}

// The files to read to restore checkpoint `number`: back to the full checkpoint it is stored relative to.
Result<std::vector<CheckpointFileRef>> checkpoint_chain(const segments::Manifest& m, uint64_t number,
                                                        const std::string& store) {
  std::vector<CheckpointFileRef> chain;
  for (uint64_t at = number; at != 0;) {
    const segments::CheckpointRef* c = find_checkpoint(m, at);
    if (!c || chain.size() > size_t(m.checkpoints_size())) {
      return fail(ErrorKind::kInvalidArgument, "the manifest's checkpoint {} cannot be reached", number);
    }
    auto path = store_find(store, sha_of(c->file().sha256()), c->file().path(), fmt::format("checkpoint {}", at));
    if (!path) return std::unexpected(path.error());
    chain.insert(chain.begin(), CheckpointFileRef{c->number(), c->parent(), *path, sha_of(c->file().sha256()),
                                                  sha_of(c->digest())});
    at = c->parent();
  }
  return chain;
}

class SegmentRun {
 public:
  SegmentRun(const LoadedManifest& loaded, uint32_t index, const ItemOptions& options)
      : m_(loaded.manifest), index_(index), store_(options.store.empty() ? m_.store() : options.store) {
    r_.set_index(index);
    r_.set_manifest_sha256(bytes_of(loaded.sha256));
    r_.set_task(options.task.empty() ? m_.task() : options.task);
    r_.set_host(host_name());
  }

  segments::ItemResult run() {
    if (auto done = segment(); !done) {
      r_.set_ok(false);
      r_.set_status(done.error().kind == ErrorKind::kBadTrace ? exit_status::kTraceEnded
                                                               : exit_status::of(done.error().kind));
      r_.set_error(where_ + done.error().message);
    } else {
      r_.set_ok(true);
      r_.set_status(0);
    }
    return r_;
  }

 private:
  Result<std::string> find(const segments::FileRef& f, const std::string& what) {
    if (f.sha256().size() != 32) return f.path();  // a lazily hashed disk, planned without a store
    return store_find(store_, sha_of(f.sha256()), f.path(), what);
  }

  Result<> segment() {
    if (index_ >= uint32_t(m_.segments_size())) {
      return fail(ErrorKind::kInvalidArgument, "item {}: the manifest has {} segments", index_, m_.segments_size());
    }
    const segments::Segment& seg = m_.segments(int(index_));
    where_ = fmt::format("segment {} (from {} to {}): ", index_, describe_boundary(m_, seg.start_checkpoint(), false),
                         describe_boundary(m_, seg.end_checkpoint(), true));
    auto task = make_segment_task(r_.task());
    if (!task) return std::unexpected(task.error());

    ReplaySetupOptions ro;
    auto trace = find(m_.trace(), "trace");
    if (!trace) return std::unexpected(trace.error());
    ro.trace_path = *trace;
    ro.backend = m_.backend();
    ro.interp_mode = m_.interp_mode();
    ro.serial_out = "/dev/null";
    ro.restores_checkpoint = seg.start_checkpoint() != 0;
    for (const auto& in : m_.inputs()) {
      auto path = find(in, in.role());
      if (!path) return std::unexpected(path.error());
      if (in.role() == "image" || in.role() == "kernel") ro.image_path = *path;
      else if (in.role() == "initrd") ro.initrd_path = *path;
      else if (in.role() == "module") ro.module_paths.push_back(*path);
      else if (in.role() == "disk") ro.disk_paths.push_back(*path);
    }
    auto setup = open_replay(ro);
    if (!setup) return std::unexpected(setup.error());
    if (sha_of(m_.trace_header_sha256()) != setup->identity.trace_header_sha256) {
      return fail(ErrorKind::kInvalidArgument, "the trace {} is not the one the manifest was planned for", *trace);
    }
    Session& session = *setup->session;
    Engine& engine = session.engine();
    const bool steps = session.machine().backend().step_count().has_value();
    if ((*task)->needs_steps() && !steps) {
      return fail(ErrorKind::kUnsupported, "task {} needs a backend that counts steps (interp)", r_.task());
    }

    uint64_t first_event = 0;
    if (seg.start_checkpoint() != 0) {
      auto chain = checkpoint_chain(m_, seg.start_checkpoint(), store_);
      if (!chain) return std::unexpected(chain.error());
      auto digest = restore_trace_checkpoint(session, setup->identity, *chain);
      if (!digest) return std::unexpected(digest.error());
      r_.set_start_digest(bytes_of(digest->value));
      first_event = find_checkpoint(m_, seg.start_checkpoint())->next_raw_event();
    }
    const CheckpointPosition start = session.checkpoint_position();
    *r_.mutable_start() = deja::to_proto(start);

    StopRequest end;
    const segments::CheckpointRef* to = seg.end_checkpoint() ? find_checkpoint(m_, seg.end_checkpoint()) : nullptr;
    if (to) {
      if (steps) end.at_step = to->at().steps();
      else end.at_event = to->at().events();
    }
    std::vector<std::string> records;
    auto stopped = (*task)->run(session, end, records);
    if (!stopped) return std::unexpected(stopped.error());
    for (auto& line : records) r_.add_records(std::move(line));
    const CheckpointPosition here = session.checkpoint_position();
    *r_.mutable_end() = deja::to_proto(here);
    r_.set_events(here.events - start.events);
    if (engine.divergence()) return fail(ErrorKind::kDivergence, "{}", engine.divergence()->report);
    TraceReader& reader = *engine.reader();
    if (auto link = reader.chain_point(first_event)) *r_.mutable_chain_start() = to_proto(*link);

    if (stopped->kind == StopReason::Kind::kInterrupted) return fail(ErrorKind::kHost, "interrupted");
    if (to) {
      if (stopped->kind == StopReason::Kind::kEnd) {
        return fail(ErrorKind::kBadTrace, "the replay ended ({}) at instruction {}, before the segment's end",
                    stopped->outcome.reason, here.instructions);
      }
      if (here != from_proto(to->at())) {
        return fail(ErrorKind::kDivergence,
                    "the replay stopped at steps {} instructions {} events {} guest exits {}, but checkpoint {} lies "
                    "at steps {} instructions {} events {} guest exits {}",
                    here.steps, here.instructions, here.events, here.guest_exits, to->number(), to->at().steps(),
                    to->at().instructions(), to->at().events(), to->at().guest_exits());
      }
      auto state = session.capture_state();
      if (!state) return std::unexpected(state.error());
      auto digest = state_digest(session, *state);
      if (!digest) return std::unexpected(digest.error());
      r_.set_end_digest(bytes_of(digest->value));
      if (digest->value != sha_of(to->digest())) {
        std::string parts;
        if (auto path = store_find(store_, sha_of(to->file().sha256()), to->file().path(), "checkpoint")) {
          if (auto file = read_trace_checkpoint(*path, setup->identity, UINT64_MAX)) {
            parts = differing_parts(file->meta.parts, digest->parts);
          }
        }
        return fail(ErrorKind::kDivergence,
                    "the state at the segment's end has digest {}, checkpoint {} names {}{}: the digests do not chain",
                    hex(digest->value).substr(0, 16), to->number(), hex(to->digest()).substr(0, 16),
                    parts.empty() ? "" : fmt::format(" (differing: {})", parts));
      }
      auto next = reader.chain_point(to->next_raw_event());
      if (!next) {
        return fail(ErrorKind::kBadTrace, "the trace was not read up to event {}, where the next segment starts",
                    to->next_raw_event());
      }
      *r_.mutable_chain_next() = to_proto(*next);
      return {};
    }
    // The End: every check `deja replay` makes there.
    const Outcome& outcome = stopped->outcome;
    if (auto ok = check_recording_end(session, outcome); !ok) return std::unexpected(ok.error());
    r_.set_reached_end(true);
    r_.set_exit_status(outcome.status);
    engine.peek();  // reads the footer and the trailer
    r_.set_trace_complete(reader.complete());
    if (!reader.complete()) {
      return fail(ErrorKind::kBadTrace, "after its End: {}",
                  engine.trace_error().empty() ? reader.end_description() : engine.trace_error());
    }
    return {};
  }

  const segments::Manifest& m_;
  uint32_t index_;
  std::string store_;
  std::string where_ = "";
  segments::ItemResult r_;
};

segments::ItemResult run_shard(const LoadedManifest& loaded, uint32_t index, const ItemOptions&) {
  const segments::Manifest& m = loaded.manifest;
  segments::ItemResult r;
  r.set_index(index);
  r.set_manifest_sha256(bytes_of(loaded.sha256));
  r.set_task(m.kind());
  r.set_host(host_name());
  auto task = make_shard_task(m.kind());
  const std::vector<std::string> args(m.shard_args().begin(), m.shard_args().end());
  std::vector<std::string> records;
  Result<int> status = task ? task->run_shard(args, index, m.shards(), records)
                            : fail(ErrorKind::kUnsupported, "this deja has no sharded task '{}'", m.kind());
  for (auto& line : records) r.add_records(std::move(line));
  r.set_ok(status.has_value());
  r.set_status(status ? *status : exit_status::of(status.error().kind));
  if (!status) r.set_error(fmt::format("shard {}/{}: {}", index, m.shards(), status.error().message));
  return r;
}

double cpu_seconds() {
  rusage usage{};
  ::getrusage(RUSAGE_SELF, &usage);
  auto seconds = [](const timeval& t) { return double(t.tv_sec) + double(t.tv_usec) / 1e6; };
  return seconds(usage.ru_utime) + seconds(usage.ru_stime);
}

}  // namespace

segments::ItemResult run_item(const LoadedManifest& loaded, uint32_t index, const ItemOptions& options) {
  const auto started = std::chrono::steady_clock::now();
  const double started_cpu = cpu_seconds();
  const double started_unix =
      double(std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch())
                 .count()) /
      1e6;
  segments::ItemResult r = loaded.manifest.kind() != "segments" ? run_shard(loaded, index, options)
                                                                 : SegmentRun(loaded, index, options).run();
  r.set_started_unix(started_unix);
  r.set_seconds(std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
  r.set_cpu_seconds(cpu_seconds() - started_cpu);
  return r;
}

}  // namespace deja
