// Disk image + copy-on-write overlay: block reads and writes, the overlay file, hashing (full and lazy), history.
#include "vmm/disk_image.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string_view>

#include <fmt/format.h>
#include <openssl/evp.h>
#include <xxhash.h>

#include "core/messages.h"
#include "devices/state_codec.h"

namespace deja {
namespace {

constexpr char kOverlayMagic[8] = {'D', 'E', 'J', 'A', 'O', 'V', 'L', '\0'};
// Version 2 records the base image (docs/devices.md, "The disk behind it"); version 1 overlays are adopted.
constexpr uint32_t kOverlayVersion = 2;
constexpr uint64_t kOverlayHeaderBytes = 4096;
constexpr size_t kOverlayBaseSha256 = 48;  // [32] SHA-256 of the base image
constexpr size_t kOverlayBaseStat = 80;    // u64 dev, inode, mtime ns, ctime ns of the base when last hashed
constexpr size_t kOverlayBasePath = 112;   // u16 length, then the base image's path (for messages)
constexpr size_t kOverlayBasePathMax = 1024;

uint64_t get_u64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= uint64_t(p[i]) << (8 * i);
  return v;
}
uint32_t get_u32(const uint8_t* p) { return uint32_t(p[0] | p[1] << 8 | p[2] << 16 | uint32_t(p[3]) << 24); }
void put_u64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = uint8_t(v >> (8 * i));
}
void put_u32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = uint8_t(v >> (8 * i));
}

