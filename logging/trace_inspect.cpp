// inspect_trace: streams a trace (one chunk in memory) into a provenance / duration / counts / serial / timeline view.
#include "logging/trace_inspect.h"

#include <array>
#include <ctime>
#include <map>
#include <optional>

#include <google/protobuf/util/json_util.h>

#include "logging/linux_trace.h"
#include "logging/output_file.h"
#include "logging/pcap_writer.h"
#include "logging/trace_html.h"
#include "logging/trace_reader.h"
#include "core/text.h"

namespace deja {

namespace {

// Valid UTF-8 is kept as it is ("café" stays "café"); a byte that is not part of valid UTF-8 (serial
// output is arbitrary bytes) is escaped as \u00XX, so the JSON stays valid either way.
std::string json_string(std::string_view s) {
  std::string out = "\"";
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  for (size_t i = 0; i < s.size(); ++i) {
    const unsigned char c = p[i];
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c >= 0x80) {
          if (size_t length = utf8_sequence(s, i)) {
            out.append(s.data() + i, length);
            i += length - 1;
            break;
          }
        }
        if (c < 0x20 || c >= 0x7f) out += fmt::format("\\u{:04x}", c);
        else out += static_cast<char>(c);
    }
  }
  out += '"';
  return out;
}

std::string proto_json(const google::protobuf::Message& m) {
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  std::string out;
  if (!google::protobuf::util::MessageToJsonString(m, &out, options).ok()) return "null";
  return out;
}

std::string utc_time(int64_t unix_ns) {
  std::time_t seconds = static_cast<std::time_t>(unix_ns / 1000000000);
  std::tm tm{};
  if (unix_ns < 0 || gmtime_r(&seconds, &tm) == nullptr) return fmt::format("{} ns since the epoch", unix_ns);
  char buffer[64];
  std::strftime(buffer, sizeof buffer, "%Y-%m-%dT%H:%M:%S", &tm);
  return fmt::format("{}.{:09}Z", buffer, unix_ns % 1000000000);
}

// Everything the summary needs, gathered in one streaming pass.
struct Survey {
  std::map<std::string, uint64_t> by_kind;
  uint64_t events = 0;
  uint64_t chunks = 0;
  uint64_t serial_bytes = 0;
  uint64_t entropy_bytes = 0;
  uint64_t pcap_in = 0, pcap_out = 0;  // frames written to the pcap, received and sent
  std::optional<Error> pcap_error;
  std::optional<trace::End> end;
  uint64_t last_digest_instructions = 0;
  uint64_t last_branches = 0;
  bool complete = false;
  bool truncated = false;
  std::string end_description;
  std::optional<Error> error;
  std::optional<trace::Footer> footer;
  uint64_t file_size = 0;
  std::map<uint32_t, uint64_t> events_by_vcpu;  // several vCPUs: the events each made or took
};

struct Duration {
  uint64_t instructions = 0;
  uint64_t branches = 0;
  std::optional<uint64_t> wall_ns;
  std::optional<int32_t> exit_status;
  std::string reason;
  bool lower_bound = false;  // the trace was cut short: these are only what was reached
};

Duration duration_of(const Survey& s) {
  Duration d;
  if (s.footer) {
    d.instructions = s.footer->instructions();
    d.branches = s.footer->branches();
    d.wall_ns = s.footer->wall_ns();
    d.exit_status = s.footer->exit_status();
  }
  if (s.end) {
    if (d.instructions == 0) d.instructions = s.end->instructions();
    if (d.branches == 0) d.branches = s.end->at().branches();
    if (!d.exit_status) d.exit_status = s.end->exit_status();
    d.reason = s.end->reason();
  }
  if (!s.footer && !s.end) {
    d.instructions = s.last_digest_instructions;
    d.branches = s.last_branches;
    d.lower_bound = true;
  }
  return d;
}

std::span<const uint8_t> as_bytes(const std::string& s) {
  return std::span(reinterpret_cast<const uint8_t*>(s.data()), s.size());
}

