// The gdb remote serial protocol's framing: packets, acknowledgements, interrupts, checksums, hex and escapes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace deja::gdb {

// Longest packet deja accepts (and announces as PacketSize): longer ones are answered with an error.
constexpr size_t kMaxPacket = 16384;

// One unit of what gdb sent.
struct Incoming {
  enum class Kind {
    kPacket,       // a complete "$payload#xx" with a good checksum: `payload` (escapes left in place)
    kInterrupt,    // 0x03 between packets (Ctrl-C)
    kAck,          // '+'
    kNack,         // '-': resend the last reply
    kBadChecksum,  // a packet whose checksum does not match (answer '-')
    kTooLong,      // a packet longer than kMaxPacket (discarded; answer with an error)
  };
  Kind kind;
  std::string payload;
};

// Incremental parser: feed() whatever arrived on the socket, in any split, and get complete units.
// Bytes outside packets other than '+', '-' and 0x03 are ignored, as gdb's own stubs do.
class PacketReader {
 public:
  explicit PacketReader(size_t max_packet = kMaxPacket) : max_(max_packet) {}
  void feed(std::span<const uint8_t> bytes, std::vector<Incoming>& out);
  void feed(std::string_view bytes, std::vector<Incoming>& out) {
    feed(std::span(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()), out);
  }

 private:
  enum class State { kIdle, kBody, kChecksum1, kChecksum2 };
  size_t max_;
  State state_ = State::kIdle;
  std::string body_;
  bool overflow_ = false;
  uint8_t sum_ = 0;
  uint8_t expected_ = 0;
};

// "$" + payload with '$', '#', '}' and '*' escaped + "#" + checksum.
std::string frame(std::string_view payload);

// Hex helpers; every parser refuses what is not exactly what it expects.
std::string hex_encode(std::span<const uint8_t> bytes);
std::string hex_encode(std::string_view text);
std::optional<std::vector<uint8_t>> hex_decode(std::string_view hex);
std::optional<uint64_t> parse_hex_u64(std::string_view hex);
// Little-endian target-order hex of an integer of `bytes` bytes (register values).
std::string hex_le(uint64_t value, unsigned bytes);
// "addr,length" (m packets, qXfer offsets): both hex, length bounded by `max_length`.
std::optional<std::pair<uint64_t, uint64_t>> parse_addr_length(std::string_view text, uint64_t max_length);
// Splits at every `sep`.
std::vector<std::string_view> split(std::string_view text, char sep);

}  // namespace deja::gdb
