// Guest RAM implementation: memfd + shared mapping, checked access, VMM-write dirty tracking.
#include "core/guest_memory.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstring>

namespace deja {

Result<GuestMemory> GuestMemory::create(uint64_t size) {
  if (size < (1u << 20) || size % kPageSize != 0) {
    return fail(ErrorKind::kInvalidArgument, "guest memory size {} must be at least 1M and a multiple of 4K", size);
  }
  if (size > (uint64_t{64} << 30)) {
    return fail(ErrorKind::kInvalidArgument, "guest memory size {} exceeds the 64G limit", size);
  }
  int fd = memfd_create("deja-guest-ram", MFD_CLOEXEC);
  if (fd < 0) return fail(ErrorKind::kHost, "memfd_create failed: {}", strerror(errno));
  if (ftruncate(fd, static_cast<off_t>(size)) != 0) {
    int e = errno;
    close(fd);
    // Guest RAM is a memfd, so a file-size limit applies to it as to any file.
    return fail(ErrorKind::kHost, "cannot size guest RAM to {} bytes: {}{}", size, strerror(e),
                e == EFBIG ? " (the file-size limit, ulimit -f, applies to guest RAM, which is a memory file: raise it "
                             "above the guest's --mem)"
                           : "");
  }
  void* base = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd, 0);
  if (base == MAP_FAILED) {
    int e = errno;
    close(fd);
    return fail(ErrorKind::kHost, "cannot map {} bytes of guest RAM: {}", size, strerror(e));
  }
  return GuestMemory(fd, static_cast<uint8_t*>(base), size);
}

GuestMemory::GuestMemory(GuestMemory&& other) noexcept
    : fd_(other.fd_),
      base_(other.base_),
      size_(other.size_),
      vmm_dirty_(std::move(other.vmm_dirty_)),
      vmm_dirty_bits_(std::move(other.vmm_dirty_bits_)),
      dirty_bits_(std::move(other.dirty_bits_)),
      dirty_generation_(other.dirty_generation_) {
  other.fd_ = -1;
  other.base_ = nullptr;
  other.size_ = 0;
}

GuestMemory& GuestMemory::operator=(GuestMemory&& other) noexcept {
  if (this != &other) {
    release();
    fd_ = other.fd_;
    base_ = other.base_;
    size_ = other.size_;
    vmm_dirty_ = std::move(other.vmm_dirty_);
    vmm_dirty_bits_ = std::move(other.vmm_dirty_bits_);
    dirty_bits_ = std::move(other.dirty_bits_);
    dirty_generation_ = other.dirty_generation_;
    other.fd_ = -1;
    other.base_ = nullptr;
    other.size_ = 0;
  }
  return *this;
}

GuestMemory::~GuestMemory() { release(); }

void GuestMemory::release() {
  if (base_) munmap(base_, size_);
  if (fd_ >= 0) close(fd_);
  base_ = nullptr;
  fd_ = -1;
}

Result<std::span<uint8_t>> GuestMemory::span(Gpa gpa, uint64_t len) {
  if (!contains(gpa, len)) {
    return fail(ErrorKind::kGuest, "guest-physical range [{:#x}, +{:#x}) lies outside RAM (size {:#x})", gpa.value, len,
                size_);
  }
  return std::span<uint8_t>(base_ + gpa.value, len);
}

Result<std::span<const uint8_t>> GuestMemory::span(Gpa gpa, uint64_t len) const {
  if (!contains(gpa, len)) {
    return fail(ErrorKind::kGuest, "guest-physical range [{:#x}, +{:#x}) lies outside RAM (size {:#x})", gpa.value, len,
                size_);
  }
  return std::span<const uint8_t>(base_ + gpa.value, len);
}

Result<> GuestMemory::write(Gpa gpa, std::span<const uint8_t> data) {
  auto dst = span(gpa, data.size());
  if (!dst) return std::unexpected(dst.error());
  if (!data.empty()) {
    std::memcpy(dst->data(), data.data(), data.size());
    for (uint64_t page = gpa.value / kPageSize; page <= (gpa.value + data.size() - 1) / kPageSize; ++page) {
      note_vmm_write(page);
    }
    mark_dirty(gpa.value, data.size());
  }
  return {};
}

Result<> GuestMemory::read(Gpa gpa, std::span<uint8_t> out) const {
  auto src = span(gpa, out.size());
  if (!src) return std::unexpected(src.error());
  if (!out.empty()) std::memcpy(out.data(), src->data(), out.size());
  return {};
}

std::vector<uint64_t> GuestMemory::take_vmm_dirty_pages() {
  for (uint64_t page : vmm_dirty_) vmm_dirty_bits_[page >> 6] &= ~(uint64_t{1} << (page & 63));
  return std::exchange(vmm_dirty_, {});
}

std::vector<uint64_t> GuestMemory::take_dirty_pages() {
  ++dirty_generation_;
  std::vector<uint64_t> pages;
  const uint64_t page_count = size_ / kPageSize;
  for (size_t w = 0; w < dirty_bits_.size(); ++w) {
    for (uint64_t bits = std::exchange(dirty_bits_[w], 0); bits; bits &= bits - 1) {
      uint64_t page = w * 64 + uint64_t(__builtin_ctzll(bits));
      if (page < page_count) pages.push_back(page);
    }
  }
  return pages;
}

void GuestMemory::mark_all_dirty() { mark_dirty(0, size_); }

Result<uint64_t> parse_size(const std::string& text) {
  uint64_t value = 0;
  const char* begin = text.data();
  const char* end = begin + text.size();
  auto [ptr, ec] = std::from_chars(begin, end, value);
  if (ec != std::errc() || ptr == begin) {
    return fail(ErrorKind::kInvalidArgument, "'{}' is not a size (expected a number with an optional K, M or G suffix)",
                text);
  }
  uint64_t shift = 0;
  std::string_view suffix(ptr, end);
  if (suffix == "" || suffix == "B") shift = 0;
  else if (suffix == "K" || suffix == "k" || suffix == "KiB") shift = 10;
  else if (suffix == "M" || suffix == "m" || suffix == "MiB") shift = 20;
  else if (suffix == "G" || suffix == "g" || suffix == "GiB") shift = 30;
  else {
    return fail(ErrorKind::kInvalidArgument, "'{}' has an unknown size suffix '{}' (use K, M or G)", text, suffix);
  }
  if (shift && value > (UINT64_MAX >> shift)) {
    return fail(ErrorKind::kInvalidArgument, "size '{}' is too large", text);
  }
  return value << shift;
}

}  // namespace deja
