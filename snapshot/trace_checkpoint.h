// Checkpoint files that travel with a trace (TRACE.ckpt/): full or incremental, compressed, named by trace, position and state digest.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "snapshot/checkpoint.h"

namespace deja {

using StateSha = std::array<uint8_t, 32>;

// What names a checkpoint file: the trace and machine it belongs to, its place in the sequence, where in the
// recording it was taken, and the state digest of the machine there (segments/state_digest.h) with the digest of
// each part (for messages naming what differs).
struct TraceCheckpointMeta {
  CheckpointIdentity identity;
  uint64_t number = 0;       // 1, 2, ... in trace order
  uint64_t parent = 0;       // the checkpoint its RAM and disks are stored relative to; 0: a full checkpoint
  StateSha parent_digest{};  // the parent's state digest
  CheckpointPosition at;
  uint64_t next_raw_event = 0;  // the first trace event (serial output counted) a replay starting here reads
  StateSha digest{};
  std::vector<std::pair<std::string, StateSha>> parts;
  bool full() const { return parent == 0; }
};

// A disk's part of a checkpoint: its saved counts (DiskImage::save()), and the blocks written and verified since
// the parent (all of them in a full checkpoint).
struct DiskCheckpoint {
  std::vector<uint8_t> state;
  std::vector<uint64_t> written;
  std::vector<uint64_t> verified;
};

// What a checkpoint file is made from: the state sections (machine.memory unused), the pages of RAM to store
// (ascending; `page` gives a page's bytes, null for a page of zeros) and the disks, whose written blocks `block`
// fills in as they are compressed.
struct TraceCheckpointSource {
  TraceCheckpointMeta meta;
  const MachineCheckpoint* machine = nullptr;
  std::vector<uint64_t> pages;
  std::function<const uint8_t*(uint64_t pfn)> page;
  std::vector<DiskCheckpoint> disks;
  std::function<Result<>(size_t disk, uint64_t block, std::vector<uint8_t>& bytes)> block;
};

// File layout (integers little-endian): "DEJATCKP", u32 format version, then seven sections, each a u64 length
// and its bytes: META (StateWriter "TCKM"), CPU0 (the vCPU codec), BKND (backend-internal), DEVS (StateWriter
// "DEVS": the devices by name), SESS (the session's loop state), MEMZ and DSKZ (a u64 raw length and one zstd
// frame: RAM's pages as (pfn, present, 4096 bytes), the disks as (state, written blocks with their bytes, verified
// blocks)); then the SHA-256 of every byte before it. Written whole and renamed into place by the caller.
// Version 2: the state digest's RAM part hashes each page's SHA-256 rather than its bytes (segments/state_digest.h),
// so version 1 files name digests this build does not compute.
constexpr uint32_t kTraceCheckpointVersion = 2;

Result<std::vector<uint8_t>> encode_trace_checkpoint(const TraceCheckpointSource& source);

// A checkpoint file read and checked: the state sections decoded, RAM and disks still compressed (apply_* decode
// them). `sha256` is the whole file's, which a segment manifest names it by.
struct TraceCheckpointFile {
  std::string path;
  StateSha sha256{};
  TraceCheckpointMeta meta;
  MachineCheckpoint machine;
  std::vector<uint8_t> memory_z, disks_z;
  uint64_t file_bytes = 0;
};

// Refuses (kBadTrace, naming the file and the problem) a file over `max_bytes`, cut short, failing its checksum, with
// another magic or version, malformed sections, or an identity other than `expected` (its trace, RAM size, backend).
Result<TraceCheckpointFile> read_trace_checkpoint(const std::string& path, const CheckpointIdentity& expected,
                                                  uint64_t max_bytes);
// The pages the file stores, in ascending order (bytes null: a page of zeros); a page outside `page_count` or out of
// order is refused.
Result<> apply_checkpoint_pages(const TraceCheckpointFile& file, uint64_t page_count,
                                const std::function<void(uint64_t pfn, const uint8_t* bytes)>& page);
// The disks the file stores: each disk's state, then its blocks (bytes empty: zeros) and verified blocks.
struct DiskCheckpointSink {
  std::function<Result<>(size_t disk, std::span<const uint8_t> state)> state;
  std::function<Result<>(size_t disk, uint64_t block, std::span<const uint8_t> bytes)> block;
  std::function<Result<>(size_t disk, uint64_t block)> verified;
};
Result<> apply_checkpoint_disks(const TraceCheckpointFile& file, size_t disks, const DiskCheckpointSink& sink);

}  // namespace deja
