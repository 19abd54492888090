// A raw disk image that is never written, plus the guest's writes in a copy-on-write overlay (in memory or a file).
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <sys/stat.h>
#include <unordered_map>
#include <vector>

#include "devices/block_store.h"
#include "core/error.h"

namespace deja {

// How a disk image is identified in a trace header.
//   full: SHA-256 of the whole image, computed when the recording starts (images up to kFullHashLimit by default);
//         replay refuses a different image up front.
//   lazy: XXH3-64 of each kHashBlock-byte block of the image, computed the first time the guest reads from that
//         block, recorded as a disk_block event; replay checks each block at the same point and stops at the first
//         one that differs, naming it. Recording a huge image then costs nothing up front.
enum class DiskHashMode { kAuto, kFull, kLazy };

struct DiskOptions {
  std::string path;     // the base image: a regular file, opened read-only
  std::string overlay;  // the overlay file ("" = in memory)
  bool read_only = false;
  DiskHashMode hash = DiskHashMode::kAuto;
};

// What a recording says about a disk, and what replay checks.
struct DiskIdentity {
  uint64_t size = 0;
  std::array<uint8_t, 32> sha256{};  // full mode
  uint32_t hash_block = 0;           // lazy mode: the block size (0 = full mode)
};

// The engine's choke point for disk images. Lazily hashed images: record logs the hash of each block the first time
// it is read, replay compares it with the recording (a difference is reported as divergence and fails the read).
// Every image: each read and write of the guest's (at most 64 KiB, as the device hands them over), which a
// recording logs for inspect.
class DiskBlockChecker {
 public:
  virtual ~DiskBlockChecker() = default;
  virtual Result<> check_disk_block(unsigned disk, uint64_t block, uint64_t hash) = 0;
  virtual void disk_io(unsigned /*disk*/, bool /*write*/, bool /*zeroes*/, uint64_t /*offset*/, uint64_t /*length*/) {}
};

// The guest sees the base image with its own writes on top, in kBlockSize blocks (a partial-block write reads the
// rest of the block first). Overlay file layout (little-endian): a 4 KiB header ("DEJAOVL\0", u32 version 2,
// u32 block size, u64 image size, u64 bitmap offset, u64 bitmap bytes, u64 data offset, then the base image's
// identity: its SHA-256, the dev/inode/mtime/ctime it had when last hashed, its path), a bitmap of the blocks the
// overlay holds, then block i at data offset + i * kBlockSize (a sparse file). An existing overlay is reopened (a
// plain run continues from it) only over the image it was made over (the same SHA-256; hashed again only when the
// file's dev/inode/mtime/ctime changed); a recording must start from an empty one, since replay starts from the base
// image alone. In replay the overlay is always in memory: deja never writes the user's
// files then.
//
// State (save/restore, digests, checkpoints): the number of writes so far and a hash chained over every write
// (offset, length, data), and the number of lazily verified blocks with a hash of their numbers. With history kept
// (a replay that moves through checkpoints, backwards and forwards), every write's block versions, the hash after
// each write and the order of verified blocks are kept: any state this replay has passed can be restored, and
// re-executing a write it has seen finds the version already there. A re-execution that writes something else
// (a replay that diverged after a restore) drops the history after that point. Without history only the present
// state can be "restored".
class DiskImage : public BlockStore {
 public:
  static constexpr uint64_t kBlockSize = 4096;
  static constexpr uint32_t kHashBlock = 64 * 1024;
  static constexpr uint64_t kFullHashLimit = 256ull << 20;

  // A plain run or a recording: the base opened read-only; the overlay file created, or reopened.
  static Result<std::unique_ptr<DiskImage>> open(const DiskOptions& options, bool recording);
  // Replay: the base checked against `identity` (size, and SHA-256 in full mode) before anything runs.
  static Result<std::unique_ptr<DiskImage>> open_for_replay(const std::string& path, const DiskIdentity& identity,
                                                            bool read_only);
  ~DiskImage() override;

  // The identity a recording writes into its header (hashing the whole image in full mode).
  Result<DiskIdentity> identity(DiskHashMode mode);
  const std::string& path() const { return path_; }
  const std::string& overlay_path() const { return overlay_path_; }

