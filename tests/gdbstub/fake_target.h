// A gdb::Target without a machine: fixed registers, a small memory, resumes that record what they were asked.
#pragma once

#include <cstring>
#include <vector>

#include "gdbstub/target.h"

namespace deja::gdb {

class FakeTarget : public Target {
 public:
  FakeTarget() {
    for (int i = 0; i < kGprCount; ++i) state.gpr[i] = 0x1111111111111111ull * uint64_t(i + 1);
    state.rip = 0x100000;
    state.rflags = 0x246;
    state.cs.selector = 0x10;
    state.fs.base = 0xfedcba9876543210ull;
    state.cr3 = 0x1000;
    memory.resize(0x2000);
    for (size_t i = 0; i < memory.size(); ++i) memory[i] = uint8_t(i);
  }
  uint32_t threads() override { return vcpus; }
  uint32_t stopped_vcpu() override { return stopped; }
  Result<CpuState> registers(uint32_t vcpu) override {
    CpuState st = state;
    st.rip += vcpu;  // each vCPU tells itself apart by its RIP
    return st;
  }
  size_t read_virtual(uint32_t vcpu, uint64_t gva, std::span<uint8_t> out) override {
    reads_by.push_back(vcpu);
    if (gva >= memory.size()) return 0;
    size_t n = std::min<size_t>(out.size(), memory.size() - gva);
    std::memcpy(out.data(), memory.data() + gva, n);
    return n;
  }
  StopInfo resume(const ResumeRequest& request, const std::function<bool()>& interrupted) override {
    requests.push_back(request);
    if (interrupted && interrupted()) return {StopInfo::Why::kInterrupted};
    return next_stop;
  }
  std::string monitor(std::string_view command, const std::function<bool()>&) override {
    monitors.emplace_back(command);
    return "said: " + std::string(command) + "\n";
  }

  CpuState state;
  uint32_t vcpus = 1, stopped = 0;
  std::vector<uint32_t> reads_by;
  std::vector<uint8_t> memory;
  std::vector<ResumeRequest> requests;
  std::vector<std::string> monitors;
  StopInfo next_stop;
};

}  // namespace deja::gdb
