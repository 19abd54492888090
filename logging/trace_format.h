// The on-disk constants of the trace format and the small helpers shared by writer, reader and tools.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "logging/trace.pb.h"
#include "core/error.h"

namespace deja {

// Bumped on any change an older reader could misinterpret; see docs/trace-format.md "Versioning".
// Version 2: the virtio events (entropy, net_transmit, disk_block, Async.net_frames) that replay must not skip.
// Version 3: disk_io events (which an older replay would not know to skip) and the frames in net_transmit.
// Version 4: derived time (MachineConfig.derived_time, Async.instructions): an older replay would wait for Clock and
// Rdtsc events that are not there.
// Version 5: the software CPU's TLB size (MachineConfig.software_tlb_entries).
// Version 6: seal frames (signed chain values written while recording), each chunk's chain value in the footer's
// index, Header.signer: an older reader would stop at a seal frame's magic.
// Versions 1 to 5 are the same layout without them: this deja reads them all.
constexpr uint32_t kTraceFormatVersion = 6;
// How the End's reason of a recording that a host failure stopped begins ("stopped by a host failure: ..."): a disk
// overlay or the serial output could not be written. Its exit status is kInterrupted's: it replays to where it stopped.
inline constexpr std::string_view kHostFailureReason = "stopped by a host failure";
constexpr uint32_t kOldestTraceFormatVersion = 1;

// Layout constants (docs/trace-format.md is the normative description).
inline constexpr std::string_view kFileMagic{"DEJATRC\0", 8};
inline constexpr std::string_view kTrailerMagic{"DEJAEND\0", 8};
inline constexpr uint32_t kChunkFrameMagic = 0x4b434a44;   // "DJCK" little-endian
inline constexpr uint32_t kFooterFrameMagic = 0x54464a44;  // "DJFT" little-endian
inline constexpr uint32_t kSealFrameMagic = 0x4c534a44;    // "DJSL" little-endian (format 6)
inline constexpr uint64_t kMaxSealBytes = 64u << 10;
inline constexpr size_t kFilePreambleBytes = 12;           // magic + u32 version
inline constexpr size_t kFrameHeaderBytes = 48;            // magic, stored, raw, count, chain[32]
inline constexpr size_t kFrameFieldBytes = 16;             // the part of the frame header the chain covers
inline constexpr size_t kTrailerBytes = 48;                // magic[8], u64 footer offset, chain[32]
// Sanity caps so a corrupt length can never make a reader allocate or seek absurdly.
inline constexpr uint64_t kMaxHeaderBytes = 16u << 20;
inline constexpr uint64_t kMaxChunkRawBytes = 64u << 20;
inline constexpr uint64_t kMaxFooterBytes = 256u << 20;
inline constexpr size_t kDefaultChunkBytes = 64u << 10;

using Sha256 = std::array<uint8_t, 32>;

// The Event's oneof case as a stable snake_case name ("port_read", "async", ...); "none" when unset.
std::string event_kind_name(const trace::Event& e);
// One line describing an event (kind, vcpu and every field), for timelines and divergence reports.
std::string describe_event(const trace::Event& e);
// The coordinate an event is pinned to, or nullptr for synchronous events that have none.
const trace::Coordinate* event_coordinate(const trace::Event& e);
// Whether events of this Event::kind_case() carry a coordinate (event_coordinate() may return one).
bool event_kind_has_coordinate(int kind_case);
std::string describe_coordinate(const trace::Coordinate& c);

Result<std::array<uint8_t, 32>> sha256_file(const std::string& path);
// A directory tree's identity (a TFTP server's files): the SHA-256 of each regular file's relative path, a NUL and
// the file's SHA-256, in path order; and the files' total size. At most 100,000 entries.
Result<std::pair<std::array<uint8_t, 32>, uint64_t>> sha256_directory(const std::string& path);
std::array<uint8_t, 32> sha256_bytes(std::span<const uint8_t> bytes);
std::string hex(std::span<const uint8_t> bytes);
inline std::string hex(const std::string& bytes) {
  return hex(std::span(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()));
}
// 64 lowercase hex digits back to a SHA-256; false for anything else.
bool unhex_sha256(std::string_view text, std::array<uint8_t, 32>& out);

namespace trace_detail {

// Incremental SHA-256 (the chain hashes several pieces without concatenating them).
class Sha256Stream {
 public:
  Sha256Stream();
  ~Sha256Stream();
  Sha256Stream(const Sha256Stream&) = delete;
  Sha256Stream& operator=(const Sha256Stream&) = delete;
  void update(const void* data, size_t size);
  Sha256 finish();

 private:
  void* ctx_;  // EVP_MD_CTX*, kept opaque so OpenSSL headers stay out of this header
};

// event_kind_name() for a raw Event::kind_case() value, so counters need not build a string per event.
std::string kind_name_of_case(size_t kind_case);

// chain_n = SHA-256(chain_{n-1} || frame fields (16 bytes) || payload).
Sha256 chain_next(const Sha256& previous, std::span<const uint8_t> frame_fields, std::span<const uint8_t> payload);

inline void put_u32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
inline void put_u64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
inline uint32_t get_u32(const uint8_t* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(p[i]) << (8 * i);
  return v;
}
inline uint64_t get_u64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return v;
}

}  // namespace trace_detail
}  // namespace deja
