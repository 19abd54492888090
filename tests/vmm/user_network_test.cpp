// The user-mode network outside the machine: --net option parsing, and libslirp answering a guest's ARP request.
#include <gtest/gtest.h>

#include <vector>

#include "vmm/user_network.h"

namespace deja {
namespace {

// Who has 10.0.2.2? Tell 10.0.2.15 (52:54:00:12:34:56).
std::vector<uint8_t> arp_for_the_gateway() {
  std::vector<uint8_t> arp = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x52, 0x54, 0x00, 0x12, 0x34, 0x56, 0x08, 0x06,
                              0x00, 0x01, 0x08, 0x00, 0x06, 0x04, 0x00, 0x01, 0x52, 0x54, 0x00, 0x12, 0x34, 0x56,
                              10,   0,    2,    15,   0,    0,    0,    0,    0,    0,    10,   0,    2,    2};
  arp.resize(60, 0);
  return arp;
}

TEST(NetOption, Parses) {
  auto o = parse_net_option("user,hostfwd=tcp::2222-:22,hostfwd=udp:127.0.0.1:5353-10.0.2.15:53");
  ASSERT_TRUE(o) << o.error().message;
  ASSERT_EQ(o->forwards.size(), 2u);
  EXPECT_FALSE(o->forwards[0].udp);
  EXPECT_EQ(o->forwards[0].host_port, 2222);
  EXPECT_EQ(o->forwards[0].guest_port, 22);
  EXPECT_TRUE(o->forwards[1].udp);
  EXPECT_EQ(o->forwards[1].host_addr, "127.0.0.1");
  EXPECT_EQ(o->forwards[1].guest_addr, "10.0.2.15");
  EXPECT_EQ(o->forward_texts[0], "tcp::2222-:22");
  EXPECT_TRUE(parse_net_option("user"));
  EXPECT_FALSE(parse_net_option("tap"));
  EXPECT_FALSE(parse_net_option("user,hostfwd=tcp::0-:22"));
  EXPECT_FALSE(parse_net_option("user,hostfwd=sctp::1-:2"));
  EXPECT_FALSE(parse_net_option("user,hostfwd=tcp:999.1.1.1:1-:2"));
  EXPECT_FALSE(parse_net_option("user,foo=bar"));
}

TEST(NetOption, TakesAUnicastMac) {
  auto o = parse_net_option("user,mac=52:54:00:AB:cd:01");
  ASSERT_TRUE(o) << o.error().message;
  ASSERT_TRUE(o->mac);
  EXPECT_EQ(*o->mac, (std::array<uint8_t, 6>{0x52, 0x54, 0x00, 0xab, 0xcd, 0x01}));
  EXPECT_FALSE(parse_net_option("user").value().mac);
  EXPECT_FALSE(parse_net_option("user,mac=01:00:5e:00:00:01"));  // multicast
  EXPECT_FALSE(parse_net_option("user,mac=52:54:00:ab:cd"));
  EXPECT_FALSE(parse_net_option("user,mac=52-54-00-ab-cd-01"));
  EXPECT_FALSE(parse_net_option("user,mac=52:54:00:ab:cd:0g"));
}

TEST(NetOption, TakesATftpDirectoryAndRestrict) {
  auto o = parse_net_option("user,tftp=/tmp,restrict=on");
  ASSERT_TRUE(o) << o.error().message;
  EXPECT_EQ(o->tftp_dir, "/tmp");
  EXPECT_TRUE(o->restricted);
  EXPECT_FALSE(parse_net_option("user").value().restricted);
  EXPECT_FALSE(parse_net_option("user,restrict=off").value().restricted);
  EXPECT_FALSE(parse_net_option("user,restrict=yes"));
  EXPECT_FALSE(parse_net_option("user,tftp="));
  EXPECT_FALSE(parse_net_option("user,tftp=/nonexistent-deja-dir"));
  EXPECT_FALSE(parse_net_option("user,tftp=/etc/passwd"));  // not a directory
}

TEST(NetOption, TakesAnEchoServiceAsGuestForward) {
  auto o = parse_net_option("user,guestfwd=tcp:10.0.2.4:7-echo");
  ASSERT_TRUE(o) << o.error().message;
  ASSERT_EQ(o->echoes.size(), 1u);
  EXPECT_EQ(o->echoes[0].addr, "10.0.2.4");
  EXPECT_EQ(o->echoes[0].port, 7);
  EXPECT_FALSE(parse_net_option("user,guestfwd=tcp:10.0.2.4:7-cmd:cat"));  // QEMU's commands: not here
  EXPECT_FALSE(parse_net_option("user,guestfwd=udp:10.0.2.4:7-echo"));
  EXPECT_FALSE(parse_net_option("user,guestfwd=tcp:10.0.2.4:0-echo"));
  EXPECT_FALSE(parse_net_option("user,guestfwd=tcp:10.0.2-echo"));
  EXPECT_FALSE(parse_net_option("user,guestfwd=tcp:10.0.2.4:7"));
  // Inside the network and not one of libslirp's own addresses.
  uint64_t now = 0;
  EXPECT_FALSE(UserNetwork::create(parse_net_option("user,guestfwd=tcp:10.0.2.2:7-echo").value(), [&now] { return now; }));
  EXPECT_FALSE(UserNetwork::create(parse_net_option("user,guestfwd=tcp:192.168.1.1:7-echo").value(), [&now] { return now; }));
  EXPECT_TRUE(UserNetwork::create(o.value(), [&now] { return now; }));
}

// A restricted network's own services answer with no host socket and no host time: a ping of the gateway, polled
// without looking at the host (what a seeded run does), comes back at once and owes nothing to a timer.
TEST(UserNetwork, RestrictedAnswersPingWithoutTheHost) {
  uint64_t now = 5'000'000'000;
  NetOptions options;
  options.restricted = true;
  auto net = UserNetwork::create(options, [&now] { return now; });
  ASSERT_TRUE(net) << net.error().message;
  EXPECT_TRUE((*net)->restricted());
  const std::vector<uint8_t> mac = {0x52, 0x54, 0x00, 0x12, 0x34, 0x56};
  (*net)->input(arp_for_the_gateway());  // (slirp learns the guest's MAC from it)
  (*net)->poll_simulated();
  auto replies = (*net)->take(1);
  ASSERT_EQ(replies.size(), 1u);
  const std::vector<uint8_t> gateway_mac(replies[0].begin() + 6, replies[0].begin() + 12);
  // An ICMP echo request 10.0.2.15 -> 10.0.2.2, id 1 seq 1, 8 bytes of data.
  std::vector<uint8_t> ping(gateway_mac);
  ping.insert(ping.end(), mac.begin(), mac.end());
  const std::vector<uint8_t> ip = {0x08, 0x00, 0x45, 0, 0, 36, 0, 1, 0x40, 0, 64, 1, 0, 0, 10, 0, 2, 15, 10, 0, 2, 2};
  ping.insert(ping.end(), ip.begin(), ip.end());
  const std::vector<uint8_t> icmp = {8, 0, 0, 0, 0, 1, 0, 1, 'd', 'e', 'j', 'a', 'p', 'i', 'n', 'g'};
  ping.insert(ping.end(), icmp.begin(), icmp.end());
  auto checksum = [&ping](size_t from, size_t to, size_t at) {
    uint32_t sum = 0;
    for (size_t i = from; i < to; i += 2) sum += uint32_t(ping[i] << 8 | ping[i + 1]);
    while (sum >> 16) sum = (sum & 0xffff) + (sum >> 16);
    ping[at] = uint8_t(~sum >> 8);
    ping[at + 1] = uint8_t(~sum);
  };
  checksum(14, 34, 24);
  checksum(34, ping.size(), 36);
  (*net)->input(ping);
  (*net)->poll_simulated();
  auto echoed = (*net)->take(4);
  ASSERT_EQ(echoed.size(), 1u);
  ASSERT_EQ(echoed[0].size(), ping.size());
  EXPECT_EQ(echoed[0][34], 0) << "an ICMP echo reply";
  EXPECT_EQ(std::vector<uint8_t>(echoed[0].begin() + 42, echoed[0].end()),
            std::vector<uint8_t>(ping.begin() + 42, ping.end()));
  EXPECT_FALSE((*net)->next_wake_ns()) << "no TCP work, no timer: nothing until the guest sends";
}

TEST(UserNetwork, AnswersArpForTheGateway) {
  uint64_t now = 0;
  auto net = UserNetwork::create(NetOptions{}, [&now] { return now; });
  ASSERT_TRUE(net) << net.error().message;
  (*net)->input(arp_for_the_gateway());
  (*net)->poll_now();
  ASSERT_GE((*net)->pending(), 1u);
  auto frames = (*net)->take(1);
  ASSERT_EQ(frames.size(), 1u);
  const auto& reply = frames[0];
  ASSERT_GE(reply.size(), 42u);
  EXPECT_EQ(reply[12], 0x08);
  EXPECT_EQ(reply[13], 0x06);
  EXPECT_EQ(reply[21], 2) << "an ARP reply";
  EXPECT_EQ(std::vector<uint8_t>(reply.begin() + 28, reply.begin() + 32), (std::vector<uint8_t>{10, 0, 2, 2}));
  EXPECT_EQ((*net)->pending(), 0u);
}

}  // namespace
}  // namespace deja
