// Reverse execution: restore the nearest checkpoint before the target, replay forward to it; checkpoints thinned logarithmically.
#include "replay/replay_timeline.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "core/messages.h"

namespace deja {

ReplayTimeline::ReplayTimeline(Session& session, const TimelineOptions& options,
                               std::unique_ptr<CheckpointMemory> memory)
    : session_(session), options_(options), memory_(std::move(memory)),
      counts_steps_(session.machine().backend().step_count().has_value() && !options.by_events) {}

Result<std::unique_ptr<ReplayTimeline>> ReplayTimeline::create(Session& session, const TimelineOptions& options) {
  auto memory = CheckpointMemory::create(session.machine().memory(), session.machine().backend());
  if (!memory) return std::unexpected(memory.error());
  std::unique_ptr<ReplayTimeline> t(new ReplayTimeline(session, options, std::move(*memory)));
  t->start_time_ = t->now();
  // The start is always kept: reverse execution can always get back to it.
  if (auto r = t->take_checkpoint(); !r) return std::unexpected(r.error());
  t->next_auto_at_ = t->start_time_ + t->checkpoint_stride(session.checkpoint_position());
  return t;
}

uint64_t ReplayTimeline::now() { return time_of(session_.checkpoint_position()); }

Result<> ReplayTimeline::take_checkpoint() {
  auto cp = session_.capture_checkpoint(*memory_);
  if (!cp) return std::unexpected(cp.error());
  uint64_t t = time_of(cp->at);
  automatic_[t] = std::move(*cp);
  thin_out();
  return {};
}

uint64_t ReplayTimeline::memory_in_use() const {
  uint64_t n = memory_->stored_bytes();
  for (const auto& [t, cp] : automatic_) n += cp.state_bytes();
  for (const auto& [id, cp] : named_) n += cp.state_bytes();
  return n;
}

void ReplayTimeline::thin_out() {
  if (options_.memory_limit == 0) return;
  const uint64_t here = time_of(session_.checkpoint_position());
  while (automatic_.size() > 2 && memory_in_use() > options_.memory_limit) {
    // rr's rule of thumb: keep checkpoints dense near the current position and sparse far from it.
    // Drop the one whose neighbours are closest together relative to its distance from here.
    double best = INFINITY;
    uint64_t victim = 0;
    auto it = std::next(automatic_.begin());  // never the start
    for (; it != automatic_.end(); ++it) {
      auto prev = std::prev(it);
      auto next = std::next(it);
      uint64_t gap = (next == automatic_.end() ? it->first : next->first) - prev->first;
      uint64_t distance = (here > it->first ? here - it->first : it->first - here) + 1;
      double score = double(gap) / double(distance);
      if (score < best) {
        best = score;
        victim = it->first;
      }
    }
    automatic_.erase(victim);
    ++thinned_;
  }
}

const MachineCheckpoint* ReplayTimeline::checkpoint_before(uint64_t t, bool strict) const {
  const MachineCheckpoint* best = nullptr;
  uint64_t best_time = 0;
  auto consider = [&](const MachineCheckpoint& cp) {
    uint64_t ct = time_of(cp.at);
    if (strict ? ct >= t : ct > t) return;
    if (!best || ct > best_time) {
      best = &cp;
      best_time = ct;
    }
  };
  for (const auto& [time, cp] : automatic_) consider(cp);
  for (const auto& [id, cp] : named_) consider(cp);
  return best;
}

Result<> ReplayTimeline::restore(const MachineCheckpoint& cp) {
  if (auto r = session_.restore_checkpoint(cp, *memory_); !r) return r;
  ++restores_;
  next_auto_at_ = time_of(cp.at) + checkpoint_stride(cp.at);
  return {};
}

void ReplayTimeline::forget(const MachineCheckpoint* cp) {
  for (auto it = automatic_.begin(); it != automatic_.end(); ++it) {
    if (&it->second == cp) {
      automatic_.erase(it);
      return;
    }
  }
  for (auto it = named_.begin(); it != named_.end(); ++it) {
    if (&it->second == cp) {
      named_.erase(it);
      return;
    }
  }
}

Result<std::optional<uint64_t>> ReplayTimeline::restore_before(uint64_t t, bool strict) {
  for (;;) {
    const MachineCheckpoint* cp = checkpoint_before(t, strict);
    if (!cp) return std::nullopt;
    const uint64_t time = time_of(cp->at);
    auto r = restore(*cp);
    if (r) return time;
    if (time == start_time_ && automatic_.contains(time) && &automatic_.at(time) == cp) return std::unexpected(r.error());
    say("warning: dropping the checkpoint at {}: {}; replaying from an earlier one", time, r.error().message);
    forget(cp);
  }
}

uint64_t ReplayTimeline::checkpoint_stride(const CheckpointPosition& at) const {
  const uint64_t interval = std::max<uint64_t>(1, counts_steps_ ? options_.interval_steps : options_.interval_events);
  if (!counts_steps_ || at.instructions == 0) return interval;
  const uint64_t per_instruction = std::clamp<uint64_t>(at.steps / at.instructions, 1, uint64_t{1} << 16);
  return interval > (UINT64_MAX / 2) / per_instruction ? UINT64_MAX / 2 : interval * per_instruction;
}

Result<StopReason> ReplayTimeline::forward(StopRequest stop) {
  bool first = true;
  for (;;) {
    StopRequest slice = stop;
    const uint64_t t = now();
    if (options_.memory_limit > 0 && !session_.replay_ended()) {
      if (t >= next_auto_at_) {
        if (!automatic_.contains(t)) {
          if (auto r = take_checkpoint(); !r) return std::unexpected(r.error());
        }
        next_auto_at_ = t + checkpoint_stride(session_.checkpoint_position());
      }
      if (counts_steps_) slice.at_step = std::min(stop.at_step.value_or(UINT64_MAX), next_auto_at_);
      else slice.at_event = std::min(stop.at_event.value_or(UINT64_MAX), next_auto_at_);
    }
    // A slice boundary is not a new start: a breakpoint there is a hit.
    if (!first) slice.stop_at_start_breakpoint = true;
    auto r = session_.run_until(slice);
    if (!r) return r;
    first = false;
    const uint64_t after = now();
    const bool slice_end = counts_steps_ ? r->kind == StopReason::Kind::kStep && (!stop.at_step || after < *stop.at_step)
                                         : r->kind == StopReason::Kind::kEvent && (!stop.at_event || after < *stop.at_event);
    if (!slice_end) return r;
  }
}

Result<StopReason> ReplayTimeline::seek(uint64_t t) {
  if (!counts_steps_) return seek_event(t);
  const uint64_t here = now();
  if (t == here && !session_.replay_ended()) return StopReason{StopReason::Kind::kStep};
  const MachineCheckpoint* cp = checkpoint_before(t, false);
  // Restore unless replaying on from here is at least as close.
  if (cp && (t < here || time_of(cp->at) > here || session_.replay_ended())) {
    if (auto r = restore_before(t, false); !r) return std::unexpected(r.error());
  }
  if (t < now()) return fail(ErrorKind::kInvalidArgument, "time {} lies before the start of the replay", t);
  StopRequest stop;
  stop.at_step = t;
  return forward(stop);
}

Result<StopReason> ReplayTimeline::seek_event(uint64_t events) {
  const uint64_t here = session_.checkpoint_position().events;
  for (;;) {
    const MachineCheckpoint* best = nullptr;
    auto consider = [&](const MachineCheckpoint& cp) {
      if (cp.at.events > events) return;
      if (!best || cp.at.events > best->at.events ||
          (cp.at.events == best->at.events && cp.at.steps < best->at.steps))
        best = &cp;
    };
    for (const auto& [time, cp] : automatic_) consider(cp);
    for (const auto& [id, cp] : named_) consider(cp);
    if (!best || !(events < here || best->at.events > here || session_.replay_ended() || events == here)) break;
    auto r = restore(*best);
    if (r) break;
    if (&automatic_.begin()->second == best) return std::unexpected(r.error());
    say("warning: dropping the checkpoint at event {}: {}; replaying from an earlier one", best->at.events,
        r.error().message);
    forget(best);
  }
  StopRequest stop;
  stop.at_event = events;
  return forward(stop);
}

Result<StopReason> ReplayTimeline::reverse_step() {
  if (!counts_steps_) {
    return fail(ErrorKind::kUnsupported,
                "reverse stepping needs a backend that counts steps (debug with --backend interp)");
  }
  const uint64_t here = now();
  if (here <= start_time_) return StopReason{StopReason::Kind::kStep};
  return seek(here - 1);
}

Result<std::optional<ReplayTimeline::Hit>> ReplayTimeline::scan_back(uint64_t end,
                                                                     const std::vector<uint64_t>& breakpoints,
                                                                     const std::vector<Watchpoint>& watchpoints,
                                                                     const std::function<bool()>& interrupted,
                                                                     bool& was_interrupted) {
  was_interrupted = false;
  uint64_t window_end = end;
  for (;;) {
    auto restored = restore_before(window_end, true);
    if (!restored) return std::unexpected(restored.error());
    if (!*restored) return std::nullopt;
    const uint64_t window_start = **restored;
    // Replay the window forward, noting every hit; the last one is where reverse execution stops.
    std::optional<Hit> last;
    bool at_start = true;
    for (;;) {
      StopRequest stop;
      stop.at_step = window_end;
      stop.breakpoints = breakpoints;
      stop.watchpoints = watchpoints;
      stop.interrupted = interrupted;
      stop.stop_at_start_breakpoint = at_start;
      at_start = false;
      auto r = forward(stop);
      if (!r) return std::unexpected(r.error());
      const uint64_t t = now();
      if (r->kind == StopReason::Kind::kBreakpoint && t < window_end) {
        last = Hit{t, *r};
      } else if (r->kind == StopReason::Kind::kWatchpoint && t >= 1 && t - 1 < window_end) {
        last = Hit{t - 1, *r};  // stop before the accessing instruction, as rr does
      } else if (r->kind == StopReason::Kind::kInterrupted) {
        was_interrupted = true;
        return last;
      } else {
        break;  // reached the window's end (or the end of the trace)
      }
    }
    if (last) return last;
    if (window_start <= start_time_) return std::nullopt;
    window_end = window_start;
  }
}

Result<StopReason> ReplayTimeline::reverse_continue(const std::vector<uint64_t>& breakpoints,
                                                    const std::vector<Watchpoint>& watchpoints,
                                                    const std::function<bool()>& interrupted) {
  if (!counts_steps_) {
    return fail(ErrorKind::kUnsupported,
                "reverse execution needs a backend that counts steps (debug with --backend interp)");
  }
  const uint64_t here = now();
  bool was_interrupted = false;
  auto hit = scan_back(here, breakpoints, watchpoints, interrupted, was_interrupted);
  if (!hit) return std::unexpected(hit.error());
  if (was_interrupted) {
    // Stop where the last hit was found so far, or back where we started.
    auto r = seek(*hit ? (*hit)->time : here);
    if (!r) return r;
    return StopReason{StopReason::Kind::kInterrupted};
  }
  if (!*hit) {
    auto r = seek(start_time_);
    if (!r) return r;
    return StopReason{StopReason::Kind::kStep};  // at_start() tells the caller
  }
  auto r = seek((*hit)->time);
  if (!r) return r;
  return (*hit)->reason;
}

Result<std::optional<ReplayTimeline::WriteHit>> ReplayTimeline::last_write(uint64_t address, uint64_t length,
                                                                           const std::function<bool()>& interrupted) {
  if (!counts_steps_) return fail(ErrorKind::kUnsupported, "`last` needs a backend that counts steps (interp)");
  const uint64_t here = now();
  bool was_interrupted = false;
  auto hit = scan_back(here, {}, {Watchpoint{address, length, WatchKind::kWrite}}, interrupted, was_interrupted);
  if (!hit) return std::unexpected(hit.error());
  if (auto back = seek(here); !back) return std::unexpected(back.error());
  if (was_interrupted) return fail(ErrorKind::kInvalidArgument, "interrupted");
  if (!*hit) return std::nullopt;
  return WriteHit{(*hit)->time, (*hit)->reason.watch_rip};
}

Result<uint64_t> ReplayTimeline::add_named_checkpoint() {
  auto cp = session_.capture_checkpoint(*memory_);
  if (!cp) return std::unexpected(cp.error());
  uint64_t id = next_named_++;
  named_[id] = std::move(*cp);
  return id;
}

Result<StopReason> ReplayTimeline::restart(uint64_t id) {
  auto it = named_.find(id);
  if (it == named_.end()) return fail(ErrorKind::kInvalidArgument, "no checkpoint {} (see `monitor info checkpoints`)", id);
  if (auto r = restore(it->second); !r) return std::unexpected(r.error());
  return StopReason{StopReason::Kind::kStep};
}

std::string ReplayTimeline::describe_checkpoints() {
  std::string out;
  for (const auto& [id, cp] : named_) {
    out += fmt::format("checkpoint {}: steps {} events {} instructions {}\n", id, cp.at.steps, cp.at.events,
                       cp.at.instructions);
  }
  Stats s = stats();
  out += fmt::format("{} automatic checkpoints, {:.1f} MiB in use (limit {:.0f} MiB), {} restores, {} thinned out\n",
                     automatic_.size(), double(s.memory_bytes) / (1 << 20), double(options_.memory_limit) / (1 << 20),
                     s.restores, s.thinned);
  return out;
}

ReplayTimeline::Stats ReplayTimeline::stats() const {
  return Stats{automatic_.size() + named_.size(), memory_in_use(), restores_, thinned_};
}

void ReplayTimeline::drop_automatic_checkpoints() {
  auto first = automatic_.begin();
  if (first == automatic_.end()) return;
  MachineCheckpoint keep = std::move(first->second);
  uint64_t t = first->first;
  automatic_.clear();
  automatic_[t] = std::move(keep);
}

std::vector<uint64_t> ReplayTimeline::checkpoint_times() const {
  std::vector<uint64_t> out;
  for (const auto& [t, cp] : automatic_) out.push_back(t);
  return out;
}

Result<> ReplayTimeline::restore_at(uint64_t t) {
  auto it = automatic_.find(t);
  if (it == automatic_.end()) return fail(ErrorKind::kInvalidArgument, "no checkpoint at {}", t);
  return restore(it->second);
}

Result<uint64_t> ReplayTimeline::save_files(const std::string& prefix, const CheckpointIdentity& identity) {
  uint64_t n = 0;
  for (const auto& [t, cp] : automatic_) {
    if (auto r = write_checkpoint_file(fmt::format("{}.{}.ckpt", prefix, n), identity, cp); !r) {
      return std::unexpected(r.error());
    }
    ++n;
  }
  return n;
}

uint64_t ReplayTimeline::load_files(const std::string& prefix, const CheckpointIdentity& identity,
                                    std::vector<std::string>& warnings,
                                    const std::function<Result<>(const std::string&)>& accept) {
  if (options_.memory_limit == 0) return 0;  // no automatic checkpoints
  uint64_t loaded = 0;
  // Each image shares the pages it has in common with the one before it (files are saved in time order), and
  // checkpoints are thinned out as they come in: loading stays within --checkpoint-memory as replaying does.
  std::shared_ptr<const MemoryImage> previous = automatic_.empty() ? nullptr : automatic_.begin()->second.memory;
  for (uint64_t n = 0;; ++n) {
    std::string path = fmt::format("{}.{}.ckpt", prefix, n);
    if (::access(path.c_str(), F_OK) != 0) break;
    if (accept) {
      if (auto ok = accept(path); !ok) {
        warnings.push_back(fmt::format("checkpoint file {}: {}; ignored (the replay uses the trace instead)", path,
                                       ok.error().message));
        continue;
      }
    }
    auto cp = read_checkpoint_file(path, identity, *memory_, previous);
    if (!cp) {
      warnings.push_back(cp.error().message + "; ignored (the replay uses the trace instead)");
      continue;
    }
    previous = cp->memory;
    uint64_t t = time_of(cp->at);
    if (!automatic_.contains(t)) {
      automatic_[t] = std::move(*cp);
      ++loaded;
      thin_out();
    }
  }
  return loaded;
}

}  // namespace deja