// One pass over the events: counts, the Linux view, and the frames into `pcap` (when given) at their guest time.
Result<Survey> survey(const std::string& path, LinuxTraceView& view, PcapWriter* pcap, HtmlTimeline* html) {
  auto opened = TraceReader::open(path);
  if (!opened) return std::unexpected(opened.error());
  TraceReader& reader = **opened;
  Survey s;
  while (true) {
    auto event = reader.next();
    if (!event) {
      s.error = event.error();
      break;
    }
    if (!*event) break;
    const trace::Event& e = **event;
    view.add(reader.events_read() - 1, e);
    if (html) html->add(reader.events_read() - 1, e, view);
    ++s.by_kind[event_kind_name(e)];
    ++s.events_by_vcpu[e.vcpu()];
    if (e.has_serial_output()) s.serial_bytes += e.serial_output().data().size();
    if (pcap && !s.pcap_error) {
      Result<> r;
      if (e.has_async()) {
        for (const auto& f : e.async().net_frames()) {
          if (r) r = pcap->add(view.unix_ns(), as_bytes(f.data()));
          ++s.pcap_in;
        }
      }
      if (e.has_net_transmit() && !e.net_transmit().data().empty()) {
        r = pcap->add(view.unix_ns(), as_bytes(e.net_transmit().data()));
        ++s.pcap_out;
      }
      if (!r) s.pcap_error = r.error();
    }
    if (e.has_entropy()) s.entropy_bytes += e.entropy().data().size();
    if (e.has_end()) s.end = e.end();
    if (e.has_digest()) s.last_digest_instructions = e.digest().instructions();
    if (const trace::Coordinate* c = event_coordinate(e)) s.last_branches = std::max(s.last_branches, c->branches());
  }
  s.events = reader.events_read();
  s.chunks = reader.chunks_read();
  s.complete = reader.complete();
  s.truncated = reader.truncated();
  s.end_description = reader.end_description();
  if (reader.footer()) s.footer = *reader.footer();
  s.file_size = reader.file_size();
  return s;
}

// Calls `visit` for each event until the end or an error (already reported by the survey).
template <typename Visit>
Result<> for_each_event(const std::string& path, Visit visit) {
  auto opened = TraceReader::open(path);
  if (!opened) return std::unexpected(opened.error());
  while (true) {
    auto event = (*opened)->next();
    if (!event || !*event) return {};
    visit((*opened)->events_read() - 1, **event);
  }
}

// What inspect says about a Linux trace (or any trace with virtio devices) beyond the header and the counts.
struct GuestStory {
  std::optional<KernelVersion> kernel;  // Linux traces only
  std::vector<TimelineEntry> timeline;
};

GuestStory tell(const trace::Header& h, const LinuxTraceView& view) {
  GuestStory story;
  if (view.is_linux()) {
    KernelVersion k = kernel_version_from_image(*linux_kernel_input(h));
    if (k.version.empty()) {
      if (auto banner = linux_banner_version(view.serial_head())) {
        k = KernelVersion{*banner, "the kernel's banner in the serial output (" + k.source + ")"};
      } else {
        k.source += "; the serial output has no \"Linux version\" banner (a `quiet` boot prints none)";
      }
    }
    story.kernel = std::move(k);
  }
  story.timeline = view.timeline();
  return story;
}

bool has_devices(const trace::Header& h) {
  return h.config().disks_size() > 0 || h.config().nets_size() > 0;
}

std::string guest_time(uint64_t ns) { return fmt::format("+{}.{:06} s", ns / 1'000'000'000, ns % 1'000'000'000 / 1000); }

constexpr size_t kTextListLimit = 40;  // text output lists at most this many connections, and disk / net entries each

