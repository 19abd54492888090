// ScriptedInput: a recording's serial input handed out at the guest times it arrived, in order, never early.
#include "replay/scripted_input.h"

#include <gtest/gtest.h>

#include <string>

namespace deja {
namespace {

std::string read(ScriptedInput& in, size_t space, uint64_t now_ns) {
  std::string out(space, '\0');
  out.resize(in.read_available(std::span(reinterpret_cast<uint8_t*>(out.data()), out.size()), now_ns));
  return out;
}

TEST(ScriptedInput, BytesArriveAtTheirTimeInOrderAcrossReads) {
  ScriptedInput in({{2'000, "late"}, {1'000, "early "}, {1'500, ""}});
  EXPECT_EQ(read(in, 64, 999), "");
  EXPECT_EQ(in.next_arrival_ns(999), 1'000u);
  // The receiver takes 4 bytes at a time: the rest waits, in order, even once the next arrival is due.
  EXPECT_EQ(read(in, 4, 2'500), "earl");
  EXPECT_EQ(read(in, 4, 2'500), "y la");
  EXPECT_EQ(read(in, 64, 2'500), "te");
  EXPECT_TRUE(in.at_end());
  EXPECT_EQ(in.next_arrival_ns(0), std::nullopt);
}

TEST(ScriptedInput, TheNextArrivalIsTheFirstAfterTheGivenTime) {
  ScriptedInput in({{1'000, "a"}, {5'000, "b"}});
  EXPECT_EQ(in.next_arrival_ns(0), 1'000u);
  // Due but not yet taken (a full receiver): only a later arrival ends a wait.
  EXPECT_EQ(in.next_arrival_ns(1'000), 5'000u);
  EXPECT_EQ(in.next_arrival_ns(5'000), std::nullopt);
  EXPECT_FALSE(in.at_end());
}

}  // namespace
}  // namespace deja