  // Where reads and writes are reported and, in lazy mode (hash_block > 0), first reads of each block are checked
  // (record and replay); `index` names this disk.
  void set_block_checker(DiskBlockChecker* checker, unsigned index, uint32_t hash_block) {
    checker_ = checker;
    index_ = index;
    hash_block_ = hash_block;
  }
  // Host failures (an I/O error on the image or the overlay) go here; the run then stops.
  void set_host_error_handler(std::function<void(const std::string&)> handler) { host_error_ = std::move(handler); }
  // Call before any read or write.
  void keep_history(bool keep) {
    keep_history_ = keep;
    hash_at_.assign(1, 0);
    verified_hash_at_.assign(1, 0);
  }

  // BlockStore.
  uint64_t size_bytes() const override { return size_; }
  bool read_only() const override { return read_only_; }
  Result<> read(uint64_t offset, std::span<uint8_t> out) override;
  Result<> write(uint64_t offset, std::span<const uint8_t> data) override;
  Result<> write_zeroes(uint64_t offset, uint64_t length) override;
  Result<> flush() override;
  std::vector<uint8_t> save() const override;
  Result<> restore(std::span<const uint8_t> state) override;

  uint64_t bytes_read() const { return bytes_read_; }
  uint64_t bytes_written() const { return bytes_written_; }
  uint64_t overlay_blocks() const;

 private:
  DiskImage() = default;
  Result<> fail_host(std::string message);
  Result<> read_base(uint64_t offset, std::span<uint8_t> out);
  Result<> verify_base(uint64_t offset, uint64_t length);
  Result<> read_block(uint64_t block, std::span<uint8_t> out);  // the guest-visible block
  Result<> store_block(uint64_t block, std::span<const uint8_t> data);  // data empty: zeros
  Result<> open_overlay_file(bool recording);
  // Writes `header` (kOverlayHeaderBytes) with the base image's identity and the current version.
  Result<> record_base(int fd, uint8_t* header, const struct stat& base);
  // The base image's SHA-256, computed once.
  Result<std::array<uint8_t, 32>> base_sha256();
  std::optional<std::array<uint8_t, 32>> base_sha256_;
  void chain_write(uint64_t offset, uint64_t length, std::span<const uint8_t> data);

  std::string path_;
  std::string overlay_path_;
  int base_fd_ = -1;
  int overlay_fd_ = -1;
  uint64_t size_ = 0;
  bool read_only_ = false;

  // In-memory overlay: per block, its versions (the last is current); an empty version is all zeros.
  struct Version {
    uint64_t seq;
    std::vector<uint8_t> data;
  };
  std::unordered_map<uint64_t, std::vector<Version>> blocks_;  // versions in write order
  std::vector<uint64_t> hash_at_;  // with history: write_hash_ after n writes, for every n this replay reached
  void drop_writes_from(uint64_t seq);
  bool seen_write();
  // Overlay file: which blocks it holds.
  std::vector<uint8_t> bitmap_;
  uint64_t bitmap_offset_ = 0, data_offset_ = 0;

  uint64_t writes_ = 0;
  uint64_t write_hash_ = 0;
  bool keep_history_ = false;

  DiskBlockChecker* checker_ = nullptr;
  unsigned index_ = 0;
  uint32_t hash_block_ = 0;
  bool verified(uint64_t block) const;
  void mark_verified(uint64_t block);
  std::vector<uint64_t> verified_bits_;  // without history
  std::vector<uint64_t> verified_log_;   // with history: the verified blocks in order, their positions, the hashes
  std::unordered_map<uint64_t, uint64_t> verified_index_;
  std::vector<uint64_t> verified_hash_at_;
  uint64_t verified_count_ = 0;
  uint64_t verified_hash_ = 0;
  std::function<void(const std::string&)> host_error_;

  uint64_t bytes_read_ = 0, bytes_written_ = 0;
};

// Parses --disk's value: FILE[,overlay=FILE][,readonly][,hash=full|lazy].
Result<DiskOptions> parse_disk_option(const std::string& text);

}  // namespace deja
