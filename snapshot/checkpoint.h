// A checkpoint: the complete machine state as typed sections plus a copy-on-write memory image, and its file format.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "snapshot/cow_memory.h"
#include "core/error.h"

namespace deja {

// Where on the replay a checkpoint was taken (the timeline orders and names checkpoints by these).
struct CheckpointPosition {
  uint64_t steps = 0;         // Backend::step_count(), the debugger's time axis (0 without one)
  uint64_t events = 0;        // trace events replayed
  uint64_t branches = 0;      // progress counter
  uint64_t guest_exits = 0;   // guest-caused exits
  uint64_t instructions = 0;  // Backend::instruction_count()
  bool operator==(const CheckpointPosition&) const = default;
};

struct MachineCheckpoint {
  CheckpointPosition at;
  std::vector<uint8_t> cpu;      // encode_cpu_state() of vCPU 0
  std::vector<uint8_t> backend;  // its Backend::save_internal()
  // The other vCPUs of a machine with several (docs/smp.md), in order: the same two for each.
  struct Vcpu {
    std::vector<uint8_t> cpu, backend;
  };
  std::vector<Vcpu> more_vcpus;
  std::vector<std::pair<std::string, std::vector<uint8_t>>> devices;  // Machine::stateful_parts() order
  std::vector<uint8_t> session;  // the replay session's loop state and the engine's trace cursor
  std::shared_ptr<const MemoryImage> memory;

  // Bytes of state outside memory (memory is shared between checkpoints and counted by CheckpointMemory).
  uint64_t state_bytes() const;
};

// What a checkpoint file must match to be used: the trace it belongs to and the machine that replays it.
struct CheckpointIdentity {
  std::array<uint8_t, 32> trace_header_sha256{};
  uint64_t ram_bytes = 0;
  std::string backend;
  bool operator==(const CheckpointIdentity&) const = default;
};

// File layout (all integers little-endian):
//   "DEJACKPT" magic, u32 format version,
//   u32 section count, then per section: 4-byte tag, u64 length, bytes
//     META identity and position, CPU0 vCPU, BKND backend-internal, DEVS devices, SESS session, MEM0 pages,
//     and with several vCPUs VCPU: u32 count, then per vCPU u64 length + encode_cpu_state, u64 length + backend,
//   SHA-256 of every byte before it.
// Written as a product (logging/output_file.h: PATH.partial renamed over PATH), streamed: saving holds no copy of the
// memory, so a crash never leaves a half-written checkpoint and saving costs no more memory than the image.
constexpr uint32_t kCheckpointFileVersion = 1;

Result<> write_checkpoint_file(const std::string& path, const CheckpointIdentity& identity,
                               const MachineCheckpoint& checkpoint);
// Refuses (kBadTrace, with the path and the problem) a file that is truncated, fails its checksum, has
// another magic or version, malformed sections, or an identity other than `expected`. The memory image
// is built in `memory`'s page store, page by page (the file is streamed, never held whole), sharing every page that
// `share_with` (the image of the checkpoint before it, say) holds with the same bytes.
Result<MachineCheckpoint> read_checkpoint_file(const std::string& path, const CheckpointIdentity& expected,
                                               CheckpointMemory& memory,
                                               const std::shared_ptr<const MemoryImage>& share_with = nullptr);

}  // namespace deja
