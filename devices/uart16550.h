// National Semiconductor PC16550D UART as COM1 (ports 0x3f8-0x3ff), with instantaneous transmission.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "devices/device.h"

namespace deja {

// Registers and interrupt logic follow the PC16550D datasheet: RBR/THR, IER, IIR (priorities
// line status > received data / character timeout > THRE > modem status; bits 7-6 = 11 with
// FIFOs on), FCR (enable, clear, RX trigger 1/4/8/14), LCR with DLAB, DLL/DLM, MCR, LSR, MSR, SCR.
//
// No bit time is modelled, because the UART has no clock and the machine delivers input in
// recorded batches:
// - A THR write reaches the ByteSink at once; THR and the transmitter are always empty
//   (LSR.THRE = LSR.TEMT = 1) and the THRE interrupt re-arms right after each write. It is
//   cleared by reading IIR while THRE is the reported source, or by writing THR, and armed when
//   IER.ETBEI goes 0 -> 1 (the datasheet's behaviour with an empty THR).
// - With FIFOs on, the character timeout (IIR 0xCC) is treated as already elapsed: data below
//   the trigger level that sits in the FIFO after a receive() or an RBR read raises it.
// - Parity, framing and break never happen; only overrun (OE) can be set.
// The IRQ line is driven as a level: interrupt pending AND MCR.OUT2 AND NOT loopback (the PC
// gates the UART's INTR through OUT2, which the chip forces inactive in loopback).
// Modem inputs from outside are CTS, DSR and DCD asserted, RI not (a connected terminal).
class Uart16550 : public Device {
 public:
  static constexpr size_t kFifoDepth = 16;

  Uart16550(IrqLine irq, ByteSink& output);

  std::string_view name() const override { return "uart16550"; }
  void read(uint64_t offset, std::span<uint8_t> data) override;
  void write(uint64_t offset, std::span<const uint8_t> data) override;
  std::vector<uint8_t> save() const override;
  Result<> restore(std::span<const uint8_t> state) override;

  // Serial input: appends to the receive FIFO (16 deep with FIFOs on, the 1-byte RBR otherwise).
  // Returns how many bytes were stored; bytes beyond rx_space() are lost and set LSR.OE.
  // In loopback mode the receiver is disconnected from the outside: rx_space() is 0.
  size_t receive(std::span<const uint8_t> bytes);
  size_t rx_space() const;

 private:
  uint8_t read_register(unsigned reg);
  void write_register(unsigned reg, uint8_t value);
  void push_rx(uint8_t byte);
  size_t rx_capacity() const { return fifo_enabled() ? kFifoDepth : 1; }
  bool fifo_enabled() const { return fcr_ & 0x01; }
  size_t trigger_level() const;
  bool loopback() const { return mcr_ & 0x10; }
  // The modem status bits 7..4 (DCD, RI, DSR, CTS) the chip sees now.
  uint8_t modem_inputs() const;
  void set_modem_inputs(uint8_t inputs);
  uint8_t interrupt_id() const;  // IIR bits 3..0
  void update_irq();

  IrqLine irq_;
  ByteSink& output_;
  std::array<uint8_t, kFifoDepth> rx_{};
  uint8_t rx_head_ = 0;
  uint8_t rx_count_ = 0;
  uint8_t ier_ = 0;
  uint8_t fcr_ = 0;  // enable, DMA mode and trigger bits as last written
  uint8_t lcr_ = 0;
  uint8_t mcr_ = 0;
  uint8_t lsr_errors_ = 0;  // OE (bit 1); cleared by reading LSR
  uint8_t msr_ = 0;         // status bits 7..4 and delta bits 3..0
  uint8_t scr_ = 0;
  uint8_t dll_ = 0x0c;  // 9600 baud, as firmware leaves it
  uint8_t dlm_ = 0;
  bool thre_pending_ = false;
  bool timeout_pending_ = false;
  bool irq_level_ = false;
};

}  // namespace deja