void print_text(const std::string& path, const trace::Header& h, const Survey& s, const LinuxTraceView& view,
                const GuestStory& story, std::FILE* out) {
  fmt::print(out, "trace        {} ({} bytes)\n", path, s.file_size);
  if (s.error) fmt::print(out, "status       CORRUPT: {}\n", s.error->message);
  else if (s.complete) fmt::print(out, "status       complete ({} chunks, verified)\n", s.chunks);
  else fmt::print(out, "status       TRUNCATED: {}\n", s.end_description);
  fmt::print(out, "format       version {}\n", h.format_version());
  // Every string from the trace goes through printable() (core/text.h): a trace cannot forge a line or move the
  // cursor. The JSON output escapes them its own way.
  fmt::print(out, "recorded by  deja {} (build {})\n", printable(h.deja_version()), printable(h.build_id()));
  fmt::print(out, "host         {}\n", printable(h.host()));
  fmt::print(out, "started      {}\n", utc_time(h.start_unix_ns()));
  if (h.has_libvirt_domain()) {
    const trace::LibvirtDomain& d = h.libvirt_domain();
    fmt::print(out, "libvirt      domain {} uuid {} from {}, XML sha256={}{}\n", json_string(d.name()),
               d.uuid().empty() ? "(none)" : d.uuid(), d.source(), hex(d.xml_sha256()),
               d.schema_validated() ? " (valid per libvirt's schema)" : "");
  }
  const trace::MachineConfig& c = h.config();
  // (Traces before software_tlb_entries was recorded ran the software CPU with 256.)
  fmt::print(out, "models       cpu {} v{}, devices v{}, software TLB {} entries\n",
             h.cpu_model().empty() ? "deja-v1" : printable(h.cpu_model()), h.cpu_model_version(), h.device_model_version(),
             c.software_tlb_entries() ? c.software_tlb_entries() : 256);
  fmt::print(out, "machine      {} backend={} vcpus={} memory={} MiB progress={} tsc_hz={} rdtsc_trapped={} serial_input={}\n",
             c.machine().empty() ? "pc" : printable(c.machine()), printable(c.backend()), c.vcpus(), c.memory_bytes() >> 20,
             printable(c.progress_mode()), c.tsc_hz(), c.rdtsc_trapped() ? "yes" : "no",
             c.serial_input() ? "yes" : "no");
  if (!c.progress_counter().empty()) fmt::print(out, "progress by  {}\n", printable(c.progress_counter()));
  if (c.has_derived_time()) {
    fmt::print(out, "time         derived between asynchronous events: {} ps an instruction, {} ns a device read (no "
               "clock or RDTSC events)\n", c.derived_time().picoseconds_per_instruction(),
               c.derived_time().nanoseconds_per_device_read());
  }
  if (c.has_schedule()) {
    const trace::Schedule& sc = c.schedule();
    fmt::print(out, "schedule     {} seed {}: slices of {} {} on average, up to {} PAUSEs (docs/smp.md)\n", sc.policy(),
               sc.seed(), sc.quantum(), sc.unit(), sc.pause_limit());
    if (sc.policy() == "pct") {
      fmt::print(out, "             PCT depth {}: {} change points among the first {} scheduling events (docs/explore.md)\n",
                 sc.depth(), sc.depth() ? sc.depth() - 1 : 0, sc.change_window());
      if (sc.lock_events()) fmt::print(out, "             locked instructions are scheduling events\n");
    }
  }
  if (c.has_faults()) {
    const auto& f = c.faults();
    const bool network = f.net_drop_ppm() || f.net_dup_ppm() || f.net_reorder_ppm();
    fmt::print(out, "faults       seed {} (docs/explore.md)\n", f.seed());
    if (f.disk_eio_ppm() || f.disk_torn_ppm() || !network) {
      fmt::print(out, "             disk I/O errors {} ppm, torn writes {} ppm\n", f.disk_eio_ppm(), f.disk_torn_ppm());
    }
    if (network) {
      fmt::print(out, "             network frames lost {} ppm, duplicated {} ppm, reordered {} ppm\n", f.net_drop_ppm(),
                 f.net_dup_ppm(), f.net_reorder_ppm());
    }
  }
  if (c.has_tso()) {
    fmt::print(out, "memory model x86-TSO store buffers, seed {}: {} stores each, drained after {} instructions on "
               "average (docs/explore.md)\n", c.tso().seed(), c.tso().capacity(), c.tso().drain_mean());
  }
  for (const auto& quirk : c.cpu_quirks()) fmt::print(out, "cpu quirk    {}\n", printable(quirk));
  if (!c.cmdline().empty()) fmt::print(out, "cmdline      {}\n", json_string(c.cmdline()));
  for (const auto& arg : c.module_args()) fmt::print(out, "module arg   {}\n", json_string(arg));
  if (!c.device_semantics().empty()) fmt::print(out, "device sem.  {}\n", printable(c.device_semantics()));
  for (const auto& in : h.inputs()) {
    fmt::print(out, "input        {} {} ({} bytes) sha256={}\n", printable(in.role()), printable(in.path()), in.size(),
               hex(in.sha256()));
  }
  for (int i = 0; i < c.disks_size(); ++i) {
    const auto& d = c.disks(i);
    std::string traffic = ": traffic not in this trace (format 3 records it)";
    if (view.disk_io_recorded()) {
      auto it = view.disks().find(uint32_t(i));
      DiskTraffic t = it == view.disks().end() ? DiskTraffic{} : it->second;
      traffic = fmt::format(": read {} bytes ({} reads), wrote {} bytes ({} writes)", t.read_bytes, t.reads,
                            t.written_bytes, t.writes);
    }
    fmt::print(out, "disk         {} {} ({} bytes) {}{}{}{}\n", i, printable(d.path()), d.size(),
               d.hash_block() ? fmt::format("hashed per {}-byte block at first read", d.hash_block())
                              : "sha256=" + hex(d.sha256()),
               d.read_only() ? ", read-only" : "", d.overlay().empty() ? "" : ", overlay " + printable(d.overlay()),
               traffic);
  }
  for (int i = 0; i < c.nets_size(); ++i) {
    const auto& n = c.nets(i);
    std::string forwards;
    for (const auto& f : n.host_forwards()) forwards += " hostfwd=" + printable(f);
    auto it = view.nics().find(uint32_t(i));
    NicTraffic t = it == view.nics().end() ? NicTraffic{} : it->second;
    fmt::print(out, "net          {} {} mac={}{}: received {} frames ({} bytes), sent {} frames ({} bytes)\n", printable(n.mode()),
               i, hex(n.mac()), forwards, t.frames_in, t.bytes_in, t.frames_out, t.bytes_out);
  }
  if (c.rng()) fmt::print(out, "rng          yes: {} bytes of entropy\n", s.entropy_bytes);

  Duration d = duration_of(s);
  fmt::print(out, "duration     {}{} instructions, {} branches", d.lower_bound ? "at least " : "", d.instructions,
             d.branches);
  if (d.wall_ns) fmt::print(out, ", wall time {:.3f} s", static_cast<double>(*d.wall_ns) / 1e9);
  if (d.exit_status) fmt::print(out, ", exit status {}", *d.exit_status);
  if (!d.reason.empty()) fmt::print(out, " ({})", printable(d.reason));
  fmt::print(out, "\n");
  if (s.footer && !s.footer->final_digest().empty())
    fmt::print(out, "final digest {}\n", hex(s.footer->final_digest()));
  fmt::print(out, "events       {} total{}\n", s.events, s.complete ? "" : " (up to where the trace ends)");
  for (const auto& [kind, count] : s.by_kind) fmt::print(out, "  {:<16} {}\n", kind, count);
  if (c.vcpus() > 1) {
    for (uint32_t v = 0; v < c.vcpus(); ++v) {
      fmt::print(out, "  vCPU {:<11} {} events", v, s.events_by_vcpu.contains(v) ? s.events_by_vcpu.at(v) : 0);
      if (s.footer && v < uint32_t(s.footer->vcpus_size())) {
        const trace::VcpuSummary& t = s.footer->vcpus(int(v));
        fmt::print(out, ", {} instructions, {} branches, {} guest exits", t.instructions(), t.branches(),
                   t.guest_exits());
      }
      fmt::print(out, "\n");
    }
  }
  fmt::print(out, "serial       {} bytes of guest output\n", s.serial_bytes);

  if (story.kernel) {
    if (story.kernel->version.empty()) {
      fmt::print(out, "kernel       unknown: {}\n", printable(story.kernel->source));
    } else {
      fmt::print(out, "kernel       {}\n             from {}\n", printable(story.kernel->version),
                 printable(story.kernel->source));
    }
    if (const auto& u = view.first_user_space()) {
      fmt::print(out, "user space   event {} at {}: {}\n", u->event, guest_time(u->guest_ns),
                 printable(view.first_user_space_detail()));
    } else {
      fmt::print(out, "user space   not located: no event at a user address after the kernel ran in its upper half\n");
    }
  }
  if (!story.kernel && !has_devices(h)) return;
  if (c.nets_size() > 0) {
    bool kept = true;
    for (const auto& [nic, t] : view.nics()) kept = kept && t.frames_out_kept == t.frames_out;
    fmt::print(out, "connections  {}{}\n", view.connections().size(),
               kept ? "" : " (seen in the received frames only: this trace does not keep the frames the guest sent)");
    size_t shown = 0;
    for (const Connection& k : view.connections()) {
      if (++shown > kTextListLimit) {
        fmt::print(out, "  ... {} more (--json lists them all)\n", view.connections().size() - kTextListLimit);
        break;
      }
      const bool in = k.opened_by == "remote";
      fmt::print(out, "  {} {} {} {}  {}{} at {} (event {}): {}; {} bytes from the guest, {} bytes to it\n", k.protocol,
                 in ? k.remote : k.guest, in ? "->" : k.opened_by.empty() ? "<->" : "->", in ? k.guest : k.remote,
                 k.opened_by.empty() ? "first seen" : "opened by the ", k.opened_by, guest_time(k.guest_ns), k.event,
                 k.state(), k.bytes_out, k.bytes_in);
    }
  }
  fmt::print(out, "timeline     guest time since boot, event numbers as --events counts them\n");
  std::map<std::string, size_t> shown, left;
  for (const TimelineEntry& t : story.timeline) {
    if ((t.kind == "net" || t.kind == "disk") && ++shown[t.kind] > kTextListLimit) {
      ++left[t.kind];
      continue;
    }
    fmt::print(out, "  {:>16}  {:>10}  {}\n", guest_time(t.guest_ns), t.event, printable(t.text));
  }
  for (const auto& [kind, n] : left)
    fmt::print(out, "  ... and {} more {} entries (--json lists them all)\n", n, kind == "net" ? "network" : "disk");
}

