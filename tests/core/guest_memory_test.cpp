// Guest memory: sizes, checked access at the edges, VMM dirty tracking.
#include "core/guest_memory.h"

#include <gtest/gtest.h>

namespace deja {
namespace {

TEST(GuestMemory, RejectsBadSizes) {
  EXPECT_FALSE(GuestMemory::create(0));
  EXPECT_FALSE(GuestMemory::create((1 << 20) + 1));
  EXPECT_FALSE(GuestMemory::create(4096));
}

TEST(GuestMemory, CheckedAccessAtTheEdges) {
  auto mem = GuestMemory::create(1 << 20);
  ASSERT_TRUE(mem);
  EXPECT_TRUE(mem->span(Gpa{(1 << 20) - 4}, 4));
  EXPECT_FALSE(mem->span(Gpa{(1 << 20) - 3}, 4));
  EXPECT_FALSE(mem->span(Gpa{UINT64_MAX - 1}, 4));  // overflow must not wrap into RAM
  EXPECT_TRUE(mem->span(Gpa{1 << 20}, 0));
  auto bad = mem->span(Gpa{2 << 20}, 1);
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().message.find("outside RAM"), std::string::npos);
}

TEST(GuestMemory, VmmWritesAreTrackedPerPage) {
  auto mem = GuestMemory::create(1 << 20);
  ASSERT_TRUE(mem);
  std::vector<uint8_t> data(5000, 0xab);
  ASSERT_TRUE(mem->write(Gpa{4090}, data));
  auto pages = mem->take_vmm_dirty_pages();
  EXPECT_EQ(pages, (std::vector<uint64_t>{0, 1, 2}));
  EXPECT_TRUE(mem->take_vmm_dirty_pages().empty());
  std::vector<uint8_t> back(5000);
  ASSERT_TRUE(mem->read(Gpa{4090}, back));
  EXPECT_EQ(back, data);
}

// A backend that never drains the list (KVM) must not grow it per write: the fuzzer found 2 GiB of page numbers
// from loads into one RAM. Each page is on the list once until taken.
TEST(GuestMemory, VmmWriteListHoldsEachPageOnce) {
  auto mem = GuestMemory::create(1 << 20);
  ASSERT_TRUE(mem);
  const std::vector<uint8_t> data(8, 0xcd);
  for (int i = 0; i < 100000; ++i) ASSERT_TRUE(mem->write(Gpa{uint64_t(i % 3) * 4096}, data));
  EXPECT_EQ(mem->take_vmm_dirty_pages(), (std::vector<uint64_t>{0, 1, 2}));
  ASSERT_TRUE(mem->write(Gpa{4096}, data));
  EXPECT_EQ(mem->take_vmm_dirty_pages(), (std::vector<uint64_t>{1}));  // taking clears the dedupe bits too
}

TEST(ParseSize, UnitsAndErrors) {
  EXPECT_EQ(*parse_size("256M"), 256ull << 20);
  EXPECT_EQ(*parse_size("1G"), 1ull << 30);
  EXPECT_EQ(*parse_size("4096"), 4096u);
  EXPECT_FALSE(parse_size("12Q"));
  EXPECT_FALSE(parse_size("M"));
  EXPECT_FALSE(parse_size("99999999999999999999G"));
}

}  // namespace
}  // namespace deja
