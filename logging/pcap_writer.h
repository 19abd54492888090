// Classic pcap files (LINKTYPE_ETHERNET, microsecond timestamps) of a trace's network frames, for Wireshark/tshark.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "logging/output_file.h"

namespace deja {

namespace pcap {
constexpr uint32_t kMagicMicroseconds = 0xa1b2c3d4;  // written in host order (little-endian here); readers swap
constexpr uint16_t kVersionMajor = 2, kVersionMinor = 4;
constexpr uint32_t kSnapLength = 65535;
constexpr uint32_t kLinkTypeEthernet = 1;
constexpr size_t kFileHeaderBytes = 24, kRecordHeaderBytes = 16;

std::vector<uint8_t> file_header();
// A record header for a frame of `length` bytes at `unix_ns` (frames over kSnapLength are cut to it).
std::vector<uint8_t> record_header(int64_t unix_ns, uint32_t length);
}  // namespace pcap

// Written as PATH.partial and renamed over PATH by finish() (ProductFile): the way `deja record -o` writes a trace.
class PcapWriter {
 public:
  static Result<std::unique_ptr<PcapWriter>> create(const std::string& path);
  Result<> add(int64_t unix_ns, std::span<const uint8_t> frame);
  Result<> finish();
  uint64_t frames() const { return frames_; }
  const std::string& path() const { return file_->path(); }

 private:
  explicit PcapWriter(std::unique_ptr<ProductFile> file) : file_(std::move(file)) {}
  Result<> flush();
  std::unique_ptr<ProductFile> file_;
  std::vector<uint8_t> buffer_;
  uint64_t frames_ = 0;
};

}  // namespace deja
