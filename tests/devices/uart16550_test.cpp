// 16550 UART tests: output, divisor latch, loopback, IIR priorities, THRE clearing, FIFO trigger, OUT2.
#include "devices/uart16550.h"

#include <gtest/gtest.h>

#include "tests/devices/fakes.h"

namespace deja {
namespace {

using test::inb;
using test::outb;

constexpr unsigned kIrq = 4;

struct UartFixture : ::testing::Test {
  test::RecordingIrqSink irqs;
  test::CaptureSink sink;
  Uart16550 uart{IrqLine(&irqs, kIrq), sink};

  size_t receive(std::string_view text) {
    return uart.receive(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(text.data()), text.size()));
  }
  uint8_t iir() { return inb(uart, 2); }
};

TEST_F(UartFixture, TransmitGoesToTheSinkImmediately) {
  for (char c : std::string_view("hi\n")) outb(uart, 0, uint8_t(c));
  EXPECT_EQ(sink.text, "hi\n");
  EXPECT_EQ(inb(uart, 5) & 0x60, 0x60);  // THRE and TEMT
}

TEST_F(UartFixture, DivisorLatchIsBehindDlab) {
  outb(uart, 3, 0x80);
  outb(uart, 0, 0x01);
  outb(uart, 1, 0x02);
  EXPECT_EQ(inb(uart, 0), 0x01);
  EXPECT_EQ(inb(uart, 1), 0x02);
  outb(uart, 3, 0x03);  // 8N1, DLAB off
  EXPECT_EQ(inb(uart, 3), 0x03);
  outb(uart, 1, 0x00);  // IER, not DLM
  outb(uart, 0, 'x');   // THR, not DLL
  EXPECT_EQ(sink.text, "x");
  outb(uart, 3, 0x83);
  EXPECT_EQ(inb(uart, 0), 0x01);
  EXPECT_EQ(inb(uart, 1), 0x02);
}

TEST_F(UartFixture, ScratchRegisterStores) {
  outb(uart, 7, 0x5a);
  EXPECT_EQ(inb(uart, 7), 0x5a);
}

TEST_F(UartFixture, LoopbackReturnsBytesAndModemBits) {
  outb(uart, 4, 0x10);  // loopback, all modem outputs off
  EXPECT_EQ(inb(uart, 6) & 0xf0, 0x00);
  outb(uart, 0, 'A');
  EXPECT_EQ(sink.text, "");
  EXPECT_EQ(inb(uart, 5) & 0x01, 0x01);
  EXPECT_EQ(inb(uart, 0), 'A');
  EXPECT_EQ(inb(uart, 5) & 0x01, 0x00);
  EXPECT_EQ(uart.rx_space(), 0u);  // outside input is disconnected
  outb(uart, 4, 0x1f);  // DTR, RTS, OUT1, OUT2 -> DSR, CTS, RI, DCD
  uint8_t msr = inb(uart, 6);
  EXPECT_EQ(msr & 0xf0, 0xf0);
  EXPECT_EQ(msr & 0x0f, 0x0b);  // DCTS, DDSR, DDCD; TERI only on RI's falling edge
  outb(uart, 4, 0x1b);  // OUT1 off: RI falls
  EXPECT_EQ(inb(uart, 6), 0xb4);
  EXPECT_EQ(inb(uart, 6), 0xb0);  // deltas clear on read
}

TEST_F(UartFixture, InterruptIdentificationPriorityOrder) {
  outb(uart, 4, 0x08);  // OUT2
  outb(uart, 1, 0x0f);  // all four sources
  EXPECT_EQ(iir(), 0x02);  // THRE armed by enabling ETBEI with THR empty; reading clears it
  EXPECT_EQ(iir(), 0x01);
  outb(uart, 0, '.');  // THR empty again -> THRE
  receive("a");
  EXPECT_EQ(iir(), 0x04);  // received data beats THRE
  receive("b");            // overruns the 1-byte holding register
  EXPECT_EQ(iir(), 0x06);  // line status beats received data
  EXPECT_EQ(inb(uart, 5) & 0x03, 0x03);  // DR + OE; reading LSR clears OE
  EXPECT_EQ(iir(), 0x04);
  EXPECT_EQ(inb(uart, 0), 'b');  // without FIFOs the overrunning byte replaced the unread one
  EXPECT_EQ(iir(), 0x02);
  EXPECT_EQ(iir(), 0x01);
  // Modem status is the lowest: produce a delta through loopback.
  outb(uart, 4, 0x18);
  outb(uart, 4, 0x1a);  // RTS -> CTS changes
  outb(uart, 0, 'z');   // THRE + RX data now pending as well
  EXPECT_EQ(iir(), 0x04);
  inb(uart, 0);
  EXPECT_EQ(iir(), 0x02);
  EXPECT_EQ(iir(), 0x00);
  inb(uart, 6);
  EXPECT_EQ(iir(), 0x01);
}

TEST_F(UartFixture, ThreInterruptClearsOnIirReadAndRearmsOnWrite) {
  outb(uart, 4, 0x08);
  outb(uart, 1, 0x02);
  EXPECT_TRUE(irqs.levels[kIrq]);
  EXPECT_EQ(iir(), 0x02);
  EXPECT_FALSE(irqs.levels[kIrq]);
  EXPECT_EQ(iir(), 0x01);
  outb(uart, 0, 'q');
  EXPECT_TRUE(irqs.levels[kIrq]);
  EXPECT_EQ(irqs.rising_edges[kIrq], 2u);
  outb(uart, 1, 0x00);
  EXPECT_FALSE(irqs.levels[kIrq]);
}

TEST_F(UartFixture, Out2GatesTheIrqLine) {
  outb(uart, 1, 0x01);
  receive("x");
  EXPECT_EQ(iir(), 0x04);
  EXPECT_EQ(irqs.rising_edges[kIrq], 0u);
  outb(uart, 4, 0x08);
  EXPECT_TRUE(irqs.levels[kIrq]);
  inb(uart, 0);
  EXPECT_FALSE(irqs.levels[kIrq]);
}

TEST_F(UartFixture, FifoTriggerLevelAndTimeout) {
  outb(uart, 2, 0x87);  // enable + clear, trigger 8
  outb(uart, 1, 0x01);
  EXPECT_EQ(iir(), 0xc1);
  EXPECT_EQ(uart.rx_space(), 16u);
  EXPECT_EQ(receive("abc"), 3u);
  EXPECT_EQ(iir(), 0xcc);  // below the trigger: character timeout
  EXPECT_EQ(receive("defgh"), 5u);
  EXPECT_EQ(iir(), 0xc4);  // trigger level reached
  EXPECT_EQ(uart.rx_space(), 8u);
  EXPECT_EQ(inb(uart, 0), 'a');
  EXPECT_EQ(iir(), 0xcc);
  outb(uart, 2, 0x03);  // clear the receive FIFO (FIFO stays enabled, trigger 1)
  EXPECT_EQ(inb(uart, 5) & 0x01, 0x00);
  EXPECT_EQ(iir(), 0xc1);
  EXPECT_EQ(receive("1"), 1u);
  EXPECT_EQ(iir(), 0xc4);  // trigger level 1
  outb(uart, 2, 0xc1);  // trigger 14
  EXPECT_EQ(receive("23456789abcdef"), 14u);
  EXPECT_EQ(uart.rx_space(), 1u);
  EXPECT_EQ(receive("XY"), 1u);  // 'Y' overruns a full FIFO and is lost
  EXPECT_EQ(inb(uart, 5) & 0x02, 0x02);
  for (char expected : std::string_view("123456789abcdefX")) EXPECT_EQ(inb(uart, 0), uint8_t(expected));
  outb(uart, 2, 0x00);  // disabling the FIFOs: 1-byte holding register
  EXPECT_EQ(iir() & 0xc0, 0x00);
  EXPECT_EQ(uart.rx_space(), 1u);
}

TEST_F(UartFixture, NonFifoReceiveAcceptsOneByte) {
  EXPECT_EQ(uart.rx_space(), 1u);
  EXPECT_EQ(receive("xy"), 1u);
  EXPECT_EQ(uart.rx_space(), 0u);
  EXPECT_EQ(inb(uart, 5) & 0x03, 0x03);
}

TEST_F(UartFixture, SaveRestoreRoundTripAndRejection) {
  outb(uart, 2, 0x41);
  outb(uart, 4, 0x0b);
  outb(uart, 1, 0x05);
  outb(uart, 7, 0x99);
  receive("hello");
  std::vector<uint8_t> state = uart.save();

  test::CaptureSink other_sink;
  Uart16550 copy(IrqLine(&irqs, kIrq), other_sink);
  ASSERT_TRUE(copy.restore(state));
  EXPECT_EQ(copy.save(), state);
  EXPECT_EQ(inb(copy, 2), inb(uart, 2));
  EXPECT_EQ(inb(copy, 7), 0x99);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(inb(copy, 0), inb(uart, 0));

  EXPECT_FALSE(copy.restore(std::span<const uint8_t>(state).first(state.size() - 1)));
  std::vector<uint8_t> too_full = state;
  too_full[5 + 16 + 1] = 17;  // rx count beyond the FIFO
  EXPECT_FALSE(copy.restore(too_full));
  std::vector<uint8_t> trailing = state;
  trailing.push_back(0);
  EXPECT_FALSE(copy.restore(trailing));
}

TEST_F(UartFixture, IerKeepsOnlyItsFourEnableBits) {
  outb(uart, 1, 0xff);
  EXPECT_EQ(inb(uart, 1), 0x0f);
}

}  // namespace
}  // namespace deja
