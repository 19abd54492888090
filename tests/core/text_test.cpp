// printable(): the one escaping of text from outside deja (a trace's strings, a guest's output) before it is printed.
#include <gtest/gtest.h>

#include "core/text.h"

namespace deja {
namespace {

TEST(Printable, KeepsTextAndEscapesWhatWouldActOnATerminal) {
  EXPECT_EQ(printable("hello.elf"), "hello.elf");
  EXPECT_EQ(printable("café ☕"), "café ☕");
  EXPECT_EQ(printable("evil\x1b[31m\nforged line"), "evil\\x1b[31m\\nforged line");
  EXPECT_EQ(printable("a\\b\r\t\x7f"), "a\\\\b\\r\\t\\x7f");
  EXPECT_EQ(printable(std::string("nul\0x", 5)), "nul\\x00x");
  EXPECT_EQ(printable("caf\xe9"), "caf\\xe9");                       // not UTF-8
  EXPECT_EQ(printable("\xc2\x9b" "31m"), "\\u{009b}31m");             // C1 CSI
  EXPECT_EQ(printable("\xe2\x80\xae" "txt.exe"), "\\u{202e}txt.exe");  // right-to-left override
  EXPECT_EQ(printable("\xed\xa0\x80"), "\\xed\\xa0\\x80");            // a UTF-16 surrogate
}

TEST(Printable, LinesKeepTheirNewlinesButNotALoneCarriageReturn) {
  EXPECT_EQ(printable_lines("boot\r\nok\tdone\n"), "boot\r\nok\tdone\n");
  EXPECT_EQ(printable_lines("100%\rforged\x1b[2K"), "100%\\rforged\\x1b[2K");
}

TEST(Utf8, FindsTheFirstInvalidByte) {
  EXPECT_EQ(first_invalid_utf8("café"), std::nullopt);
  EXPECT_EQ(first_invalid_utf8("ab\xff"), 2u);
  EXPECT_EQ(first_invalid_utf8("\xc0\xaf"), 0u);  // overlong '/'
  EXPECT_EQ(first_invalid_utf8("\xf4\x90\x80\x80"), 0u);  // past U+10FFFF
}

}  // namespace
}  // namespace deja
