// Serial input of a simulated host (deja explore): bytes that arrive at given guest times, taken from a recording.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/error.h"
#include "devices/device.h"

namespace deja {

class ScriptedInput : public HostInput {
 public:
  struct Arrival {
    uint64_t at_ns = 0;  // guest time since the machine started
    std::string bytes;
  };
  // What a recording's serial input was, and when (its asynchronous events, in order). A trace damaged part way
  // gives what precedes the damage, and `damage` says where it stopped; network frames are counted, not taken.
  struct FromTrace {
    std::vector<Arrival> arrivals;
    uint64_t net_frames = 0;
    std::string damage;
  };
  // The input is held in memory, so a trace (maybe hostile: its events compress well) may give at most this much.
  static constexpr uint64_t kMaxBytes = uint64_t{64} << 20;
  static Result<FromTrace> read_trace(const std::string& path);

  explicit ScriptedInput(std::vector<Arrival> arrivals);
  size_t read_available(std::span<uint8_t> out, uint64_t now_ns) override;
  bool at_end() const override { return next_ == arrivals_.size(); }
  std::optional<uint64_t> next_arrival_ns(uint64_t after_ns) const override;

 private:
  std::vector<Arrival> arrivals_;  // by time
  size_t next_ = 0;                // the first arrival not wholly read
  size_t offset_ = 0;              // bytes of it already read
};

}  // namespace deja
