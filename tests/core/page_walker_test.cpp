// The debugger's page-table walker: every paging mode, large pages, faults, reads across pages.
#include <gtest/gtest.h>

#include "core/page_walker.h"

namespace deja {
namespace {

constexpr uint64_t P = 1, W = 2, U = 4, PS = 0x80;

struct Tables {
  GuestMemory ram = std::move(*GuestMemory::create(4 << 20));
  void put64(uint64_t gpa, uint64_t v) { ASSERT_TRUE(ram.write_obj(Gpa{gpa}, v).has_value()); }
  void put32(uint64_t gpa, uint32_t v) { ASSERT_TRUE(ram.write_obj(Gpa{gpa}, v).has_value()); }
};

CpuState long_mode(uint64_t cr3) {
  CpuState st;
  st.cr0 = cr0::kPe | cr0::kPg;
  st.cr4 = cr4::kPae;
  st.efer = efer::kLme | efer::kLma;
  st.cr3 = cr3;
  return st;
}

TEST(PageWalker, NoPagingIsIdentity) {
  Tables t;
  CpuState st;
  auto r = translate_gva(st, t.ram, 0x12345);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->gpa, 0x12345u);
  EXPECT_FALSE(translate_gva(st, t.ram, 0x100000000ull).has_value());  // beyond 32-bit linear addresses
}

TEST(PageWalker, FourLevelWith4KAnd2MPages) {
  Tables t;
  // PML4 at 0x1000, PDPT at 0x2000, PD at 0x3000, PT at 0x4000.
  t.put64(0x1000 + 8 * 1, 0x2000 | P | W);  // 512 GiB slot 1
  t.put64(0x2000, 0x3000 | P | W);
  t.put64(0x3000, 0x4000 | P | W);             // 0x8000000000: 4 KiB pages
  t.put64(0x4000 + 8 * 3, 0x200000 | P);       // page 3 -> 2 MiB
  t.put64(0x3000 + 8 * 1, 0x200000 | P | W | PS);  // 0x8000200000: a 2 MiB page
  CpuState st = long_mode(0x1000);
  auto r = translate_gva(st, t.ram, 0x8000003abcull);
  ASSERT_TRUE(r.has_value()) << r.error().message;
  EXPECT_EQ(r->gpa, 0x200abcu);
  EXPECT_FALSE(r->writable);
  auto big = translate_gva(st, t.ram, 0x8000212345ull);
  ASSERT_TRUE(big.has_value());
  EXPECT_EQ(big->gpa, 0x212345u);
  EXPECT_EQ(big->page_size, 2u << 20);
  auto missing = translate_gva(st, t.ram, 0x8000005000ull);
  ASSERT_FALSE(missing.has_value());
  EXPECT_NE(missing.error().message.find("page-table entry not present"), std::string::npos);
  EXPECT_FALSE(translate_gva(st, t.ram, 0x0000800000000000ull).has_value());  // not canonical
  // A table pointer outside RAM is an error, not a crash.
  t.put64(0x1000 + 8 * 2, 0x7fff0000000ull | P);
  EXPECT_FALSE(translate_gva(st, t.ram, 0x10000000000ull).has_value());
}

TEST(PageWalker, ThirtyTwoBitAndPae) {
  Tables t;
  CpuState st;
  st.cr0 = cr0::kPe | cr0::kPg;
  st.cr3 = 0x1000;
  t.put32(0x1000 + 4 * 1, 0x2000 | P | W | U);  // 4 MiB..8 MiB through a page table
  t.put32(0x2000 + 4 * 2, 0x300000 | P);
  st.cr4 = cr4::kPse;
  t.put32(0x1000 + 4 * 2, 0x000000 | P | PS);   // 8 MiB: a 4 MiB page at 0
  auto small = translate_gva(st, t.ram, 0x402010);
  ASSERT_TRUE(small.has_value());
  EXPECT_EQ(small->gpa, 0x300010u);
  auto large = translate_gva(st, t.ram, 0x812345);
  ASSERT_TRUE(large.has_value());
  EXPECT_EQ(large->gpa, 0x12345u);
  // PAE: PDPTEs at CR3.
  CpuState pae;
  pae.cr0 = cr0::kPe | cr0::kPg;
  pae.cr4 = cr4::kPae;
  pae.cr3 = 0x5000;
  t.put64(0x5000, 0x6000 | P);
  t.put64(0x6000, 0x7000 | P | W);
  t.put64(0x7000 + 8 * 1, 0x9000 | P);
  auto r = translate_gva(pae, t.ram, 0x1234);
  ASSERT_TRUE(r.has_value()) << r.error().message;
  EXPECT_EQ(r->gpa, 0x9234u);
}

TEST(PageWalker, ReadsStopAtTheFirstUnmappedPage) {
  Tables t;
  t.put64(0x1000, 0x2000 | P);
  t.put64(0x2000, 0x3000 | P);
  t.put64(0x3000, 0x4000 | P);
  t.put64(0x4000, 0x10000 | P);  // page 0 only
  uint8_t data[2] = {0xaa, 0xbb};
  ASSERT_TRUE(t.ram.write(Gpa{0x10ffe}, data).has_value());
  CpuState st = long_mode(0x1000);
  uint8_t out[8] = {};
  EXPECT_EQ(read_gva(st, t.ram, 0xffe, out), 2u);
  EXPECT_EQ(out[0], 0xaa);
  EXPECT_EQ(out[1], 0xbb);
}

}  // namespace
}  // namespace deja
