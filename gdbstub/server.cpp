// gdb packet handling (gdb manual, "Packets", "General Query Packets", "Stop Reply Packets") and the TCP transport.
#include "gdbstub/server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "core/messages.h"

namespace deja::gdb {
namespace {

constexpr char kTargetXml[] = R"(<?xml version="1.0"?>
<!DOCTYPE target SYSTEM "gdb-target.dtd">
<target version="1.0">
<architecture>i386:x86-64</architecture>
<feature name="org.gnu.gdb.i386.core">
<flags id="i386_eflags" size="4">
<field name="CF" start="0" end="0"/><field name="" start="1" end="1"/><field name="PF" start="2" end="2"/>
<field name="AF" start="4" end="4"/><field name="ZF" start="6" end="6"/><field name="SF" start="7" end="7"/>
<field name="TF" start="8" end="8"/><field name="IF" start="9" end="9"/><field name="DF" start="10" end="10"/>
<field name="OF" start="11" end="11"/><field name="NT" start="14" end="14"/><field name="RF" start="16" end="16"/>
<field name="VM" start="17" end="17"/><field name="AC" start="18" end="18"/><field name="VIF" start="19" end="19"/>
<field name="VIP" start="20" end="20"/><field name="ID" start="21" end="21"/>
</flags>
<reg name="rax" bitsize="64" type="int64"/><reg name="rbx" bitsize="64" type="int64"/>
<reg name="rcx" bitsize="64" type="int64"/><reg name="rdx" bitsize="64" type="int64"/>
<reg name="rsi" bitsize="64" type="int64"/><reg name="rdi" bitsize="64" type="int64"/>
<reg name="rbp" bitsize="64" type="data_ptr"/><reg name="rsp" bitsize="64" type="data_ptr"/>
<reg name="r8" bitsize="64" type="int64"/><reg name="r9" bitsize="64" type="int64"/>
<reg name="r10" bitsize="64" type="int64"/><reg name="r11" bitsize="64" type="int64"/>
<reg name="r12" bitsize="64" type="int64"/><reg name="r13" bitsize="64" type="int64"/>
<reg name="r14" bitsize="64" type="int64"/><reg name="r15" bitsize="64" type="int64"/>
<reg name="rip" bitsize="64" type="code_ptr"/><reg name="eflags" bitsize="32" type="i386_eflags"/>
<reg name="cs" bitsize="32" type="int32"/><reg name="ss" bitsize="32" type="int32"/>
<reg name="ds" bitsize="32" type="int32"/><reg name="es" bitsize="32" type="int32"/>
<reg name="fs" bitsize="32" type="int32"/><reg name="gs" bitsize="32" type="int32"/>
<reg name="st0" bitsize="80" type="i387_ext"/><reg name="st1" bitsize="80" type="i387_ext"/>
<reg name="st2" bitsize="80" type="i387_ext"/><reg name="st3" bitsize="80" type="i387_ext"/>
<reg name="st4" bitsize="80" type="i387_ext"/><reg name="st5" bitsize="80" type="i387_ext"/>
<reg name="st6" bitsize="80" type="i387_ext"/><reg name="st7" bitsize="80" type="i387_ext"/>
<reg name="fctrl" bitsize="32" type="int" group="float"/><reg name="fstat" bitsize="32" type="int" group="float"/>
<reg name="ftag" bitsize="32" type="int" group="float"/><reg name="fiseg" bitsize="32" type="int" group="float"/>
<reg name="fioff" bitsize="32" type="int" group="float"/><reg name="foseg" bitsize="32" type="int" group="float"/>
<reg name="fooff" bitsize="32" type="int" group="float"/><reg name="fop" bitsize="32" type="int" group="float"/>
</feature>
<feature name="org.gnu.gdb.i386.sse">
<vector id="v4f" type="ieee_single" count="4"/><vector id="v2d" type="ieee_double" count="2"/>
<vector id="v16i8" type="int8" count="16"/><vector id="v8i16" type="int16" count="8"/>
<vector id="v4i32" type="int32" count="4"/><vector id="v2i64" type="int64" count="2"/>
<union id="vec128"><field name="v4_float" type="v4f"/><field name="v2_double" type="v2d"/>
<field name="v16_int8" type="v16i8"/><field name="v8_int16" type="v8i16"/><field name="v4_int32" type="v4i32"/>
<field name="v2_int64" type="v2i64"/><field name="uint128" type="uint128"/></union>
<flags id="i386_mxcsr" size="4">
<field name="IE" start="0" end="0"/><field name="DE" start="1" end="1"/><field name="ZE" start="2" end="2"/>
<field name="OE" start="3" end="3"/><field name="UE" start="4" end="4"/><field name="PE" start="5" end="5"/>
<field name="DAZ" start="6" end="6"/><field name="IM" start="7" end="7"/><field name="DM" start="8" end="8"/>
<field name="ZM" start="9" end="9"/><field name="OM" start="10" end="10"/><field name="UM" start="11" end="11"/>
<field name="PM" start="12" end="12"/><field name="FZ" start="15" end="15"/>
</flags>
<reg name="xmm0" bitsize="128" type="vec128" regnum="40"/><reg name="xmm1" bitsize="128" type="vec128"/>
<reg name="xmm2" bitsize="128" type="vec128"/><reg name="xmm3" bitsize="128" type="vec128"/>
<reg name="xmm4" bitsize="128" type="vec128"/><reg name="xmm5" bitsize="128" type="vec128"/>
<reg name="xmm6" bitsize="128" type="vec128"/><reg name="xmm7" bitsize="128" type="vec128"/>
<reg name="xmm8" bitsize="128" type="vec128"/><reg name="xmm9" bitsize="128" type="vec128"/>
<reg name="xmm10" bitsize="128" type="vec128"/><reg name="xmm11" bitsize="128" type="vec128"/>
<reg name="xmm12" bitsize="128" type="vec128"/><reg name="xmm13" bitsize="128" type="vec128"/>
<reg name="xmm14" bitsize="128" type="vec128"/><reg name="xmm15" bitsize="128" type="vec128"/>
<reg name="mxcsr" bitsize="32" type="i386_mxcsr" group="vector"/>
</feature>
<feature name="org.gnu.gdb.i386.segments">
<reg name="fs_base" bitsize="64" type="int"/><reg name="gs_base" bitsize="64" type="int"/>
</feature>
<feature name="org.deja.x86.system">
<reg name="cr0" bitsize="64" type="int" group="system"/><reg name="cr2" bitsize="64" type="int" group="system"/>
<reg name="cr3" bitsize="64" type="int" group="system"/><reg name="cr4" bitsize="64" type="int" group="system"/>
<reg name="cr8" bitsize="64" type="int" group="system"/><reg name="efer" bitsize="64" type="int" group="system"/>
</feature>
<feature name="org.gnu.gdb.i386.avx">
<reg name="ymm0h" bitsize="128" type="uint128"/><reg name="ymm1h" bitsize="128" type="uint128"/>
<reg name="ymm2h" bitsize="128" type="uint128"/><reg name="ymm3h" bitsize="128" type="uint128"/>
<reg name="ymm4h" bitsize="128" type="uint128"/><reg name="ymm5h" bitsize="128" type="uint128"/>
<reg name="ymm6h" bitsize="128" type="uint128"/><reg name="ymm7h" bitsize="128" type="uint128"/>
<reg name="ymm8h" bitsize="128" type="uint128"/><reg name="ymm9h" bitsize="128" type="uint128"/>
<reg name="ymm10h" bitsize="128" type="uint128"/><reg name="ymm11h" bitsize="128" type="uint128"/>
<reg name="ymm12h" bitsize="128" type="uint128"/><reg name="ymm13h" bitsize="128" type="uint128"/>
<reg name="ymm14h" bitsize="128" type="uint128"/><reg name="ymm15h" bitsize="128" type="uint128"/>
</feature>
</target>
)";

// gdb's register order for the sixteen general registers, as deja's Gpr indices.
constexpr int kGdbGpr[16] = {kRax, kRbx, kRcx, kRdx, kRsi, kRdi, kRbp, kRsp,
                             kR8,  kR9,  kR10, kR11, kR12, kR13, kR14, kR15};

uint64_t fx_u(const CpuState& st, size_t offset, size_t bytes) {
  uint64_t v = 0;
  for (size_t i = 0; i < bytes; ++i) v |= uint64_t(st.fxsave[offset + i]) << (8 * i);
  return v;
}

// One register in target order: the hex of its bytes.
std::string register_hex(const CpuState& st, int n) {
  if (n < 16) return hex_le(st.gpr[kGdbGpr[n]], 8);
  if (n == 16) return hex_le(st.rip, 8);
  if (n == 17) return hex_le(st.rflags, 4);
  if (n < 24) {
    const SegmentReg* segs[] = {&st.cs, &st.ss, &st.ds, &st.es, &st.fs, &st.gs};
    return hex_le(segs[n - 18]->selector, 4);
  }
  if (n < 32) return hex_encode(std::span(st.fxsave).subspan(32 + 16 * (n - 24), 10));
  switch (n) {
    case 32: return hex_le(fx_u(st, 0, 2), 4);  // FCW
    case 33: return hex_le(fx_u(st, 2, 2), 4);  // FSW
    case 34: {
      // FXSAVE keeps an abridged tag (one bit per register: valid); gdb shows the full tag word.
      uint8_t abridged = st.fxsave[4];
      uint32_t tag = 0;
      for (int i = 0; i < 8; ++i) tag |= (abridged & (1 << i) ? 0u : 3u) << (2 * i);
      return hex_le(tag, 4);
    }
    case 35: return hex_le(fx_u(st, 12, 2), 4);  // FCS
    case 36: return hex_le(fx_u(st, 8, 4), 4);   // FIP
    case 37: return hex_le(fx_u(st, 20, 2), 4);  // FDS
    case 38: return hex_le(fx_u(st, 16, 4), 4);  // FDP
    case 39: return hex_le(fx_u(st, 6, 2), 4);   // FOP
    default: break;
  }
  if (n < 56) return hex_encode(std::span(st.fxsave).subspan(160 + 16 * (n - 40), 16));
  switch (n) {
    case 56: return hex_le(fx_u(st, 24, 4), 4);  // MXCSR
    case 57: return hex_le(st.fs.base, 8);
    case 58: return hex_le(st.gs.base, 8);
    case 59: return hex_le(st.cr0, 8);
    case 60: return hex_le(st.cr2, 8);
    case 61: return hex_le(st.cr3, 8);
    case 62: return hex_le(st.cr4, 8);
    case 63: return hex_le(st.cr8, 8);
    case 64: return hex_le(st.efer, 8);
    default: break;
  }
  if (n < 81) return hex_encode(std::span(st.ymmh).subspan(16 * (n - 65), 16));  // YMM0-15 bits 128-255
  return {};
}

std::string error_reply(int code) { return fmt::format("E{:02x}", code); }
constexpr int kEInvalid = 0x01, kEFault = 0x0e, kERefused = 0x16, kENoTarget = 0x03, kENoSpace = 0x1c;

std::optional<WatchKind> watch_kind_of(char type) {
  switch (type) {
    case '2': return WatchKind::kWrite;
    case '3': return WatchKind::kRead;
    case '4': return WatchKind::kAccess;
    default: return std::nullopt;
  }
}

}  // namespace

