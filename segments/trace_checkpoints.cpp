// Checkpoint directories: the writer (dirty pages and disk blocks since the last checkpoint) and the restore of a chain of files into a fresh replay.
#include "segments/trace_checkpoints.h"

#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <set>

#include <fmt/format.h>

#include "core/exit_status.h"
#include "segments/files.h"

namespace deja {

std::string checkpoint_directory(const std::string& trace) { return trace + ".ckpt"; }
std::string checkpoint_file_name(uint64_t number) { return fmt::format("{:06}.ckpt", number); }

Result<uint64_t> parse_checkpoint_interval(const std::string& text, uint64_t ps_per_instruction) {
  auto bad = [&] {
    return fail(ErrorKind::kInvalidArgument,
                "checkpoint interval '{}': give guest time (60s, 500ms, 2m, 1h) or instructions (5G, 250M, "
                "1000000instr)",
                text);
  };
  double value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end == text.data() || !(value > 0)) return bad();
  std::string unit(end, text.data() + text.size());
  if (unit.ends_with("instr")) unit.resize(unit.size() - 5);
  double instructions = 0;
  const double per_second = 1e12 / double(ps_per_instruction ? ps_per_instruction : 1000);
  if (unit == "s") instructions = value * per_second;
  else if (unit == "ms") instructions = value * per_second / 1000;
  else if (unit == "m" || unit == "min") instructions = value * per_second * 60;
  else if (unit == "h") instructions = value * per_second * 3600;
  else if (unit == "") instructions = value;
  else if (unit == "K" || unit == "k") instructions = value * 1e3;
  else if (unit == "M") instructions = value * 1e6;
  else if (unit == "G") instructions = value * 1e9;
  else if (unit == "T") instructions = value * 1e12;
  else return bad();
  if (instructions < 1000 || instructions > 1e18) {
    return fail(ErrorKind::kInvalidArgument, "checkpoint interval '{}' is {:.0f} instructions; give 1000 or more",
                text, instructions);
  }
  return uint64_t(instructions);
}

namespace {

// Adds the calling thread's CPU time from its construction to its destruction to `into`.
class ThreadCpuTimer {
 public:
  explicit ThreadCpuTimer(double& into) : into_(into), start_(now()) {}
  ~ThreadCpuTimer() { into_ += now() - start_; }
  ThreadCpuTimer(const ThreadCpuTimer&) = delete;
  ThreadCpuTimer& operator=(const ThreadCpuTimer&) = delete;

 private:
  static double now() {
    timespec t{};
    ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return double(t.tv_sec) + double(t.tv_nsec) / 1e9;
  }
  double& into_;
  double start_;
};

}  // namespace

Result<std::unique_ptr<CheckpointWriter>> CheckpointWriter::create(Session& session, const CheckpointIdentity& identity,
                                                                   std::string directory, uint64_t full_every) {
  if (auto r = make_directories(directory); !r) return std::unexpected(r.error());
  if (auto r = session.machine().backend().start_dirty_log(); !r) return std::unexpected(r.error());
  session.machine().memory().take_dirty_pages();  // the first checkpoint is a full one
  for (auto& disk : session.disks()) disk->track_changes();
  auto writer = std::unique_ptr<CheckpointWriter>(
      new CheckpointWriter(session, identity, std::move(directory), std::max<uint64_t>(1, full_every)));
  ThreadCpuTimer timer(writer->cpu_seconds_);
  writer->ram_hashes_.update_all(session.machine().memory());  // from here on, the dirty pages keep them current
  return writer;
}