void print_json_extras(const trace::Header& h, const Survey& s, const LinuxTraceView& view, const GuestStory& story,
                       const InspectOptions& options, std::FILE* out) {
  if (story.kernel) {
    fmt::print(out, ",\n  \"linux\": {{\"kernel_version\": {}, \"kernel_version_source\": {}, \"cmdline\": {}, "
                    "\"first_user_space\": ",
               story.kernel->version.empty() ? "null" : json_string(story.kernel->version),
               json_string(story.kernel->source), json_string(h.config().cmdline()));
    if (const auto& u = view.first_user_space()) {
      fmt::print(out, "{{\"event\": {}, \"guest_ns\": {}, \"text\": {}}}}}", u->event, u->guest_ns, json_string(u->text));
    } else {
      fmt::print(out, "null}}");
    }
  } else {
    fmt::print(out, ",\n  \"linux\": null");
  }
  fmt::print(out, ",\n  \"disk_traffic\": ");
  if (!view.disk_io_recorded()) {
    fmt::print(out, "null");
  } else {
    fmt::print(out, "[");
    for (int i = 0; i < h.config().disks_size(); ++i) {
      auto it = view.disks().find(uint32_t(i));
      DiskTraffic t = it == view.disks().end() ? DiskTraffic{} : it->second;
      fmt::print(out, "{}{{\"disk\": {}, \"reads\": {}, \"read_bytes\": {}, \"writes\": {}, \"written_bytes\": {}}}",
                 i ? ", " : "", i, t.reads, t.read_bytes, t.writes, t.written_bytes);
    }
    fmt::print(out, "]");
  }
  fmt::print(out, ",\n  \"nic_traffic\": [");
  for (int i = 0; i < h.config().nets_size(); ++i) {
    auto it = view.nics().find(uint32_t(i));
    NicTraffic t = it == view.nics().end() ? NicTraffic{} : it->second;
    fmt::print(out,
               "{}{{\"nic\": {}, \"frames_received\": {}, \"bytes_received\": {}, \"frames_sent\": {}, "
               "\"bytes_sent\": {}, \"sent_frames_kept\": {}}}",
               i ? ", " : "", i, t.frames_in, t.bytes_in, t.frames_out, t.bytes_out, t.frames_out_kept);
  }
  fmt::print(out, "],\n  \"connections\": [");
  bool first = true;
  for (const Connection& k : view.connections()) {
    fmt::print(out,
               "{}\n    {{\"protocol\": \"{}\", \"guest\": {}, \"remote\": {}, \"opened_by\": {}, \"event\": {}, "
               "\"guest_ns\": {}, \"state\": {}, \"frames_from_guest\": {}, \"frames_to_guest\": {}, "
               "\"bytes_from_guest\": {}, \"bytes_to_guest\": {}}}",
               first ? "" : ",", k.protocol, json_string(k.guest), json_string(k.remote),
               k.opened_by.empty() ? "null" : json_string(k.opened_by), k.event, k.guest_ns, json_string(k.state()),
               k.frames_out, k.frames_in, k.bytes_out, k.bytes_in);
    first = false;
  }
  fmt::print(out, "{}],\n  \"timeline\": [", first ? "" : "\n  ");
  first = true;
  for (const TimelineEntry& t : story.timeline) {
    fmt::print(out, "{}\n    {{\"event\": {}, \"guest_ns\": {}, \"kind\": \"{}\", \"text\": {}}}", first ? "" : ",",
               t.event, t.guest_ns, t.kind, json_string(t.text));
    first = false;
  }
  fmt::print(out, "\n  ]");
  if (!options.pcap.empty()) {
    fmt::print(out, ",\n  \"pcap\": {{\"path\": {}, \"frames_received\": {}, \"frames_sent\": {}, \"error\": {}}}",
               json_string(options.pcap), s.pcap_in, s.pcap_out,
               s.pcap_error ? json_string(s.pcap_error->message) : "null");
  }
}

}  // namespace

