// ScriptedInput: a recording's serial input handed out again at the guest times it arrived.
#include "replay/scripted_input.h"

#include <algorithm>
#include <cstring>

#include "logging/trace_reader.h"

namespace deja {

Result<ScriptedInput::FromTrace> ScriptedInput::read_trace(const std::string& path) {
  auto reader = TraceReader::open(path);
  if (!reader) return std::unexpected(reader.error());
  FromTrace from;
  uint64_t bytes = 0;
  for (;;) {
    auto event = (*reader)->next();
    if (!event) {
      from.damage = event.error().message;
      break;
    }
    if (!*event) break;
    if (!(*event)->has_async()) continue;
    const trace::Async& a = (*event)->async();
    from.net_frames += a.net_frames_size();
    if (a.serial_input().empty()) continue;
    bytes += a.serial_input().size();
    if (bytes > kMaxBytes) {
      return fail(ErrorKind::kInvalidArgument, "its serial input is more than {} MiB, which is all that is kept",
                  kMaxBytes >> 20);
    }
    from.arrivals.push_back(Arrival{a.now_ns(), a.serial_input()});
  }
  return from;
}

ScriptedInput::ScriptedInput(std::vector<Arrival> arrivals) : arrivals_(std::move(arrivals)) {
  std::stable_sort(arrivals_.begin(), arrivals_.end(), [](const Arrival& a, const Arrival& b) { return a.at_ns < b.at_ns; });
  std::erase_if(arrivals_, [](const Arrival& a) { return a.bytes.empty(); });
}

size_t ScriptedInput::read_available(std::span<uint8_t> out, uint64_t now_ns) {
  size_t n = 0;
  while (n < out.size() && next_ < arrivals_.size() && arrivals_[next_].at_ns <= now_ns) {
    const std::string& bytes = arrivals_[next_].bytes;
    const size_t take = std::min(out.size() - n, bytes.size() - offset_);
    std::memcpy(out.data() + n, bytes.data() + offset_, take);
    n += take;
    offset_ += take;
    if (offset_ == bytes.size()) {
      ++next_;
      offset_ = 0;
    }
  }
  return n;
}

std::optional<uint64_t> ScriptedInput::next_arrival_ns(uint64_t after_ns) const {
  auto later = std::upper_bound(arrivals_.begin() + next_, arrivals_.end(), after_ns,
                                [](uint64_t t, const Arrival& a) { return t < a.at_ns; });
  if (later == arrivals_.end()) return std::nullopt;
  return later->at_ns;
}

}  // namespace deja