Result<TraceCheckpointMeta> CheckpointWriter::take() {
  ThreadCpuTimer timer(cpu_seconds_);
  auto state = session_.capture_state();
  if (!state) return std::unexpected(state.error());
  GuestMemory& ram = session_.machine().memory();
  if (auto r = session_.machine().backend().sync_dirty_log(); !r) return std::unexpected(r.error());
  std::vector<uint64_t> dirty = ram.take_dirty_pages();
  ram_hashes_.update(ram, dirty);
  auto digest = state_digest(session_, *state, &ram_hashes_);
  if (!digest) return std::unexpected(digest.error());
  const bool full = number_ % full_every_ == 0;
  TraceCheckpointSource source;
  source.meta.identity = identity_;
  source.meta.number = number_ + 1;
  source.meta.parent = full ? 0 : number_;
  if (!full) source.meta.parent_digest = previous_digest_;
  source.meta.at = state->at;
  source.meta.next_raw_event = session_.engine().next_raw_event();
  source.meta.digest = digest->value;
  source.meta.parts = digest->parts;
  source.machine = &*state;
  source.pages = full ? ram_hashes_.pages() : std::move(dirty);
  source.page = [&ram](uint64_t pfn) -> const uint8_t* {
    const uint8_t* bytes = ram.host_base() + pfn * kPageSize;
    return all_zero_page(bytes) ? nullptr : bytes;
  };
  for (auto& disk : session_.disks()) {
    DiskImage::Contents changed = disk->take_changes();
    if (full) changed = disk->contents();
    source.disks.push_back(DiskCheckpoint{disk->save(), std::move(changed.written), std::move(changed.verified)});
  }
  source.block = [this](size_t disk, uint64_t block, std::vector<uint8_t>& bytes) -> Result<> {
    DiskImage& image = *session_.disks()[disk];
    bytes.resize(image.block_bytes(block));
    return image.block_now(block, bytes);
  };
  auto encoded = encode_trace_checkpoint(source);
  if (!encoded) return std::unexpected(encoded.error());
  const std::string path = directory_ + "/" + checkpoint_file_name(source.meta.number);
  if (auto r = write_product(path, *encoded, "checkpoint"); !r) return std::unexpected(r.error());
  number_ = source.meta.number;
  previous_digest_ = digest->value;
  bytes_ += encoded->size();
  return source.meta;
}

uint64_t max_checkpoint_bytes(const CheckpointIdentity& identity, Session& session) {
  uint64_t disks = 0;
  for (auto& disk : session.disks()) disks += disk->size_bytes() + disk->size_bytes() / 256;
  return identity.ram_bytes + identity.ram_bytes / 256 + disks + (uint64_t{64} << 20);
}

