// audit_trace: verify_trace, one streaming pass (LinuxTraceView, serial sessions) and the custody log, as one page.
#include "logging/trace_audit.h"

#include <nlohmann/json.hpp>

#include "logging/custody.h"
#include "logging/linux_trace.h"
#include "logging/trace_reader.h"

namespace deja {

namespace {

using Json = nlohmann::ordered_json;

// A serial session: input that arrived with less than kSessionGap of guest time between deliveries.
constexpr uint64_t kSessionGapNs = 2'000'000'000;
constexpr size_t kListLimit = 40;     // text lists at most this many entries of a kind (--json has them all)
constexpr size_t kShownInput = 200;   // bytes of a session's input shown

struct SerialSession {
  uint64_t first_event = 0, first_ns = 0, last_ns = 0, bytes = 0, deliveries = 0;
  std::string head;  // the first kShownInput bytes typed
};

struct Pass {
  std::vector<SerialSession> sessions;
  uint64_t serial_out = 0;
  std::string error;  // where the pass stopped early, "" at a clean end
};

Pass read_through(const std::string& path, LinuxTraceView& view) {
  Pass p;
  auto reader = TraceReader::open(path);
  if (!reader) return Pass{{}, 0, reader.error().message};
  while (true) {
    auto event = (*reader)->next();
    if (!event) {
      p.error = event.error().message;
      break;
    }
    if (!*event) break;
    const trace::Event& e = **event;
    const uint64_t index = (*reader)->events_read() - 1;
    view.add(index, e);
    if (e.has_serial_output()) p.serial_out += e.serial_output().data().size();
    if (e.has_async() && !e.async().serial_input().empty()) {
      const std::string& in = e.async().serial_input();
      if (p.sessions.empty() || view.guest_ns() - p.sessions.back().last_ns > kSessionGapNs)
        p.sessions.push_back(SerialSession{index, view.guest_ns(), view.guest_ns(), 0, 0, {}});
      SerialSession& s = p.sessions.back();
      s.last_ns = view.guest_ns();
      s.bytes += in.size();
      ++s.deliveries;
      if (s.head.size() < kShownInput) s.head += in.substr(0, kShownInput - s.head.size());
    }
  }
  return p;
}

// A trace's (or the user's) text, quoted with every control character and invalid UTF-8 escaped: what the trace
// says never acts on the terminal.
std::string shown(const std::string& s) {
  return Json(s).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string seconds(uint64_t ns) { return fmt::format("+{}.{:03} s", ns / 1'000'000'000, ns % 1'000'000'000 / 1'000'000); }

const char* check_word(CheckStatus s) {
  return s == CheckStatus::kPassed ? "ok" : s == CheckStatus::kFailed ? "FAILED" : "not run";
}

}  // namespace

Result<> audit_trace(const std::string& path, const VerifyOptions& options, bool json, std::FILE* out, bool& failed) {
  auto opened = TraceReader::open(path);
  if (!opened) return std::unexpected(opened.error());
  const trace::Header h = (*opened)->header();
  auto index = (*opened)->read_index();
  opened->reset();

  VerifyReport report = verify_trace(path, options);
  LinuxTraceView view(h);
  Pass pass = read_through(path, view);
  CustodyReport custody = check_custody(path, options.keys);
  failed = !report.ok || !custody.first_problem.empty();

  std::optional<KernelVersion> kernel;
  if (const trace::InputFile* k = linux_kernel_input(h)) {
    kernel = kernel_version_from_image(*k);
    if (kernel->version.empty()) {
      if (auto banner = linux_banner_version(view.serial_head())) kernel = KernelVersion{*banner, "the serial output"};
    }
  }
  const trace::MachineConfig& c = h.config();
  Json j;
  j["trace"] = path;
  j["verdict"] = report.summary;
  j["verified"] = report.ok && report.authentication == Authentication::kTrusted;
  Json checks = Json::array();
  for (const CheckResult& check : report.checks)
    checks.push_back({{"check", check.name}, {"status", check_word(check.status)}, {"detail", check.detail}});
  j["checks"] = checks;

  Json inputs = Json::array();
  for (const auto& in : h.inputs())
    inputs.push_back({{"role", in.role()}, {"path", in.path()}, {"size", in.size()}, {"sha256", hex(in.sha256())}});
  for (const auto& d : c.disks())
    inputs.push_back({{"role", "disk"}, {"path", d.path()}, {"size", d.size()},
                      {"sha256", d.sha256().empty() ? std::string("(hashed per block as read)") : hex(d.sha256())}});
  Json devices = Json::array();
  for (int i = 0; i < c.disks_size(); ++i) devices.push_back(fmt::format("virtio-blk disk {}{}", i, c.disks(i).read_only() ? " (read-only)" : ""));
  for (int i = 0; i < c.nets_size(); ++i) devices.push_back(fmt::format("virtio-net NIC {} (user network)", i));
  if (c.rng()) devices.push_back("virtio-rng");
  j["recorded"] = {{"inputs", inputs},
                   {"kernel_version", kernel && !kernel->version.empty() ? Json(kernel->version) : Json(nullptr)},
                   {"cmdline", c.cmdline()},
                   {"machine", c.machine().empty() ? "pc" : c.machine()},
                   {"cpu_model", h.cpu_model().empty() ? "deja-v1" : h.cpu_model()},
                   {"memory_bytes", c.memory_bytes()},
                   {"backend", c.backend()},
                   {"devices", devices}};
  const uint64_t wall_ns = index ? index->wall_ns() : 0;
  Json signer = report.authentication == Authentication::kUnsigned ? Json(nullptr) : Json(report.signer);
  j["provenance"] = {{"host", h.host()},
                     {"started_at", rfc3339_utc(h.start_unix_ns())},
                     {"ended_at", index ? Json(rfc3339_utc(h.start_unix_ns() + int64_t(wall_ns))) : Json(nullptr)},
                     {"recorder", fmt::format("deja {} (build {})", h.deja_version(), h.build_id())},
                     {"signer", signer},
                     {"signer_trusted", report.authentication == Authentication::kTrusted},
                     {"timestamp", report.timestamp ? Json{{"time", report.timestamp->time},
                                                           {"authority", report.timestamp->authority},
                                                           {"authority_checked", report.timestamp->authority_checked}}
                                                    : Json(nullptr)}};
  Json records = Json::array();
  for (const CustodyRecord& r : custody.records)
    records.push_back({{"sequence", r.sequence}, {"time", r.time}, {"by", r.by}, {"action", r.action},
                       {"signer", r.signer}, {"problem", r.problem.empty() ? Json(nullptr) : Json(r.problem)}});
  j["custody"] = {{"records", records},
                  {"problem", custody.first_problem.empty() ? Json(nullptr) : Json(custody.first_problem)}};

  Json connections = Json::array();
  for (const Connection& k : view.connections())
    connections.push_back({{"protocol", k.protocol}, {"guest", k.guest}, {"remote", k.remote},
                           {"opened_by", k.opened_by}, {"event", k.event}, {"guest_ns", k.guest_ns},
                           {"state", k.state()}, {"bytes_from_guest", k.bytes_out}, {"bytes_to_guest", k.bytes_in}});
  Json writes = Json::array();
  for (const TimelineEntry& t : view.timeline())
    if (t.kind == "disk")  // the timeline's disk entries are the writes
      writes.push_back({{"event", t.event}, {"guest_ns", t.guest_ns}, {"text", t.text}});
  Json sessions = Json::array();
  for (const SerialSession& s : pass.sessions)
    sessions.push_back({{"first_event", s.first_event}, {"from_guest_ns", s.first_ns}, {"to_guest_ns", s.last_ns},
                        {"bytes_in", s.bytes}, {"deliveries", s.deliveries}, {"input_head", s.head}});
  j["boundary"] = {{"connections", connections},
                   {"disk_writes", writes},
                   {"serial_sessions", sessions},
                   {"serial_output_bytes", pass.serial_out},
                   {"read_error", pass.error.empty() ? Json(nullptr) : Json(pass.error)}};

  if (json) {
    fmt::print(out, "{}\n", j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace));
    return {};
  }