std::string_view target_xml() { return kTargetXml; }

std::string Server::stop_reply(const StopInfo& stop) {
  const std::string thread = fmt::format("thread:{:x};", target_.stopped_vcpu() + 1);
  switch (stop.why) {
    case StopInfo::Why::kStep: return "T05" + thread;
    case StopInfo::Why::kBreakpoint: return (stop.hardware ? "T05hwbreak:;" : "T05swbreak:;") + thread;
    case StopInfo::Why::kWatchpoint: {
      const char* name = stop.watch_kind == WatchKind::kRead ? "rwatch" : stop.watch_kind == WatchKind::kAccess ? "awatch" : "watch";
      return fmt::format("T05{}:{:x};{}", name, stop.watch_address, thread);
    }
    case StopInfo::Why::kInterrupted: return "T02" + thread;
    case StopInfo::Why::kHistoryBegin: return "T05replaylog:begin;" + thread;
    case StopInfo::Why::kHistoryEnd: return "T05replaylog:end;" + thread;
    case StopInfo::Why::kError: return "T06" + thread;  // SIGABRT: the replay cannot go on
  }
  return "S05";
}

std::string Server::interrupted_reply() { return stop_reply(StopInfo{StopInfo::Why::kInterrupted}); }

std::optional<uint32_t> Server::thread_vcpu(std::string_view id) {
  // "0" (any thread) and "-1" (all threads) name the vCPU the machine stopped on.
  if (id == "0" || id == "-1") return target_.stopped_vcpu();
  auto n = parse_hex_u64(id);
  if (!n || *n == 0 || *n > target_.threads()) return std::nullopt;
  return uint32_t(*n - 1);
}

