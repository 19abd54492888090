// QEMU's isa-debug-exit device (port 0xf4): a guest write asks the VMM to stop with a status.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "devices/device.h"

namespace deja {

// A write of value v (any width up to 4 bytes) requests exit with status (v << 1) | 1, exactly as
// QEMU's hw/misc/debugexit.c passes it to exit(); the process exit code is that status' low byte,
// so a guest can never signal success (0) through it. Reads return all ones.
class DebugExit : public Device {
 public:
  std::string_view name() const override { return "isa-debug-exit"; }
  void read(uint64_t offset, std::span<uint8_t> data) override;
  void write(uint64_t offset, std::span<const uint8_t> data) override;
  std::vector<uint8_t> save() const override;
  Result<> restore(std::span<const uint8_t> state) override;

  // The process exit code the guest asked for (low byte of (v << 1) | 1), once it wrote.
  std::optional<int> exit_status() const;
  // The full int status QEMU computes, before truncation to the exit code.
  std::optional<int64_t> raw_status() const { return raw_status_; }

 private:
  std::optional<int64_t> raw_status_;
};

}  // namespace deja