  fmt::print(out, "AUDIT of {}\n", shown(path));
  fmt::print(out, "verdict      {}\n", report.summary);
  int n = 0;
  for (const CheckResult& check : report.checks)
    fmt::print(out, "  {} {:<11} {:<7} {}\n", ++n, check.name, check_word(check.status), check.detail);

  fmt::print(out, "\nWHAT WAS RECORDED\n");
  for (const auto& in : j["recorded"]["inputs"])
    fmt::print(out, "  {:<8} {} ({} bytes) sha256 {}\n", in["role"].get<std::string>(), shown(in["path"].get<std::string>()),
               in["size"].get<uint64_t>(), in["sha256"].get<std::string>());
  if (kernel) fmt::print(out, "  kernel   {}\n", kernel->version.empty() ? "version unknown (" + kernel->source + ")" : shown(kernel->version));
  fmt::print(out, "  cmdline  {}\n", shown(c.cmdline()));
  fmt::print(out, "  machine  {}, CPU model {} v{}, device model v{}, {} MiB, {} backend\n",
             c.machine().empty() ? "pc" : c.machine(), h.cpu_model().empty() ? "deja-v1" : h.cpu_model(),
             h.cpu_model_version(), h.device_model_version(), c.memory_bytes() >> 20, c.backend());
  std::string device_list;
  for (const auto& d : devices) device_list += (device_list.empty() ? "" : ", ") + d.get<std::string>();
  fmt::print(out, "  devices  {}\n", device_list.empty() ? "none beyond the PC's own (serial, PIT, PIC, RTC)" : device_list);

