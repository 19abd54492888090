// The engine's entropy choke point (virtio-rng): host random bytes recorded as they are handed out; replay gives them back.
#include <sys/random.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "logging/trace_inspect.h"
#include "replay/engine.h"

namespace deja {

void Engine::fill(std::span<uint8_t> out) {
  if (mode_ == Mode::kReplay) {
    std::fill(out.begin(), out.end(), uint8_t{0});
    std::string what = fmt::format("entropy ({} bytes)", out.size());
    if (const auto* e = expect(trace::Event::kEntropy, what)) {
      const std::string& data = e->entropy().data();
      if (data.size() != out.size()) {
        diverge("the entropy device asked for another number of bytes", describe_event(*e), what);
        return;
      }
      std::copy(data.begin(), data.end(), out.begin());
    }
    return;
  }
  if (simulated_) {
    for (uint8_t& byte : out) byte = uint8_t(simulated_random_.next());
  }
  for (size_t done = simulated_ ? out.size() : 0; done < out.size();) {
    ssize_t n = ::getrandom(out.data() + done, out.size() - done, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      host_failure(fmt::format("getrandom failed: {}", strerror(errno)));
      std::fill(out.begin() + done, out.end(), uint8_t{0});
      break;
    }
    done += size_t(n);
  }
  if (mode_ == Mode::kRecord) {
    trace::Event e;
    e.mutable_entropy()->set_data(out.data(), out.size());
    append(std::move(e));
  }
}

}  // namespace deja
