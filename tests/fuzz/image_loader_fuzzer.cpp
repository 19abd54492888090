// libFuzzer target: any bytes as a guest image (and a boot module) through the loaders: a clear error or a load, never a crash.
#include <cstdint>
#include <vector>

#include "core/guest_memory.h"
#include "boot/loader.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static auto memory = deja::GuestMemory::create(64ull << 20);
  if (!memory) return 0;
  // The first byte picks a split: image bytes, then module bytes (modules exercise placement).
  const size_t split = size == 0 ? 0 : (size_t(data[0]) * size) / 256;
  std::span<const uint8_t> image(data, split), module(data + split, size - split);
  deja::LoadOptions options;
  options.cmdline = "console=ttyS0";
  std::vector<std::vector<uint8_t>> modules;
  if (!module.empty() && data[0] & 1) {
    options.modules.push_back({"module.bin", "args"});
    modules.emplace_back(module.begin(), module.end());
  }
  (void)deja::load_guest_image_bytes(*memory, image, "fuzz.elf", options, modules);
  return 0;
}