  fmt::print(out, "\nWHERE, WHEN AND BY WHOM\n");
  fmt::print(out, "  host     {}\n", shown(h.host()));
  fmt::print(out, "  started  {}\n", rfc3339_utc(h.start_unix_ns()));
  if (index) fmt::print(out, "  ended    {} ({:.3f} s of wall time)\n", rfc3339_utc(h.start_unix_ns() + int64_t(wall_ns)), wall_ns / 1e9);
  else fmt::print(out, "  ended    unknown: the trace has no footer\n");
  fmt::print(out, "  recorder deja {} (build {})\n", shown(h.deja_version()), shown(h.build_id()));
  fmt::print(out, "  signer   {}\n",
             report.authentication == Authentication::kTrusted    ? report.signer + " (a trusted key)"
             : report.authentication == Authentication::kUntrusted ? report.signer + " (NOT checked against a trusted key: give --key or --keyring)"
                                                                   : std::string("none: UNSIGNED"));
  if (report.timestamp)
    fmt::print(out, "  time     time-stamped {} by {}{}\n", report.timestamp->time, shown(report.timestamp->authority),
               report.timestamp->authority_checked ? "" : " (authority not checked)");
  if (!custody.exists) {
    fmt::print(out, "  custody  no records ({})\n", shown(custody_path(path)));
  } else {
    fmt::print(out, "  custody  {} record(s){}\n", custody.records.size(),
               custody.first_problem.empty() ? "" : ": " + custody.first_problem);
    for (const CustodyRecord& r : custody.records)
      fmt::print(out, "    {:>3} {} {}: {} [{}]\n", r.sequence, r.time, shown(r.by), shown(r.action), r.signer);
  }

  fmt::print(out, "\nWHAT CROSSED THE BOUNDARY{}\n",
             pass.error.empty() ? "" : " (up to where the trace could be read: " + pass.error + ")");
  fmt::print(out, "  connections  {}\n", view.connections().size());
  for (size_t i = 0; i < view.connections().size() && i < kListLimit; ++i) {
    const Connection& k = view.connections()[i];
    fmt::print(out, "    {} {} {} {} at {} (event {}): {}; {} bytes out, {} bytes in\n", k.protocol, shown(k.guest),
               k.opened_by == "remote" ? "<-" : "->", shown(k.remote), seconds(k.guest_ns), k.event, k.state(),
               k.bytes_out, k.bytes_in);
  }
  fmt::print(out, "  disk writes  {}{}\n", writes.size(), view.disk_io_recorded() ? "" : " (not in this trace's format)");
  for (size_t i = 0; i < writes.size() && i < kListLimit; ++i)
    fmt::print(out, "    {} (event {}): {}\n", seconds(writes[i]["guest_ns"].get<uint64_t>()), writes[i]["event"].get<uint64_t>(),
               shown(writes[i]["text"].get<std::string>()));
  fmt::print(out, "  serial       {} session(s) of input, {} bytes of output\n", pass.sessions.size(), pass.serial_out);
  for (size_t i = 0; i < pass.sessions.size() && i < kListLimit; ++i) {
    const SerialSession& s = pass.sessions[i];
    fmt::print(out, "    {} to {} (from event {}): {} bytes in {} deliveries: {}{}\n", seconds(s.first_ns),
               seconds(s.last_ns), s.first_event, s.bytes, s.deliveries, shown(s.head),
               s.bytes > s.head.size() ? "..." : "");
  }
  if (view.connections().size() > kListLimit || writes.size() > kListLimit || pass.sessions.size() > kListLimit)
    fmt::print(out, "  (lists cut at {} entries; --json has them all)\n", kListLimit);
  return {};
}

}  // namespace deja