std::string Server::read_registers() {
  auto st = target_.registers(selected_);
  if (!st) return error_reply(kENoTarget);
  std::string out;
  for (int n = 0; n < kRegisterCount; ++n) out += register_hex(*st, n);
  return out;
}

std::optional<std::string> Server::read_register(uint64_t number) {
  if (number >= kRegisterCount) return std::nullopt;
  auto st = target_.registers(selected_);
  if (!st) return error_reply(kENoTarget);
  return register_hex(*st, int(number));
}

std::string Server::resume(const ResumeRequest& base, const std::function<bool()>& interrupted) {
  ResumeRequest request = base;
  request.breakpoints = software_breakpoints_;
  request.breakpoints.insert(request.breakpoints.end(), hardware_breakpoints_.begin(), hardware_breakpoints_.end());
  request.watchpoints = watchpoints_;
  last_stop_ = target_.resume(request, interrupted);
  selected_ = target_.stopped_vcpu();  // gdb reads the stopped thread's registers next (or says Hg first)
  if (last_stop_.why == StopInfo::Why::kBreakpoint) {
    auto st = target_.registers(selected_);
    last_stop_.hardware =
        st && std::find(hardware_breakpoints_.begin(), hardware_breakpoints_.end(), st->rip) != hardware_breakpoints_.end() &&
        std::find(software_breakpoints_.begin(), software_breakpoints_.end(), st->rip) == software_breakpoints_.end();
  }
  return stop_reply(last_stop_);
}

