// Text from outside deja (a trace's strings, a guest's output, file names): checked as UTF-8, made safe to print.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace deja {

// The length of the valid UTF-8 sequence starting at text[at] (0 when there is none: a stray byte, an overlong form,
// a UTF-16 surrogate or a value past U+10FFFF).
size_t utf8_sequence(std::string_view text, size_t at);
// The offset of the first byte that is not part of valid UTF-8, or none.
std::optional<size_t> first_invalid_utf8(std::string_view text);

// `text` as it may be printed on a terminal or into a log line without acting on either: printable UTF-8 is kept
// ("café" stays "café"); a backslash is doubled; newline, carriage return and tab become \n, \r and \t; every other
// control character (ESC, C1 controls, DEL), a bidirectional override, and a byte that is not valid UTF-8 becomes
// \xNN (a code point: \u{NNNN}). So a string cannot forge a line, move the cursor or recolour what follows, and the
// escaped form names every byte. Every string deja prints from a trace goes through it.
std::string printable(std::string_view text);
// The same for a stream the user reads as lines (a guest's serial output): newlines, tabs and the \r of a \r\n
// stay as they are.
std::string printable_lines(std::string_view text);

}  // namespace deja
