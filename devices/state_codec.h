// Tagged, versioned, length-checked byte encoding shared by every device's save()/restore().
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"

namespace deja {

// Layout: 4-byte tag, 1-byte version, then fields little-endian in the order written. The tag
// and version make a state blob handed to the wrong device (or an older build) fail loudly.
class StateWriter {
 public:
  StateWriter(std::string_view tag, uint8_t version);
  void u8(uint8_t v) { bytes_.push_back(v); }
  void boolean(bool v) { bytes_.push_back(v ? 1 : 0); }
  void u16(uint16_t v) { le(v, 2); }
  void u32(uint32_t v) { le(v, 4); }
  void u64(uint64_t v) { le(v, 8); }
  void i64(int64_t v) { le(static_cast<uint64_t>(v), 8); }
  void bytes(std::span<const uint8_t> v) { bytes_.insert(bytes_.end(), v.begin(), v.end()); }
  std::vector<uint8_t> take() { return std::move(bytes_); }

 private:
  void le(uint64_t v, int n) {
    for (int i = 0; i < n; ++i) bytes_.push_back(uint8_t(v >> (8 * i)));
  }
  std::vector<uint8_t> bytes_;
};

// Reads fields back with a sticky error: after the first problem every read returns 0 and
// finish() reports the first problem, so restore() code stays a straight sequence of reads.
class StateReader {
 public:
  StateReader(std::span<const uint8_t> state, std::string_view tag, uint8_t version)
      : StateReader(state, tag, version, version) {}
  // A state of any version from `oldest` to `newest` (a format that grew: version() says which was read).
  StateReader(std::span<const uint8_t> state, std::string_view tag, uint8_t oldest, uint8_t newest);
  uint8_t version() const { return version_; }
  uint8_t u8() { return uint8_t(le(1)); }
  bool boolean();
  uint16_t u16() { return uint16_t(le(2)); }
  uint32_t u32() { return uint32_t(le(4)); }
  uint64_t u64() { return le(8); }
  int64_t i64() { return static_cast<int64_t>(le(8)); }
  void bytes(std::span<uint8_t> out);
  // Records a semantic problem (a field out of range) unless an earlier one was recorded.
  void invalid(std::string message);
  bool ok() const { return error_.empty(); }
  // Fails on the first recorded problem or on trailing bytes.
  Result<> finish() const;

 private:
  uint64_t le(int n);
  std::span<const uint8_t> state_;
  std::string tag_;
  uint8_t version_ = 0;
  size_t pos_ = 0;
  std::string error_;
};

}  // namespace deja
