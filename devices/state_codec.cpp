// Device state encoding: header checks, bounds-checked little-endian reads, first-error reporting.
#include "devices/state_codec.h"

#include <algorithm>

namespace deja {

StateWriter::StateWriter(std::string_view tag, uint8_t version) {
  DEJA_ASSERT(tag.size() == 4, "state tag '{}' must be 4 characters", tag);
  bytes_.resize(5);
  std::copy_n(tag.begin(), 4, bytes_.begin());
  bytes_[4] = version;
}

StateReader::StateReader(std::span<const uint8_t> state, std::string_view tag, uint8_t oldest, uint8_t newest)
    : state_(state), tag_(tag) {
  if (state.size() < 5) {
    invalid(fmt::format("state is {} bytes, shorter than its 5-byte header", state.size()));
    return;
  }
  std::string_view got(reinterpret_cast<const char*>(state.data()), 4);
  if (got != tag) {
    invalid(fmt::format("state tag is '{}', expected '{}' (state of another device?)", got, tag));
    return;
  }
  if (state[4] < oldest || state[4] > newest) {
    invalid(oldest == newest ? fmt::format("state version is {}, this build reads version {}", state[4], newest)
                             : fmt::format("state version is {}, this build reads versions {} to {}", state[4], oldest,
                                           newest));
    return;
  }
  version_ = state[4];
  pos_ = 5;
}

uint64_t StateReader::le(int n) {
  if (!ok()) return 0;
  if (state_.size() - pos_ < size_t(n)) {
    invalid(fmt::format("state truncated: {} bytes, needed more than {}", state_.size(), pos_));
    return 0;
  }
  uint64_t v = 0;
  for (int i = 0; i < n; ++i) v |= uint64_t(state_[pos_ + i]) << (8 * i);
  pos_ += n;
  return v;
}

bool StateReader::boolean() {
  uint8_t v = u8();
  if (v > 1) invalid(fmt::format("boolean field at byte {} holds {}", pos_ - 1, v));
  return v == 1;
}

void StateReader::bytes(std::span<uint8_t> out) {
  if (!ok()) {
    std::fill(out.begin(), out.end(), uint8_t{0});
    return;
  }
  if (state_.size() - pos_ < out.size()) {
    invalid(fmt::format("state truncated: {} bytes, needed more than {}", state_.size(), pos_));
    std::fill(out.begin(), out.end(), uint8_t{0});
    return;
  }
  std::copy_n(state_.begin() + pos_, out.size(), out.begin());
  pos_ += out.size();
}

void StateReader::invalid(std::string message) {
  if (error_.empty()) error_ = std::move(message);
}

Result<> StateReader::finish() const {
  if (!error_.empty()) return fail(ErrorKind::kInvalidArgument, "{} device state: {}", tag_, error_);
  if (pos_ != state_.size()) {
    return fail(ErrorKind::kInvalidArgument, "{} device state: {} trailing bytes after byte {}", tag_,
                state_.size() - pos_, pos_);
  }
  return {};
}

}  // namespace deja
