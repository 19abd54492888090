// NetworkLink, the seeded wire of deja explore's networks: order kept, latency, reordering, bounds.
#include <gtest/gtest.h>

#include <vector>

#include "replay/network_link.h"

namespace deja {
namespace {

using Way = NetworkLink::Way;

std::vector<uint8_t> frame(uint8_t tag, size_t size = 60) { return std::vector<uint8_t>(size, tag); }

std::vector<uint8_t> tags(const std::vector<std::vector<uint8_t>>& frames) {
  std::vector<uint8_t> out;
  for (const auto& f : frames) out.push_back(f.empty() ? 0 : f[0]);
  return out;
}

TEST(NetworkLink, FramesArriveAtTheirTimeInTheOrderSent) {
  NetworkLink link;
  EXPECT_FALSE(link.next_arrival(Way::kToGuest));
  link.send(Way::kToGuest, frame(1), 500);
  link.send(Way::kToGuest, frame(2), 100);  // sent after 1 with less latency: a wire keeps order, so at 500
  link.send(Way::kToGuest, frame(3), 700);
  link.send(Way::kToNetwork, frame(9), 50);
  EXPECT_EQ(link.next_arrival(Way::kToGuest), 500u);
  EXPECT_EQ(link.next_arrival(Way::kToNetwork), 50u);
  EXPECT_TRUE(link.take_arrived(Way::kToGuest, 499, 10).empty());
  EXPECT_EQ(tags(link.take_arrived(Way::kToGuest, 600, 10)), (std::vector<uint8_t>{1, 2}));
  EXPECT_EQ(tags(link.take_arrived(Way::kToGuest, 700, 10)), (std::vector<uint8_t>{3}));
  EXPECT_EQ(tags(link.take_arrived(Way::kToNetwork, 700, 10)), (std::vector<uint8_t>{9}));
  EXPECT_EQ(link.sent(Way::kToGuest), 3u);
  EXPECT_EQ(link.sent(Way::kToNetwork), 1u);
}

TEST(NetworkLink, AReorderedFrameIsOvertaken) {
  NetworkLink link;
  link.send(Way::kToGuest, frame(1), 5'000, /*in_order=*/false);  // late
  link.send(Way::kToGuest, frame(2), 100);
  link.send(Way::kToGuest, frame(3), 200);
  EXPECT_EQ(tags(link.take_arrived(Way::kToGuest, 10'000, 10)), (std::vector<uint8_t>{2, 3, 1}));
}

TEST(NetworkLink, TakesAtMostWhatTheNicHasRoomFor) {
  NetworkLink link;
  for (uint8_t i = 1; i <= 5; ++i) link.send(Way::kToGuest, frame(i), 10);
  EXPECT_EQ(tags(link.take_arrived(Way::kToGuest, 10, 2)), (std::vector<uint8_t>{1, 2}));
  EXPECT_EQ(link.next_arrival(Way::kToGuest), 10u);
  EXPECT_EQ(tags(link.take_arrived(Way::kToGuest, 10, 9)), (std::vector<uint8_t>{3, 4, 5}));
}

TEST(NetworkLink, ALostFrameIsCountedAndNeverArrives) {
  NetworkLink link;
  link.send(Way::kToNetwork, frame(1), 10);
  link.lose(Way::kToNetwork);
  link.send(Way::kToNetwork, frame(3), 10);
  EXPECT_EQ(link.sent(Way::kToNetwork), 3u);
  EXPECT_EQ(tags(link.take_arrived(Way::kToNetwork, 10, 9)), (std::vector<uint8_t>{1, 3}));
}

TEST(NetworkLink, IsBoundedLikeAQueue) {
  NetworkLink link;
  for (size_t i = 0; i < NetworkLink::kMaxFrames; ++i) ASSERT_TRUE(link.send(Way::kToGuest, frame(1), 1));
  EXPECT_FALSE(link.send(Way::kToGuest, frame(2), 1));
  EXPECT_EQ(link.dropped(), 1u);
  EXPECT_TRUE(link.send(Way::kToNetwork, frame(3), 1)) << "each way has its own room";
  NetworkLink bytes;
  EXPECT_TRUE(bytes.send(Way::kToGuest, frame(1, NetworkLink::kMaxBytes - 10), 1));
  EXPECT_FALSE(bytes.send(Way::kToGuest, frame(2, 60), 1));
  bytes.take_arrived(Way::kToGuest, 1, 1);
  EXPECT_TRUE(bytes.send(Way::kToGuest, frame(2, 60), 1)) << "room again once the big frame arrived";
}

}  // namespace
}  // namespace deja
