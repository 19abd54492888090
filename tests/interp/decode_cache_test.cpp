// The decode cache stays within its capacity however much distinct code a guest runs (issue 11).
#include <gtest/gtest.h>

#include "interp/decoded_insn.h"

namespace deja::interp {
namespace {

DecodedInsn nop() {
  DecodedInsn insn;
  uint8_t bytes[] = {0x90};
  EXPECT_TRUE(decode_bytes(bytes, 1, kMode64, insn));
  return insn;
}

TEST(DecodeCache, ANopSledThroughAllOfRamStaysWithinTheCapacity) {
  constexpr uint64_t kRam = uint64_t{16} << 20, kCapacity = uint64_t{2} << 20;
  DecodeCache cache(kRam, kCapacity);
  const DecodedInsn insn = nop();
  uint64_t peak = 0;
  for (uint64_t gpa = 0; gpa < kRam; ++gpa) {
    DecodedInsn* entry = cache.insert(gpa, insn);
    ASSERT_NE(entry, nullptr);
    EXPECT_EQ(cache.find(gpa, kMode64), entry);  // what was just inserted is cached
    peak = std::max(peak, cache.bytes());
    if ((gpa & 0xfff) == 0) cache.release_retired();
  }
  EXPECT_LE(peak, kCapacity);
  EXPECT_GT(cache.flushes(), 0u);
  // Before the cap, about 115 bytes an instruction address: 16 M of them would have been 1.8 GB.
}

TEST(DecodeCache, AFlushChangesTheGenerationSoFetchPointersAreDropped) {
  DecodeCache cache(uint64_t{16} << 20, uint64_t{1} << 20);
  const DecodedInsn insn = nop();
  uint64_t generation = cache.generation();
  for (uint64_t gpa = 0; cache.flushes() == 0; ++gpa) cache.insert(gpa, insn);
  EXPECT_NE(cache.generation(), generation);
}

TEST(DecodeCache, InvalidatedPagesLeaveTheAccount) {
  DecodeCache cache(uint64_t{16} << 20);
  const DecodedInsn insn = nop();
  for (uint64_t gpa = 0; gpa < 4096 * 4; ++gpa) cache.insert(gpa, insn);
  const uint64_t four_pages = cache.bytes();
  cache.invalidate(0);
  cache.invalidate(1);
  EXPECT_LT(cache.bytes(), four_pages);
  cache.clear();
  EXPECT_EQ(cache.bytes(), 0u);
}

}  // namespace
}  // namespace deja::interp
