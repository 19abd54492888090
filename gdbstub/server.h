// The gdb remote-protocol server: packets in, replies out, over a Target; plus the TCP transport that serves one connection.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "gdbstub/packet.h"
#include "gdbstub/target.h"

namespace deja::gdb {

class Server {
 public:
  explicit Server(Target& target) : target_(target) {}

  // The reply payload (unframed) to one packet; nullopt when the packet gets no reply ('k'). Never
  // throws, whatever the packet: malformed ones get "E01"-style errors, unknown ones the empty reply.
  std::optional<std::string> handle(std::string_view packet, const std::function<bool()>& interrupted);
  bool finished() const { return finished_; }  // gdb detached or killed
  bool no_ack() const { return no_ack_; }
  // Why the last packet was refused, for deja's own log (gdb shows only "E1c"); "" when it was not. Cleared.
  std::string take_refusal() { return std::exchange(refusal_, std::string()); }

  // Breakpoints (Z0 and Z1 each) and watchpoints (Z2-Z4) held at once; more are refused with E1c (ENOSPC).
  static constexpr size_t kMaxBreakpoints = 4096;
  static constexpr size_t kMaxWatchpoints = 256;

  // The stop reply to a Ctrl-C that came while the machine was stopped.
  std::string interrupted_reply();

 private:
  std::string stop_reply(const StopInfo& stop);
  std::string read_registers();
  std::optional<std::string> read_register(uint64_t number);
  std::string resume(const ResumeRequest& base, const std::function<bool()>& interrupted);
  std::string handle_query(std::string_view packet, const std::function<bool()>& interrupted);
  std::string handle_v(std::string_view packet, const std::function<bool()>& interrupted);
  std::string breakpoint(std::string_view packet, bool insert);
  // The vCPU a thread id names (hex, 1-based; "0" and "-1": the stopped one); nullopt when none.
  std::optional<uint32_t> thread_vcpu(std::string_view id);

  Target& target_;
  std::vector<uint64_t> software_breakpoints_, hardware_breakpoints_;
  std::vector<Watchpoint> watchpoints_;
  StopInfo last_stop_;
  uint32_t selected_ = 0;  // the vCPU (gdb thread - 1) whose registers and memory g, p and m read
  bool finished_ = false;
  bool no_ack_ = false;
  std::string refusal_;
};

// The x86-64 target description (qXfer:features:read:target.xml), and its register count.
std::string_view target_xml();
constexpr int kRegisterCount = 81;

// Listens on host:port (IPv4 literal or "localhost"); port 0 picks one. Returns the socket and port.
Result<std::pair<int, uint16_t>> listen_tcp(const std::string& host, uint16_t port);
// Serves one connection until gdb detaches, kills, or disconnects.
Result<> serve(int connection_fd, Server& server);

}  // namespace deja::gdb
