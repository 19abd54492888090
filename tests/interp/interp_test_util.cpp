// Test fixture implementation: binutils assembly, page tables, GDT/TSS/IDT setup for the interp tests.
#include "tests/interp/interp_test_util.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <sstream>

namespace deja::test {

std::vector<uint8_t> assemble(const std::string& source, uint64_t origin, int bits) {
  char dir_template[] = "/tmp/interp-test-XXXXXX";
  const char* dir = mkdtemp(dir_template);
  EXPECT_NE(dir, nullptr);
  std::string base = std::string(dir) + "/snippet";
  {
    std::ofstream out(base + ".s");
    out << ".intel_syntax noprefix\n" << (bits == 64 ? ".code64\n" : ".code32\n") << source << "\n";
  }
  // Always a 64-bit object: .code32 / .code64 switch the encoding, so one snippet can hold both.
  std::string command = fmt::format(
      "as --64 -o {0}.o {0}.s 2>{0}.err && ld -m elf_x86_64 -Ttext={1:#x} --oformat=binary -o {0}.bin {0}.o 2>>{0}.err",
      base, origin);
  int status = std::system(command.c_str());
  if (status != 0) {
    std::ifstream err(base + ".err");
    std::stringstream text;
    text << err.rdbuf();
    ADD_FAILURE() << "assembly failed:\n" << source << "\n" << text.str();
    return {};
  }
  std::ifstream bin(base + ".bin", std::ios::binary);
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(bin)), std::istreambuf_iterator<char>());
  std::system(fmt::format("rm -rf {}", dir).c_str());
  return bytes;
}

namespace {

uint64_t code_descriptor(bool long_mode, unsigned dpl) {
  // base 0, limit 0xfffff, G=1, P=1, S=1, type 0xb (execute/read, accessed)
  uint64_t d = 0xffff | (0xfull << 48) | (0xbull << 40) | (1ull << 44) | (uint64_t(dpl) << 45) | (1ull << 47) | (1ull << 55);
  if (long_mode) d |= 1ull << 53;
  else d |= 1ull << 54;
  return d;
}

uint64_t data_descriptor(unsigned dpl) {
  return 0xffff | (0xfull << 48) | (0x3ull << 40) | (1ull << 44) | (uint64_t(dpl) << 45) | (1ull << 47) | (1ull << 54) |
         (1ull << 55);
}

SegmentReg flat(uint16_t selector, uint8_t type, unsigned dpl, bool l, bool db) {
  SegmentReg s;
  s.selector = selector;
  s.base = 0;
  s.limit = 0xffffffff;
  s.type = type;
  s.dpl = uint8_t(dpl);
  s.present = true;
  s.s = true;
  s.l = l;
  s.db = db;
  s.g = true;
  return s;
}

TestVm make_vm(uint64_t ram, const CpuModel& model) {
  auto memory = GuestMemory::create(ram);
  EXPECT_TRUE(memory.has_value());
  TestVm vm{std::make_unique<GuestMemory>(std::move(*memory)), nullptr};
  vm.write64(kPml4, kPdpt | 7);
  vm.write64(kPdpt, kPd | 7);
  vm.write64(kPd, kPt | 7);
  for (uint64_t i = 1; i < 512; ++i) vm.write64(kPd + i * 8, (i << 21) | 0x87);
  for (uint64_t i = 0; i < 512; ++i) vm.write64(kPt + i * 8, (i << 12) | 7);
  vm.write64(kGdt + 0x08, code_descriptor(true, 0));
  vm.write64(kGdt + 0x10, data_descriptor(0));
  vm.write64(kGdt + 0x18, code_descriptor(false, 0));
  vm.write64(kGdt + 0x20, data_descriptor(3));
  vm.write64(kGdt + 0x28, code_descriptor(true, 3));
  // 64-bit available TSS at kTss, limit 0x67.
  uint64_t tss_lo = 0x67 | ((kTss & 0xffffff) << 16) | (0x9ull << 40) | (1ull << 47) | (((kTss >> 24) & 0xff) << 56);
  vm.write64(kGdt + 0x30, tss_lo);
  vm.write64(kGdt + 0x38, kTss >> 32);
  vm.cpu = std::make_unique<InterpBackend>(*vm.memory, model);
  return vm;
}

}  // namespace

