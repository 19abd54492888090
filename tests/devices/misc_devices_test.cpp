// Tests of fw_cfg, isa-debug-exit, the shared state codec, and the devices on a Bus at PC ports.
#include <gtest/gtest.h>

#include "devices/bus.h"
#include "devices/debug_exit.h"
#include "devices/fw_cfg.h"
#include "devices/pic8259.h"
#include "devices/state_codec.h"
#include "devices/uart16550.h"
#include "tests/devices/fakes.h"

namespace deja {
namespace {

using test::inb;
using test::outb;
using test::outw;

std::vector<uint8_t> read_item(FwCfg& fw, uint16_t selector, size_t n) {
  outw(fw, 0, selector);
  std::vector<uint8_t> bytes(n);
  for (auto& b : bytes) b = inb(fw, 1);
  return bytes;
}

FwCfgConfig config() { return FwCfgConfig{.ram_size = 256ull << 20, .cpus = 2, .cmdline = "console=ttyS0"}; }

TEST(FwCfg, SignatureAndInterfaceId) {
  FwCfg fw(config());
  EXPECT_EQ(read_item(fw, FwCfg::kSignature, 5), (std::vector<uint8_t>{'Q', 'E', 'M', 'U', 0}));
  EXPECT_EQ(read_item(fw, FwCfg::kId, 4), (std::vector<uint8_t>{1, 0, 0, 0}));
}

TEST(FwCfg, RamSizeAndCpus) {
  FwCfg fw(config());
  EXPECT_EQ(read_item(fw, FwCfg::kRamSize, 8), (std::vector<uint8_t>{0, 0, 0, 0x10, 0, 0, 0, 0}));
  EXPECT_EQ(read_item(fw, FwCfg::kNbCpus, 2), (std::vector<uint8_t>{2, 0}));
  EXPECT_EQ(read_item(fw, FwCfg::kMaxCpus, 2), (std::vector<uint8_t>{2, 0}));
}

TEST(FwCfg, CommandLineSizeIncludesNul) {
  FwCfg fw(config());
  EXPECT_EQ(read_item(fw, FwCfg::kCmdlineSize, 4), (std::vector<uint8_t>{14, 0, 0, 0}));
  std::vector<uint8_t> data = read_item(fw, FwCfg::kCmdlineData, 16);
  EXPECT_EQ(std::string(data.begin(), data.begin() + 13), "console=ttyS0");
  EXPECT_EQ(data[13], 0);
  EXPECT_EQ(data[14], 0);  // past the end
}

TEST(FwCfg, EmptyFileDirectoryAndUnknownSelectors) {
  FwCfg fw(config());
  EXPECT_EQ(read_item(fw, FwCfg::kFileDir, 4), (std::vector<uint8_t>{0, 0, 0, 0}));
  EXPECT_EQ(read_item(fw, 0x8003, 4), (std::vector<uint8_t>{0, 0, 0, 0}));
  // A byte-wide selector write works too, and any selector write rewinds.
  outb(fw, 0, FwCfg::kSignature);
  EXPECT_EQ(inb(fw, 1), 'Q');
  outb(fw, 0, FwCfg::kSignature);
  EXPECT_EQ(inb(fw, 1), 'Q');
}

TEST(FwCfg, SaveRestoreKeepsTheReadPosition) {
  FwCfg fw(config());
  outw(fw, 0, FwCfg::kSignature);
  inb(fw, 1);
  inb(fw, 1);
  std::vector<uint8_t> state = fw.save();
  FwCfg copy(config());
  ASSERT_TRUE(copy.restore(state));
  EXPECT_EQ(inb(copy, 1), 'M');
  EXPECT_FALSE(copy.restore(std::span<const uint8_t>(state).first(state.size() - 1)));
  std::vector<uint8_t> beyond = state;
  beyond[7] = 9;  // offset 9 in the 4-byte signature
  auto result = copy.restore(beyond);
  ASSERT_FALSE(result);
  EXPECT_NE(result.error().message.find("beyond"), std::string::npos) << result.error().message;
}

TEST(DebugExit, StatusIsValueShiftedWithLowBitSet) {
  DebugExit exit_port;
  EXPECT_FALSE(exit_port.exit_status());
  uint8_t bytes[4] = {0xff, 0xff, 0xff, 0xff};
  exit_port.read(0, bytes);
  EXPECT_EQ(bytes[0], 0xff);
  EXPECT_EQ(bytes[3], 0xff);
  outb(exit_port, 0, 0x10);
  EXPECT_EQ(exit_port.exit_status(), 0x21);
  outb(exit_port, 0, 0x80);
  EXPECT_EQ(exit_port.raw_status(), 0x101);
  EXPECT_EQ(exit_port.exit_status(), 0x01);  // the process exit code is the low byte
  uint8_t dword[4] = {0x00, 0x00, 0x00, 0x00};
  exit_port.write(0, dword);
  EXPECT_EQ(exit_port.exit_status(), 1);
}

TEST(DebugExit, SaveRestore) {
  DebugExit exit_port;
  outb(exit_port, 0, 3);
  std::vector<uint8_t> state = exit_port.save();
  DebugExit copy;
  ASSERT_TRUE(copy.restore(state));
  EXPECT_EQ(copy.exit_status(), 7);
  EXPECT_FALSE(copy.restore(std::span<const uint8_t>(state).first(6)));
  DebugExit fresh;
  ASSERT_TRUE(copy.restore(fresh.save()));
  EXPECT_FALSE(copy.exit_status());
}

TEST(StateCodec, RejectsWrongTagVersionTruncationAndTrailingBytes) {
  StateWriter w("TEST", 3);
  w.u16(0x1234);
  w.u64(0x0102030405060708);
  std::vector<uint8_t> state = w.take();
  {
    StateReader r(state, "TEST", 3);
    EXPECT_EQ(r.u16(), 0x1234);
    EXPECT_EQ(r.u64(), 0x0102030405060708u);
    EXPECT_TRUE(r.finish());
  }
  {
    StateReader r(state, "TEST", 4);
    r.u16();
    r.u64();
    auto result = r.finish();
    ASSERT_FALSE(result);
    EXPECT_NE(result.error().message.find("state version is 3"), std::string::npos) << result.error().message;
  }
  {
    StateReader r(state, "TEST", 3);
    r.u16();
    EXPECT_FALSE(r.finish());  // 8 trailing bytes
  }
  {
    StateReader r(std::span<const uint8_t>(state).first(8), "TEST", 3);
    r.u16();
    EXPECT_EQ(r.u64(), 0u);
    EXPECT_FALSE(r.finish());
  }
}

// The devices at their PC ports on a real Bus: a Linux-style serial write raises IRQ4 at the PIC.
TEST(DevicesOnBus, UartInterruptReachesThePicThroughOut2) {
  PicPair pic;
  test::CaptureSink sink;
  Uart16550 uart(IrqLine(&pic, 4), sink);
  Bus io("io");
  ASSERT_TRUE(io.add(0x20, 2, &pic.master_ports()));
  ASSERT_TRUE(io.add(0xa0, 2, &pic.slave_ports()));
  ASSERT_TRUE(io.add(0x3f8, 8, &uart));
  auto out = [&](uint16_t port, uint8_t v) { io.write(port, std::span<const uint8_t>(&v, 1)); };
  auto in = [&](uint16_t port) {
    uint8_t v = 0;
    io.read(port, std::span<uint8_t>(&v, 1));
    return v;
  };
  for (auto [port, v] : std::initializer_list<std::pair<uint16_t, uint8_t>>{
           {0x20, 0x11}, {0x21, 0x20}, {0x21, 0x04}, {0x21, 0x01}, {0xa0, 0x11}, {0xa1, 0x28}, {0xa1, 0x02},
           {0xa1, 0x01}, {0x21, 0x00}, {0xa1, 0x00}}) {
    out(port, v);
  }
  out(0x3f9, 0x02);  // THRE interrupt, but OUT2 still off
  EXPECT_FALSE(pic.interrupt_pending());
  out(0x3fc, 0x0b);
  EXPECT_TRUE(pic.interrupt_pending());
  EXPECT_EQ(pic.acknowledge(), 0x24);
  EXPECT_EQ(in(0x3fa), 0x02);
  out(0x3f8, 'k');
  EXPECT_EQ(sink.text, "k");
  out(0x20, 0x20);
  // The line went low on the IIR read and high on the THR write: a new edge.
  EXPECT_TRUE(pic.interrupt_pending());
}

// A guest scanning the address space (issue 11): per-address statistics stop growing at the sample
// size, and every further access is still counted.
TEST(BusStatistics, UnknownAddressesAreSampledAndCounted) {
  Bus bus("MMIO");
  uint8_t data[8];
  constexpr uint64_t kScanned = 1'000'000;
  for (uint64_t i = 0; i < kScanned; ++i) {
    bus.read(0x10000000 + i * 64, std::span(data, 8));
    if (i % 2 == 0) bus.write(0x10000000 + i * 64, std::span<const uint8_t>(data, 8));
  }
  EXPECT_EQ(bus.unknown_accesses().size(), Bus::kUnknownSample);
  uint64_t reads = bus.unknown_unsampled().reads, writes = bus.unknown_unsampled().writes;
  for (const auto& [address, access] : bus.unknown_accesses()) {
    reads += access.reads;
    writes += access.writes;
  }
  EXPECT_EQ(reads, kScanned);
  EXPECT_EQ(writes, kScanned / 2);
  // An address in the sample keeps its own count.
  bus.read(0x10000000, std::span(data, 8));
  EXPECT_EQ(bus.unknown_accesses().at(0x10000000).reads, 2u);
}

}  // namespace
}  // namespace deja
