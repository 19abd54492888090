// Checkpoint files that travel with a trace: round trip of state, pages and disk blocks, and refusal by name of damaged or foreign files.
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <map>

#include <gtest/gtest.h>

#include "snapshot/trace_checkpoint.h"

namespace deja {
namespace {

class TraceCheckpointFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir[] = "/tmp/deja-tckpt-XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    dir_ = dir;
    path_ = dir_ + "/000002.ckpt";
    id_.trace_header_sha256[0] = 0xab;
    id_.ram_bytes = 64 * 4096;
    id_.backend = "interp";
    machine_.cpu = {1, 2, 3, 4};
    machine_.backend = {5, 6};
    machine_.devices = {{"pic", {7, 8}}, {"uart", {}}};
    machine_.session = {9, 10, 11};
    pages_[3].fill(0x33);
    pages_[40].fill(0x44);
    source_.meta.identity = id_;
    source_.meta.number = 2;
    source_.meta.parent = 1;
    source_.meta.parent_digest[5] = 0x55;
    source_.meta.at = CheckpointPosition{100, 20, 30, 40, 90};
    source_.meta.next_raw_event = 25;
    source_.meta.digest[0] = 0x77;
    source_.meta.parts = {{"cpu", {}}, {"ram", {}}};
    source_.machine = &machine_;
    source_.pages = {3, 17, 40};  // 17: became zero
    source_.page = [this](uint64_t pfn) -> const uint8_t* {
      return pages_.contains(pfn) ? pages_.at(pfn).data() : nullptr;
    };
    source_.disks = {DiskCheckpoint{{0xd1, 0xd2}, {0, 9}, {2}}};
    source_.block = [](size_t, uint64_t block, std::vector<uint8_t>& bytes) -> Result<> {
      bytes.assign(4096, uint8_t(block));
      return {};
    };
    auto encoded = encode_trace_checkpoint(source_);
    ASSERT_TRUE(encoded.has_value());
    bytes_.assign(encoded->begin(), encoded->end());
    put(bytes_);
  }
  void TearDown() override {
    ::unlink(path_.c_str());
    ::rmdir(dir_.c_str());
  }
  void put(const std::string& s) {
    std::ofstream out(path_, std::ios::binary | std::ios::trunc);
    out << s;
  }
  Result<TraceCheckpointFile> read() { return read_trace_checkpoint(path_, id_, 1 << 30); }
  void expect_refused(const std::string& what) {
    auto r = read();
    ASSERT_FALSE(r.has_value()) << what;
    EXPECT_NE(r.error().message.find(path_), std::string::npos) << r.error().message;
    EXPECT_NE(r.error().message.find(what), std::string::npos) << r.error().message;
  }

  std::string dir_, path_, bytes_;
  CheckpointIdentity id_;
  MachineCheckpoint machine_;
  std::map<uint64_t, std::array<uint8_t, 4096>> pages_;
  TraceCheckpointSource source_;
};

TEST_F(TraceCheckpointFileTest, RoundTripsStatePagesAndDisks) {
  auto file = read();
  ASSERT_TRUE(file.has_value()) << file.error().message;
  EXPECT_EQ(file->meta.number, 2u);
  EXPECT_EQ(file->meta.parent, 1u);
  EXPECT_EQ(file->meta.parent_digest, source_.meta.parent_digest);
  EXPECT_EQ(file->meta.at, source_.meta.at);
  EXPECT_EQ(file->meta.next_raw_event, 25u);
  EXPECT_EQ(file->meta.digest, source_.meta.digest);
  EXPECT_EQ(file->meta.parts.size(), 2u);
  EXPECT_EQ(file->machine.cpu, machine_.cpu);
  EXPECT_EQ(file->machine.backend, machine_.backend);
  EXPECT_EQ(file->machine.devices, machine_.devices);
  EXPECT_EQ(file->machine.session, machine_.session);
  std::map<uint64_t, bool> seen;
  auto applied = apply_checkpoint_pages(*file, 64, [&](uint64_t pfn, const uint8_t* bytes) {
    seen[pfn] = bytes != nullptr;
    if (bytes) {
      EXPECT_EQ(std::memcmp(bytes, pages_.at(pfn).data(), 4096), 0);
    }
  });
  ASSERT_TRUE(applied.has_value()) << applied.error().message;
  EXPECT_EQ(seen, (std::map<uint64_t, bool>{{3, true}, {17, false}, {40, true}}));
  std::vector<uint8_t> state;
  std::vector<uint64_t> blocks, verified;
  DiskCheckpointSink sink{[&](size_t, std::span<const uint8_t> s) -> Result<> {
                            state.assign(s.begin(), s.end());
                            return {};
                          },
                          [&](size_t, uint64_t b, std::span<const uint8_t> bytes) -> Result<> {
                            EXPECT_EQ(bytes.size(), 4096u);
                            EXPECT_EQ(bytes[0], uint8_t(b));
                            blocks.push_back(b);
                            return {};
                          },
                          [&](size_t, uint64_t b) -> Result<> {
                            verified.push_back(b);
                            return {};
                          }};
  ASSERT_TRUE(apply_checkpoint_disks(*file, 1, sink).has_value());
  EXPECT_EQ(state, (std::vector<uint8_t>{0xd1, 0xd2}));
  EXPECT_EQ(blocks, (std::vector<uint64_t>{0, 9}));
  EXPECT_EQ(verified, (std::vector<uint64_t>{2}));
  // Another machine: refused by its RAM size or its disks.
  EXPECT_FALSE(apply_checkpoint_pages(*file, 32, [](uint64_t, const uint8_t*) {}).has_value());
  EXPECT_FALSE(apply_checkpoint_disks(*file, 2, sink).has_value());
}

TEST_F(TraceCheckpointFileTest, DamageAnywhereIsRefusedByName) {
  for (size_t at : {size_t{20}, bytes_.size() / 2, bytes_.size() - 40, bytes_.size() - 1}) {
    std::string damaged = bytes_;
    damaged[at] ^= 0x01;
    put(damaged);
    expect_refused("checksum mismatch");
  }
  put(bytes_.substr(0, bytes_.size() / 3));
  expect_refused("checksum mismatch");
  put(bytes_.substr(0, 20));
  expect_refused("truncated");
  std::string magic = bytes_;
  magic[0] = 'X';
  put(magic);
  expect_refused("bad magic");
}

TEST_F(TraceCheckpointFileTest, AnotherTracesOrMachinesCheckpointIsRefused) {
  CheckpointIdentity other = id_;
  other.trace_header_sha256[0] = 0xcd;
  auto r = read_trace_checkpoint(path_, other, 1 << 30);
  ASSERT_FALSE(r.has_value());
  EXPECT_NE(r.error().message.find("another trace"), std::string::npos) << r.error().message;
  other = id_;
  other.ram_bytes *= 2;
  EXPECT_FALSE(read_trace_checkpoint(path_, other, 1 << 30).has_value());
  other = id_;
  other.backend = "kvm";
  EXPECT_FALSE(read_trace_checkpoint(path_, other, 1 << 30).has_value());
  EXPECT_FALSE(read_trace_checkpoint(path_, id_, 100).has_value());  // larger than this machine's checkpoints can be
}

}  // namespace
}  // namespace deja
