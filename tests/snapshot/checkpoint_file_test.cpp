// Checkpoint files: round trip, and refusal (naming the file and the problem) of damaged or mismatched ones.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>

#include <gtest/gtest.h>

#include "interp/interp_backend.h"
#include "snapshot/checkpoint.h"
#include "snapshot/cpu_state_codec.h"
#include "core/cpu_model.h"

namespace deja {
namespace {

class CheckpointFile : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir[] = "/tmp/deja-ckpt-XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    dir_ = dir;
    path_ = dir_ + "/t.0.ckpt";
    uint8_t b[3] = {1, 2, 3};
    ASSERT_TRUE(ram_.write(Gpa{0x5000}, b).has_value());
    cp_.at = CheckpointPosition{100, 7, 3, 2, 90};
    CpuState st;
    st.rip = 0x1234;
    cp_.cpu = encode_cpu_state(st);
    cp_.backend = {1, 2, 3};
    cp_.devices = {{"pic", {4, 5}}, {"uart", {}}};
    cp_.session = {9};
    cp_.memory = *mem_->capture();
    id_.trace_header_sha256[0] = 0xab;
    id_.ram_bytes = ram_.size();
    id_.backend = "interp";
    ASSERT_TRUE(write_checkpoint_file(path_, id_, cp_).has_value());
  }
  void TearDown() override {
    ::unlink(path_.c_str());
    ::rmdir(dir_.c_str());
  }
  std::string bytes() {
    std::ifstream in(path_, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }
  void put(const std::string& s) {
    std::ofstream out(path_, std::ios::binary | std::ios::trunc);
    out << s;
  }

  GuestMemory ram_ = std::move(*GuestMemory::create(2 << 20));
  std::unique_ptr<Backend> cpu_ = std::move(*make_interp_backend(ram_, CpuModel::x86_64_v1()));
  std::unique_ptr<CheckpointMemory> mem_ = std::move(*CheckpointMemory::create(ram_, *cpu_));
  MachineCheckpoint cp_;
  CheckpointIdentity id_;
  std::string dir_, path_;
};

TEST_F(CheckpointFile, RoundTrips) {
  auto back = read_checkpoint_file(path_, id_, *mem_);
  ASSERT_TRUE(back.has_value()) << back.error().message;
  EXPECT_EQ(back->at, cp_.at);
  EXPECT_EQ(back->cpu, cp_.cpu);
  EXPECT_EQ(back->backend, cp_.backend);
  EXPECT_EQ(back->devices, cp_.devices);
  EXPECT_EQ(back->session, cp_.session);
  ASSERT_NE(back->memory->page(5), nullptr);
  EXPECT_EQ(back->memory->page(5)->bytes[0], 1);
  EXPECT_EQ(back->memory->stored_pages(), 1u);
}

TEST_F(CheckpointFile, ImagesLoadedOneAfterAnotherShareTheirUnchangedPages) {
  // Many pages, then one of them changed: the second file, loaded sharing with the first, costs one page.
  std::vector<uint8_t> page(kPageSize, 0x11);
  for (uint64_t pfn = 16; pfn < 300; ++pfn) ASSERT_TRUE(ram_.write(Gpa{pfn * kPageSize}, page).has_value());
  MachineCheckpoint first = cp_;
  first.memory = *mem_->capture();
  page[7] = 0x22;
  ASSERT_TRUE(ram_.write(Gpa{100 * kPageSize}, page).has_value());
  MachineCheckpoint second = cp_;
  second.memory = *mem_->capture();
  const std::string second_path = dir_ + "/t.1.ckpt";
  ASSERT_TRUE(write_checkpoint_file(path_, id_, first).has_value());
  ASSERT_TRUE(write_checkpoint_file(second_path, id_, second).has_value());
  EXPECT_FALSE(std::filesystem::exists(path_ + ".partial"));

  auto loader_cpu = std::move(*make_interp_backend(ram_, CpuModel::x86_64_v1()));
  auto loader = std::move(*CheckpointMemory::create(ram_, *loader_cpu));
  auto a = read_checkpoint_file(path_, id_, *loader);
  ASSERT_TRUE(a.has_value()) << a.error().message;
  const uint64_t after_first = loader->stored_bytes();
  auto b = read_checkpoint_file(second_path, id_, *loader, a->memory);
  ASSERT_TRUE(b.has_value()) << b.error().message;
  EXPECT_EQ(loader->stored_bytes() - after_first, sizeof(PageCopy)) << "only the changed page is new";
  EXPECT_EQ(MemoryImage::differing_pages(*a->memory, *b->memory), std::vector<uint64_t>{100});
  EXPECT_EQ(b->memory->page(100)->bytes[7], 0x22);
  EXPECT_EQ(b->memory->page(101)->bytes[7], 0x11);
  ::unlink(second_path.c_str());
}

TEST_F(CheckpointFile, EveryDamageIsRefusedNamingTheFile) {
  const std::string good = bytes();
  std::mt19937_64 rng(3);
  for (int i = 0; i < 300; ++i) {
    std::string bad = good;
    switch (i % 3) {
      case 0: bad[rng() % bad.size()] ^= char(1 << (rng() % 8)); break;
      case 1: bad.resize(rng() % bad.size()); break;
      case 2: bad.insert(rng() % bad.size(), 1, 'x'); break;
    }
    put(bad);
    auto r = read_checkpoint_file(path_, id_, *mem_);
    ASSERT_FALSE(r.has_value()) << "damage " << i << " was accepted";
    EXPECT_NE(r.error().message.find(path_), std::string::npos) << r.error().message;
  }
}

TEST_F(CheckpointFile, AnotherTraceOrMachineIsRefused) {
  CheckpointIdentity other = id_;
  other.trace_header_sha256[0] = 0xcd;
  auto r = read_checkpoint_file(path_, other, *mem_);
  ASSERT_FALSE(r.has_value());
  EXPECT_NE(r.error().message.find("another trace"), std::string::npos) << r.error().message;
  other = id_;
  other.backend = "kvm";
  r = read_checkpoint_file(path_, other, *mem_);
  ASSERT_FALSE(r.has_value());
  EXPECT_NE(r.error().message.find("interp backend"), std::string::npos) << r.error().message;
  put("not a checkpoint at all, just some text that is long enough to have a trailer.................");
  r = read_checkpoint_file(path_, id_, *mem_);
  ASSERT_FALSE(r.has_value());
  EXPECT_NE(r.error().message.find("bad magic"), std::string::npos) << r.error().message;
}

}  // namespace
}  // namespace deja
