// LinuxTraceView: the kernel's version, user space by the address split, TCP/UDP flows in the frames, disk I/O.
#include "logging/linux_trace.h"

#include <arpa/inet.h>

#include <algorithm>
#include <cstring>

#include "boot/bzimage.h"
#include "boot/elf.h"
#include "boot/kernel_decompress.h"
#include "boot/loader.h"

namespace deja {

namespace {

// x86-64 Linux maps itself in the upper half of the address space and user space in the lower half.
constexpr uint64_t kKernelHalf = 0xffff800000000000ull;
constexpr uint64_t kUserEnd = 0x0000800000000000ull;
constexpr size_t kSerialHead = 64 * 1024;
constexpr uint64_t kMaxKernelBytes = 1ull << 30;
constexpr std::string_view kBanner = "Linux version ";

uint16_t be16(const uint8_t* p) { return uint16_t(p[0] << 8 | p[1]); }

std::string endpoint(bool v6, const uint8_t* address, uint16_t port) {
  char text[INET6_ADDRSTRLEN] = {};
  inet_ntop(v6 ? AF_INET6 : AF_INET, address, text, sizeof text);
  return v6 ? fmt::format("[{}]:{}", text, port) : fmt::format("{}:{}", text, port);
}

// An IPv4 or IPv6 TCP/UDP packet in an Ethernet frame (no VLAN tags, no IPv6 extension headers, first fragments).
struct Packet {
  bool tcp = false;
  std::string source, destination;
  uint8_t flags = 0;  // TCP
  uint64_t payload = 0;
};

std::optional<Packet> parse_frame(std::span<const uint8_t> f) {
  if (f.size() < 14) return std::nullopt;
  const uint16_t type = be16(&f[12]);
  const uint8_t* ip = f.data() + 14;
  const size_t room = f.size() - 14;
  bool v6 = false;
  uint8_t protocol = 0;
  size_t header = 0, total = 0;
  const uint8_t *source = nullptr, *destination = nullptr;
  if (type == 0x0800) {
    if (room < 20 || ip[0] >> 4 != 4) return std::nullopt;
    header = size_t(ip[0] & 0xf) * 4;
    total = be16(ip + 2);
    if (header < 20 || total < header || total > room || (be16(ip + 6) & 0x1fff) != 0) return std::nullopt;
    protocol = ip[9];
    source = ip + 12;
    destination = ip + 16;
  } else if (type == 0x86dd) {
    if (room < 40 || ip[0] >> 4 != 6) return std::nullopt;
    v6 = true;
    header = 40;
    total = 40 + size_t(be16(ip + 4));
    if (total > room) return std::nullopt;
    protocol = ip[6];
    source = ip + 8;
    destination = ip + 24;
  } else {
    return std::nullopt;
  }
  const uint8_t* l4 = ip + header;
  const size_t l4_bytes = total - header;
  Packet p;
  if (protocol == 6) {
    if (l4_bytes < 20 || size_t(l4[12] >> 4) * 4 < 20 || size_t(l4[12] >> 4) * 4 > l4_bytes) return std::nullopt;
    p.tcp = true;
    p.flags = l4[13];
    p.payload = l4_bytes - size_t(l4[12] >> 4) * 4;
  } else if (protocol == 17) {
    if (l4_bytes < 8) return std::nullopt;
    p.payload = l4_bytes - 8;
  } else {
    return std::nullopt;
  }
  p.source = endpoint(v6, source, be16(l4));
  p.destination = endpoint(v6, destination, be16(l4 + 2));
  return p;
}

}  // namespace

std::string describe_frame(std::span<const uint8_t> frame) {
  if (auto p = parse_frame(frame)) {
    return fmt::format("{} {} > {}, {} bytes of data", p->tcp ? "tcp" : "udp", p->source, p->destination, p->payload);
  }
  const uint16_t type = frame.size() >= 14 ? be16(&frame[12]) : 0;
  if (type == 0x0806) return "arp";
  if (type == 0x0800 && frame.size() >= 34 && frame[23] == 1) {
    char from[INET_ADDRSTRLEN] = {}, to[INET_ADDRSTRLEN] = {};
    inet_ntop(AF_INET, &frame[26], from, sizeof from);
    inet_ntop(AF_INET, &frame[30], to, sizeof to);
    return fmt::format("icmp {} > {}", from, to);
  }
  return fmt::format("{} bytes, ethertype {:#06x}", frame.size(), type);
}

namespace {

std::string sha_of(std::span<const uint8_t> bytes) {
  const Sha256 sha = sha256_bytes(bytes);
  return std::string(reinterpret_cast<const char*>(sha.data()), sha.size());
}

std::string bytes_text(uint64_t n) {
  if (n < 10 * 1024) return fmt::format("{} bytes", n);
  if (n < 10 * 1024 * 1024) return fmt::format("{} bytes ({:.1f} KiB)", n, double(n) / 1024);
  return fmt::format("{} bytes ({:.1f} MiB)", n, double(n) / (1024 * 1024));
}

}  // namespace

const trace::InputFile* linux_kernel_input(const trace::Header& header) {
  for (const auto& in : header.inputs())
    if (in.role() == "kernel") return &in;
  return nullptr;
}

std::optional<std::string> linux_banner_version(std::string_view text) {
  for (size_t at = text.find(kBanner); at != std::string_view::npos; at = text.find(kBanner, at + 1)) {
    const size_t start = at + kBanner.size();
    if (start >= text.size() || text[start] < '0' || text[start] > '9') continue;  // a format string, not the banner
    size_t end = start;
    while (end < text.size() && end - start < 512 && text[end] >= 0x20 && text[end] < 0x7f) ++end;
    return std::string(text.substr(start, end - start));
  }
  return std::nullopt;
}

KernelVersion kernel_version_from_image(const trace::InputFile& kernel) {
  const std::string& path = kernel.path();
  auto bytes = read_boot_file(path, "Linux kernel", kMaxKernelBytes);
  if (!bytes) return {"", fmt::format("not from the kernel image: {}", bytes.error().message)};
  if (sha_of(*bytes) != kernel.sha256()) {
    return {"", fmt::format("not from the kernel image: {} is not the recorded one (its SHA-256 differs)", path)};
  }
  auto banner = [](std::span<const uint8_t> b) {
    return linux_banner_version(std::string_view(reinterpret_cast<const char*>(b.data()), b.size()));
  };
  if (has_elf_magic(*bytes)) {
    if (auto v = banner(*bytes)) return {*v, fmt::format("the \"Linux version\" banner in the kernel image {}", path)};
    return {"", fmt::format("not found in the kernel image {} (an ELF with no \"Linux version\" banner)", path)};
  }
  auto image = parse_bzimage(*bytes, path);
  if (!image) return {"", fmt::format("not from the kernel image: {}", image.error().message)};
  if (!image->kernel_version.empty()) {
    return {image->kernel_version, fmt::format("the bzImage setup header of the kernel image {}", path)};
  }
  auto vmlinux = decompress_kernel_payload(image->payload, path, kMaxKernelBytes);
  if (!vmlinux) return {"", fmt::format("not from the kernel image: {}", vmlinux.error().message)};
  if (auto v = banner(*vmlinux))
    return {*v, fmt::format("the \"Linux version\" banner in the vmlinux inside the kernel image {}", path)};
  return {"", fmt::format("not found in the kernel image {} (no version in its setup header or its vmlinux)", path)};
}

std::string Connection::state() const {
  if (protocol != "tcp") return "datagrams";
  if (refused) return "refused";
  std::string s = established ? "established" : opened_by.empty() ? "already open" : "not answered";
  if (reset) s += ", reset";
  if (closed) s += ", closed (FIN)";
  return s;
}

LinuxTraceView::LinuxTraceView(const trace::Header& header)
    : format_version_(header.format_version()),
      start_unix_ns_(header.start_unix_ns()),
      tsc_hz_(header.config().tsc_hz()) {
  const trace::MachineConfig& c = header.config();
  for (const auto& d : c.disks()) disk_names_.push_back(d.path());
  std::string what;
  if (const trace::InputFile* kernel = linux_kernel_input(header)) {
    linux_ = true;
    what = fmt::format("Linux kernel {}{}", kernel->path(),
                       c.image_format().empty() ? "" : fmt::format(" entered through {}", c.image_format()));
  } else {
    for (const auto& in : header.inputs())
      if (in.role() == "image") what = fmt::format("image {}", in.path());
  }
  entries_.push_back(TimelineEntry{0, 0, "boot",
                                   fmt::format("boot: {}, {} MiB of RAM, {} backend", what.empty() ? "the guest" : what,
                                               c.memory_bytes() >> 20, c.backend())});
}

void LinuxTraceView::see_rip(uint64_t index, uint64_t rip, const char* where) {
  if (rip == 0 || user_ || !linux_) return;
  if (rip >= kKernelHalf) {
    kernel_half_seen_ = true;
  } else if (kernel_half_seen_ && rip < kUserEnd) {
    user_detail_ = fmt::format("{} at rip {:#x}, the first event at a user address (the first user instruction ran "
                               "at or before it)",
                               where, rip);
    user_ = TimelineEntry{index, guest_ns_, "user", "user space: " + user_detail_};
  }
}

void LinuxTraceView::see_frame(uint64_t index, std::span<const uint8_t> frame, bool from_guest) {
  auto p = parse_frame(frame);
  if (!p) return;
  const std::string& guest = from_guest ? p->source : p->destination;
  const std::string& remote = from_guest ? p->destination : p->source;
  const std::string protocol = p->tcp ? "tcp" : "udp";
  const std::string key = protocol + " " + guest + " " + remote;
  const bool syn = p->flags & 0x02, ack = p->flags & 0x10, rst = p->flags & 0x04, fin = p->flags & 0x01;
  auto it = open_.find(key);
  if (it != open_.end() && p->tcp && syn && !ack) {
    const Connection& old = connections_[it->second];
    if (old.refused || old.reset || old.closed) it = open_.end();  // the port used again for a new connection
  }
  if (it == open_.end()) {
    Connection c;
    c.protocol = protocol;
    c.guest = guest;
    c.remote = remote;
    c.event = index;
    c.guest_ns = guest_ns_;
    std::string text;
    if (!p->tcp) {
      c.opened_by = from_guest ? "guest" : "remote";
      text = from_guest ? fmt::format("udp {} -> {}: the guest's first datagram", guest, remote)
                        : fmt::format("udp {} -> {}: a first datagram to the guest", remote, guest);
    } else if (syn) {
      // A SYN-ACK first: the SYN it answers is not in the trace (a trace before format 3 keeps no sent frames).
      c.opened_by = (from_guest != ack) ? "guest" : "remote";
      text = c.opened_by == "guest"
                 ? fmt::format("tcp {} -> {}: the guest opens a connection{}", guest, remote,
                               ack ? " (the SYN-ACK to it is its first frame in this trace)" : "")
                 : fmt::format("tcp {} -> {}: a connection to the guest comes in", remote, guest);
    } else {
      text = fmt::format("tcp {} <-> {}: a connection whose start is not in the trace", guest, remote);
    }
    it = open_.insert_or_assign(key, connections_.size()).first;
    connections_.push_back(std::move(c));
    entries_.push_back(TimelineEntry{index, guest_ns_, "net", std::move(text)});
  }
  Connection& c = connections_[it->second];
  (from_guest ? c.frames_out : c.frames_in) += 1;
  (from_guest ? c.bytes_out : c.bytes_in) += p->payload;
  if (!p->tcp) return;
  if (syn && ack) c.established = true;
  if (rst && !c.refused && !c.reset) {
    if (c.established) {
      c.reset = true;
    } else {
      c.refused = true;
      entries_.push_back(TimelineEntry{index, guest_ns_, "net",
                                       fmt::format("tcp {} -> {}: refused (RST)", c.opened_by == "remote" ? remote : guest,
                                                   c.opened_by == "remote" ? guest : remote)});
    }
  }
  if (fin) c.closed = true;
}

void LinuxTraceView::see_disk_io(uint64_t index, const trace::DiskIo& d) {
  DiskTraffic& t = disks_[d.disk()];
  if (!d.write()) {
    ++t.reads;
    t.read_bytes += d.length();
    last_io_was_write_ = false;
    return;
  }
  ++t.writes;
  t.written_bytes += d.length();
  const bool extends = last_io_was_write_ && last_write_ && last_write_->disk() == d.disk() &&
                       last_write_->zeroes() == d.zeroes() &&
                       last_write_->offset() + last_write_->length() == d.offset();
  if (extends) {
    last_write_->set_length(last_write_->length() + d.length());
  } else {
    last_write_ = d;
    last_write_entry_ = entries_.size();
    entries_.push_back(TimelineEntry{index, guest_ns_, "disk", ""});
  }
  last_io_was_write_ = true;
  const trace::DiskIo& w = *last_write_;
  const std::string name = w.disk() < disk_names_.size() ? fmt::format("disk {} ({})", w.disk(), disk_names_[w.disk()])
                                                         : fmt::format("disk {}", w.disk());
  entries_[last_write_entry_].text = fmt::format("{}: {} {} at offset {} (sector {})", name,
                                                 w.zeroes() ? "zeroes" : "writes", bytes_text(w.length()), w.offset(),
                                                 w.offset() / 512);
}

void LinuxTraceView::add(uint64_t index, const trace::Event& e) {
  switch (e.kind_case()) {
    case trace::Event::kClock: guest_ns_ = std::max(guest_ns_, e.clock().now_ns()); break;
    case trace::Event::kAsync: {
      const auto& a = e.async();
      guest_ns_ = std::max(guest_ns_, a.now_ns());
      see_rip(index, a.at().rip(), "an asynchronous event");
      for (const auto& f : a.net_frames()) {
        NicTraffic& t = nics_[f.nic()];
        ++t.frames_in;
        t.bytes_in += f.data().size();
        see_frame(index, std::span(reinterpret_cast<const uint8_t*>(f.data().data()), f.data().size()), false);
      }
      break;
    }
    case trace::Event::kRdtsc:
      if (tsc_hz_ != 0) guest_ns_ = std::max(guest_ns_, uint64_t((unsigned __int128)e.rdtsc().value() * 1'000'000'000u / tsc_hz_));
      see_rip(index, e.rdtsc().rip(), "RDTSC");
      break;
    case trace::Event::kPortRead: see_rip(index, e.port_read().rip(), "a port read"); break;
    case trace::Event::kMmioRead: see_rip(index, e.mmio_read().rip(), "an MMIO read"); break;
    case trace::Event::kRdrand: see_rip(index, e.rdrand().rip(), "RDRAND"); break;
    case trace::Event::kMsrRead: see_rip(index, e.msr_read().rip(), "an MSR read"); break;
    case trace::Event::kInterrupt: see_rip(index, e.interrupt().at().rip(), "an interrupt"); break;
    case trace::Event::kDigest: see_rip(index, e.digest().at().rip(), "a state digest"); break;
    case trace::Event::kNetTransmit: {
      const auto& t = e.net_transmit();
      NicTraffic& n = nics_[t.nic()];
      ++n.frames_out;
      n.bytes_out += t.length();
      if (!t.data().empty()) {
        ++n.frames_out_kept;
        see_frame(index, std::span(reinterpret_cast<const uint8_t*>(t.data().data()), t.data().size()), true);
      }
      break;
    }
    case trace::Event::kDiskIo: see_disk_io(index, e.disk_io()); break;
    case trace::Event::kSerialOutput:
      if (serial_head_.size() < kSerialHead)
        serial_head_ += e.serial_output().data().substr(0, kSerialHead - serial_head_.size());
      break;
    case trace::Event::kEnd: {
      const auto& d = e.end();
      entries_.push_back(TimelineEntry{index, guest_ns_, "end",
                                       fmt::format("end: exit status {}{}", d.exit_status(),
                                                   d.reason().empty() ? "" : fmt::format(" ({})", d.reason()))});
      break;
    }
    default: break;
  }
}

std::vector<TimelineEntry> LinuxTraceView::timeline() const {
  std::vector<TimelineEntry> all = entries_;
  if (user_) {
    auto at = std::upper_bound(all.begin(), all.end(), user_->event,
                               [](uint64_t event, const TimelineEntry& x) { return event < x.event; });
    all.insert(at, *user_);
  }
  return all;
}

}  // namespace deja
