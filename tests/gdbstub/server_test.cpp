// The gdb server over a fake target: queries, registers, memory, breakpoints, resumes, refusals.
#include <gtest/gtest.h>

#include "fake_target.h"
#include "gdbstub/server.h"

namespace deja::gdb {
namespace {

std::string ask(Server& s, std::string_view p) {
  auto r = s.handle(p, [] { return false; });
  return r ? *r : "<none>";
}

TEST(GdbServer, AnnouncesReverseExecutionAndTheTargetDescription) {
  FakeTarget t;
  Server s(t);
  std::string supported = ask(s, "qSupported:multiprocess+;swbreak+");
  EXPECT_NE(supported.find("ReverseStep+"), std::string::npos);
  EXPECT_NE(supported.find("ReverseContinue+"), std::string::npos);
  EXPECT_NE(supported.find("qXfer:features:read+"), std::string::npos);
  // The description reads back whole in pieces.
  std::string xml;
  for (uint64_t offset = 0;;) {
    std::string part = ask(s, "qXfer:features:read:target.xml:" + fmt::format("{:x},{:x}", offset, 0x200));
    ASSERT_FALSE(part.empty());
    xml += part.substr(1);
    offset += part.size() - 1;
    if (part[0] == 'l') break;
    ASSERT_EQ(part[0], 'm');
  }
  EXPECT_EQ(xml, target_xml());
  EXPECT_NE(xml.find("org.gnu.gdb.i386.sse"), std::string::npos);
  EXPECT_NE(xml.find("fs_base"), std::string::npos);
}

TEST(GdbServer, RegistersInTargetDescriptionOrder) {
  FakeTarget t;
  Server s(t);
  std::string g = ask(s, "g");
  // 16 GPRs + rip (8 bytes each), eflags and 6 selectors (4), 8 x87 (10), 8 x87 control (4), 16 XMM (16),
  // MXCSR (4), fs_base, gs_base and 6 system registers (8), the upper halves of the 16 YMM registers (16).
  EXPECT_EQ(g.size(), size_t(2 * (17 * 8 + 7 * 4 + 8 * 10 + 8 * 4 + 16 * 16 + 4 + 8 * 8 + 16 * 16)));
  EXPECT_EQ(g.substr(0, 16), hex_le(t.state.gpr[kRax], 8));
  EXPECT_EQ(g.substr(16, 16), hex_le(t.state.gpr[kRbx], 8));  // gdb's second register is rbx
  EXPECT_EQ(ask(s, "p10"), hex_le(0x100000, 8));              // rip
  EXPECT_EQ(ask(s, "p39"), hex_le(t.state.fs.base, 8));       // fs_base (57)
  EXPECT_EQ(ask(s, "p3d"), hex_le(0x1000, 8));                // cr3 (61)
  t.state.ymmh[16 * 2] = 0xab;
  EXPECT_EQ(ask(s, "p43"), "ab" + std::string(30, '0'));      // ymm2h (67)
  EXPECT_EQ(ask(s, "p51"), "E01");                            // past the last register
}

TEST(GdbServer, MemoryReadsAndPartialReads) {
  FakeTarget t;
  Server s(t);
  EXPECT_EQ(ask(s, "m10,4"), "10111213");
  EXPECT_EQ(ask(s, "m1ffe,4"), "feff");  // the readable prefix
  EXPECT_EQ(ask(s, "m5000,4"), "E0e");
}

TEST(GdbServer, WritesAreRefused) {
  FakeTarget t;
  Server s(t);
  EXPECT_EQ(ask(s, "M10,1:00"), "E16");
  EXPECT_EQ(ask(s, "G00"), "E16");
  EXPECT_EQ(ask(s, "P0=00"), "E16");
  EXPECT_EQ(ask(s, "X10,1:a"), "E16");
}

TEST(GdbServer, BreakpointsAndWatchpointsReachTheTarget) {
  FakeTarget t;
  Server s(t);
  EXPECT_EQ(ask(s, "Z0,100010,1"), "OK");
  EXPECT_EQ(ask(s, "Z1,100020,1"), "OK");
  EXPECT_EQ(ask(s, "Z2,2000,8"), "OK");
  EXPECT_EQ(ask(s, "Z4,3000,4"), "OK");
  t.next_stop = StopInfo{StopInfo::Why::kWatchpoint, false, 0x2004, WatchKind::kWrite};
  EXPECT_EQ(ask(s, "vCont;c"), "T05watch:2004;thread:1;");
  ASSERT_EQ(t.requests.size(), 1u);
  EXPECT_EQ(t.requests[0].breakpoints, (std::vector<uint64_t>{0x100010, 0x100020}));
  ASSERT_EQ(t.requests[0].watchpoints.size(), 2u);
  EXPECT_EQ(t.requests[0].watchpoints[1].kind, WatchKind::kAccess);
  EXPECT_EQ(ask(s, "z2,2000,8"), "OK");
  t.next_stop = StopInfo{StopInfo::Why::kHistoryBegin};
  EXPECT_EQ(ask(s, "bc"), "T05replaylog:begin;thread:1;");
  EXPECT_TRUE(t.requests[1].reverse);
  EXPECT_FALSE(t.requests[1].single_step);
  EXPECT_EQ(t.requests[1].watchpoints.size(), 1u);
  t.next_stop = StopInfo{StopInfo::Why::kStep};
  EXPECT_EQ(ask(s, "bs"), "T05thread:1;");
  EXPECT_TRUE(t.requests[2].single_step);
  EXPECT_EQ(ask(s, "?"), "T05thread:1;");
  EXPECT_EQ(ask(s, "Z2,0,0"), "E01");  // zero-length watchpoint
  EXPECT_EQ(ask(s, "Z9,0,1"), "");     // unknown type: unsupported
}

TEST(GdbServer, ReadsUpToTheAnnouncedPacketSize) {
  FakeTarget t;
  t.memory.resize(0x4000);
  Server s(t);
  const std::string supported = ask(s, "qSupported");
  EXPECT_NE(supported.find(fmt::format("PacketSize={:x}", kMaxPacket)), std::string::npos);
  // gdb reads PacketSize / 2 bytes at a time (8 KiB for `dump binary memory` of 8 KiB in one packet).
  const std::string full = ask(s, fmt::format("m0,{:x}", kMaxPacket / 2));
  EXPECT_EQ(full.size(), kMaxPacket);
  EXPECT_EQ(full.substr(0, 8), "00010203");
  EXPECT_EQ(ask(s, fmt::format("m0,{:x}", kMaxPacket / 2 + 1)), "E01");
}

TEST(GdbServer, BreakpointsAndWatchpointsUpToTheDocumentedLimits) {
  FakeTarget t;
  Server s(t);
  for (size_t i = 0; i < Server::kMaxBreakpoints; ++i) ASSERT_EQ(ask(s, fmt::format("Z0,{:x},1", 0x1000 + i)), "OK");
  EXPECT_EQ(s.take_refusal(), "");
  EXPECT_EQ(ask(s, "Z0,ffff0,1"), "E1c");  // ENOSPC
  EXPECT_NE(s.take_refusal().find("at most 4096 software breakpoints"), std::string::npos);
  EXPECT_EQ(ask(s, "Z0,1000,1"), "OK") << "one already held";
  EXPECT_EQ(ask(s, "z0,1000,1"), "OK");
  EXPECT_EQ(ask(s, "Z0,ffff0,1"), "OK") << "room again";
  EXPECT_EQ(ask(s, "Z1,1000,1"), "OK") << "hardware breakpoints are counted apart";
  for (size_t i = 0; i < Server::kMaxWatchpoints; ++i) ASSERT_EQ(ask(s, fmt::format("Z2,{:x},8", 8 * i)), "OK");
  EXPECT_EQ(ask(s, "Z3,fff00,8"), "E1c");
  EXPECT_NE(s.take_refusal().find("at most 256 watchpoints"), std::string::npos);
}

TEST(GdbServer, MonitorCommandsAndThreads) {
  FakeTarget t;
  Server s(t);
  EXPECT_EQ(ask(s, "qRcmd," + hex_encode(std::string_view("when"))), hex_encode(std::string_view("said: when\n")));
  EXPECT_EQ(t.monitors.at(0), "when");
  EXPECT_EQ(ask(s, "qfThreadInfo"), "m1");
  EXPECT_EQ(ask(s, "qsThreadInfo"), "l");
  EXPECT_EQ(ask(s, "Hg0"), "OK");
  EXPECT_EQ(ask(s, "vCont?"), "vCont;c;C;s;S");
  EXPECT_EQ(ask(s, "qUnknownThing"), "");
  EXPECT_EQ(ask(s, "k"), "<none>");
  EXPECT_TRUE(s.finished());
}

TEST(GdbServer, EveryVcpuIsAThread) {
  FakeTarget t;
  t.vcpus = 3;
  t.stopped = 1;
  Server s(t);
  EXPECT_EQ(ask(s, "qfThreadInfo"), "m1,2,3");
  EXPECT_EQ(ask(s, "qsThreadInfo"), "l");
  EXPECT_EQ(ask(s, "qC"), "QC2");
  EXPECT_EQ(ask(s, "qThreadExtraInfo,3"), hex_encode(std::string_view("vCPU 2")));
  EXPECT_EQ(ask(s, "qThreadExtraInfo,4"), "E01");
  EXPECT_EQ(ask(s, "T3"), "OK");
  EXPECT_EQ(ask(s, "Tzz"), "E01");
  EXPECT_EQ(ask(s, "T4"), "E01");
  // A stop names the vCPU the machine stopped on, and g then reads that vCPU.
  EXPECT_EQ(ask(s, "vCont;s:2"), "T05thread:2;");
  const uint64_t rip1 = t.state.rip + 1, rip2 = t.state.rip + 2;
  EXPECT_EQ(ask(s, "p10"), hex_le(rip1, 8));
  // Hg picks another vCPU's registers and page tables; Hc is accepted (the whole machine resumes).
  EXPECT_EQ(ask(s, "Hg3"), "OK");
  EXPECT_EQ(ask(s, "p10"), hex_le(rip2, 8));
  EXPECT_EQ(ask(s, "m0,4"), "00010203");
  EXPECT_EQ(t.reads_by.back(), 2u);
  EXPECT_EQ(ask(s, "Hg0"), "OK");  // any thread: the stopped one
  EXPECT_EQ(ask(s, "p10"), hex_le(rip1, 8));
  EXPECT_EQ(ask(s, "Hc-1"), "OK");
  EXPECT_EQ(ask(s, "Hg9"), "E01");
  EXPECT_EQ(ask(s, "Hx1"), "E01");
  t.stopped = 2;
  t.next_stop = {StopInfo::Why::kWatchpoint, false, 0x2004, WatchKind::kWrite};
  EXPECT_EQ(ask(s, "vCont;c"), "T05watch:2004;thread:3;");
  EXPECT_EQ(ask(s, "?"), "T05watch:2004;thread:3;");
  EXPECT_EQ(s.interrupted_reply(), "T02thread:3;");
}

}  // namespace
}  // namespace deja::gdb
