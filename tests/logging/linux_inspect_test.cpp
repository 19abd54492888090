// The Linux view of inspect (kernel version, user space, connections, disk writes, timeline) and the pcap export, on
// a small hand-made trace; tshark reads the pcap back when it is installed.
#include <sys/stat.h>
#include <unistd.h>

#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>

#include "logging/linux_trace.h"
#include "logging/pcap_writer.h"
#include "logging/trace_inspect.h"
#include "trace_test_support.h"

namespace deja {
namespace {

using testing::capture;
using testing::TempDir;
using Bytes = std::vector<uint8_t>;

constexpr uint64_t kTscHz = 2'000'000'000;
constexpr int64_t kStart = 1764408492'000'000'000;  // the header's start_unix_ns

void put16(Bytes& b, size_t at, uint16_t v) {
  b[at] = uint8_t(v >> 8);
  b[at + 1] = uint8_t(v);
}
void put32(Bytes& b, size_t at, uint32_t v) {
  put16(b, at, uint16_t(v >> 16));
  put16(b, at + 2, uint16_t(v));
}

// An Ethernet + IPv4 + TCP frame between the guest 10.0.2.15:40000 and slirp's host 10.0.2.2:8080.
std::string tcp_frame(bool from_guest, uint8_t flags, const std::string& payload, uint32_t seq, uint32_t ack) {
  Bytes f(14 + 20 + 20);
  const uint8_t guest_mac[6] = {0x52, 0x54, 0, 0x12, 0x34, 0x56}, host_mac[6] = {0x52, 0x55, 10, 0, 2, 2};
  std::copy_n(from_guest ? host_mac : guest_mac, 6, f.begin());
  std::copy_n(from_guest ? guest_mac : host_mac, 6, f.begin() + 6);
  put16(f, 12, 0x0800);
  const uint8_t guest_ip[4] = {10, 0, 2, 15}, host_ip[4] = {10, 0, 2, 2};
  f[14] = 0x45;
  put16(f, 16, uint16_t(40 + payload.size()));
  f[20] = 0x40;  // don't fragment
  f[22] = 64;
  f[23] = 6;
  std::copy_n(from_guest ? guest_ip : host_ip, 4, f.begin() + 26);
  std::copy_n(from_guest ? host_ip : guest_ip, 4, f.begin() + 30);
  uint32_t sum = 0;
  for (size_t i = 14; i < 34; i += 2) sum += uint32_t(f[i] << 8 | f[i + 1]);
  while (sum >> 16) sum = (sum & 0xffff) + (sum >> 16);
  put16(f, 24, uint16_t(~sum));
  put16(f, 34, from_guest ? 40000 : 8080);
  put16(f, 36, from_guest ? 8080 : 40000);
  put32(f, 38, seq);
  put32(f, 42, ack);
  f[46] = 5 << 4;
  f[47] = flags;
  put16(f, 48, 64240);
  std::string s(f.begin(), f.end());
  return s + payload;
}

constexpr uint8_t kFin = 0x01, kSyn = 0x02, kPsh = 0x08, kAck = 0x10;

trace::Event rdtsc(uint64_t ns, uint64_t rip) {
  trace::Event e;
  e.mutable_rdtsc()->set_value(ns * (kTscHz / 1'000'000'000));
  e.mutable_rdtsc()->set_rip(rip);
  return e;
}
trace::Event sent(const std::string& frame, bool keep = true) {
  trace::Event e;
  auto* t = e.mutable_net_transmit();
  t->set_length(uint32_t(frame.size()));
  t->set_hash(1);
  if (keep) t->set_data(frame);
  return e;
}
trace::Event received(uint64_t ns, const std::string& frame, uint64_t rip) {
  trace::Event e;
  auto* a = e.mutable_async();
  *a->mutable_at() = testing::coordinate(ns / 1000, rip);
  a->set_now_ns(ns);
  a->add_net_frames()->set_data(frame);
  return e;
}
trace::Event disk_io(bool write, uint64_t offset, uint64_t length) {
  trace::Event e;
  auto* d = e.mutable_disk_io();
  d->set_write(write);
  d->set_offset(offset);
  d->set_length(length);
  return e;
}

const std::string kRequest = "GET /blob HTTP/1.1\r\nHost: 10.0.2.2:8080\r\n\r\n";
const std::string kResponse = "HTTP/1.0 200 OK\r\nContent-Length: 5\r\n\r\nhello";

// A Linux boot in miniature: kernel code, a disk read and two adjacent writes, user space, an HTTP fetch, the end.
std::vector<trace::Event> linux_events(bool keep_sent) {
  const uint64_t kernel_rip = 0xffffffff81000000, user_rip = 0x401000;
  std::vector<trace::Event> v;
  v.push_back(rdtsc(1'000'000, kernel_rip));
  trace::Event serial;
  serial.mutable_serial_output()->set_data("[    0.000000] Linux version 6.1.0-test (builder@host) (gcc 12) #1 SMP\n");
  v.push_back(serial);
  v.push_back(disk_io(false, 0, 4096));
  v.push_back(disk_io(true, 4096, 4096));
  v.push_back(disk_io(true, 8192, 4096));  // contiguous: the same timeline entry
  v.push_back(rdtsc(2'000'000, user_rip));  // event 5: the first at a user address
  trace::Event clock;
  clock.mutable_clock()->set_now_ns(3'000'000);
  v.push_back(clock);
  v.push_back(sent(tcp_frame(true, kSyn, "", 100, 0), keep_sent));  // event 7
  v.push_back(received(3'500'000, tcp_frame(false, kSyn | kAck, "", 500, 101), user_rip));
  v.push_back(sent(tcp_frame(true, kAck, "", 101, 501), keep_sent));
  v.push_back(sent(tcp_frame(true, kAck | kPsh, kRequest, 101, 501), keep_sent));
  v.push_back(received(4'000'000, tcp_frame(false, kAck | kPsh | kFin, kResponse, 501, 101 + uint32_t(kRequest.size())),
                       kernel_rip));
  v.push_back(sent(tcp_frame(true, kAck | kFin, "", 101 + uint32_t(kRequest.size()), 502 + uint32_t(kResponse.size())),
                   keep_sent));
  v.push_back(disk_io(true, 0, 512));  // event 13
  trace::Event end;
  *end.mutable_end()->mutable_at() = testing::coordinate(9000, user_rip);
  end.mutable_end()->set_exit_status(1);
  end.mutable_end()->set_reason("the guest wrote to isa-debug-exit");
  v.push_back(end);
  return v;
}

trace::Header linux_header() {
  trace::Header h = testing::sample_header();
  h.set_start_unix_ns(kStart);
  h.mutable_inputs(0)->set_role("kernel");
  h.mutable_inputs(0)->set_path("/nonexistent-deja-test/vmlinuz");
  auto* c = h.mutable_config();
  c->set_tsc_hz(kTscHz);
  c->set_image_format("linux-pvh");
  c->set_cmdline("console=ttyS0 quiet");
  auto* d = c->add_disks();
  d->set_path("disk.img");
  d->set_size(1 << 20);
  auto* n = c->add_nets();
  n->set_mode("user");
  n->set_mac(std::string("\x52\x54\x00\x12\x34\x56", 6));
  return h;
}

void write_linux_trace(const std::string& path, bool keep_sent = true) {
  auto writer = TraceWriter::create(path, linux_header());
  ASSERT_TRUE(writer) << writer.error().message;
  for (const auto& e : linux_events(keep_sent)) ASSERT_TRUE((*writer)->append(e));
  ASSERT_TRUE((*writer)->finish(trace::Footer{}));
}

void expect_contains(const std::string& text, std::initializer_list<const char*> wanted) {
  for (const char* want : wanted) EXPECT_NE(text.find(want), std::string::npos) << "missing \"" << want << "\" in:\n" << text;
}

TEST(LinuxInspect, TextShowsKernelUserSpaceConnectionsDiskAndTimeline) {
  TempDir dir;
  const std::string path = dir.file("linux.trace");
  write_linux_trace(path);
  const std::string text = capture(path, InspectOptions{});
  expect_contains(text, {
      "cmdline      \"console=ttyS0 quiet\"",
      "kernel       6.1.0-test (builder@host) (gcc 12) #1 SMP\n",
      "from the kernel's banner in the serial output (not from the kernel image: cannot open Linux kernel "
      "'/nonexistent-deja-test/vmlinuz'",
      "user space   event 5 at +0.002000 s: RDTSC at rip 0x401000, the first event at a user address",
      "disk         0 disk.img (1048576 bytes) sha256=: read 4096 bytes (1 reads), wrote 8704 bytes (3 writes)",
      "received 2 frames (",
      "connections  1\n",
      "tcp 10.0.2.15:40000 -> 10.0.2.2:8080  opened by the guest at +0.003000 s (event 7): established, closed (FIN); "
      "43 bytes from the guest, 43 bytes to it",
      "+0.000000 s           0  boot: Linux kernel /nonexistent-deja-test/vmlinuz entered through linux-pvh",
      "+0.001000 s           3  disk 0 (disk.img): writes 8192 bytes at offset 4096 (sector 8)",
      "+0.002000 s           5  user space: RDTSC at rip 0x401000",
      "+0.003000 s           7  tcp 10.0.2.15:40000 -> 10.0.2.2:8080: the guest opens a connection",
      "+0.004000 s          13  disk 0 (disk.img): writes 512 bytes at offset 0 (sector 0)",
      "+0.004000 s          14  end: exit status 1 (the guest wrote to isa-debug-exit)",
  });
}

TEST(LinuxInspect, JsonCarriesTheSame) {
  TempDir dir;
  const std::string path = dir.file("linux.trace");
  write_linux_trace(path);
  const std::string json = capture(path, InspectOptions{.json = true, .pcap = dir.file("out.pcap")});
  google::protobuf::Struct parsed;
  auto status = google::protobuf::util::JsonStringToMessage(json, &parsed);
  ASSERT_TRUE(status.ok()) << status.ToString() << "\n" << json;
  const auto& f = parsed.fields();
  const auto& linux = f.at("linux").struct_value().fields();
  EXPECT_EQ(linux.at("kernel_version").string_value(), "6.1.0-test (builder@host) (gcc 12) #1 SMP");
  EXPECT_EQ(linux.at("cmdline").string_value(), "console=ttyS0 quiet");
  EXPECT_EQ(linux.at("first_user_space").struct_value().fields().at("event").number_value(), 5);
  const auto& disk = f.at("disk_traffic").list_value().values(0).struct_value().fields();
  EXPECT_EQ(disk.at("written_bytes").number_value(), 8704);
  EXPECT_EQ(disk.at("read_bytes").number_value(), 4096);
  const auto& nic = f.at("nic_traffic").list_value().values(0).struct_value().fields();
  EXPECT_EQ(nic.at("frames_sent").number_value(), 4);
  EXPECT_EQ(nic.at("sent_frames_kept").number_value(), 4);
  const auto& connection = f.at("connections").list_value().values(0).struct_value().fields();
  EXPECT_EQ(connection.at("remote").string_value(), "10.0.2.2:8080");
  EXPECT_EQ(connection.at("opened_by").string_value(), "guest");
  EXPECT_EQ(connection.at("bytes_to_guest").number_value(), double(kResponse.size()));
  std::vector<std::string> kinds;
  for (const auto& t : f.at("timeline").list_value().values()) kinds.push_back(t.struct_value().fields().at("kind").string_value());
  EXPECT_EQ(kinds, (std::vector<std::string>{"boot", "disk", "user", "net", "disk", "end"}));
  const auto& pcap = f.at("pcap").struct_value().fields();
  EXPECT_EQ(pcap.at("frames_received").number_value(), 2);
  EXPECT_EQ(pcap.at("frames_sent").number_value(), 4);
}

uint32_t le32(const std::string& b, size_t at) {
  return uint32_t(uint8_t(b[at])) | uint32_t(uint8_t(b[at + 1])) << 8 | uint32_t(uint8_t(b[at + 2])) << 16 |
         uint32_t(uint8_t(b[at + 3])) << 24;
}

TEST(LinuxInspect, PcapHoldsEveryFrameAtItsGuestTime) {
  TempDir dir;
  const std::string path = dir.file("linux.trace"), pcap = dir.file("net.pcap");
  write_linux_trace(path);
  const std::string text = capture(path, InspectOptions{.pcap = pcap});
  expect_contains(text, {"pcap         ", ": 2 frames received and 4 sent\n"});
  const std::string bytes = testing::read_bytes(pcap);
  ASSERT_GE(bytes.size(), pcap::kFileHeaderBytes);
  EXPECT_EQ(le32(bytes, 0), pcap::kMagicMicroseconds);
  EXPECT_EQ(le32(bytes, 4), 2u | 4u << 16);  // version 2.4
  EXPECT_EQ(le32(bytes, 20), pcap::kLinkTypeEthernet);
  std::vector<std::string> frames;
  std::vector<int64_t> times;
  for (size_t at = pcap::kFileHeaderBytes; at < bytes.size();) {
    ASSERT_LE(at + pcap::kRecordHeaderBytes, bytes.size());
    const uint32_t caplen = le32(bytes, at + 8);
    EXPECT_EQ(caplen, le32(bytes, at + 12));
    times.push_back(int64_t(le32(bytes, at)) * 1'000'000'000 + int64_t(le32(bytes, at + 4)) * 1000 - kStart);
    frames.push_back(bytes.substr(at + pcap::kRecordHeaderBytes, caplen));
    at += pcap::kRecordHeaderBytes + caplen;
  }
  std::vector<std::string> expected;
  for (const auto& e : linux_events(true)) {
    if (e.has_net_transmit()) expected.push_back(e.net_transmit().data());
    if (e.has_async()) expected.push_back(e.async().net_frames(0).data());
  }
  EXPECT_EQ(frames, expected);
  EXPECT_EQ(times, (std::vector<int64_t>{3'000'000, 3'500'000, 3'500'000, 3'500'000, 4'000'000, 4'000'000}));
  struct stat st {};
  ASSERT_EQ(::stat(pcap.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u) << "captures carry guest payloads, like traces";
  EXPECT_NE(::access((pcap + ".partial").c_str(), F_OK), 0);

  // tshark, where installed, reads it as Ethernet and follows the HTTP exchange on port 8080.
  if (std::system("tshark --version >/dev/null 2>&1") != 0) return;
  const std::string command = "tshark -r " + pcap + " -Y http -T fields -e http.request.method -e http.response.code 2>&1";
  std::FILE* p = ::popen(command.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buffer[4096];
  while (size_t n = std::fread(buffer, 1, sizeof buffer, p)) out.append(buffer, n);
  EXPECT_EQ(::pclose(p), 0) << out;
  EXPECT_NE(out.find("GET"), std::string::npos) << out;
  EXPECT_NE(out.find("200"), std::string::npos) << out;
}

TEST(LinuxInspect, OlderTraceWithoutSentFramesSaysSo) {
  TempDir dir;
  const std::string path = dir.file("old.trace"), pcap = dir.file("net.pcap");
  write_linux_trace(path, false);
  const std::string text = capture(path, InspectOptions{.pcap = pcap});
  expect_contains(text, {
      "connections  1 (seen in the received frames only: this trace does not keep the frames the guest sent)",
      "tcp 10.0.2.15:40000 -> 10.0.2.2:8080: the guest opens a connection (the SYN-ACK to it is its first frame",
      ": 2 frames received and 0 sent (4 sent frames are not in this trace, which keeps only their length and hash)",
  });
}

TEST(LinuxInspect, TraceWithoutKernelHasNoLinuxSection) {
  TempDir dir;
  const std::string path = dir.file("t.trace");
  testing::write_trace(path, testing::sample_events(30));
  const std::string text = capture(path, InspectOptions{});
  EXPECT_EQ(text.find("kernel       "), std::string::npos) << text;
  EXPECT_EQ(text.find("timeline"), std::string::npos) << text;
}

TEST(LinuxInspect, BannerIsTheVersionNotAFormatString) {
  EXPECT_EQ(linux_banner_version("%s version %s\nLinux version %s\nLinux version 6.1.0-18-amd64 (x) #1\n"),
            "6.1.0-18-amd64 (x) #1");
  EXPECT_FALSE(linux_banner_version("no banner here"));
}

TEST(PcapWriter, WritesTheWayTracesAreWritten) {
  TempDir dir;
  // A regular file is replaced; the .partial is gone afterwards.
  const std::string path = dir.file("a.pcap");
  testing::write_bytes(path, "old");
  auto w = PcapWriter::create(path);
  ASSERT_TRUE(w) << w.error().message;
  EXPECT_EQ(::access((path + ".partial").c_str(), F_OK), 0);
  ASSERT_TRUE((*w)->add(kStart + 1'234'567'891, Bytes(60, 0xab)));
  ASSERT_TRUE((*w)->add(kStart, Bytes(70000, 0xcd)));  // longer than the snap length: cut, its length kept
  ASSERT_TRUE((*w)->finish());
  const std::string bytes = testing::read_bytes(path);
  ASSERT_EQ(bytes.size(), pcap::kFileHeaderBytes + 2 * pcap::kRecordHeaderBytes + 60 + pcap::kSnapLength);
  EXPECT_EQ(le32(bytes, 24), uint32_t(kStart / 1'000'000'000) + 1);
  EXPECT_EQ(le32(bytes, 28), 234567u);
  const size_t second = pcap::kFileHeaderBytes + pcap::kRecordHeaderBytes + 60;
  EXPECT_EQ(le32(bytes, second + 8), pcap::kSnapLength);
  EXPECT_EQ(le32(bytes, second + 12), 70000u);
  EXPECT_NE(::access((path + ".partial").c_str(), F_OK), 0);

  // A symlink, a directory and a device are refused, and nothing is created.
  const std::string link = dir.file("link.pcap");
  ASSERT_EQ(::symlink(dir.file("target").c_str(), link.c_str()), 0);
  for (const std::string& refused : {link, dir.file(""), std::string("/dev/null")}) {
    auto r = PcapWriter::create(refused);
    ASSERT_FALSE(r) << refused;
    EXPECT_NE(r.error().message.find("deja writes the packet capture only as a new or regular file"),
              std::string::npos)
        << r.error().message;
  }
  EXPECT_NE(::access(dir.file("target").c_str(), F_OK), 0);

  // Abandoned before finish(): the old file stays, the .partial goes.
  {
    auto abandoned = PcapWriter::create(path);
    ASSERT_TRUE(abandoned);
  }
  EXPECT_EQ(testing::read_bytes(path), bytes);
  EXPECT_NE(::access((path + ".partial").c_str(), F_OK), 0);
}

}  // namespace
}  // namespace deja