std::string Server::breakpoint(std::string_view packet, bool insert) {
  // Z/z TYPE,ADDR,KIND[;cond...]: conditions and commands are not supported (ignored past ';').
  auto fields = split(packet.substr(1, packet.find(';') == std::string_view::npos ? std::string_view::npos
                                                                                   : packet.find(';') - 1),
                      ',');
  if (fields.size() != 3 || fields[0].size() != 1) return error_reply(kEInvalid);
  auto address = parse_hex_u64(fields[1]);
  auto kind = parse_hex_u64(fields[2]);
  if (!address || !kind) return error_reply(kEInvalid);
  char type = fields[0][0];
  if (type == '0' || type == '1') {
    auto& list = type == '0' ? software_breakpoints_ : hardware_breakpoints_;
    auto it = std::find(list.begin(), list.end(), *address);
    if (insert && it == list.end()) {
      // Every step compares its RIP with each breakpoint: a bounded list keeps stepping fast (docs/debugging.md).
      if (list.size() >= kMaxBreakpoints) {
        refusal_ = fmt::format("a breakpoint at {:#x} refused: deja holds at most {} {} breakpoints", *address,
                               kMaxBreakpoints, type == '0' ? "software" : "hardware");
        return error_reply(kENoSpace);
      }
      list.push_back(*address);
    }
    if (!insert && it != list.end()) list.erase(it);
    return "OK";
  }
  auto watch = watch_kind_of(type);
  if (!watch) return "";  // unknown breakpoint type: not supported
  if (*kind == 0 || *kind > 4096 || *address + *kind < *address) return error_reply(kEInvalid);
  Watchpoint w{*address, *kind, *watch};
  auto it = std::find(watchpoints_.begin(), watchpoints_.end(), w);
  if (insert && it == watchpoints_.end()) {
    // Every memory access is compared with each watchpoint (docs/debugging.md).
    if (watchpoints_.size() >= kMaxWatchpoints) {
      refusal_ = fmt::format("a watchpoint at {:#x} refused: deja holds at most {} watchpoints", *address,
                             kMaxWatchpoints);
      return error_reply(kENoSpace);
    }
    watchpoints_.push_back(w);
  }
  if (!insert && it != watchpoints_.end()) watchpoints_.erase(it);
  return "OK";
}

