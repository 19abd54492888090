// fw_cfg: builds QEMU's well-known items from the machine configuration and serves them bytewise.
#include "devices/fw_cfg.h"

#include <algorithm>

#include "devices/state_codec.h"

namespace deja {
namespace {

std::vector<uint8_t> little_endian(uint64_t value, int bytes) {
  std::vector<uint8_t> out(bytes);
  for (int i = 0; i < bytes; ++i) out[i] = uint8_t(value >> (8 * i));
  return out;
}

}  // namespace

FwCfg::FwCfg(const FwCfgConfig& config) {
  items_[kSignature] = {'Q', 'E', 'M', 'U'};
  items_[kId] = little_endian(1, 4);  // bit 0: traditional interface; bit 1 (DMA) clear
  items_[kRamSize] = little_endian(config.ram_size, 8);
  items_[kNbCpus] = little_endian(config.cpus, 2);
  items_[kMaxCpus] = little_endian(config.cpus, 2);
  items_[kCmdlineSize] = little_endian(config.cmdline.size() + 1, 4);
  std::vector<uint8_t> cmdline(config.cmdline.begin(), config.cmdline.end());
  cmdline.push_back(0);
  items_[kCmdlineData] = std::move(cmdline);
  items_[kFileDir] = {0, 0, 0, 0};  // FWCfgFiles.count, big-endian: no files
}

const std::vector<uint8_t>* FwCfg::selected_item() const {
  auto it = items_.find(selector_);
  return it == items_.end() ? nullptr : &it->second;
}

void FwCfg::read(uint64_t offset, std::span<uint8_t> data) {
  if (offset != 1) {
    std::fill(data.begin(), data.end(), 0);
    return;
  }
  const std::vector<uint8_t>* item = selected_item();
  for (uint8_t& byte : data) {
    if (item && offset_ < item->size()) {
      byte = (*item)[offset_++];
    } else {
      byte = 0;
    }
  }
}

void FwCfg::write(uint64_t offset, std::span<const uint8_t> data) {
  if (offset != 0 || data.empty()) return;
  selector_ = uint16_t(load_le(data.first(std::min<size_t>(data.size(), 2))));
  offset_ = 0;
}

namespace {
constexpr char kTag[] = "FWCF";
constexpr uint8_t kVersion = 1;
}  // namespace

std::vector<uint8_t> FwCfg::save() const {
  StateWriter w(kTag, kVersion);
  w.u16(selector_);
  w.u32(offset_);
  return w.take();
}

Result<> FwCfg::restore(std::span<const uint8_t> state) {
  StateReader r(state, kTag, kVersion);
  uint16_t selector = r.u16();
  uint32_t offset = r.u32();
  if (r.ok()) {
    auto it = items_.find(selector);
    size_t size = it == items_.end() ? 0 : it->second.size();
    if (offset > size) {
      r.invalid(fmt::format("offset {} beyond the {}-byte item {:#x}", offset, size, selector));
    }
  }
  if (auto done = r.finish(); !done) return done;
  selector_ = selector;
  offset_ = offset;
  return {};
}

}  // namespace deja
