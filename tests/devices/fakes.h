// Test doubles for device tests: a settable Clock, an IrqSink that records edges, a capturing ByteSink.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "devices/device.h"

namespace deja::test {

class FakeClock : public Clock {
 public:
  uint64_t now_ns() override { return now; }
  uint64_t now = 0;
};

class RecordingIrqSink : public IrqSink {
 public:
  void set_irq(unsigned line, bool level) override {
    if (level && !levels[line]) ++rising_edges[line];
    levels[line] = level;
    changes.emplace_back(line, level);
  }
  bool levels[16] = {};
  unsigned rising_edges[16] = {};
  std::vector<std::pair<unsigned, bool>> changes;
};

class CaptureSink : public ByteSink {
 public:
  void write(std::span<const uint8_t> bytes) override { text.append(bytes.begin(), bytes.end()); }
  std::string text;
};

inline void outb(Device& device, uint64_t offset, uint8_t value) {
  device.write(offset, std::span<const uint8_t>(&value, 1));
}

inline uint8_t inb(Device& device, uint64_t offset) {
  uint8_t value = 0;
  device.read(offset, std::span<uint8_t>(&value, 1));
  return value;
}

inline void outw(Device& device, uint64_t offset, uint16_t value) {
  uint8_t bytes[2] = {uint8_t(value), uint8_t(value >> 8)};
  device.write(offset, bytes);
}

}  // namespace deja::test
