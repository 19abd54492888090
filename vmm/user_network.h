// The user-mode network outside the machine (libslirp, as QEMU's -netdev user): host sockets, never run in replay.
#pragma once

#include <poll.h>

#include <array>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/error.h"

struct Slirp;

namespace deja {

// --net user[,hostfwd=tcp:[HOSTADDR]:HOSTPORT-[GUESTADDR]:GUESTPORT]... (also udp:).
struct HostForward {
  bool udp = false;
  std::string host_addr;  // "" = 127.0.0.1... as QEMU: any address (0.0.0.0)
  uint16_t host_port = 0;
  std::string guest_addr;  // "" = the guest's DHCP address 10.0.2.15
  uint16_t guest_port = 0;
};
struct NetOptions {
  std::vector<HostForward> forwards;
  std::vector<std::string> forward_texts;  // as given, for the trace header
  std::optional<std::array<uint8_t, 6>> mac;  // mac=52:54:00:12:34:56 (default: nic_mac(index), vmm/machine.h)
  std::string tftp_dir;  // tftp=DIR: libslirp's read-only TFTP server at 10.0.2.2 serves DIR's files
  // restrict=on: nothing of the host's network (libslirp's own services only: DHCP, ARP, ping and TFTP at the
  // gateway); deja explore's networks are restricted, so that a run needs nothing from outside.
  bool restricted = false;
  // guestfwd=tcp:ADDR:PORT-echo: a TCP echo service at ADDR:PORT inside the network (10.0.2.0/24, not the gateway,
  // DNS or guest address), run in-process: a peer for the guest's TCP that needs nothing of the host's.
  struct Echo {
    std::string addr;
    uint16_t port = 0;
  };
  std::vector<Echo> echoes;
};
Result<NetOptions> parse_net_option(const std::string& text);
// "52:54:00:12:34:56": a unicast MAC address.
Result<std::array<uint8_t, 6>> parse_mac(std::string_view text);

// libslirp's network 10.0.2.0/24: the guest at 10.0.2.15 (DHCP), the gateway 10.0.2.2 (the host: its loopback
// services answer there), DNS at 10.0.2.3; IPv6 off (its router advertisements would be input for nothing).
// Everything here happens on the vCPU thread, from the session's poll points. slirp's clock is the machine's
// virtual time (the engine's, which follows the host while recording), so its TCP timers run in that time.
// Frames slirp sends towards the guest wait in a bounded queue until the session hands them to the NIC inside
// a recorded asynchronous event; beyond the bound they are dropped (as a full NIC would), before any recording.
class UserNetwork {
 public:
  static constexpr size_t kMaxPendingFrames = 4096;
  static constexpr size_t kMaxPendingBytes = 8u << 20;
  // What an echo service holds that it could not send back yet (a guest that sends without reading): beyond it the
  // service drops what the guest sends, and counts it.
  static constexpr size_t kMaxEchoBytes = 1u << 20;

  static Result<std::unique_ptr<UserNetwork>> create(const NetOptions& options, std::function<uint64_t()> clock_ns);
  ~UserNetwork();

  bool restricted() const { return restricted_; }
  // A frame the guest sent.
  void input(std::span<const uint8_t> frame);
  // Frames waiting for the guest, and taking the oldest `count` of them.
  size_t pending() const { return pending_.size(); }
  std::vector<std::vector<uint8_t>> take(size_t count);
  uint64_t dropped() const { return dropped_; }
  uint64_t echo_dropped() const { return echo_dropped_; }

  // One poll cycle, split so that the session can wait on slirp's sockets together with its own fds: add slirp's
  // fds to `fds` (and shorten `timeout_ms` to its next timer), then after poll(2) hand the results back.
  void add_fds(std::vector<pollfd>& fds, int* timeout_ms);
  void dispatch(std::span<const pollfd> fds, bool poll_failed);
  // A poll cycle that does not wait.
  void poll_now();
  // A restricted network's poll cycle, with no host socket to look at (a seeded run's: deja explore): slirp's TCP
  // timers and its queue of frames waiting for an ARP answer, in the clock's time.
  void poll_simulated();
  // Virtual ns of the next slirp timer (none: UINT64_MAX).
  uint64_t next_timer_ns() const;
  // After poll_simulated(): when slirp next has work of its own (its timers, its TCP timers: nullopt, none).
  std::optional<uint64_t> next_wake_ns() const;

 private:
  UserNetwork() = default;
  struct Callbacks;  // libslirp's callbacks (user_network.cpp)
  friend struct Callbacks;
  void fire_timers();

  struct Timer {
    void (*cb)(void*) = nullptr;
    int id = -1;  // timer_new_opaque: slirp_handle_timer's id
    void* cb_opaque = nullptr;
    int64_t expire_ms = -1;  // -1: not armed
  };
  struct EchoService {
    UserNetwork* network = nullptr;
    uint32_t addr = 0;  // network order, as libslirp's in_addr
    uint16_t port = 0;
    std::string held;   // from the guest, not yet sent back
  };
  // Sends back what the echo services hold, as far as libslirp's windows let it (never from inside its callback).
  void flush_echoes();
  Slirp* slirp_ = nullptr;
  std::vector<std::unique_ptr<EchoService>> echoes_;
  uint64_t echo_dropped_ = 0;
  bool restricted_ = false;
  std::function<uint64_t()> clock_ns_;
  std::deque<std::vector<uint8_t>> pending_;
  size_t pending_bytes_ = 0;
  uint64_t dropped_ = 0;
  std::vector<std::unique_ptr<Timer>> timers_;
  uint64_t tcp_timers_due_ns_ = UINT64_MAX;  // poll_simulated(): when slirp's TCP timers want the next cycle
  std::vector<pollfd>* fill_ = nullptr;  // during add_fds: slirp's indexes are indexes into it
  std::span<const pollfd> results_;      // during dispatch
};

}  // namespace deja
