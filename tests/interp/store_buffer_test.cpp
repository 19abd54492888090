// x86-TSO store buffers (`--tso`): the FIFO's forwarding, capacity, seeded drain and saved state; the software CPU
// draining it at each ordering point.
#include <gtest/gtest.h>

#include <cstring>

#include "interp/store_buffer.h"
#include "tests/interp/interp_test_util.h"

namespace deja::test {
namespace {

using interp::StoreBuffer;

constexpr uint64_t kData = 0x180000;  // a data page away from the code (stores into code bypass the buffer)

StoreBufferPlan plan(uint32_t capacity = 50, uint32_t drain_mean = 64, uint64_t seed = 7) {
  return StoreBufferPlan{seed, capacity, drain_mean};
}

void push64(StoreBuffer& b, uint64_t gpa, uint64_t value, unsigned size = 8) { b.push(gpa, &value, size); }

TEST(StoreBuffer, ForwardsTheYoungestBytesOverMemoryByteForByte) {
  StoreBuffer b(plan(), 0);
  push64(b, 0x1000, 0x1122334455667788, 8);
  push64(b, 0x1002, 0xaabb, 2);   // overwrites bytes 2-3 of the first
  push64(b, 0x1007, 0xccdd, 2);   // straddles the first store's end
  uint8_t bytes[12];
  std::memset(bytes, 0xee, sizeof bytes);  // what memory holds at 0x0ffe..0x1009
  b.forward(0x0ffe, bytes, sizeof bytes);
  const uint8_t expected[12] = {0xee, 0xee, 0x88, 0x77, 0xbb, 0xaa, 0x44, 0x33, 0x22, 0xdd, 0xcc, 0xee};
  EXPECT_EQ(0, std::memcmp(bytes, expected, sizeof bytes));
  uint8_t untouched[4] = {1, 2, 3, 4};
  b.forward(0x2000, untouched, 4);
  EXPECT_EQ(untouched[0], 1);
  EXPECT_EQ(b.pop().gpa, 0x1000u);  // oldest first
  EXPECT_EQ(b.size(), 2u);
}

TEST(StoreBuffer, DrainDelaysAreSeededAndBounded) {
  auto delays = [](uint64_t seed, uint32_t vcpu) {
    StoreBuffer b(plan(50, 16, seed), vcpu);
    std::vector<int> out;
    for (int i = 0; i < 20; ++i) {
      push64(b, 0x1000, i);
      int n = 0;
      for (; !b.due(); ++n) b.retire();
      out.push_back(n);
      b.pop();
    }
    return out;
  };
  const std::vector<int> a = delays(1, 0);
  EXPECT_EQ(a, delays(1, 0));
  EXPECT_NE(a, delays(1, 1));  // each vCPU draws its own
  EXPECT_NE(a, delays(2, 0));
  for (int d : a) {
    EXPECT_GE(d, 1);
    EXPECT_LE(d, 32);
  }
  StoreBuffer empty(plan(), 0);
  empty.retire();
  EXPECT_FALSE(empty.due());
}

TEST(StoreBuffer, SavedStateContinuesTheSameAndBadStateIsRefused) {
  StoreBuffer b(plan(4, 100), 0);
  push64(b, 0x1000, 1);
  push64(b, 0x1004, 0xabcdef, 3);
  b.retire();
  const std::vector<uint8_t> saved = b.save();
  StoreBuffer c(plan(4, 100), 0);
  ASSERT_TRUE(c.restore(saved));
  EXPECT_EQ(c.save(), saved);
  int steps_b = 0, steps_c = 0;
  for (; !b.due(); ++steps_b) b.retire();
  for (; !c.due(); ++steps_c) c.retire();
  EXPECT_EQ(steps_b, steps_c);
  const StoreBuffer::Entry second = (c.pop(), c.pop());
  EXPECT_EQ(second.gpa, 0x1004u);
  EXPECT_EQ(second.size, 3);
  EXPECT_EQ(second.bytes[2], 0xab);

  std::vector<uint8_t> cut(saved.begin(), saved.end() - 1);
  EXPECT_FALSE(StoreBuffer(plan(4, 100), 0).restore(cut));
  EXPECT_FALSE(StoreBuffer(plan(1, 100), 0).restore(saved));  // two stores in a buffer of one
  std::vector<uint8_t> wide = saved;
  wide[4 + 1 + 8 + 8 + 4 + 8 + 8] = 200;  // the first store's size
  EXPECT_FALSE(StoreBuffer(plan(4, 100), 0).restore(wide));
}

// A vCPU with a store buffer whose stores wait far longer than the snippets run.
TestVm tso_vm(uint32_t capacity = 50) {
  TestVm vm = TestVm::long_mode();
  vm.cpu->enable_store_buffer(plan(capacity, 1u << 20), 0);
  return vm;
}

// Runs `n` instructions.
void run_instructions(TestVm& vm, uint64_t n) {
  ASSERT_TRUE(vm.cpu->set_instruction_budget(n));
  EXPECT_EQ(vm.run().kind, ExitKind::kKicked);
}

TEST(StoreBufferCpu, LoadsForwardFromTheBufferWhileMemoryWaits) {
  TestVm vm = tso_vm();
  vm.write64(kData, 0x1111);
  vm.code(fmt::format("mov rax, 0x2222\n mov qword ptr [{0}], rax\n mov word ptr [{0} + 6], 0x3333\n"
                      "mov rbx, [{0}]\n mov ecx, [{0} + 4]\n hlt\n", kData));
  run_instructions(vm, 5);
  EXPECT_EQ(vm.state().gpr[kRbx], 0x3333000000002222u);
  EXPECT_EQ(vm.state().gpr[kRcx], 0x33330000u);
  EXPECT_EQ(vm.read64(kData), 0x1111u);  // other vCPUs and devices still see memory
  EXPECT_EQ(vm.cpu->store_buffer()->size(), 2u);
  EXPECT_EQ(vm.run().kind, ExitKind::kHlt);  // HLT drains
  EXPECT_EQ(vm.read64(kData), 0x3333000000002222u);
}

TEST(StoreBufferCpu, OrderingInstructionsDrainItAndFencesForStoresDoNot) {
  struct Case {
    const char* instruction;
    bool drains;
  };
  const Case cases[] = {
      {"lock or dword ptr [0x181000], 0", true}, {"xchg [0x181000], rcx", true}, {"mfence", true},
      {"cpuid", true},  {"out 0xe9, al", true}, {"mov cr3, rax", true}, {"invlpg [0x181000]", true},
      {"int3", true},   {"sfence", false},      {"lfence", false},     {"xchg rcx, rdx", false},
      {"cmpxchg [0x181000], rcx", false},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.instruction);
    TestVm vm = tso_vm();
    vm.idt_gate(3, kCode + 0x800);
    vm.load(kCode + 0x800, assemble("nop\n nop\n hlt\n", kCode + 0x800));
    vm.code(fmt::format("mov rax, cr3\n mov qword ptr [{}], 5\n {}\n nop\n hlt\n", kData, c.instruction));
    run_instructions(vm, 3);
    EXPECT_EQ(vm.read64(kData), c.drains ? 5u : 0u);
  }
}

TEST(StoreBufferCpu, LockedInstructionStoresGoStraightToMemory) {
  TestVm vm = tso_vm();
  vm.code(fmt::format("mov qword ptr [{}], 1\n lock inc qword ptr [{} + 8]\n nop\n hlt\n", kData, kData));
  run_instructions(vm, 2);
  EXPECT_EQ(vm.read64(kData), 1u);
  EXPECT_EQ(vm.read64(kData + 8), 1u);
  EXPECT_TRUE(vm.cpu->store_buffer()->empty());
}

TEST(StoreBufferCpu, AFullBufferDrainsItsOldestStore) {
  TestVm vm = tso_vm(2);
  vm.code(fmt::format("mov qword ptr [{0}], 1\n mov qword ptr [{0} + 8], 2\n mov qword ptr [{0} + 16], 3\n hlt\n",
                      kData));
  run_instructions(vm, 3);
  EXPECT_EQ(vm.read64(kData), 1u);
  EXPECT_EQ(vm.read64(kData + 8), 0u);
  EXPECT_EQ(vm.read64(kData + 16), 0u);
  EXPECT_EQ(vm.cpu->store_buffer()->size(), 2u);
}

TEST(StoreBufferCpu, StoresDrainAfterTheirSeededDelay) {
  TestVm vm = TestVm::long_mode();
  vm.cpu->enable_store_buffer(plan(50, 4), 0);  // delays of 1 to 8 instructions
  vm.code(fmt::format("mov qword ptr [{}], 9\n .rept 20\n nop\n .endr\n hlt\n", kData));
  run_instructions(vm, 10);
  EXPECT_EQ(vm.read64(kData), 9u);
  EXPECT_TRUE(vm.cpu->store_buffer()->empty());
}

TEST(StoreBufferCpu, ItsOwnStoresIntoTheNextInstructionsAreFetched) {
  TestVm vm = tso_vm();
  vm.code("mov byte ptr [rip + patch], 0x90\n patch: hlt\n mov eax, 7\n hlt\n");
  EXPECT_EQ(vm.run().kind, ExitKind::kHlt);
  EXPECT_EQ(vm.state().gpr[kRax], 7u);  // the HLT became a NOP before it ran
}

TEST(StoreBufferCpu, RunsOnTheReferenceExecutorOnly) {
  TestVm vm = tso_vm();
  vm.cpu->set_mode(InterpMode::kJit);  // (asked for after: still the reference executor)
  vm.code(fmt::format("mov qword ptr [{}], 1\n .rept 100\n add rax, 1\n .endr\n hlt\n", kData));
  EXPECT_EQ(vm.run().kind, ExitKind::kHlt);
  EXPECT_EQ(vm.cpu->fast_stats().blocks_translated, 0u);
  EXPECT_EQ(vm.read64(kData), 1u);
}

}  // namespace
}  // namespace deja::test