Result<> pread_all(int fd, uint8_t* out, uint64_t length, uint64_t offset, const std::string& path) {
  while (length > 0) {
    ssize_t n = ::pread(fd, out, length, off_t(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return fail(ErrorKind::kHost, "reading {} at byte {}: {}", path, offset, strerror(errno));
    if (n == 0) return fail(ErrorKind::kHost, "{} ends at byte {}: it was shortened while in use", path, offset);
    out += n;
    length -= uint64_t(n);
    offset += uint64_t(n);
  }
  return {};
}

Result<> pwrite_all(int fd, const uint8_t* data, uint64_t length, uint64_t offset, const std::string& path) {
  while (length > 0) {
    ssize_t n = ::pwrite(fd, data, length, off_t(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return fail(ErrorKind::kHost, "writing the overlay {} at byte {}: {}", path, offset, strerror(errno));
    data += n;
    length -= uint64_t(n);
    offset += uint64_t(n);
  }
  return {};
}

Result<std::array<uint8_t, 32>> sha256_fd(int fd, uint64_t size, const std::string& path) {
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  EVP_DigestInit_ex(ctx, EVP_sha256(), nullptr);
  std::vector<uint8_t> buffer(1 << 20);
  for (uint64_t at = 0; at < size;) {
    const uint64_t n = std::min<uint64_t>(buffer.size(), size - at);
    if (auto r = pread_all(fd, buffer.data(), n, at, path); !r) {
      EVP_MD_CTX_free(ctx);
      return std::unexpected(r.error());
    }
    EVP_DigestUpdate(ctx, buffer.data(), n);
    at += n;
  }
  std::array<uint8_t, 32> digest{};
  unsigned length = 0;
  EVP_DigestFinal_ex(ctx, digest.data(), &length);
  EVP_MD_CTX_free(ctx);
  return digest;
}

std::string hex32(const std::array<uint8_t, 32>& bytes) {
  std::string s;
  for (uint8_t b : bytes) s += fmt::format("{:02x}", b);
  return s;
}

Result<int> open_base(const std::string& path, uint64_t* size) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return fail(ErrorKind::kInvalidArgument, "cannot open the disk image {}: {}", path, strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return fail(ErrorKind::kInvalidArgument, "the disk image {} is not a regular file", path);
  }
  if (st.st_size < off_t(512)) {
    ::close(fd);
    return fail(ErrorKind::kInvalidArgument, "the disk image {} is {} bytes, smaller than one 512-byte sector", path,
                st.st_size);
  }
  *size = uint64_t(st.st_size);
  return fd;
}

// Disk image formats other than raw, by their magic numbers (QEMU's block drivers probe the same): used as raw, such
// an image would show the guest its metadata instead of its disk.
struct ImageFormat {
  const char* name;         // for messages
  const char* qemu_format;  // qemu-img's name for it
};

std::optional<ImageFormat> non_raw_format(int fd, uint64_t size) {
  uint8_t head[512] = {}, tail[512] = {};
  if (::pread(fd, head, sizeof head, 0) != ssize_t(sizeof head)) return std::nullopt;
  auto at = [&](size_t offset, std::string_view magic) {
    return std::memcmp(head + offset, magic.data(), magic.size()) == 0;
  };
  if (at(0, std::string_view("QFI\xfb", 4))) {
    return head[7] == 1 ? ImageFormat{"qcow (version 1)", "qcow"} : ImageFormat{"qcow2", "qcow2"};
  }
  if (at(0, std::string_view("QED\0", 4))) return ImageFormat{"QED", "qed"};
  if (at(0, "KDMV") || at(0, "COWD") || at(0, "# Disk DescriptorFile")) return ImageFormat{"VMDK", "vmdk"};
  if (at(0x40, std::string_view("\x7f\x10\xda\xbe", 4))) return ImageFormat{"VirtualBox VDI", "vdi"};
  if (at(0, "vhdxfile")) return ImageFormat{"VHDX", "vhdx"};
  if (at(0, "WithoutFreeSpace") || at(0, "WithouFreSpacExt")) return ImageFormat{"Parallels", "parallels"};
  // A dynamic VHD starts with its footer's copy; a fixed one is raw data with the footer in its last sector.
  if (at(0, "conectix")) return ImageFormat{"VHD (dynamic)", "vpc"};
  if (::pread(fd, tail, sizeof tail, off_t(size - sizeof tail)) == ssize_t(sizeof tail) &&
      std::memcmp(tail, "conectix", 8) == 0) {
    return ImageFormat{"VHD (fixed)", "vpc"};
  }
  return std::nullopt;
}

}  // namespace

Result<DiskOptions> parse_disk_option(const std::string& text) {
  DiskOptions o;
  size_t start = 0;
  bool first = true;
  while (start <= text.size()) {
    size_t comma = text.find(',', start);
    std::string part = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (first) {
      o.path = part;
      first = false;
    } else if (part.starts_with("overlay=")) {
      o.overlay = part.substr(8);
    } else if (part == "readonly" || part == "ro") {
      o.read_only = true;
    } else if (part == "hash=full") {
      o.hash = DiskHashMode::kFull;
    } else if (part == "hash=lazy") {
      o.hash = DiskHashMode::kLazy;
    } else {
      return fail(ErrorKind::kInvalidArgument,
                  "--disk {}: unknown part '{}' (use FILE[,overlay=FILE][,readonly][,hash=full|lazy])", text, part);
    }
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  if (o.path.empty()) return fail(ErrorKind::kInvalidArgument, "--disk {}: no image file", text);
  if (o.read_only && !o.overlay.empty()) {
    return fail(ErrorKind::kInvalidArgument, "--disk {}: a read-only disk has no overlay", text);
  }
  return o;
}

DiskImage::~DiskImage() {
  if (base_fd_ >= 0) ::close(base_fd_);
  if (overlay_fd_ >= 0) ::close(overlay_fd_);
}

Result<std::unique_ptr<DiskImage>> DiskImage::open(const DiskOptions& options, bool recording) {
  std::unique_ptr<DiskImage> d(new DiskImage());
  d->path_ = options.path;
  d->overlay_path_ = options.overlay;
  d->read_only_ = options.read_only;
  auto fd = open_base(options.path, &d->size_);
  if (!fd) return std::unexpected(fd.error());
  d->base_fd_ = *fd;
  // Replay does not ask: the recording decided how the image is read, and its hash says it is the same file.
  if (auto format = non_raw_format(d->base_fd_, d->size_)) {
    return fail(ErrorKind::kInvalidArgument,
                "the disk image {} is a {} image, and deja reads raw images only: convert it with `qemu-img convert "
                "-f {} -O raw {} IMAGE.raw` and give IMAGE.raw to --disk",
                options.path, format->name, format->qemu_format, options.path);
  }
  if (!options.overlay.empty()) {
    if (auto r = d->open_overlay_file(recording); !r) return std::unexpected(r.error());
  }
  return d;
}

Result<std::unique_ptr<DiskImage>> DiskImage::open_for_replay(const std::string& path, const DiskIdentity& identity,
                                                              bool read_only) {
  std::unique_ptr<DiskImage> d(new DiskImage());
  d->path_ = path;
  d->read_only_ = read_only;
  auto fd = open_base(path, &d->size_);
  if (!fd) return std::unexpected(fd.error());
  d->base_fd_ = *fd;
  if (d->size_ != identity.size) {
    return fail(ErrorKind::kInvalidArgument, "the disk image {} differs from the recording's: {} bytes here, {} recorded",
                path, d->size_, identity.size);
  }
  if (identity.hash_block == 0) {
    auto sha = sha256_fd(d->base_fd_, d->size_, path);
    if (!sha) return std::unexpected(sha.error());
    if (*sha != identity.sha256) {
      return fail(ErrorKind::kInvalidArgument,
                  "the disk image {} differs from the recording's: SHA-256 {} here, {} recorded", path, hex32(*sha),
                  hex32(identity.sha256));
    }
  }
  return d;
}

Result<std::array<uint8_t, 32>> DiskImage::base_sha256() {
  if (!base_sha256_) {
    auto sha = sha256_fd(base_fd_, size_, path_);
    if (!sha) return std::unexpected(sha.error());
    base_sha256_ = *sha;
  }
  return *base_sha256_;
}

Result<DiskIdentity> DiskImage::identity(DiskHashMode mode) {
  DiskIdentity id;
  id.size = size_;
  if (mode == DiskHashMode::kAuto) mode = size_ <= kFullHashLimit ? DiskHashMode::kFull : DiskHashMode::kLazy;
  if (mode == DiskHashMode::kLazy) {
    id.hash_block = kHashBlock;
    return id;
  }
  auto sha = base_sha256();
  if (!sha) return std::unexpected(sha.error());
  id.sha256 = *sha;
  return id;
}

namespace {

// The base image's file as an overlay last saw it with the recorded SHA-256: while it is unchanged, reopening the
// overlay need not hash the image again.
void put_base_stat(uint8_t* p, const struct stat& st) {
  put_u64(p, st.st_dev);
  put_u64(p + 8, st.st_ino);
  put_u64(p + 16, uint64_t(st.st_mtim.tv_sec) * 1'000'000'000 + uint64_t(st.st_mtim.tv_nsec));
  put_u64(p + 24, uint64_t(st.st_ctim.tv_sec) * 1'000'000'000 + uint64_t(st.st_ctim.tv_nsec));
}

}  // namespace

Result<> DiskImage::record_base(int fd, uint8_t* header, const struct stat& base) {
  auto sha = base_sha256();
  if (!sha) return std::unexpected(sha.error());
  std::memcpy(header + kOverlayBaseSha256, sha->data(), sha->size());
  put_base_stat(header + kOverlayBaseStat, base);
  std::string name = std::filesystem::absolute(path_).lexically_normal().string();
  if (name.size() > kOverlayBasePathMax) name.resize(kOverlayBasePathMax);
  header[kOverlayBasePath] = uint8_t(name.size());
  header[kOverlayBasePath + 1] = uint8_t(name.size() >> 8);
  std::memcpy(header + kOverlayBasePath + 2, name.data(), name.size());
  put_u32(header + 8, kOverlayVersion);
  return pwrite_all(fd, header, kOverlayHeaderBytes, 0, overlay_path_);
}

Result<> DiskImage::open_overlay_file(bool recording) {
  int fd = ::open(overlay_path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return fail(ErrorKind::kInvalidArgument, "cannot open the overlay {}: {}", overlay_path_, strerror(errno));
  overlay_fd_ = fd;
  struct stat st {}, base {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    return fail(ErrorKind::kInvalidArgument, "the overlay {} is not a regular file", overlay_path_);
  }
  if (::fstat(base_fd_, &base) != 0 || (base.st_dev == st.st_dev && base.st_ino == st.st_ino)) {
    return fail(ErrorKind::kInvalidArgument, "the overlay {} is the disk image itself; the image is never written",
                overlay_path_);
  }
  const uint64_t blocks = (size_ + kBlockSize - 1) / kBlockSize;
  const uint64_t bitmap_bytes = (blocks + 7) / 8;
  bitmap_offset_ = kOverlayHeaderBytes;
  data_offset_ = kOverlayHeaderBytes + (bitmap_bytes + kBlockSize - 1) / kBlockSize * kBlockSize;
  bitmap_.assign(bitmap_bytes, 0);
  std::vector<uint8_t> header(kOverlayHeaderBytes, 0);
  if (st.st_size == 0) {
    std::memcpy(header.data(), kOverlayMagic, 8);
    put_u32(header.data() + 12, uint32_t(kBlockSize));
    put_u64(header.data() + 16, size_);
    put_u64(header.data() + 24, bitmap_offset_);
    put_u64(header.data() + 32, bitmap_bytes);
    put_u64(header.data() + 40, data_offset_);
    if (auto r = record_base(fd, header.data(), base); !r) return r;
    if (::ftruncate(fd, off_t(data_offset_ + blocks * kBlockSize)) != 0) {
      return fail(ErrorKind::kHost, "cannot size the overlay {}: {}", overlay_path_, strerror(errno));
    }
    return {};
  }
  if (st.st_size < off_t(kOverlayHeaderBytes) ||
      !pread_all(fd, header.data(), header.size(), 0, overlay_path_) ||
      std::memcmp(header.data(), kOverlayMagic, 8) != 0) {
    return fail(ErrorKind::kInvalidArgument,
                "{} exists and is not a deja overlay: refusing to overwrite it (give a new file, or an empty one)",
                overlay_path_);
  }
  const uint32_t version = get_u32(header.data() + 8);
  const size_t name_length = std::min<size_t>(header[kOverlayBasePath] | header[kOverlayBasePath + 1] << 8,
                                              kOverlayBasePathMax);
  const std::string base_name(reinterpret_cast<const char*>(header.data()) + kOverlayBasePath + 2, name_length);
  if ((version != 1 && version != kOverlayVersion) || get_u32(header.data() + 12) != kBlockSize ||
      get_u64(header.data() + 16) != size_ || get_u64(header.data() + 24) != bitmap_offset_ ||
      get_u64(header.data() + 32) != bitmap_bytes || get_u64(header.data() + 40) != data_offset_) {
    return fail(ErrorKind::kInvalidArgument,
                "the overlay {} belongs to a disk image of {} bytes{} (or is of another overlay version: {}); {} is {} "
                "bytes",
                overlay_path_, get_u64(header.data() + 16), version >= 2 ? " (" + base_name + ")" : "", version,
                path_, size_);
  }
  if (version == 1) {
    // Made before overlays recorded their base: from now on it records this one.
    say("warning: the overlay {} was made by an earlier deja and does not say which disk image it was made over; it "
        "is used over {}, which it now records as its base",
        overlay_path_, path_);
    if (auto r = record_base(fd, header.data(), base); !r) return r;
  } else {
    uint8_t seen[32] = {};
    put_base_stat(seen, base);
    if (std::memcmp(seen, header.data() + kOverlayBaseStat, sizeof seen) != 0) {
      // Another file, or the same one touched since: its contents decide.
      auto sha = base_sha256();
      if (!sha) return std::unexpected(sha.error());
      std::array<uint8_t, 32> recorded{};
      std::memcpy(recorded.data(), header.data() + kOverlayBaseSha256, recorded.size());
      if (*sha != recorded) {
        return fail(ErrorKind::kInvalidArgument,
                    "the overlay {} was made over the disk image {} (SHA-256 {}); {} is another image of the same size "
                    "(SHA-256 {}): the overlay holds only the blocks its guest wrote, so over another image the guest "
                    "would see a mix of two disks. Give it the image it was made over, or give a new overlay file",
                    overlay_path_, base_name, hex32(recorded), path_, hex32(*sha));
      }
      if (auto r = pwrite_all(fd, seen, sizeof seen, kOverlayBaseStat, overlay_path_); !r) return r;
    }
  }
  if (auto r = pread_all(fd, bitmap_.data(), bitmap_bytes, bitmap_offset_, overlay_path_); !r) {
    return fail(ErrorKind::kInvalidArgument, "the overlay {} is damaged: {}", overlay_path_, r.error().message);
  }
  if (recording && overlay_blocks() > 0) {
    return fail(ErrorKind::kInvalidArgument,
                "the overlay {} already holds {} blocks of earlier guest writes; a recording starts from the disk "
                "image alone (replay has only the image): give a new overlay file, or none",
                overlay_path_, overlay_blocks());
  }
  return {};
}

uint64_t DiskImage::overlay_blocks() const {
  if (overlay_fd_ >= 0) {
    uint64_t n = 0;
    for (uint8_t b : bitmap_) n += uint64_t(__builtin_popcount(b));
    return n;
  }
  return blocks_.size();
}

Result<> DiskImage::fail_host(std::string message) {
  if (host_error_) host_error_(message);
  return fail(ErrorKind::kHost, "{}", message);
}

bool DiskImage::verified(uint64_t block) const {
  if (keep_history_) {
    auto it = verified_index_.find(block);
    return it != verified_index_.end() && it->second < verified_count_;
  }
  return !verified_bits_.empty() && (verified_bits_[block / 64] & (1ull << (block % 64)));
}

void DiskImage::mark_verified(uint64_t block) {
  if (keep_history_) {
    if (verified_count_ < verified_log_.size() && verified_log_[verified_count_] != block) {
      // A re-execution that reads another block than last time: what this replay had seen after here is gone.
      for (size_t i = verified_count_; i < verified_log_.size(); ++i) verified_index_.erase(verified_log_[i]);
      verified_log_.resize(verified_count_);
      verified_hash_at_.resize(verified_count_ + 1);
    }
    if (verified_count_ == verified_log_.size()) {
      verified_log_.push_back(block);
      verified_index_[block] = verified_count_;
    }
  } else {
    if (verified_bits_.empty()) verified_bits_.assign((size_ / hash_block_ + 64) / 64, 0);
    verified_bits_[block / 64] |= 1ull << (block % 64);
  }
  ++verified_count_;
  verified_hash_ = XXH3_64bits_withSeed(&block, sizeof block, verified_hash_);
  if (keep_history_ && verified_count_ == verified_hash_at_.size()) verified_hash_at_.push_back(verified_hash_);
}

Result<> DiskImage::verify_base(uint64_t offset, uint64_t length) {
  if (!checker_ || hash_block_ == 0 || length == 0) return {};
  std::vector<uint8_t> block;
  for (uint64_t b = offset / hash_block_; b <= (offset + length - 1) / hash_block_; ++b) {
    if (verified(b)) continue;
    const uint64_t start = b * hash_block_;
    block.resize(size_t(std::min<uint64_t>(hash_block_, size_ - start)));
    if (auto r = pread_all(base_fd_, block.data(), block.size(), start, path_); !r) return fail_host(r.error().message);
    const uint64_t hash = XXH3_64bits(block.data(), block.size());
    if (auto r = checker_->check_disk_block(index_, b, hash); !r) return r;
    mark_verified(b);
  }
  return {};
}

Result<> DiskImage::read_base(uint64_t offset, std::span<uint8_t> out) {
  if (auto r = verify_base(offset, out.size()); !r) return r;
  if (auto r = pread_all(base_fd_, out.data(), out.size(), offset, path_); !r) return fail_host(r.error().message);
  return {};
}

Result<> DiskImage::read_block(uint64_t block, std::span<uint8_t> out) {
  const uint64_t start = block * kBlockSize;
  if (overlay_fd_ >= 0) {
    if (bitmap_[block / 8] & (1u << (block % 8))) {
      if (auto r = pread_all(overlay_fd_, out.data(), out.size(), data_offset_ + start, overlay_path_); !r) {
        return fail_host(r.error().message);
      }
      return {};
    }
  } else if (auto it = blocks_.find(block); it != blocks_.end()) {
    // The newest version at this point of the history (without history there is only one).
    const std::vector<Version>& versions = it->second;
    auto v = std::find_if(versions.rbegin(), versions.rend(), [&](const Version& x) { return x.seq <= writes_; });
    if (v != versions.rend()) {
      if (v->data.empty()) {
        std::fill(out.begin(), out.end(), uint8_t{0});
      } else {
        std::copy_n(v->data.begin(), out.size(), out.begin());
      }
      return {};
    }
  }
  return read_base(start, out);
}

Result<> DiskImage::read(uint64_t offset, std::span<uint8_t> out) {
  if (offset > size_ || out.size() > size_ - offset) {
    return fail(ErrorKind::kGuest, "read of {} bytes at {} past the end of {}", out.size(), offset, path_);
  }
  if (checker_) checker_->disk_io(index_, false, false, offset, out.size());
  uint8_t block[kBlockSize];
  for (uint64_t done = 0; done < out.size();) {
    const uint64_t at = offset + done, b = at / kBlockSize, within = at % kBlockSize;
    const uint64_t block_bytes = std::min<uint64_t>(kBlockSize, size_ - b * kBlockSize);
    const uint64_t n = std::min<uint64_t>(block_bytes - within, out.size() - done);
    if (auto r = read_block(b, std::span(block, block_bytes)); !r) return r;
    std::copy_n(block + within, n, out.begin() + done);
    done += n;
  }
  bytes_read_ += out.size();
  return {};
}

Result<> DiskImage::store_block(uint64_t block, std::span<const uint8_t> data) {
  const uint64_t start = block * kBlockSize;
  const uint64_t block_bytes = std::min<uint64_t>(kBlockSize, size_ - start);
  if (overlay_fd_ >= 0) {
    if (data.empty()) {
      std::vector<uint8_t> zeros(block_bytes, 0);
      if (auto r = pwrite_all(overlay_fd_, zeros.data(), zeros.size(), data_offset_ + start, overlay_path_); !r) {
        return fail_host(r.error().message);
      }
    } else if (auto r = pwrite_all(overlay_fd_, data.data(), data.size(), data_offset_ + start, overlay_path_); !r) {
      return fail_host(r.error().message);
    }
    // The data before the bitmap bit: an overlay cut short by a crash never claims a block it does not hold.
    if (!(bitmap_[block / 8] & (1u << (block % 8)))) {
      bitmap_[block / 8] |= uint8_t(1u << (block % 8));
      if (auto r = pwrite_all(overlay_fd_, &bitmap_[block / 8], 1, bitmap_offset_ + block / 8, overlay_path_); !r) {
        return fail_host(r.error().message);
      }
    }
    return {};
  }
  std::vector<Version>& versions = blocks_[block];
  Version v{writes_, data.empty() ? std::vector<uint8_t>{} : std::vector<uint8_t>(data.begin(), data.end())};
  if (keep_history_) {
    if (!versions.empty() && versions.back().seq == writes_) {
      versions.back() = std::move(v);  // the same write touching this block again (a partial, then a full one)
    } else {
      versions.push_back(std::move(v));
    }
  } else {
    versions.assign(1, std::move(v));
  }
  return {};
}

void DiskImage::drop_writes_from(uint64_t seq) {
  for (auto it = blocks_.begin(); it != blocks_.end();) {
    std::erase_if(it->second, [seq](const Version& v) { return v.seq >= seq; });
    it = it->second.empty() ? blocks_.erase(it) : std::next(it);
  }
  hash_at_.resize(seq);
}

// With history: true when this write (just counted and hashed) is one this replay made before, whose versions are
// already there; a different one drops the history from here on.
bool DiskImage::seen_write() {
  if (!keep_history_) return false;
  if (writes_ < hash_at_.size()) {
    if (hash_at_[writes_] == write_hash_) return true;
    drop_writes_from(writes_);
  }
  hash_at_.push_back(write_hash_);
  return false;
}

void DiskImage::chain_write(uint64_t offset, uint64_t length, std::span<const uint8_t> data) {
  XXH3_state_t* state = XXH3_createState();
  XXH3_64bits_reset_withSeed(state, write_hash_);
  XXH3_64bits_update(state, &offset, sizeof offset);
  XXH3_64bits_update(state, &length, sizeof length);
  if (!data.empty()) XXH3_64bits_update(state, data.data(), data.size());
  write_hash_ = XXH3_64bits_digest(state);
  XXH3_freeState(state);
}

Result<> DiskImage::write(uint64_t offset, std::span<const uint8_t> data) {
  if (read_only_) return fail(ErrorKind::kGuest, "{} is read-only", path_);
  if (offset > size_ || data.size() > size_ - offset) {
    return fail(ErrorKind::kGuest, "write of {} bytes at {} past the end of {}", data.size(), offset, path_);
  }
  if (checker_) checker_->disk_io(index_, true, false, offset, data.size());
  ++writes_;
  chain_write(offset, data.size(), data);
  bytes_written_ += data.size();
  if (seen_write()) return {};
  uint8_t block[kBlockSize];
  for (uint64_t done = 0; done < data.size();) {
    const uint64_t at = offset + done, b = at / kBlockSize, within = at % kBlockSize;
    const uint64_t block_bytes = std::min<uint64_t>(kBlockSize, size_ - b * kBlockSize);
    const uint64_t n = std::min<uint64_t>(block_bytes - within, data.size() - done);
    if (n < block_bytes) {
      if (auto r = read_block(b, std::span(block, block_bytes)); !r) return r;
    }
    std::copy_n(data.begin() + done, n, block + within);
    if (auto r = store_block(b, std::span(block, block_bytes)); !r) return r;
    done += n;
  }
  return {};
}

Result<> DiskImage::write_zeroes(uint64_t offset, uint64_t length) {
  if (read_only_) return fail(ErrorKind::kGuest, "{} is read-only", path_);
  if (offset > size_ || length > size_ - offset) {
    return fail(ErrorKind::kGuest, "zeroing {} bytes at {} past the end of {}", length, offset, path_);
  }
  if (checker_) checker_->disk_io(index_, true, true, offset, length);
  ++writes_;
  chain_write(offset, length, {});
  if (seen_write()) return {};
  uint8_t block[kBlockSize];
  for (uint64_t done = 0; done < length;) {
    const uint64_t at = offset + done, b = at / kBlockSize, within = at % kBlockSize;
    const uint64_t block_bytes = std::min<uint64_t>(kBlockSize, size_ - b * kBlockSize);
    const uint64_t n = std::min<uint64_t>(block_bytes - within, length - done);
    if (n < block_bytes) {
      if (auto r = read_block(b, std::span(block, block_bytes)); !r) return r;
      std::fill_n(block + within, n, uint8_t{0});
      if (auto r = store_block(b, std::span(block, block_bytes)); !r) return r;
    } else if (auto r = store_block(b, {}); !r) {
      return r;
    }
    done += n;
  }
  return {};
}

Result<> DiskImage::flush() {
  if (overlay_fd_ >= 0 && ::fdatasync(overlay_fd_) != 0) {
    return fail_host(fmt::format("flushing the overlay {}: {}", overlay_path_, strerror(errno)));
  }
  return {};
}

std::vector<uint8_t> DiskImage::save() const {
  StateWriter w("DISK", 1);
  w.u64(writes_);
  w.u64(write_hash_);
  w.u64(verified_count_);
  w.u64(verified_hash_);
  return w.take();
}

Result<> DiskImage::restore(std::span<const uint8_t> state) {
  StateReader r(state, "DISK", 1);
  const uint64_t writes = r.u64(), write_hash = r.u64(), verified = r.u64(), verified_hash = r.u64();
  if (auto done = r.finish(); !done) return done;
  const bool present = writes == writes_ && write_hash == write_hash_ && verified == verified_count_ &&
                       verified_hash == verified_hash_;
  if (present) return {};
  const bool reachable = keep_history_ && overlay_fd_ < 0 && writes < hash_at_.size() &&
                         hash_at_[writes] == write_hash && verified < verified_hash_at_.size() &&
                         verified_hash_at_[verified] == verified_hash;
  if (!reachable) {
    return fail(ErrorKind::kUnsupported,
                "the disk {} is at write {} (and {} verified blocks); the saved state at write {} ({}) is not one this "
                "replay has passed",
                path_, writes_, verified_count_, writes, verified);
  }
  writes_ = writes;
  write_hash_ = write_hash;
  verified_count_ = verified;
  verified_hash_ = verified_hash;
  return {};
}

}  // namespace deja