std::string Server::handle_query(std::string_view p, const std::function<bool()>& interrupted) {
  if (p.starts_with("qSupported")) {
    return fmt::format("PacketSize={:x};qXfer:features:read+;swbreak+;hwbreak+;ReverseStep+;ReverseContinue+;"
                       "vContSupported+;QStartNoAckMode+",
                       kMaxPacket);
  }
  if (p.starts_with("qXfer:features:read:")) {
    auto rest = p.substr(std::string_view("qXfer:features:read:").size());
    size_t colon = rest.find(':');
    if (colon == std::string_view::npos) return error_reply(kEInvalid);
    if (rest.substr(0, colon) != "target.xml") return error_reply(kEFault);
    auto range = parse_addr_length(rest.substr(colon + 1), kMaxPacket);
    if (!range) return error_reply(kEInvalid);
    std::string_view xml = target_xml();
    if (range->first >= xml.size()) return "l";
    auto part = xml.substr(range->first, std::min<uint64_t>(range->second, (kMaxPacket - 16) / 2));
    // Built by append rather than `const char* + std::string`: GCC 12 at -O3 (Release) reports a false
    // -Wrestrict in the latter, and warnings are errors.
    std::string reply(range->first + part.size() >= xml.size() ? "l" : "m");
    reply.append(part);
    return reply;
  }
  if (p == "qAttached") return "1";
  if (p == "qC") return fmt::format("QC{:x}", target_.stopped_vcpu() + 1);
  if (p == "qfThreadInfo") {
    std::string list = "m1";
    for (uint32_t t = 2; t <= target_.threads(); ++t) list += fmt::format(",{:x}", t);
    return list;
  }
  if (p == "qsThreadInfo") return "l";
  if (p.starts_with("qThreadExtraInfo,")) {
    auto vcpu = thread_vcpu(p.substr(std::string_view("qThreadExtraInfo,").size()));
    if (!vcpu) return error_reply(kEInvalid);
    return hex_encode(std::string_view(fmt::format("vCPU {}", *vcpu)));
  }
  if (p == "qOffsets") return "Text=0;Data=0;Bss=0";
  if (p.starts_with("qSymbol")) return "OK";
  if (p.starts_with("qRcmd,")) {
    auto command = hex_decode(p.substr(6));
    if (!command) return error_reply(kEInvalid);
    std::string text(command->begin(), command->end());
    std::string output = target_.monitor(text, interrupted);
    return output.empty() ? "OK" : hex_encode(std::string_view(output));
  }
  return "";
}

