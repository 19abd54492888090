// libslirp glue: configuration, host forwards, the poll cycle, timers on virtual time, the frame queue to the guest.
#include "vmm/user_network.h"

#include <arpa/inet.h>
#include <sys/stat.h>
#include <slirp/libslirp.h>

#include <algorithm>
#include <charconv>
#include <optional>

#include <fmt/format.h>

namespace deja {
namespace {

int to_slirp_events(short events) {
  int e = 0;
  if (events & POLLIN) e |= SLIRP_POLL_IN;
  if (events & POLLOUT) e |= SLIRP_POLL_OUT;
  if (events & POLLPRI) e |= SLIRP_POLL_PRI;
  if (events & POLLERR) e |= SLIRP_POLL_ERR;
  if (events & POLLHUP) e |= SLIRP_POLL_HUP;
  return e;
}

short to_poll_events(int events) {
  short e = 0;
  if (events & SLIRP_POLL_IN) e |= POLLIN;
  if (events & SLIRP_POLL_OUT) e |= POLLOUT;
  if (events & SLIRP_POLL_PRI) e |= POLLPRI;
  if (events & SLIRP_POLL_ERR) e |= POLLERR;
  if (events & SLIRP_POLL_HUP) e |= POLLHUP;
  return e;
}

std::optional<uint16_t> parse_port(std::string_view s) {
  unsigned v = 0;
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || ptr != s.data() + s.size() || v == 0 || v > 65535) return std::nullopt;
  return uint16_t(v);
}

// tcp:[HOSTADDR]:HOSTPORT-[GUESTADDR]:GUESTPORT, as QEMU's hostfwd.
Result<HostForward> parse_forward(const std::string& rule) {
  auto bad = [&] {
    return fail(ErrorKind::kInvalidArgument,
                "--net hostfwd={}: expected tcp|udp:[HOSTADDR]:HOSTPORT-[GUESTADDR]:GUESTPORT", rule);
  };
  HostForward f;
  std::string_view s = rule;
  if (s.starts_with("tcp:")) {
    s.remove_prefix(4);
  } else if (s.starts_with("udp:")) {
    f.udp = true;
    s.remove_prefix(4);
  } else {
    return bad();
  }
  size_t dash = s.find('-');
  if (dash == std::string_view::npos) return bad();
  std::string_view host = s.substr(0, dash), guest = s.substr(dash + 1);
  size_t hc = host.rfind(':'), gc = guest.rfind(':');
  if (hc == std::string_view::npos || gc == std::string_view::npos) return bad();
  f.host_addr = std::string(host.substr(0, hc));
  f.guest_addr = std::string(guest.substr(0, gc));
  auto hp = parse_port(host.substr(hc + 1)), gp = parse_port(guest.substr(gc + 1));
  if (!hp || !gp) return bad();
  f.host_port = *hp;
  f.guest_port = *gp;
  in_addr a{};
  if ((!f.host_addr.empty() && inet_pton(AF_INET, f.host_addr.c_str(), &a) != 1) ||
      (!f.guest_addr.empty() && inet_pton(AF_INET, f.guest_addr.c_str(), &a) != 1)) {
    return bad();
  }
  return f;
}

}  // namespace

Result<std::array<uint8_t, 6>> parse_mac(std::string_view text) {
  std::array<uint8_t, 6> mac{};
  auto hex = [](char c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                                                                                          : -1;
  };
  bool ok = text.size() == 17;
  for (size_t i = 0; ok && i < 6; ++i) {
    const int hi = hex(text[i * 3]), lo = hex(text[i * 3 + 1]);
    ok = hi >= 0 && lo >= 0 && (i == 5 || text[i * 3 + 2] == ':');
    mac[i] = uint8_t(hi << 4 | lo);
  }
  if (!ok) return fail(ErrorKind::kInvalidArgument, "MAC address '{}' is not six hex bytes (52:54:00:12:34:56)", text);
  if (mac[0] & 1) return fail(ErrorKind::kInvalidArgument, "MAC address '{}' is a multicast address", text);
  return mac;
}

