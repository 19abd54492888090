// Copy-on-write memory images: sharing between captures, minimal restores, VMM-write tracking, the CPU codec.
#include <random>

#include <gtest/gtest.h>

#include "interp/interp_backend.h"
#include "snapshot/cow_memory.h"
#include "snapshot/cpu_state_codec.h"
#include "core/cpu_model.h"

namespace deja {
namespace {

struct Rig {
  GuestMemory ram = std::move(*GuestMemory::create(4 << 20));
  std::unique_ptr<Backend> cpu = std::move(*make_interp_backend(ram, CpuModel::x86_64_v1()));
  std::unique_ptr<CheckpointMemory> mem = std::move(*CheckpointMemory::create(ram, *cpu));
  std::vector<uint8_t> copy() const {
    return std::vector<uint8_t>(ram.host_base(), ram.host_base() + ram.size());
  }
  void write(uint64_t gpa, uint8_t v) {
    uint8_t b[1] = {v};
    ASSERT_TRUE(ram.write(Gpa{gpa}, b).has_value());
  }
};

TEST(CowMemory, FirstCaptureStoresOnlyNonZeroPages) {
  Rig r;
  r.write(0x1000, 1);
  r.write(0x3fffff, 2);
  auto image = r.mem->capture();
  ASSERT_TRUE(image.has_value());
  EXPECT_EQ((*image)->stored_pages(), 2u);
  EXPECT_EQ(r.mem->stored_bytes(), 2 * sizeof(PageCopy));
}

TEST(CowMemory, CapturesShareUnchangedPagesAndRestoreRewritesOnlyDifferences) {
  Rig r;
  std::mt19937_64 rng(7);
  for (int i = 0; i < 200; ++i) r.write(rng() % r.ram.size(), uint8_t(rng()));
  auto a = *r.mem->capture();
  auto state_a = r.copy();
  uint64_t after_a = r.mem->stored_bytes();
  // Ten more dirty pages: the next image stores ten more copies and shares the rest.
  for (int i = 0; i < 10; ++i) r.write(uint64_t(i) * 0x10000 + 5, 0xee);
  auto b = *r.mem->capture();
  auto state_b = r.copy();
  EXPECT_LE(r.mem->stored_bytes(), after_a + 10 * sizeof(PageCopy));
  EXPECT_LE(MemoryImage::differing_pages(*a, *b).size(), 10u);
  // Scribble, then go back to a and forward to b.
  for (int i = 0; i < 50; ++i) r.write(rng() % r.ram.size(), uint8_t(rng()));
  auto rewritten = r.mem->restore(a);
  ASSERT_TRUE(rewritten.has_value());
  EXPECT_LE(*rewritten, 60u);
  EXPECT_EQ(r.copy(), state_a);
  ASSERT_TRUE(r.mem->restore(b).has_value());
  EXPECT_EQ(r.copy(), state_b);
  // Restored pages go to the decode cache's VMM-write list, not into the dirty bitmap.
  EXPECT_FALSE(r.ram.take_vmm_dirty_pages().empty());
  EXPECT_EQ(*r.mem->pending_dirty_pages(), 0u);
  // Dropping an image frees what only it held.
  a.reset();
  EXPECT_LE(r.mem->stored_bytes(), after_a + 10 * sizeof(PageCopy));
}

TEST(CowMemory, RandomCheckpointsRestoreExactly) {
  Rig r;
  std::mt19937_64 rng(11);
  std::vector<std::shared_ptr<const MemoryImage>> images;
  std::vector<std::vector<uint8_t>> states;
  for (int round = 0; round < 12; ++round) {
    for (int i = 0; i < 30; ++i) r.write(rng() % r.ram.size(), uint8_t(rng()));
    images.push_back(*r.mem->capture());
    states.push_back(r.copy());
  }
  for (int i = 0; i < 40; ++i) {
    size_t k = rng() % images.size();
    if (rng() % 2) r.write(rng() % r.ram.size(), uint8_t(rng()));
    ASSERT_TRUE(r.mem->restore(images[k]).has_value());
    ASSERT_EQ(r.copy(), states[k]) << "restore of image " << k;
  }
}

TEST(CpuStateCodec, RoundTripsEveryFieldAndRefusesDamage) {
  CpuState st;
  for (int i = 0; i < kGprCount; ++i) st.gpr[i] = 0x0101010101010101ull * uint64_t(i);
  st.rip = 0xffffffff81000000ull;
  st.cs = SegmentReg{0, 0xffffffff, 0x10, 11, 0, true, true, false, true, true, false, false};
  st.fs.base = 0x7f0000001000;
  st.cr3 = 0x123000;
  st.efer = efer::kLme | efer::kLma;
  st.msrs.lstar = 0xffffffff81800000ull;
  for (size_t i = 0; i < st.fxsave.size(); ++i) st.fxsave[i] = uint8_t(i * 7);
  st.interrupt_shadow = true;
  auto blob = encode_cpu_state(st);
  auto back = decode_cpu_state(blob);
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(*back, st);
  auto shorter = blob;
  shorter.pop_back();
  EXPECT_FALSE(decode_cpu_state(shorter).has_value());
  auto wrong_tag = blob;
  wrong_tag[0] = 'X';
  EXPECT_FALSE(decode_cpu_state(wrong_tag).has_value());
}

}  // namespace
}  // namespace deja
