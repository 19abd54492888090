// UTF-8 sequences, and the one escaping function for text from outside deja.
#include "core/text.h"

#include <cstdint>

#include <fmt/format.h>

namespace deja {

size_t utf8_sequence(std::string_view text, size_t at) {
  const auto* p = reinterpret_cast<const uint8_t*>(text.data()) + at;
  const size_t n = text.size() - at;
  const uint8_t c = p[0];
  const size_t length = c < 0x80 ? 1 : (c & 0xe0) == 0xc0 ? 2 : (c & 0xf0) == 0xe0 ? 3 : (c & 0xf8) == 0xf0 ? 4 : 0;
  if (length == 0 || length > n) return 0;
  uint32_t code = length == 1 ? c : c & (0x7f >> length);
  for (size_t k = 1; k < length; ++k) {
    if ((p[k] & 0xc0) != 0x80) return 0;
    code = (code << 6) | (p[k] & 0x3f);
  }
  static constexpr uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
  if (code < kMin[length] || (code >= 0xd800 && code <= 0xdfff) || code > 0x10ffff) return 0;
  return length;
}

std::optional<size_t> first_invalid_utf8(std::string_view text) {
  for (size_t i = 0; i < text.size();) {
    const size_t length = utf8_sequence(text, i);
    if (length == 0) return i;
    i += length;
  }
  return std::nullopt;
}

namespace {

uint32_t code_point(std::string_view text, size_t at, size_t length) {
  const auto* p = reinterpret_cast<const uint8_t*>(text.data()) + at;
  uint32_t code = length == 1 ? p[0] : p[0] & (0x7f >> length);
  for (size_t k = 1; k < length; ++k) code = (code << 6) | (p[k] & 0x3f);
  return code;
}

std::string escape(std::string_view text, bool lines) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const size_t length = utf8_sequence(text, i);
    const auto byte = static_cast<uint8_t>(text[i]);
    if (length == 0) {
      out += fmt::format("\\x{:02x}", byte);
      ++i;
      continue;
    }
    const uint32_t code = code_point(text, i, length);
    const bool crlf = byte == '\r' && i + 1 < text.size() && text[i + 1] == '\n';
    if (lines && (byte == '\n' || byte == '\t' || crlf)) {
      out += char(byte);
    } else if (byte == '\\') {
      out += "\\\\";
    } else if (byte == '\n') {
      out += "\\n";
    } else if (byte == '\r') {
      out += "\\r";
    } else if (byte == '\t') {
      out += "\\t";
    } else if (code < 0x20 || code == 0x7f) {
      out += fmt::format("\\x{:02x}", code);
    } else if ((code >= 0x80 && code < 0xa0) || (code >= 0x202a && code <= 0x202e) ||
               (code >= 0x2066 && code <= 0x2069)) {
      out += fmt::format("\\u{{{:04x}}}", code);  // C1 controls and bidirectional overrides
    } else {
      out.append(text.substr(i, length));
    }
    i += length;
  }
  return out;
}

}  // namespace

std::string printable(std::string_view text) { return escape(text, false); }

std::string printable_lines(std::string_view text) { return escape(text, true); }

}  // namespace deja