TestVm TestVm::long_mode(uint64_t ram, const CpuModel& model) {
  TestVm vm = make_vm(ram, model);
  CpuState s = vm.state();
  s.cr0 = cr0::kPe | cr0::kPg | cr0::kEt | cr0::kWp | cr0::kNe | cr0::kMp;
  s.cr3 = kPml4;
  s.cr4 = cr4::kPae | cr4::kOsfxsr | cr4::kOsxmmexcpt;
  s.efer = efer::kLme | efer::kLma | efer::kSce | efer::kNxe;
  s.cs = flat(kCode64, 0xb, 0, true, false);
  s.ds = s.es = s.ss = flat(kData, 0x3, 0, false, true);
  s.fs = s.gs = flat(kData, 0x3, 0, false, true);
  s.tr = SegmentReg{kTss, 0x67, kTssSel, 0xb, 0, true, false, false, false, false, false, false};
  s.gdt = {kGdt, 0x3f};
  s.idt = {kIdt, 0xfff};
  s.ldt.unusable = true;
  s.rip = kCode;
  s.gpr[kRsp] = kStackTop;
  s.rflags = 2;
  vm.set_state(s);
  return vm;
}

TestVm TestVm::protected_mode(uint64_t ram) {
  TestVm vm = make_vm(ram, CpuModel::deja_v1());
  CpuState s = vm.state();
  s.cr0 = cr0::kPe | cr0::kEt;
  s.cs = flat(kCode32, 0xb, 0, false, true);
  s.ds = s.es = s.ss = s.fs = s.gs = flat(kData, 0x3, 0, false, true);
  s.gdt = {kGdt, 0x3f};
  s.ldt.unusable = true;
  s.tr = SegmentReg{0, 0xffff, 0, 0xb, 0, true, false, false, false, false, false, false};
  s.rip = kCode;
  s.gpr[kRax] = 0x2badb002;
  s.gpr[kRbx] = 0x9000;
  s.gpr[kRsp] = kStackTop;
  vm.set_state(s);
  return vm;
}

void TestVm::load(uint64_t gpa, const std::vector<uint8_t>& bytes) {
  ASSERT_TRUE(memory->write(Gpa{gpa}, bytes).has_value());
}

void TestVm::code(const std::string& source, int bits) { load(kCode, assemble(source, kCode, bits)); }

void TestVm::idt_gate(uint8_t vector, uint64_t handler, uint8_t ist, uint8_t dpl, uint8_t type) {
  uint64_t lo = (handler & 0xffff) | (uint64_t(kCode64) << 16) | (uint64_t(ist) << 32) | (uint64_t(type) << 40) |
                (uint64_t(dpl) << 45) | (1ull << 47) | (((handler >> 16) & 0xffff) << 48);
  write64(kIdt + vector * 16, lo);
  write64(kIdt + vector * 16 + 8, handler >> 32);
}

void TestVm::write64(uint64_t gpa, uint64_t value) { ASSERT_TRUE(memory->write_obj(Gpa{gpa}, value).has_value()); }

uint64_t TestVm::read64(uint64_t gpa) {
  uint64_t value = 0;
  EXPECT_TRUE(memory->read(Gpa{gpa}, std::span(reinterpret_cast<uint8_t*>(&value), 8)).has_value());
  return value;
}

CpuState TestVm::state() {
  if (!cpu) return CpuState{};
  return *cpu->get_state();
}

void TestVm::set_state(const CpuState& s) { ASSERT_TRUE(cpu->set_state(s).has_value()); }

VcpuExit TestVm::run() {
  for (int guard = 0; guard < 100000; ++guard) {
    auto exit = cpu->run();
    EXPECT_TRUE(exit.has_value());
    if (!exit) return VcpuExit{};
    if ((*exit)->kind == ExitKind::kIoOut && (*exit)->port == 0xe9) continue;
    return **exit;
  }
  ADD_FAILURE() << "guest did not stop";
  return VcpuExit{};
}

}  // namespace deja::test
