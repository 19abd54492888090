// Packet framing and the hex codecs of the remote protocol (gdb manual, "Overview" of Remote Protocol).
#include "gdbstub/packet.h"

#include <fmt/format.h>

namespace deja::gdb {
namespace {

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

void PacketReader::feed(std::span<const uint8_t> bytes, std::vector<Incoming>& out) {
  for (uint8_t b : bytes) {
    switch (state_) {
      case State::kIdle:
        if (b == '$') {
          state_ = State::kBody;
          body_.clear();
          overflow_ = false;
          sum_ = 0;
        } else if (b == 0x03) {
          out.push_back({Incoming::Kind::kInterrupt, {}});
        } else if (b == '+') {
          out.push_back({Incoming::Kind::kAck, {}});
        } else if (b == '-') {
          out.push_back({Incoming::Kind::kNack, {}});
        }
        break;
      case State::kBody:
        if (b == '#') {
          state_ = State::kChecksum1;
        } else if (b == '$') {
          // A new packet start inside a packet: the earlier one was cut off; start over.
          body_.clear();
          overflow_ = false;
          sum_ = 0;
        } else {
          sum_ = uint8_t(sum_ + b);
          if (body_.size() < max_) body_.push_back(char(b));
          else overflow_ = true;
        }
        break;
      case State::kChecksum1: {
        int d = hex_digit(char(b));
        if (d < 0) {
          out.push_back({Incoming::Kind::kBadChecksum, {}});
          state_ = State::kIdle;
          break;
        }
        expected_ = uint8_t(d << 4);
        state_ = State::kChecksum2;
        break;
      }
      case State::kChecksum2: {
        int d = hex_digit(char(b));
        state_ = State::kIdle;
        if (d < 0 || uint8_t(expected_ | d) != sum_) {
          out.push_back({Incoming::Kind::kBadChecksum, {}});
        } else if (overflow_) {
          out.push_back({Incoming::Kind::kTooLong, {}});
        } else {
          out.push_back({Incoming::Kind::kPacket, std::move(body_)});
        }
        body_.clear();
        break;
      }
    }
  }
}

std::string frame(std::string_view payload) {
  std::string out = "$";
  uint8_t sum = 0;
  auto put = [&](char c) {
    out.push_back(c);
    sum = uint8_t(sum + uint8_t(c));
  };
  for (char c : payload) {
    if (c == '$' || c == '#' || c == '}' || c == '*') {
      put('}');
      put(char(c ^ 0x20));
    } else {
      put(c);
    }
  }
  out += fmt::format("#{:02x}", sum);
  return out;
}

std::string hex_encode(std::span<const uint8_t> bytes) {
  static const char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (uint8_t b : bytes) {
    out.push_back(kDigits[b >> 4]);
    out.push_back(kDigits[b & 15]);
  }
  return out;
}

std::string hex_encode(std::string_view text) {
  return hex_encode(std::span(reinterpret_cast<const uint8_t*>(text.data()), text.size()));
}

std::optional<std::vector<uint8_t>> hex_decode(std::string_view hex) {
  if (hex.size() % 2 != 0) return std::nullopt;
  std::vector<uint8_t> out(hex.size() / 2);
  for (size_t i = 0; i < out.size(); ++i) {
    int hi = hex_digit(hex[2 * i]), lo = hex_digit(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return std::nullopt;
    out[i] = uint8_t(hi << 4 | lo);
  }
  return out;
}

std::optional<uint64_t> parse_hex_u64(std::string_view hex) {
  if (hex.empty() || hex.size() > 16) return std::nullopt;
  uint64_t v = 0;
  for (char c : hex) {
    int d = hex_digit(c);
    if (d < 0) return std::nullopt;
    v = v << 4 | uint64_t(d);
  }
  return v;
}

std::string hex_le(uint64_t value, unsigned bytes) {
  std::string out;
  for (unsigned i = 0; i < bytes; ++i) out += fmt::format("{:02x}", uint8_t(i < 8 ? value >> (8 * i) : 0));
  return out;
}

std::optional<std::pair<uint64_t, uint64_t>> parse_addr_length(std::string_view text, uint64_t max_length) {
  size_t comma = text.find(',');
  if (comma == std::string_view::npos) return std::nullopt;
  auto addr = parse_hex_u64(text.substr(0, comma));
  auto length = parse_hex_u64(text.substr(comma + 1));
  if (!addr || !length || *length > max_length) return std::nullopt;
  return std::pair{*addr, *length};
}

std::vector<std::string_view> split(std::string_view text, char sep) {
  std::vector<std::string_view> parts;
  size_t start = 0;
  for (;;) {
    size_t at = text.find(sep, start);
    if (at == std::string_view::npos) {
      parts.push_back(text.substr(start));
      return parts;
    }
    parts.push_back(text.substr(start, at - start));
    start = at + 1;
  }
}

}  // namespace deja::gdb
