// isa-debug-exit: turns a guest write into the exit status QEMU would pass to exit().
#include "devices/debug_exit.h"

#include <algorithm>

#include "devices/state_codec.h"

namespace deja {

void DebugExit::read(uint64_t /*offset*/, std::span<uint8_t> data) { std::fill(data.begin(), data.end(), 0xff); }

void DebugExit::write(uint64_t /*offset*/, std::span<const uint8_t> data) {
  if (data.empty()) return;
  // QEMU computes (val << 1) | 1 on a uint64 value and passes it to exit(int).
  uint64_t value = load_le(data);
  raw_status_ = int64_t(int32_t(uint32_t((value << 1) | 1)));
}

std::optional<int> DebugExit::exit_status() const {
  if (!raw_status_) return std::nullopt;
  return int(uint64_t(*raw_status_) & 0xff);
}

namespace {
constexpr char kTag[] = "DBGX";
constexpr uint8_t kVersion = 1;
}  // namespace

std::vector<uint8_t> DebugExit::save() const {
  StateWriter w(kTag, kVersion);
  w.boolean(raw_status_.has_value());
  w.i64(raw_status_.value_or(0));
  return w.take();
}

Result<> DebugExit::restore(std::span<const uint8_t> state) {
  StateReader r(state, kTag, kVersion);
  bool has = r.boolean();
  int64_t status = r.i64();
  if (r.ok() && !has && status != 0) r.invalid("status value present without an exit request");
  if (r.ok() && has && (status & 1) == 0) r.invalid(fmt::format("status {} is even; (v << 1) | 1 is always odd", status));
  if (auto done = r.finish(); !done) return done;
  raw_status_ = has ? std::optional<int64_t>(status) : std::nullopt;
  return {};
}

}  // namespace deja
