// The pcap file and record headers (the libpcap "classic" format, https://www.tcpdump.org/manpages/pcap-savefile.5.html).
#include "logging/pcap_writer.h"

#include <algorithm>

namespace deja {

namespace {

void put16(std::vector<uint8_t>& out, uint16_t v) {
  for (int i = 0; i < 2; ++i) out.push_back(uint8_t(v >> (8 * i)));
}
void put32(std::vector<uint8_t>& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(uint8_t(v >> (8 * i)));
}

constexpr size_t kFlushBytes = 256 * 1024;

}  // namespace

std::vector<uint8_t> pcap::file_header() {
  std::vector<uint8_t> h;
  put32(h, kMagicMicroseconds);
  put16(h, kVersionMajor);
  put16(h, kVersionMinor);
  put32(h, 0);  // thiszone: timestamps are UTC
  put32(h, 0);  // sigfigs
  put32(h, kSnapLength);
  put32(h, kLinkTypeEthernet);
  return h;
}

std::vector<uint8_t> pcap::record_header(int64_t unix_ns, uint32_t length) {
  if (unix_ns < 0) unix_ns = 0;
  std::vector<uint8_t> h;
  put32(h, uint32_t(unix_ns / 1'000'000'000));  // seconds: a u32 until 2106
  put32(h, uint32_t(unix_ns % 1'000'000'000 / 1000));
  put32(h, std::min(length, kSnapLength));
  put32(h, length);
  return h;
}

Result<std::unique_ptr<PcapWriter>> PcapWriter::create(const std::string& path) {
  auto file = ProductFile::create_replacing(path, "packet capture", ProductFile::Unfinished::kRemove);
  if (!file) return std::unexpected(file.error());
  std::unique_ptr<PcapWriter> writer(new PcapWriter(std::move(*file)));
  writer->buffer_ = pcap::file_header();
  return writer;
}

Result<> PcapWriter::add(int64_t unix_ns, std::span<const uint8_t> frame) {
  const auto header = pcap::record_header(unix_ns, uint32_t(std::min<size_t>(frame.size(), UINT32_MAX)));
  buffer_.insert(buffer_.end(), header.begin(), header.end());
  buffer_.insert(buffer_.end(), frame.begin(), frame.begin() + std::min<size_t>(frame.size(), pcap::kSnapLength));
  ++frames_;
  return buffer_.size() >= kFlushBytes ? flush() : Result<>{};
}

Result<> PcapWriter::flush() {
  auto r = file_->write(buffer_);
  buffer_.clear();
  return r;
}

Result<> PcapWriter::finish() {
  if (auto r = flush(); !r) return r;
  return file_->commit();
}

}  // namespace deja
