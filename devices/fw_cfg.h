// QEMU's firmware configuration device, traditional I/O interface (selector 0x510, data 0x511).
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "devices/device.h"

namespace deja {

struct FwCfgConfig {
  uint64_t ram_size = 0;
  uint16_t cpus = 1;
  std::string cmdline;
};

// Items and encodings as QEMU's hw/nvram/fw_cfg.c and include/standard-headers/linux/
// qemu_fw_cfg.h define them: SIGNATURE "QEMU", ID 1 (traditional interface, no DMA), RAM_SIZE
// u64 le, NB_CPUS and MAX_CPUS u16 le, CMDLINE_SIZE u32 le (including the NUL), CMDLINE_DATA
// (NUL-terminated), FILE_DIR (big-endian count 0: no files). The selector is written at offset 0
// (8 or 16 bits) and rewinds the data offset; each data read at offset 1 returns the next byte,
// 0 past the end or for an unknown selector. Data writes are ignored, as QEMU does since 2.4;
// reading the selector port returns 0.
class FwCfg : public Device {
 public:
  static constexpr uint16_t kSignature = 0x00;
  static constexpr uint16_t kId = 0x01;
  static constexpr uint16_t kRamSize = 0x03;
  static constexpr uint16_t kNbCpus = 0x05;
  static constexpr uint16_t kMaxCpus = 0x0f;
  static constexpr uint16_t kCmdlineSize = 0x14;
  static constexpr uint16_t kCmdlineData = 0x15;
  static constexpr uint16_t kFileDir = 0x19;

  explicit FwCfg(const FwCfgConfig& config);

  std::string_view name() const override { return "fw_cfg"; }
  void read(uint64_t offset, std::span<uint8_t> data) override;
  void write(uint64_t offset, std::span<const uint8_t> data) override;
  std::vector<uint8_t> save() const override;
  Result<> restore(std::span<const uint8_t> state) override;

 private:
  const std::vector<uint8_t>* selected_item() const;

  std::map<uint16_t, std::vector<uint8_t>> items_;
  uint16_t selector_ = 0;
  uint32_t offset_ = 0;
};

}  // namespace deja