Result<> inspect_trace(const std::string& path, const InspectOptions& options, std::FILE* out) {
  if (!options.pcap.empty() || !options.html.empty()) {
    OutputPlan files;  // the one output rule (logging/output_file.h)
    files.add_input("the trace", path);
    files.add_output("the packet capture", options.pcap, OutputKind::kProduct);
    files.add_output("the HTML timeline", options.html, OutputKind::kProduct);
    if (auto ok = files.check(); !ok) return ok;
  }
  auto opened = TraceReader::open(path);
  if (!opened) return std::unexpected(opened.error());
  const trace::Header& h = (*opened)->header();
  LinuxTraceView view(h);
  std::unique_ptr<PcapWriter> pcap;
  if (!options.pcap.empty()) {
    auto created = PcapWriter::create(options.pcap);
    if (!created) return std::unexpected(created.error());
    pcap = std::move(*created);
  }
  // Created before the survey, so that a path that cannot be written is said at once.
  std::unique_ptr<ProductFile> html_file;
  std::optional<HtmlTimeline> html;
  if (!options.html.empty()) {
    auto created = ProductFile::create_replacing(options.html, "HTML timeline", ProductFile::Unfinished::kRemove);
    if (!created) return std::unexpected(created.error());
    html_file = std::move(*created);
    html.emplace(h, options.divergence_event);
  }
  auto surveyed = survey(path, view, pcap.get(), html ? &*html : nullptr);
  if (!surveyed) return std::unexpected(surveyed.error());
  Survey& s = *surveyed;
  if (pcap && !s.pcap_error) {
    if (auto r = pcap->finish(); !r) s.pcap_error = r.error();
  }
  const GuestStory story = tell(h, view);
  if (html) {
    HtmlTimeline::Summary summary{path, s.error ? "corrupt: " + s.error->message
                                        : s.complete ? std::string("complete")
                                                     : "truncated: " + s.end_description,
                                  s.events, s.file_size, s.by_kind, story.kernel ? story.kernel->version : ""};
    // The page of a damaged trace shows it up to the damage, as the text does.
    if (auto r = html->write(summary, view, *html_file); !r) return r;
    if (auto r = html_file->commit(); !r) return r;
  }

  if (!options.json) {
    print_text(path, h, s, view, story, out);
    if (pcap) {
      if (s.pcap_error) {
        fmt::print(out, "pcap         not written: {}\n", s.pcap_error->message);
      } else {
        uint64_t sent = 0, kept = 0;
        for (const auto& [nic, t] : view.nics()) {
          sent += t.frames_out;
          kept += t.frames_out_kept;
        }
        fmt::print(out, "pcap         {}: {} frames received and {} sent{}{}\n", options.pcap, s.pcap_in, s.pcap_out,
                   kept < sent ? fmt::format(" ({} sent frames are not in this trace, which keeps only their length "
                                             "and hash)", sent - kept)
                               : "",
                   s.complete ? "" : ", up to where the trace ends");
      }
    }
    if (options.serial) {
      fmt::print(out, "--- serial output ({} bytes) ---\n", s.serial_bytes);
      // The guest's bytes as lines: its control characters (an escape sequence, a lone \r) are shown, not obeyed.
      // A UTF-8 sequence or a \r\n split between two events is held back until it is whole.
      std::string pending;
      auto r = for_each_event(path, [&](uint64_t, const trace::Event& e) {
        if (!e.has_serial_output()) return;
        pending += e.serial_output().data();
        size_t keep = !pending.empty() && pending.back() == '\r' ? 1 : 0;
        for (size_t back = 1; keep == 0 && back <= std::min<size_t>(3, pending.size()); ++back) {
          const auto c = static_cast<uint8_t>(pending[pending.size() - back]);
          if ((c & 0xc0) == 0x80) continue;  // a continuation byte: look further back for its lead
          const size_t need = (c & 0xe0) == 0xc0 ? 2 : (c & 0xf0) == 0xe0 ? 3 : (c & 0xf8) == 0xf0 ? 4 : 1;
          if (need > back) keep = back;
          break;
        }
        fmt::print(out, "{}", printable_lines(std::string_view(pending).substr(0, pending.size() - keep)));
        pending.erase(0, pending.size() - keep);
      });
      fmt::print(out, "{}", printable_lines(pending));
      if (!r) return r;
      fmt::print(out, "\n--- end of serial output{} ---\n", s.complete ? "" : " (trace ends early)");
    }
    if (options.events) {
      fmt::print(out, "timeline:\n");
      auto r = for_each_event(path, [&](uint64_t index, const trace::Event& e) {
        fmt::print(out, "{:>10} {}\n", index, describe_event(e));
      });
      if (!r) return r;
      fmt::print(out, "{:>10} {}\n", "--", s.error ? s.error->message : s.end_description);
    }
  } else {
    Duration d = duration_of(s);
    fmt::print(out, "{{\n  \"path\": {},\n  \"size\": {},\n", json_string(path), s.file_size);
    fmt::print(out, "  \"status\": \"{}\",\n  \"end\": {},\n",
               s.error ? "corrupt" : s.complete ? "complete" : "truncated",
               json_string(s.error ? s.error->message : s.end_description));
    fmt::print(out, "  \"header\": {},\n", proto_json(h));
    fmt::print(out, "  \"inputs\": [");
    for (int i = 0; i < h.inputs_size(); ++i) {
      const auto& in = h.inputs(i);
      fmt::print(out, "{}{{\"role\": {}, \"path\": {}, \"size\": {}, \"sha256\": \"{}\"}}", i ? ", " : "",
                 json_string(in.role()), json_string(in.path()), in.size(), hex(in.sha256()));
    }
    fmt::print(out, "],\n  \"footer\": {},\n", s.footer ? proto_json(*s.footer) : "null");
    fmt::print(out, "  \"duration\": {{\"instructions\": {}, \"branches\": {}, \"lower_bound\": {}", d.instructions,
               d.branches, d.lower_bound);
    if (d.wall_ns) fmt::print(out, ", \"wall_ns\": {}", *d.wall_ns);
    if (d.exit_status) fmt::print(out, ", \"exit_status\": {}", *d.exit_status);
    fmt::print(out, ", \"reason\": {}}},\n", json_string(d.reason));
    fmt::print(out, "  \"chunks\": {},\n  \"total_events\": {},\n  \"events_by_kind\": {{", s.chunks, s.events);
    bool first = true;
    for (const auto& [kind, count] : s.by_kind) {
      fmt::print(out, "{}{}: {}", first ? "" : ", ", json_string(kind), count);
      first = false;
    }
    fmt::print(out, "}},\n  \"serial_bytes\": {}", s.serial_bytes);
    print_json_extras(h, s, view, story, options, out);
    if (options.serial) {
      fmt::print(out, ",\n  \"serial\": \"");
      auto r = for_each_event(path, [&](uint64_t, const trace::Event& e) {
        if (!e.has_serial_output()) return;
        std::string quoted = json_string(e.serial_output().data());
        std::fwrite(quoted.data() + 1, 1, quoted.size() - 2, out);  // drop the quotes: pieces are concatenated
      });
      if (!r) return r;
      fmt::print(out, "\"");
    }
    if (options.events) {
      fmt::print(out, ",\n  \"events\": [");
      auto r = for_each_event(path, [&](uint64_t index, const trace::Event& e) {
        fmt::print(out, "{}\n    {{\"index\": {}, \"vcpu\": {}, \"kind\": \"{}\", \"event\": {}}}", index ? "," : "",
                   index, e.vcpu(), event_kind_name(e), proto_json(e));
      });
      if (!r) return r;
      fmt::print(out, "\n  ]");
    }
    fmt::print(out, "\n}}\n");
  }
  if (s.error) return std::unexpected(*s.error);
  if (s.pcap_error) return std::unexpected(*s.pcap_error);
  return {};
}

}  // namespace deja