Result<StateDigest> restore_trace_checkpoint(Session& session, const CheckpointIdentity& identity,
                                             std::span<const CheckpointFileRef> chain) {
  if (chain.empty() || chain.front().parent != 0) {
    return fail(ErrorKind::kInvalidArgument, "a checkpoint chain starts with a full checkpoint");
  }
  GuestMemory& ram = session.machine().memory();
  const uint64_t page_count = ram.size() / kPageSize;
  const uint64_t max_bytes = max_checkpoint_bytes(identity, session);
  std::set<uint64_t> touched;
  std::vector<std::vector<uint8_t>> disk_states(session.disks().size());
  TraceCheckpointFile last;
  for (size_t i = 0; i < chain.size(); ++i) {
    const CheckpointFileRef& ref = chain[i];
    auto file = read_trace_checkpoint(ref.path, identity, max_bytes);
    if (!file) return std::unexpected(file.error());
    const TraceCheckpointMeta& m = file->meta;
    auto bad = [&](std::string what) {
      return std::unexpected(Error{ErrorKind::kBadTrace, fmt::format("checkpoint file {}: {}", ref.path, what)});
    };
    if (ref.sha256 != StateSha{} && file->sha256 != ref.sha256) {
      return bad(fmt::format("its SHA-256 is {}, the manifest names checkpoint {} by {}: the file was replaced or "
                             "swapped with another",
                             hex(file->sha256).substr(0, 16), ref.number, hex(ref.sha256).substr(0, 16)));
    }
    if (m.number != ref.number || m.parent != ref.parent) {
      return bad(fmt::format("it is checkpoint {} (stored relative to {}), the manifest expects checkpoint {} (relative "
                             "to {}): the files were swapped or renamed",
                             m.number, m.parent, ref.number, ref.parent));
    }
    if (i > 0 && (m.parent != chain[i - 1].number || m.parent_digest != last.meta.digest)) {
      return bad(fmt::format("it is stored relative to checkpoint {} with digest {}, which is not the checkpoint "
                             "before it in the chain",
                             m.parent, hex(m.parent_digest).substr(0, 16)));
    }
    if (m.digest != ref.digest) {
      return bad(fmt::format("it names the state digest {}, the manifest {}", hex(m.digest).substr(0, 16),
                             hex(ref.digest).substr(0, 16)));
    }
    std::vector<bool> stored;
    if (i == 0) stored.assign(page_count, false);
    auto put = [&](uint64_t pfn, const uint8_t* bytes) {
      uint8_t* to = ram.host_base() + pfn * kPageSize;
      if (i == 0) stored[pfn] = true;
      if (bytes) std::memcpy(to, bytes, kPageSize);
      else if (!all_zero_page(to)) std::memset(to, 0, kPageSize);
      touched.insert(pfn);
    };
    if (auto r = apply_checkpoint_pages(*file, page_count, put); !r) return std::unexpected(r.error());
    if (i == 0) {
      // A full checkpoint: every page it does not hold is zero.
      for (uint64_t page : data_pages(ram)) {
        if (stored[page] || all_zero_page(ram.host_base() + page * kPageSize)) continue;
        std::memset(ram.host_base() + page * kPageSize, 0, kPageSize);
        touched.insert(page);
      }
    }
    DiskCheckpointSink sink{
        [&](size_t d, std::span<const uint8_t> state) -> Result<> {
          disk_states[d].assign(state.begin(), state.end());
          return {};
        },
        [&](size_t d, uint64_t block, std::span<const uint8_t> bytes) {
          return session.disks()[d]->adopt_block(block, bytes);
        },
        [&](size_t d, uint64_t block) { return session.disks()[d]->adopt_verified(block); }};
    if (auto r = apply_checkpoint_disks(*file, session.disks().size(), sink); !r) return std::unexpected(r.error());
    last = std::move(*file);
  }
  const std::vector<uint64_t> pages(touched.begin(), touched.end());
  ram.note_restored_pages(pages);
  ram.take_dirty_pages();
  for (size_t d = 0; d < session.disks().size(); ++d) {
    if (auto r = session.disks()[d]->adopt_state(disk_states[d]); !r) {
      return fail(ErrorKind::kBadTrace, "checkpoint file {}: disk {}: {}", last.path, d, r.error().message);
    }
  }
  if (auto r = session.restore_state(last.machine); !r) {
    return fail(ErrorKind::kBadTrace, "checkpoint file {}: {}", last.path, r.error().message);
  }
  auto state = session.capture_state();
  if (!state) return std::unexpected(state.error());
  auto digest = state_digest(session, *state);
  if (!digest) return std::unexpected(digest.error());
  if (digest->value != last.meta.digest) {
    std::string parts = differing_parts(last.meta.parts, digest->parts);
    return fail(ErrorKind::kBadTrace,
                "checkpoint file {}: the state it restores has digest {}, not the {} it names{}: the file's contents "
                "do not match its digest",
                last.path, hex(digest->value).substr(0, 16), hex(last.meta.digest).substr(0, 16),
                parts.empty() ? "" : fmt::format(" (differing: {})", parts));
  }
  return digest;
}

namespace {

// Whether `directory` holds only checkpoint files (and their .partial files), or does not exist.
Result<> only_checkpoints(const std::string& directory) {
  std::error_code ec;
  if (!std::filesystem::exists(directory, ec)) return {};
  if (!std::filesystem::is_directory(std::filesystem::symlink_status(directory, ec))) {
    return fail(ErrorKind::kInvalidArgument, "{} is not a checkpoint directory (not a directory)", directory);
  }
  for (const auto& entry : std::filesystem::directory_iterator(directory, ec)) {
    const std::string name = entry.path().filename().string();
    const bool ours = entry.is_regular_file(ec) && (name.ends_with(".ckpt") || name.ends_with(".ckpt.partial")) &&
                      name.size() >= 11 && std::all_of(name.begin(), name.begin() + 6, ::isdigit);
    if (!ours) {
      return fail(ErrorKind::kInvalidArgument,
                  "{} holds {}, which is not a deja checkpoint file: deja replaces a checkpoint directory only when "
                  "it holds nothing else (move it away)",
                  directory, entry.path().string());
    }
  }
  return {};
}

Result<> remove_checkpoints(const std::string& directory) {
  if (auto r = only_checkpoints(directory); !r) return r;
  std::error_code ec;
  std::filesystem::remove_all(directory, ec);
  if (ec) return fail(ErrorKind::kHost, "cannot remove {}: {}", directory, ec.message());
  return {};
}

}  // namespace

