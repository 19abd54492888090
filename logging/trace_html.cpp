// HtmlTimeline: bins and rows gathered in inspect's pass, then one page: the data as JSON, drawn by an inline script.
#include "logging/trace_html.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

namespace deja {
namespace {

// UTF-8 sequence length at p[0], or 0 when the bytes there are not valid UTF-8.
size_t utf8_length(const unsigned char* p, size_t n) {
  const unsigned char c = p[0];
  const size_t len = c < 0x80 ? 1 : (c & 0xe0) == 0xc0 ? 2 : (c & 0xf0) == 0xe0 ? 3 : (c & 0xf8) == 0xf0 ? 4 : 0;
  if (len == 0 || len > n) return 0;
  for (size_t k = 1; k < len; ++k)
    if ((p[k] & 0xc0) != 0x80) return 0;
  return len;
}

// Text in HTML: markup characters escaped, bytes that are not UTF-8 (and control characters) as U+FFFD.
std::string html_text(std::string_view s) {
  std::string out;
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  for (size_t i = 0; i < s.size();) {
    const size_t len = utf8_length(p + i, s.size() - i);
    const unsigned char c = p[i];
    if (len == 0 || (len == 1 && c < 0x20 && c != '\n' && c != '\t') || c == 0x7f) {
      out += "\xef\xbf\xbd";
      i += len ? len : 1;
      continue;
    }
    if (c == '<') out += "&lt;";
    else if (c == '>') out += "&gt;";
    else if (c == '&') out += "&amp;";
    else if (c == '"') out += "&quot;";
    else out.append(s.data() + i, len);
    i += len;
  }
  return out;
}

// A JSON string that is also safe inside <script> (no "</script>", no HTML-significant characters); bytes that are not
// UTF-8 (serial output is arbitrary) become \u00XX.
std::string json_text(std::string_view s) {
  std::string out = "\"";
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  for (size_t i = 0; i < s.size();) {
    const size_t len = utf8_length(p + i, s.size() - i);
    const unsigned char c = p[i];
    if (len > 1) {
      out.append(s.data() + i, len);
      i += len;
      continue;
    }
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      default:
        // Not UTF-8, control characters, and what could end the <script> element: escaped.
        if (len == 0 || c < 0x20 || c >= 0x7f || c == '<' || c == '>' || c == '&') out += fmt::format("\\u{:04x}", c);
        else out += char(c);
    }
    ++i;
  }
  return out + "\"";
}

std::string number(double v) {
  if (v == std::floor(v) && std::fabs(v) < 1e15) return fmt::format("{}", int64_t(v));
  return fmt::format("{:.6g}", v);
}

// The counts a replay keeps: every event but serial output and disk I/O records (replay/engine.cpp, Engine::peek).
bool replay_counts(const trace::Event& e) {
  return e.kind_case() != trace::Event::kSerialOutput && e.kind_case() != trace::Event::kDiskIo;
}

constexpr size_t kMaxConnections = 2000;
constexpr size_t kMaxSerialMarks = 5000;

// The page's style and script: plain CSS and DOM, no library, nothing fetched (the page forbids it itself).
constexpr std::string_view kStyle = R"CSS(
body { font: 13px/1.4 system-ui, sans-serif; margin: 16px; color: #1d2733; background: #fff; }
h1 { font-size: 18px; margin: 0 0 8px; }
table.facts td { padding: 1px 12px 1px 0; vertical-align: top; }
table.facts td:first-child { color: #5b6b7c; }
#chart { margin: 12px 0; border: 1px solid #d4dbe3; border-radius: 4px; padding: 8px; overflow-x: auto; }
#chart text { font: 11px system-ui, sans-serif; fill: #39475a; }
#chart .axis line { stroke: #c2ccd6; }
#chart rect.bar:hover { opacity: 0.6; }
pre#serial { max-height: 280px; overflow: auto; background: #f5f7f9; border: 1px solid #d4dbe3; padding: 8px; }
#events { border-collapse: collapse; width: 100%; }
#events th, #events td { text-align: left; padding: 2px 8px; border-bottom: 1px solid #e6ebf0; }
#events tr.hit { background: #fff4c2; }
#events code { font-size: 12px; }
button.copy { font-size: 11px; }
.kind-divergence td { color: #b3261e; font-weight: bold; }
)CSS";

constexpr std::string_view kScript = R"JS(
(function () {
  "use strict";
  var t0 = performance.now();
  var data = JSON.parse(document.getElementById("deja-data").textContent);
  var svgNs = "http://www.w3.org/2000/svg";
  function el(name, attrs, parent) {
    var e = document.createElementNS(svgNs, name);
    for (var k in attrs) e.setAttribute(k, attrs[k]);
    if (parent) parent.appendChild(e);
    return e;
  }
  // Guest time in the unit the whole trace is best read in.
  var unit = data.end_ns < 2e6 ? [1e3, " us"] : data.end_ns < 2e9 ? [1e6, " ms"] : [1e9, " s"];
  function seconds(ns) {
    var v = ns / unit[0];
    return (v < 10 ? v.toFixed(3) : v < 100 ? v.toFixed(2) : v.toFixed(1)) + unit[1];
  }
  function bytes(n) {
    if (n < 1024) return n + " B";
    if (n < 1048576) return (n / 1024).toFixed(1) + " KiB";
    return (n / 1048576).toFixed(1) + " MiB";
  }
  var end = Math.max(data.end_ns, 1);
  var width = 1100, left = 190, plot = width - left - 20, laneHeight = 46, gap = 10;
  var lanes = data.lanes.filter(function (l) { return l.values.some(function (v) { return v > 0; }); });
  var markerLanes = 2;
  var height = 30 + (lanes.length + markerLanes) * (laneHeight + gap) + 20;
  var svg = el("svg", {width: width, height: height, viewBox: "0 0 " + width + " " + height, role: "img"},
               document.getElementById("chart"));
  function x(ns) { return left + plot * Math.min(ns, end) / end; }
  var axis = el("g", {"class": "axis"}, svg);
  for (var i = 0; i <= 10; ++i) {
    var ns = end * i / 10;
    el("line", {x1: x(ns), x2: x(ns), y1: 20, y2: height - 10}, axis);
    el("text", {x: x(ns), y: 14, "text-anchor": "middle"}, axis).textContent = seconds(ns);
  }
  var y = 30;
  lanes.forEach(function (lane) {
    var max = Math.max.apply(null, lane.values);
    el("text", {x: 4, y: y + laneHeight / 2 + 4}, svg).textContent = lane.name;
    el("text", {x: left - 6, y: y + 10, "text-anchor": "end"}, svg).textContent =
        lane.unit === "bytes" ? bytes(max) : String(max);
    el("line", {x1: left, x2: left + plot, y1: y + laneHeight, y2: y + laneHeight, stroke: "#c2ccd6"}, svg);
    var binWidth = plot * data.bin_ns / end;
    lane.values.forEach(function (v, b) {
      if (v <= 0) return;
      var h = Math.max(1, laneHeight * v / max);
      var r = el("rect", {"class": "bar", x: x(b * data.bin_ns), y: y + laneHeight - h,
                          width: Math.max(1, binWidth - 0.5), height: h, fill: lane.color}, svg);
      el("title", {}, r).textContent = lane.name + ": " + (lane.unit === "bytes" ? bytes(v) : v) + " at " +
          seconds(b * data.bin_ns) + " to " + seconds((b + 1) * data.bin_ns);
      r.addEventListener("click", function () { showRows(b * data.bin_ns, (b + 1) * data.bin_ns); });
    });
    y += laneHeight + gap;
  });
  function markers(name, points, color) {
    el("text", {x: 4, y: y + laneHeight / 2 + 4}, svg).textContent = name;
    points.forEach(function (p) {
      var m = el("line", {x1: x(p.ns), x2: x(p.ns), y1: y + 4, y2: y + laneHeight, stroke: p.color || color,
                          "stroke-width": p.width || 1}, svg);
      el("title", {}, m).textContent = seconds(p.ns) + ": " + p.text;
      m.addEventListener("click", function () { showRows(p.ns, p.ns); });
    });
    y += laneHeight + gap;
  }
  markers("connections opened", data.connections.map(function (c) {
    return {ns: c[0], text: c[1]};
  }), "#8e44ad");
  markers("boot, user space, digests, end", data.rows.filter(function (r) { return r[3] !== "net" && r[3] !== "disk"; })
      .map(function (r) {
        var color = r[3] === "digest" ? "#7f8c8d" : r[3] === "divergence" ? "#b3261e" : "#1d6fb8";
        return {ns: r[2], text: r[4], color: color, width: r[3] === "digest" ? 1 : 2};
      }), "#1d6fb8");
  if (data.divergence) {
    var d = el("line", {x1: x(data.divergence.ns), x2: x(data.divergence.ns), y1: 20, y2: height - 10,
                        stroke: "#b3261e", "stroke-width": 2, "stroke-dasharray": "4 3"}, svg);
    el("title", {}, d).textContent = "replay diverged here: " + data.divergence.text;
  }

  var tbody = document.querySelector("#events tbody");
  var rowsByNs = [];
  data.rows.forEach(function (r) {
    var tr = document.createElement("tr");
    tr.className = "kind-" + r[3];
    var command = "deja query " + data.trace_arg + " --at event:" + r[1] + " --regs";
    [seconds(r[2]), String(r[0]), r[3], r[4]].forEach(function (text) {
      var td = document.createElement("td");
      td.textContent = text;
      tr.appendChild(td);
    });
    var td = document.createElement("td");
    var code = document.createElement("code");
    code.textContent = command;
    var button = document.createElement("button");
    button.className = "copy";
    button.textContent = "copy";
    button.addEventListener("click", function () {
      var range = document.createRange();
      range.selectNodeContents(code);
      var selection = window.getSelection();
      selection.removeAllRanges();
      selection.addRange(range);
      if (navigator.clipboard && window.isSecureContext) navigator.clipboard.writeText(command).catch(function () {});
    });
    td.appendChild(code);
    td.appendChild(document.createTextNode(" "));
    td.appendChild(button);
    tr.appendChild(td);
    tbody.appendChild(tr);
    rowsByNs.push({ns: r[2], tr: tr});
  });
  function showRows(from, to) {
    var first = null;
    rowsByNs.forEach(function (r) {
      var hit = r.ns >= from && r.ns <= to;
      r.tr.classList.toggle("hit", hit);
      if (hit && !first) first = r.tr;
    });
    if (!first) first = (rowsByNs.find(function (r) { return r.ns >= from; }) || {}).tr;
    if (first) first.scrollIntoView({block: "center"});
  }
  document.getElementById("filter").addEventListener("input", function (ev) {
    var q = ev.target.value.toLowerCase();
    rowsByNs.forEach(function (r) { r.tr.hidden = q !== "" && r.tr.textContent.toLowerCase().indexOf(q) < 0; });
  });
  document.getElementById("serial").textContent = data.serial;
  window.dejaRenderMs = performance.now() - t0;
  document.body.setAttribute("data-rendered", "yes");
})();
)JS";

}  // namespace

HtmlTimeline::HtmlTimeline(const trace::Header& header, std::optional<uint64_t> divergence_event)
    : header_(header), divergence_event_(divergence_event) {}

void HtmlTimeline::add_to(const std::string& series, uint64_t ns, double amount) {
  while (ns / bin_ns_ >= kBins) {  // the trace outgrew the axis: halve the resolution
    for (auto& [name, s] : series_) {
      for (size_t b = 0; b < kBins; ++b) s.values[b] = b * 2 + 1 < kBins ? s.values[b * 2] + s.values[b * 2 + 1] : 0;
    }
    bin_ns_ *= 2;
  }
  series_[series].values[ns / bin_ns_] += amount;
}

void HtmlTimeline::add(uint64_t index, const trace::Event& e, const LinuxTraceView& view) {
  const uint64_t ns = view.guest_ns();
  last_ns_ = std::max(last_ns_, ns);
  for (size_t n = view.timeline_entry_count(); entries_seen_ < n; ++entries_seen_) replay_event_at_[index] = replay_events_;
  if (view.first_user_space() && view.first_user_space()->event == index) replay_event_at_[index] = replay_events_;
  if (divergence_event_ && *divergence_event_ == replay_events_ && replay_counts(e) && !divergence_) {
    divergence_ = Row{index, replay_events_, ns, "divergence",
                      fmt::format("a replay diverged at event {} ({})", replay_events_, event_kind_name(e))};
    rows_.push_back(*divergence_);
  }
  const std::string cpu = fmt::format(" (vCPU {})", e.vcpu());
  switch (e.kind_case()) {
    case trace::Event::kAsync: {
      add_to("asynchronous events" + cpu, ns, 1);
      uint64_t in = 0;
      for (const auto& f : e.async().net_frames()) in += f.data().size();
      if (in) add_to("network received", ns, double(in));
      if (!e.async().serial_input().empty()) add_to("serial input", ns, double(e.async().serial_input().size()));
      break;
    }
    case trace::Event::kInterrupt: add_to("interrupts" + cpu, ns, 1); break;
    case trace::Event::kNetTransmit: add_to("network sent", ns, double(e.net_transmit().length())); break;
    case trace::Event::kDiskIo:
      add_to(e.disk_io().write() ? "disk written" : "disk read", ns, double(e.disk_io().length()));
      break;
    case trace::Event::kSerialOutput: {
      const std::string& d = e.serial_output().data();
      add_to("serial output", ns, double(d.size()));
      if (serial_.size() < kMaxSerialBytes) {
        if (serial_marks_.size() < kMaxSerialMarks) serial_marks_.emplace_back(serial_.size(), ns);
        serial_ += d.substr(0, kMaxSerialBytes - serial_.size());
      }
      break;
    }
    case trace::Event::kDigest:
      if (rows_.size() < kMaxRows / 4) {
        rows_.push_back(Row{index, replay_events_, ns, "digest",
                            fmt::format("state digest {}", hex(e.digest().digest()).substr(0, 16))});
      }
      ++digests_;
      break;
    default: break;
  }
  if (replay_counts(e)) ++replay_events_;
}

Result<> HtmlTimeline::write(const Summary& summary, const LinuxTraceView& view, ProductFile& out) const {
  // The rows: the Linux view's timeline (boot, user space, connections, disk I/O, end) and this page's own.
  std::vector<Row> rows = rows_;
  uint64_t dropped = 0;
  for (const TimelineEntry& t : view.timeline()) {
    if (rows.size() >= kMaxRows) {
      ++dropped;
      continue;
    }
    auto it = replay_event_at_.find(t.event);
    rows.push_back(Row{t.event, it == replay_event_at_.end() ? 0 : it->second, t.guest_ns, t.kind, t.text});
  }
  std::stable_sort(rows.begin(), rows.end(), [](const Row& a, const Row& b) { return a.event < b.event; });

  // Lanes in a fixed order, then any other series (a vCPU beyond the first) after them.
  static const std::pair<const char*, const char*> kLaneColors[] = {
      {"asynchronous events", "#2f7ed8"}, {"interrupts", "#0d9488"},    {"disk read", "#16a34a"},
      {"disk written", "#ea580c"},        {"network received", "#7c3aed"}, {"network sent", "#db2777"},
      {"serial output", "#475569"},       {"serial input", "#a16207"}};
  std::string lanes;
  for (const auto& [prefix, color] : kLaneColors) {
    for (const auto& [name, s] : series_) {
      if (!name.starts_with(prefix)) continue;
      const bool in_bytes = !name.starts_with("asynchronous") && !name.starts_with("interrupts");
      std::string values;
      for (double v : s.values) {
        if (!values.empty()) values += ',';
        values += number(v);
      }
      lanes += fmt::format("{}{{\"name\": {}, \"unit\": \"{}\", \"color\": \"{}\", \"values\": [{}]}}",
                           lanes.empty() ? "" : ",\n", json_text(name), in_bytes ? "bytes" : "count", color, values);
    }
  }
  std::string connections;
  size_t shown = 0;
  for (const Connection& c : view.connections()) {
    if (++shown > kMaxConnections) break;
    const bool in = c.opened_by == "remote";
    connections += fmt::format("{}[{}, {}]", connections.empty() ? "" : ",", c.guest_ns,
                               json_text(fmt::format("{} {} -> {} ({}; {} bytes out, {} in)", c.protocol,
                                                     in ? c.remote : c.guest, in ? c.guest : c.remote, c.state(),
                                                     c.bytes_out, c.bytes_in)));
  }
  std::string row_json;
  for (const Row& r : rows) {
    row_json += fmt::format("{}[{},{},{},{},{}]", row_json.empty() ? "" : ",\n", r.event, r.replay_event, r.ns,
                            json_text(r.kind), json_text(r.text));
  }
  // The trace as a shell word for the commands in the table.
  std::string trace_arg = summary.path;
  if (trace_arg.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-./=:") !=
      std::string::npos) {
    std::string quoted = "'";
    for (char c : trace_arg) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
    trace_arg = quoted + "'";
  }

  const trace::MachineConfig& c = header_.config();
  std::string facts;
  auto add_fact = [&facts](const std::string& name, const std::string& value) {
    facts += "<tr><td>" + html_text(name) + "</td><td>" + html_text(value) + "</td></tr>\n";
  };
  add_fact("trace", fmt::format("{} ({} bytes, {})", summary.path, summary.file_size, summary.status));
  add_fact("recorded by", fmt::format("deja {} (build {}), format {}", header_.deja_version(), header_.build_id(),
                                      header_.format_version()));
  add_fact("machine", fmt::format("{}, {} vCPU, {} MiB, CPU model {}, backend {}, {} progress",
                                  c.machine().empty() ? "pc" : c.machine(), c.vcpus() ? c.vcpus() : 1,
                                  c.memory_bytes() >> 20, header_.cpu_model().empty() ? "deja-v1" : header_.cpu_model(),
                                  c.backend(), c.progress_mode()));
  if (header_.has_libvirt_domain()) {
    const auto& d = header_.libvirt_domain();
    add_fact("libvirt", fmt::format("domain {} ({}) from {}", d.name(), d.uuid(), d.source()));
  }
  if (!summary.kernel.empty()) add_fact("kernel", summary.kernel);
  std::string kinds;
  for (const auto& [kind, n] : summary.by_kind) kinds += fmt::format("{}{} {}", kinds.empty() ? "" : ", ", n, kind);
  add_fact("events", fmt::format("{} ({})", summary.events, kinds));
  add_fact("guest time", fmt::format("{:.6f} s", double(last_ns_) / 1e9));
  if (dropped || digests_ > kMaxRows / 4) {
    add_fact("table", fmt::format("the first {} points ({} more left out; `deja inspect --json` lists them all)",
                                  rows.size(), dropped + (digests_ > kMaxRows / 4 ? digests_ - kMaxRows / 4 : 0)));
  }

  std::string serial_marks;
  for (const auto& [offset, ns] : serial_marks_)
    serial_marks += fmt::format("{}[{},{}]", serial_marks.empty() ? "" : ",", offset, ns);
  std::string divergence = "null";
  if (divergence_) {
    divergence = fmt::format("{{\"ns\": {}, \"event\": {}, \"text\": {}}}", divergence_->ns, divergence_->event,
                             json_text(divergence_->text));
  } else if (divergence_event_) {
    divergence = fmt::format("{{\"ns\": {}, \"event\": null, \"text\": {}}}", last_ns_,
                             json_text(fmt::format("event {} is past the end of this trace", *divergence_event_)));
  }

  const std::string escaped_title = html_text("deja: " + summary.path);
  std::string page;
  page += "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n";
  // Nothing is fetched: the page says so to the browser too.
  page += "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'; "
          "script-src 'unsafe-inline'\">\n";
  page += "<title>" + escaped_title + "</title>\n<style>" + std::string(kStyle) + "</style>\n</head>\n<body>\n";
  page += "<h1>" + escaped_title + "</h1>\n<table class=\"facts\">\n" + facts + "</table>\n";
  page += "<div id=\"chart\"></div>\n<h2>Serial output</h2>\n<pre id=\"serial\"></pre>\n";
  page += "<h2>Points in the recording</h2>\n<p>Each row's command replays to the point (event numbers as `deja "
          "inspect --events` counts them; the command's as replay counts them). Click a bar to find its rows.</p>\n"
          "<input id=\"filter\" placeholder=\"filter rows\" size=\"40\">\n<table id=\"events\"><thead><tr><th>guest "
          "time</th><th>event</th><th>kind</th><th>what</th><th>deja query</th></tr></thead><tbody></tbody></table>\n";
  page += "<script type=\"application/json\" id=\"deja-data\">{";
  page += fmt::format("\"trace_arg\": {}, \"end_ns\": {}, \"bin_ns\": {},\n", json_text(trace_arg),
                      std::max<uint64_t>(last_ns_, 1), bin_ns_);
  page += "\"lanes\": [" + lanes + "],\n\"connections\": [" + connections + "],\n\"rows\": [" + row_json + "],\n";
  page += fmt::format("\"serial\": {},\n\"serial_marks\": [{}],\n\"divergence\": {}", json_text(serial_), serial_marks,
                      divergence);
  page += "}</script>\n<script>\n";
  page += std::string(kScript) + "</script>\n</body>\n</html>\n";
  return out.write(std::span(reinterpret_cast<const uint8_t*>(page.data()), page.size()));
}

}  // namespace deja