std::string Server::handle_v(std::string_view p, const std::function<bool()>& interrupted) {
  if (p == "vCont?") return "vCont;c;C;s;S";
  if (p.starts_with("vCont;")) {
    // One thread: the first action decides (gdb sends "vCont;s:1" or "vCont;c", maybe with a default after ';').
    auto actions = split(p.substr(6), ';');
    std::string_view action = actions[0];
    if (action.empty()) return error_reply(kEInvalid);
    ResumeRequest request;
    switch (action[0]) {
      case 'c': case 'C': break;
      case 's': case 'S': request.single_step = true; break;
      default: return error_reply(kEInvalid);
    }
    return resume(request, interrupted);
  }
  if (p == "vMustReplyEmpty") return "";
  if (p.starts_with("vKill")) {
    finished_ = true;
    return "OK";
  }
  return "";
}

std::optional<std::string> Server::handle(std::string_view p, const std::function<bool()>& interrupted) {
  if (p.empty()) return "";
  switch (p[0]) {
    case '?': return stop_reply(last_stop_);
    case 'g': return p.size() == 1 ? read_registers() : error_reply(kEInvalid);
    case 'p': {
      auto n = parse_hex_u64(p.substr(1));
      if (!n) return error_reply(kEInvalid);
      auto r = read_register(*n);
      return r ? *r : error_reply(kEInvalid);
    }
    case 'G': case 'P': case 'M': case 'X':
      // Writes would make the replay diverge from the recording; refused, as rr does.
      return error_reply(kERefused);
    case 'm': {
      // Up to the PacketSize announced in qSupported, as gdb asks for: its reply is two hex digits a byte.
      auto range = parse_addr_length(p.substr(1), kMaxPacket / 2);
      if (!range) return error_reply(kEInvalid);
      std::vector<uint8_t> buffer(range->second);
      size_t got = target_.read_virtual(selected_, range->first, buffer);
      if (got == 0 && !buffer.empty()) return error_reply(kEFault);
      return hex_encode(std::span(buffer).first(got));
    }
    case 'H': {
      // Hg picks the thread whose registers and memory gdb reads; Hc the one to resume, which is the whole
      // machine whatever gdb names (one vCPU runs at a time, as the schedule says).
      if (p.size() < 3 || (p[1] != 'g' && p[1] != 'c')) return error_reply(kEInvalid);
      auto vcpu = thread_vcpu(p.substr(2));
      if (!vcpu) return error_reply(kEInvalid);
      if (p[1] == 'g') selected_ = *vcpu;
      return "OK";
    }
    case 'T': return thread_vcpu(p.substr(1)) ? "OK" : error_reply(kEInvalid);  // is the thread alive
    case 'c': case 's': {
      if (p.size() > 1) return error_reply(kEInvalid);  // resuming at another address would diverge
      ResumeRequest request;
      request.single_step = p[0] == 's';
      return resume(request, interrupted);
    }
    case 'b':
      if (p == "bs" || p == "bc") {
        ResumeRequest request;
        request.reverse = true;
        request.single_step = p == "bs";
        return resume(request, interrupted);
      }
      return "";
    case 'Z': case 'z': return breakpoint(p, p[0] == 'Z');
    case 'q': return handle_query(p, interrupted);
    case 'Q':
      if (p == "QStartNoAckMode") {
        no_ack_ = true;
        return "OK";
      }
      return "";
    case 'v': return handle_v(p, interrupted);
    case 'D':
      finished_ = true;
      return "OK";
    case 'k':
      finished_ = true;
      return std::nullopt;
    default: return "";
  }
}

Result<std::pair<int, uint16_t>> listen_tcp(const std::string& host, uint16_t port) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  std::string numeric = host == "localhost" ? "127.0.0.1" : host;
  if (::inet_pton(AF_INET, numeric.c_str(), &addr.sin_addr) != 1) {
    return fail(ErrorKind::kInvalidArgument, "--gdb: '{}' is not an IPv4 address (use 127.0.0.1 or localhost)", host);
  }
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return fail(ErrorKind::kHost, "socket: {}", std::strerror(errno));
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || ::listen(fd, 1) != 0) {
    int e = errno;
    ::close(fd);
    return fail(ErrorKind::kHost, "cannot listen on {}:{}: {}", host, port, std::strerror(e));
  }
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  return std::pair{fd, ntohs(addr.sin_port)};
}