Result<NetOptions> parse_net_option(const std::string& text) {
  NetOptions o;
  size_t start = 0;
  bool first = true;
  while (start <= text.size()) {
    size_t comma = text.find(',', start);
    std::string part = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (first) {
      if (part != "user") {
        return fail(ErrorKind::kInvalidArgument, "--net {}: only 'user' (libslirp's user-mode network) exists", text);
      }
      first = false;
    } else if (part.starts_with("hostfwd=")) {
      auto f = parse_forward(part.substr(8));
      if (!f) return std::unexpected(f.error());
      o.forwards.push_back(*f);
      o.forward_texts.push_back(part.substr(8));
    } else if (part.starts_with("tftp=")) {
      o.tftp_dir = part.substr(5);
      struct stat st{};
      if (o.tftp_dir.empty() || ::stat(o.tftp_dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
        return fail(ErrorKind::kInvalidArgument, "--net {}: tftp={} is not a directory", text, o.tftp_dir);
      }
    } else if (part.starts_with("guestfwd=")) {
      // tcp:ADDR:PORT-echo (QEMU's guestfwd syntax, with deja's in-process echo service as the target).
      std::string_view rule = std::string_view(part).substr(9);
      const bool ok_form = rule.starts_with("tcp:") && rule.ends_with("-echo");
      const std::string_view where = ok_form ? rule.substr(4, rule.size() - 9) : std::string_view();
      const size_t colon = where.rfind(':');
      in_addr a{};
      const auto port = colon == std::string_view::npos ? std::nullopt : parse_port(where.substr(colon + 1));
      if (!ok_form || !port || inet_pton(AF_INET, std::string(where.substr(0, colon)).c_str(), &a) != 1) {
        return fail(ErrorKind::kInvalidArgument, "--net {}: guestfwd=tcp:ADDR:PORT-echo (an echo service inside the "
                    "network, 10.0.2.4:7 say) is the one guest forward deja has", text);
      }
      o.echoes.push_back(NetOptions::Echo{std::string(where.substr(0, colon)), *port});
    } else if (part == "restrict=on" || part == "restrict=off") {
      o.restricted = part == "restrict=on";
    } else if (part.starts_with("mac=")) {
      auto mac = parse_mac(part.substr(4));
      if (!mac) return fail(ErrorKind::kInvalidArgument, "--net {}: {}", text, mac.error().message);
      o.mac = *mac;
    } else {
      return fail(ErrorKind::kInvalidArgument,
                  "--net {}: unknown part '{}' (use user[,hostfwd=tcp::HOSTPORT-:GUESTPORT][,tftp=DIR][,restrict=on]"
                  "[,guestfwd=tcp:ADDR:PORT-echo][,mac=52:54:00:12:34:56])",
                  text, part);
    }
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return o;
}

struct UserNetwork::Callbacks {
  static ssize_t send_packet(const void* buf, size_t len, void* opaque) {
    auto* self = static_cast<UserNetwork*>(opaque);
    if (self->pending_.size() >= kMaxPendingFrames || self->pending_bytes_ + len > kMaxPendingBytes) {
      ++self->dropped_;
      return ssize_t(len);
    }
    const auto* bytes = static_cast<const uint8_t*>(buf);
    self->pending_.emplace_back(bytes, bytes + len);
    self->pending_bytes_ += len;
    return ssize_t(len);
  }
  static void guest_error(const char* /*msg*/, void* /*opaque*/) {}
  static int64_t clock_get_ns(void* opaque) { return int64_t(static_cast<UserNetwork*>(opaque)->clock_ns_()); }
  static void* timer_new(SlirpTimerCb cb, void* cb_opaque, void* opaque) {
    auto* self = static_cast<UserNetwork*>(opaque);
    auto t = std::make_unique<Timer>();
    t->cb = cb;
    t->cb_opaque = cb_opaque;
    self->timers_.push_back(std::move(t));
    return self->timers_.back().get();
  }
  static void* timer_new_opaque(SlirpTimerId id, void* cb_opaque, void* opaque) {
    auto* self = static_cast<UserNetwork*>(opaque);
    auto t = std::make_unique<Timer>();
    t->id = int(id);
    t->cb_opaque = cb_opaque;
    self->timers_.push_back(std::move(t));
    return self->timers_.back().get();
  }
  static void timer_free(void* timer, void* opaque) {
    auto* self = static_cast<UserNetwork*>(opaque);
    std::erase_if(self->timers_, [timer](const std::unique_ptr<Timer>& t) { return t.get() == timer; });
  }
  static void timer_mod(void* timer, int64_t expire_ms, void* /*opaque*/) { static_cast<Timer*>(timer)->expire_ms = expire_ms; }
  static void register_poll_fd(int /*fd*/, void* /*opaque*/) {}
  static void unregister_poll_fd(int /*fd*/, void* /*opaque*/) {}
  static void notify(void* /*opaque*/) {}
  static ssize_t echo_write(const void* buf, size_t len, void* opaque) {
    auto* echo = static_cast<EchoService*>(opaque);
    const size_t kept = std::min(len, kMaxEchoBytes - std::min(kMaxEchoBytes, echo->held.size()));
    echo->held.append(static_cast<const char*>(buf), kept);
    echo->network->echo_dropped_ += len - kept;
    return ssize_t(len);
  }
  static int add_poll(int fd, int events, void* opaque) {
    auto* self = static_cast<UserNetwork*>(opaque);
    self->fill_->push_back(pollfd{fd, to_poll_events(events), 0});
    return int(self->fill_->size() - 1);
  }
  static int get_revents(int idx, void* opaque) {
    auto* self = static_cast<UserNetwork*>(opaque);
    if (idx < 0 || size_t(idx) >= self->results_.size()) return 0;
    return to_slirp_events(self->results_[size_t(idx)].revents);
  }
};

Result<std::unique_ptr<UserNetwork>> UserNetwork::create(const NetOptions& options, std::function<uint64_t()> clock_ns) {
  std::unique_ptr<UserNetwork> n(new UserNetwork());
  n->clock_ns_ = std::move(clock_ns);
  n->restricted_ = options.restricted;
  static const SlirpCb callbacks = {
      .send_packet = Callbacks::send_packet,
      .guest_error = Callbacks::guest_error,
      .clock_get_ns = Callbacks::clock_get_ns,
      .timer_new = Callbacks::timer_new,
      .timer_free = Callbacks::timer_free,
      .timer_mod = Callbacks::timer_mod,
      .register_poll_fd = Callbacks::register_poll_fd,
      .unregister_poll_fd = Callbacks::unregister_poll_fd,
      .notify = Callbacks::notify,
      .init_completed = nullptr,
      .timer_new_opaque = Callbacks::timer_new_opaque,
  };
  SlirpConfig cfg{};
  cfg.version = 4;
  cfg.restricted = options.restricted ? 1 : 0;
  cfg.in_enabled = true;
  inet_pton(AF_INET, "10.0.2.0", &cfg.vnetwork);
  inet_pton(AF_INET, "255.255.255.0", &cfg.vnetmask);
  inet_pton(AF_INET, "10.0.2.2", &cfg.vhost);
  cfg.in6_enabled = false;
  inet_pton(AF_INET, "10.0.2.15", &cfg.vdhcp_start);
  inet_pton(AF_INET, "10.0.2.3", &cfg.vnameserver);
  cfg.if_mtu = 1500;
  cfg.if_mru = 1500;
  cfg.disable_host_loopback = false;
  cfg.enable_emu = false;
  if (!options.tftp_dir.empty()) cfg.tftp_path = options.tftp_dir.c_str();
  n->slirp_ = slirp_new(&cfg, &callbacks, n.get());
  if (!n->slirp_) return fail(ErrorKind::kHost, "libslirp could not create the user-mode network");
  for (const HostForward& f : options.forwards) {
    in_addr host{}, guest{};
    inet_pton(AF_INET, f.host_addr.empty() ? "0.0.0.0" : f.host_addr.c_str(), &host);
    inet_pton(AF_INET, f.guest_addr.empty() ? "10.0.2.15" : f.guest_addr.c_str(), &guest);
    if (slirp_add_hostfwd(n->slirp_, f.udp, host, f.host_port, guest, f.guest_port) < 0) {
      return fail(ErrorKind::kHost, "--net hostfwd: cannot listen on {} port {} on the host (in use?)",
                  f.udp ? "UDP" : "TCP", f.host_port);
    }
  }
  for (const NetOptions::Echo& e : options.echoes) {
    auto echo = std::make_unique<EchoService>();
    echo->network = n.get();
    in_addr addr{};
    inet_pton(AF_INET, e.addr.c_str(), &addr);
    echo->addr = addr.s_addr;
    echo->port = e.port;
    if (slirp_add_guestfwd(n->slirp_, Callbacks::echo_write, echo.get(), &addr, e.port) < 0) {
      return fail(ErrorKind::kInvalidArgument, "--net guestfwd=tcp:{}:{}-echo: not an address inside 10.0.2.0/24 that "
                  "is free (the gateway 10.0.2.2, DNS 10.0.2.3 and another forward are taken)", e.addr, e.port);
    }
    n->echoes_.push_back(std::move(echo));
  }
  return n;
}

void UserNetwork::flush_echoes() {
  for (const auto& echo : echoes_) {
    if (echo->held.empty()) continue;
    in_addr addr{};
    addr.s_addr = echo->addr;
    const size_t room = std::min(slirp_socket_can_recv(slirp_, addr, echo->port), echo->held.size());
    if (room == 0) continue;
    slirp_socket_recv(slirp_, addr, echo->port, reinterpret_cast<const uint8_t*>(echo->held.data()), int(room));
    echo->held.erase(0, room);
  }
}

UserNetwork::~UserNetwork() {
  if (slirp_) slirp_cleanup(slirp_);
}

void UserNetwork::input(std::span<const uint8_t> frame) { slirp_input(slirp_, frame.data(), int(frame.size())); }

uint64_t UserNetwork::next_timer_ns() const {
  uint64_t next = UINT64_MAX;
  for (const auto& t : timers_) {
    if (t->expire_ms >= 0) next = std::min(next, uint64_t(t->expire_ms) * 1'000'000);
  }
  return next;
}

void UserNetwork::fire_timers() {
  const int64_t now_ms = int64_t(clock_ns_() / 1'000'000);
  // A callback may free or re-arm timers: collect the due ones first.
  std::vector<Timer*> due;
  for (const auto& t : timers_) {
    if (t->expire_ms >= 0 && t->expire_ms <= now_ms) due.push_back(t.get());
  }
  for (Timer* t : due) {
    if (std::none_of(timers_.begin(), timers_.end(), [t](const auto& p) { return p.get() == t; })) continue;
    t->expire_ms = -1;
    if (t->cb) {
      t->cb(t->cb_opaque);
    } else {
      slirp_handle_timer(slirp_, SlirpTimerId(t->id), t->cb_opaque);
    }
  }
}

void UserNetwork::add_fds(std::vector<pollfd>& fds, int* timeout_ms) {
  fill_ = &fds;
  uint32_t timeout = uint32_t(std::max(*timeout_ms, 0));
  slirp_pollfds_fill(slirp_, &timeout, Callbacks::add_poll, this);
  fill_ = nullptr;
  *timeout_ms = int(std::min<uint32_t>(timeout, uint32_t(std::max(*timeout_ms, 0))));
  const uint64_t next = next_timer_ns(), now = clock_ns_();
  if (next != UINT64_MAX) *timeout_ms = std::min<int>(*timeout_ms, next <= now ? 0 : int((next - now) / 1'000'000 + 1));
}

void UserNetwork::dispatch(std::span<const pollfd> fds, bool poll_failed) {
  results_ = fds;
  slirp_pollfds_poll(slirp_, poll_failed ? 1 : 0, Callbacks::get_revents, this);
  results_ = {};
  flush_echoes();
  fire_timers();
}

std::vector<std::vector<uint8_t>> UserNetwork::take(size_t count) {
  std::vector<std::vector<uint8_t>> frames;
  while (count-- > 0 && !pending_.empty()) {
    pending_bytes_ -= pending_.front().size();
    frames.push_back(std::move(pending_.front()));
    pending_.pop_front();
  }
  return frames;
}

void UserNetwork::poll_simulated() {
  // A restricted slirp opens no host socket; were one there, its events would be the host's: none are looked at.
  std::vector<pollfd> fds;
  fill_ = &fds;
  uint32_t timeout = UINT32_MAX;
  slirp_pollfds_fill(slirp_, &timeout, Callbacks::add_poll, this);
  fill_ = nullptr;
  for (pollfd& p : fds) p.revents = 0;
  dispatch(fds, false);
  // slirp asks for a cycle in 2 ms (delayed ACKs) or 499 ms (retransmissions) while it has TCP work, else says 1 s.
  tcp_timers_due_ns_ = timeout < 1000 ? clock_ns_() + uint64_t(timeout) * 1'000'000 : UINT64_MAX;
}

std::optional<uint64_t> UserNetwork::next_wake_ns() const {
  const uint64_t next = std::min(next_timer_ns(), tcp_timers_due_ns_);
  return next == UINT64_MAX ? std::nullopt : std::optional(next);
}

void UserNetwork::poll_now() {
  std::vector<pollfd> fds;
  int timeout = 0;
  add_fds(fds, &timeout);
  int n = fds.empty() ? 0 : ::poll(fds.data(), fds.size(), 0);
  dispatch(fds, n < 0);
}

}  // namespace deja
