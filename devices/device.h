// The device model interface, and the ports through which devices see time, IRQ lines and output.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "core/error.h"

namespace deja {

// Virtual time as devices see it, in nanoseconds since machine start. The engine owns the
// implementation: host time in a plain run, recorded in record mode, from the trace in replay.
// Devices never read the host clock themselves.
class Clock {
 public:
  virtual ~Clock() = default;
  virtual uint64_t now_ns() = 0;
};

// Bytes arriving from outside the machine (serial input). Owned by the engine like Clock:
// the machine pumps it into devices at recorded points; devices never read host fds.
class HostInput {
 public:
  virtual ~HostInput() = default;
  // Non-blocking: copies up to out.size() bytes available at guest time now_ns, returns how many. 0 = none now.
  virtual size_t read_available(std::span<uint8_t> out, uint64_t now_ns) = 0;
  // True once the source is exhausted for good (end of file).
  virtual bool at_end() const = 0;
  // The host file descriptor to wait on for more bytes, or -1 (a simulated host's input has none).
  virtual int fd() const { return -1; }
  // Input scripted in guest time (a simulated host's): when the next bytes arrive after guest time after_ns, so that
  // a halted guest's wait ends there. nullopt: nothing more is scheduled after it (or it comes from the host).
  virtual std::optional<uint64_t> next_arrival_ns(uint64_t /*after_ns*/) const { return std::nullopt; }
};

// Random bytes from outside the machine (virtio-rng). Owned by the engine like Clock: host entropy in a plain
// run, recorded in record mode, from the trace in replay.
class Entropy {
 public:
  virtual ~Entropy() = default;
  virtual void fill(std::span<uint8_t> out) = 0;
};

// Where a network device's transmitted frames go. Owned by the engine: to the user-mode network stack in a plain
// run or a recording, checked against the recording in replay. `nic` is the device's index among the NICs.
class NetworkPort {
 public:
  virtual ~NetworkPort() = default;
  virtual void transmit(unsigned nic, std::span<const uint8_t> frame) = 0;
};

// Where a device's output goes (serial output to the terminal or a file). Output is not an input
// to the machine, so it needs no recording; replay re-produces it byte-identically.
class ByteSink {
 public:
  virtual ~ByteSink() = default;
  virtual void write(std::span<const uint8_t> bytes) = 0;
};

// Receives interrupt request line changes (the PIC implements it). Edge-triggered ISA lines:
// a device raises (true) and lowers (false) its line; the controller latches rising edges.
class IrqSink {
 public:
  virtual ~IrqSink() = default;
  virtual void set_irq(unsigned line, bool level) = 0;
};

// One IRQ line of one controller, handed to a device by the machine builder.
class IrqLine {
 public:
  IrqLine() = default;
  IrqLine(IrqSink* sink, unsigned line) : sink_(sink), line_(line) {}
  void set(bool level) {
    if (sink_) sink_->set_irq(line_, level);
  }
  void pulse() {
    set(true);
    set(false);
  }
  unsigned line() const { return line_; }

 private:
  IrqSink* sink_ = nullptr;
  unsigned line_ = 0;
};

// A device on the port-I/O or MMIO bus. `offset` is relative to the base the device was mapped at;
// accesses are 1, 2, 4 (or 8, MMIO) bytes, little-endian.
class Device {
 public:
  virtual ~Device() = default;
  virtual std::string_view name() const = 0;
  virtual void read(uint64_t offset, std::span<uint8_t> data) = 0;
  virtual void write(uint64_t offset, std::span<const uint8_t> data) = 0;

  // Complete device state, for checkpoints and state digests. restore() rejects malformed state.
  virtual std::vector<uint8_t> save() const = 0;
  virtual Result<> restore(std::span<const uint8_t> state) = 0;

  // Devices with timers: the virtual time (ns) of the next internal event, if any, and
  // advance(now) to process every event up to `now` (raising IRQs). Called by the machine.
  virtual std::optional<uint64_t> next_deadline_ns() const { return std::nullopt; }
  virtual void advance(uint64_t /*now_ns*/) {}
};

// Little-endian helpers for device register access.
inline uint64_t load_le(std::span<const uint8_t> data) {
  uint64_t v = 0;
  for (size_t i = 0; i < data.size() && i < 8; ++i) v |= uint64_t(data[i]) << (8 * i);
  return v;
}
inline void store_le(std::span<uint8_t> data, uint64_t v) {
  for (size_t i = 0; i < data.size(); ++i) data[i] = i < 8 ? uint8_t(v >> (8 * i)) : 0;
}

}  // namespace deja