std::string partial_checkpoint_directory(const std::string& directory) { return directory + ".partial"; }

Result<> check_checkpoint_directory(const std::string& directory) {
  if (auto r = only_checkpoints(directory); !r) return r;
  // A .partial one left by a run that was killed is deja's too.
  return remove_checkpoints(partial_checkpoint_directory(directory));
}

Result<> commit_checkpoint_directory(const std::string& directory) {
  if (auto r = remove_checkpoints(directory); !r) return r;
  if (::rename(partial_checkpoint_directory(directory).c_str(), directory.c_str()) != 0) {
    return fail(ErrorKind::kHost, "cannot rename {} to {}: {}", partial_checkpoint_directory(directory), directory,
                std::strerror(errno));
  }
  return {};
}

void discard_partial_checkpoint_directory(const std::string& directory) {
  (void)remove_checkpoints(partial_checkpoint_directory(directory));
}

Result<> check_recording_end(Session& session, const Outcome& outcome) {
  Engine& engine = session.engine();
  auto diverged = [&](const std::string& what) {
    return fail(ErrorKind::kDivergence, "{}", engine.divergence() ? engine.divergence()->report : what);
  };
  if (engine.divergence()) return diverged("");
  if (outcome.status == exit_status::kTraceEnded) {
    return fail(ErrorKind::kBadTrace, "the trace ends before its End event: {}",
                !engine.trace_error().empty() ? engine.trace_error()
                : engine.reader()            ? engine.reader()->end_description()
                                             : "end of trace");
  }
  const trace::End* recorded = engine.expect_end(
      outcome.recorded_end ? std::string("the recording's end") : fmt::format("the guest stopped: {}", outcome.reason));
  if (!recorded) return diverged("the replay ended where the recording did not");
  session.check_replay_end(*recorded, outcome);
  if (engine.divergence()) return diverged("");
  return {};
}

Result<IndexReport> index_trace(Session& session, const CheckpointIdentity& identity, const std::string& directory,
                                uint64_t every, uint64_t full_every) {
  Backend& cpu = session.machine().backend();
  if (!cpu.step_count() || !cpu.instruction_count()) {
    return fail(ErrorKind::kUnsupported, "deja index needs a backend that counts instructions (--backend interp)");
  }
  if (auto r = check_checkpoint_directory(directory); !r) return std::unexpected(r.error());
  auto writer = CheckpointWriter::create(session, identity, partial_checkpoint_directory(directory), full_every);
  if (!writer) return std::unexpected(writer.error());
  auto give_up = [&](Error e) {
    discard_partial_checkpoint_directory(directory);
    return std::unexpected(e);
  };
  uint64_t next = every;
  for (;;) {
    const CheckpointPosition here = session.checkpoint_position();
    if (here.instructions >= next) {
      if (auto taken = (*writer)->take(); taken) {
        next = (here.instructions / every + 1) * every;
      } else if (taken.error().kind == ErrorKind::kUnsupported) {
        next = here.instructions + std::max<uint64_t>(1, every / 16);  // no checkpoint just here: a little later
      } else {
        return give_up(taken.error());
      }
      continue;
    }
    StopRequest stop;
    stop.at_step = here.steps + (next - here.instructions);  // a step retires at most one instruction
    auto r = session.run_until(stop);
    if (!r) return give_up(r.error());
    if (r->kind == StopReason::Kind::kInterrupted) return give_up(Error{ErrorKind::kHost, "interrupted"});
    if (r->kind == StopReason::Kind::kEnd) {
      if (auto ok = check_recording_end(session, r->outcome); !ok) return give_up(ok.error());
      break;
    }
  }
  if (auto r = commit_checkpoint_directory(directory); !r) return give_up(r.error());
  return IndexReport{(*writer)->checkpoints(), (*writer)->bytes_written(),
                     session.machine().backend().instruction_count().value_or(0)};
}

}  // namespace deja
