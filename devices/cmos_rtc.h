// Motorola MC146818A real-time clock and 128-byte CMOS RAM as on the PC (ports 0x70-0x71, IRQ8).
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "devices/device.h"

namespace deja {

// Registers follow the MC146818A datasheet: 0-9 time, alarm and date, A (UIP, divider, rate),
// B (SET, PIE, AIE, UIE, SQWE, DM, 24/12, DSE), C (IRQF, PF, AF, UF; read clears), D (VRT);
// 0x32 holds the century as on the PC (IBM AT BIOS convention).
//
// Time: the guest's wall clock is unix_seconds_at_start + offset + floor(now_ns / 1e9), UTC,
// where offset starts at 0 and changes only when the guest sets the time. The update cycle happens
// at every whole virtual second; UIP (A bit 7) reads 1 during the 244 us before it. The periodic
// interrupt divider runs from machine start at 32.768 kHz derived from now_ns with integer math.
// Nothing here reads the host clock. Flags are brought up to date lazily (register reads, writes,
// advance()); IRQ8 is driven as the chip's IRQ output: high while C's IRQF is set, low after C is
// read, so the PIC sees one rising edge per interrupt.
//
// Not modelled: the divider-chain reset (DV bits are stored only), square-wave output, daylight
// saving (DSE stored only), the 1984 us update duration (registers change at the boundary).
class CmosRtc : public Device {
 public:
  CmosRtc(Clock& clock, int64_t unix_seconds_at_start, IrqLine irq8);

  std::string_view name() const override { return "cmos-rtc"; }
  void read(uint64_t offset, std::span<uint8_t> data) override;
  void write(uint64_t offset, std::span<const uint8_t> data) override;
  std::vector<uint8_t> save() const override;
  Result<> restore(std::span<const uint8_t> state) override;
  std::optional<uint64_t> next_deadline_ns() const override;
  void advance(uint64_t now_ns) override;

  // The memory size bytes firmware reads, as QEMU's pc_cmos_init() fills them: 0x15/0x16 base
  // memory (640 KiB), 0x17/0x18 and 0x30/0x31 KiB above 1 MiB (max 65535), 0x34/0x35 64 KiB
  // units above 16 MiB below 4 GiB (max 65535), 0x5b-0x5d 64 KiB units above 4 GiB.
  void set_memory_size(uint64_t bytes);
  bool nmi_masked() const { return nmi_masked_; }

  static constexpr uint64_t kUipWindowNs = 244000;

 private:
  struct WallTime {
    int64_t year;
    int month, day, hour, minute, second, weekday;  // weekday 0 = Sunday
  };
  static WallTime wall_time(int64_t unix_seconds);
  static int64_t unix_seconds(const WallTime& t);

  bool binary() const { return reg_b_ & 0x04; }
  bool hours_24() const { return reg_b_ & 0x02; }
  bool set_mode() const { return reg_b_ & 0x80; }
  uint8_t encode(int value) const;
  int decode(uint8_t value) const;
  // Time and date registers (0, 2, 4, 6, 7, 8, 9, 0x32) as the running clock shows them.
  std::array<uint8_t, 128> clock_registers(uint64_t now_ns) const;
  int64_t registers_to_unix(const std::array<uint8_t, 128>& regs) const;
  static bool is_clock_register(uint8_t index);

  uint8_t read_register(uint8_t index, uint64_t now_ns);
  void write_register(uint8_t index, uint8_t value, uint64_t now_ns);
  uint64_t periodic_cycles() const;  // 32.768 kHz cycles per periodic interrupt, 0 = off
  void update_flags(uint64_t now_ns);
  void update_irq();

  Clock& clock_;
  IrqLine irq8_;
  int64_t unix_start_;
  int64_t offset_seconds_ = 0;
  std::array<uint8_t, 128> cmos_{};  // also the frozen clock registers while SET = 1
  uint8_t index_ = 0;
  bool nmi_masked_ = false;
  uint8_t reg_a_ = 0x26;  // 32.768 kHz time base, 1024 Hz periodic rate
  uint8_t reg_b_ = 0x02;  // 24-hour, BCD
  uint8_t reg_c_ = 0;     // PF, AF, UF
  uint64_t flags_through_ns_ = 0;
  bool irq_level_ = false;
};

}  // namespace deja
