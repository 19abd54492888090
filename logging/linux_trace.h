// What a trace says about the Linux guest it recorded: kernel version, first user-space event, connections, disk I/O.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "logging/trace_format.h"

namespace deja {

// The kernel's version and where it came from ("the bzImage setup header of the kernel image ...", "the kernel's
// banner in the serial output"). `version` empty: `source` says why it is not known.
struct KernelVersion {
  std::string version;
  std::string source;
};

// A Linux trace names a kernel among its inputs (`record --linux` or `--kernel`).
const trace::InputFile* linux_kernel_input(const trace::Header& header);

// From the kernel image the header names, when that file is still there with the recorded SHA-256: a bzImage's
// setup header (kernel_version), else the "Linux version" banner in the vmlinux (an ELF, or a bzImage's payload
// decompressed by the loader's code).
KernelVersion kernel_version_from_image(const trace::InputFile& kernel);

// "6.1.0-18-amd64 (debian-kernel@...) ..." from the first "Linux version " line in `text`.
std::optional<std::string> linux_banner_version(std::string_view text);

// One line of the timeline, at an event (its number as `inspect --events` counts) and a guest time.
struct TimelineEntry {
  uint64_t event = 0;
  uint64_t guest_ns = 0;
  std::string kind;  // "boot", "user", "net", "disk", "end"
  std::string text;
};

// An Ethernet frame in a few words: "udp 10.0.2.2:69 > 10.0.2.15:40312, 516 bytes of data", "arp", "icmp A > B".
std::string describe_frame(std::span<const uint8_t> frame);

// A TCP connection or a UDP flow seen in the NICs' frames, from the guest's side.
struct Connection {
  std::string protocol;  // "tcp", "udp"
  std::string guest, remote;  // "10.0.2.15:40312", "10.0.2.2:8080" ("[fec0::2]:80" for IPv6)
  std::string opened_by;      // "guest", "remote" (a host forward, or a datagram in), "" (its start is not seen)
  uint64_t event = 0, guest_ns = 0;  // its first frame
  bool established = false, refused = false, reset = false, closed = false;  // TCP: SYN-ACK, RST to the SYN, RST, FIN
  uint64_t frames_out = 0, frames_in = 0;
  uint64_t bytes_out = 0, bytes_in = 0;  // payload bytes (TCP or UDP data), from and to the guest
  std::string state() const;
};

struct DiskTraffic {
  uint64_t reads = 0, read_bytes = 0, writes = 0, written_bytes = 0;
};

struct NicTraffic {
  uint64_t frames_in = 0, bytes_in = 0, frames_out = 0, bytes_out = 0;
  uint64_t frames_out_kept = 0;  // sent frames whose bytes are in the trace (format 3)
};

// Reads a trace's events in order (one streaming pass) and keeps what the summary needs; guest time is the latest
// virtual time the events carry (clock and async events, RDTSC values at the recorded TSC rate).
class LinuxTraceView {
 public:
  explicit LinuxTraceView(const trace::Header& header);
  void add(uint64_t index, const trace::Event& e);

  uint64_t guest_ns() const { return guest_ns_; }
  int64_t unix_ns() const { return start_unix_ns_ + int64_t(guest_ns_); }

  bool is_linux() const { return linux_; }
  // The timeline in event order; disk writes to contiguous bytes in a row are one entry.
  std::vector<TimelineEntry> timeline() const;
  // Entries so far, but the first user-space event: each new one is at the event just added.
  size_t timeline_entry_count() const { return entries_.size(); }
  const std::optional<TimelineEntry>& first_user_space() const { return user_; }
  const std::string& first_user_space_detail() const { return user_detail_; }  // "RDTSC at rip 0x7f..., the first ..."

  const std::vector<Connection>& connections() const { return connections_; }
  const std::map<uint32_t, DiskTraffic>& disks() const { return disks_; }
  const std::map<uint32_t, NicTraffic>& nics() const { return nics_; }
  bool disk_io_recorded() const { return format_version_ >= 3; }
  const std::string& serial_head() const { return serial_head_; }

 private:
  void see_rip(uint64_t index, uint64_t rip, const char* where);
  void see_frame(uint64_t index, std::span<const uint8_t> frame, bool from_guest);
  void see_disk_io(uint64_t index, const trace::DiskIo& d);

  bool linux_ = false;
  uint32_t format_version_ = 0;
  int64_t start_unix_ns_ = 0;
  uint64_t tsc_hz_ = 0;
  uint64_t guest_ns_ = 0;
  std::vector<std::string> disk_names_;

  bool kernel_half_seen_ = false;
  std::optional<TimelineEntry> user_;
  std::string user_detail_;
  std::vector<TimelineEntry> entries_;  // boot, net, disk, end (user is added by timeline())
  std::optional<trace::DiskIo> last_write_;  // the disk entry being extended
  size_t last_write_entry_ = 0;
  bool last_io_was_write_ = false;

  std::vector<Connection> connections_;
  std::map<std::string, size_t> open_;  // flow key -> connections_ index
  std::map<uint32_t, DiskTraffic> disks_;
  std::map<uint32_t, NicTraffic> nics_;
  std::string serial_head_;  // the first 64 KiB of serial output, where the kernel's banner would be
};

}  // namespace deja