Result<> serve(int fd, Server& server) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  // Whether a packet resumes the target (which may run for long before its reply).
  auto resumes = [](std::string_view p) {
    return p.starts_with("vCont;") || p == "c" || p == "s" || p == "bc" || p == "bs" || p.starts_with("qRcmd,");
  };
  PacketReader reader;
  std::vector<Incoming> items;
  std::string last_reply;
  bool interrupt_pending = false;
  auto send_all = [&](std::string_view bytes) -> bool {
    size_t done = 0;
    while (done < bytes.size()) {
      ssize_t n = ::send(fd, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return false;
      done += size_t(n);
    }
    return true;
  };
  // Polled during long resumes: a 0x03 from gdb interrupts; other bytes are kept for later.
  std::vector<Incoming> deferred;
  auto interrupted = [&]() -> bool {
    if (interrupt_pending) return true;
    pollfd pfd{fd, POLLIN, 0};
    if (::poll(&pfd, 1, 0) <= 0) return false;
    uint8_t buf[512];
    ssize_t n = ::recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
    if (n <= 0) {
      interrupt_pending = true;  // gdb went away: stop what we are doing
      return true;
    }
    std::vector<Incoming> got;
    reader.feed(std::span(buf, size_t(n)), got);
    for (auto& item : got) {
      if (item.kind == Incoming::Kind::kInterrupt) interrupt_pending = true;
      else deferred.push_back(std::move(item));
    }
    return interrupt_pending;
  };
  while (!server.finished()) {
    if (deferred.empty()) {
      uint8_t buf[4096];
      // ACK what gdb sends at once (Linux clears quick-ACK mode now and then): a delayed ACK of gdb's '+' would
      // hold its next packet back for ~40 ms where gdb's Nagle algorithm is on.
      ::setsockopt(fd, IPPROTO_TCP, TCP_QUICKACK, &one, sizeof(one));
      ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return {};  // gdb disconnected
      reader.feed(std::span(buf, size_t(n)), items);
    }
    items.insert(items.begin(), std::make_move_iterator(deferred.begin()), std::make_move_iterator(deferred.end()));
    deferred.clear();
    for (auto& item : items) {
      switch (item.kind) {
        case Incoming::Kind::kAck: break;
        case Incoming::Kind::kNack:
          if (!last_reply.empty() && !send_all(last_reply)) return {};
          break;
        case Incoming::Kind::kInterrupt: {
          // Ctrl-C while stopped: report a stop where we are.
          if (!send_all(frame(server.interrupted_reply()))) return {};
          break;
        }
        case Incoming::Kind::kBadChecksum:
          if (!server.no_ack() && !send_all("-")) return {};
          break;
        case Incoming::Kind::kTooLong:
          last_reply = frame("E01");
          if (!send_all(server.no_ack() ? last_reply : std::string("+").append(last_reply))) return {};
          break;
        case Incoming::Kind::kPacket: {
          // In acknowledgement mode the '+' goes out with the reply in one write (one segment, not two). A resume,
          // which may run long, is acknowledged first, so that gdb does not resend it meanwhile.
          std::string ack = server.no_ack() ? "" : "+";
          if (!ack.empty() && resumes(item.payload)) {
            if (!send_all(ack)) return {};
            ack.clear();
          }
          interrupt_pending = false;
          auto reply = server.handle(item.payload, interrupted);
          interrupt_pending = false;
          if (auto refusal = server.take_refusal(); !refusal.empty()) say("debug: {}", refusal);
          if (reply) {
            last_reply = frame(*reply);
            ack.append(last_reply);
          }
          if (!send_all(ack)) return {};
          break;
        }
      }
      if (server.finished()) break;
    }
    items.clear();
  }
  return {};
}

}  // namespace deja::gdb
