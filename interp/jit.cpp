// The software CPU's JIT: translated blocks compiled to host code (docs/interp.md, "The fast path").
//
// A block's code calls each operation's handler in turn (the guarded version, which cannot throw),
// with the operation's address as an immediate: no dispatch, every call predicted. Host register use:
// RBX holds the InterpBackend; everything else is scratch between operations.
#include "interp/jit.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

#include <fmt/format.h>

#include "interp/interp_backend.h"
#include "interp/x64_asm.h"

namespace deja {

namespace interp {

JitBuffer::JitBuffer(size_t bytes) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE | PROT_EXEC, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p != MAP_FAILED) {
    base_ = static_cast<uint8_t*>(p);
    capacity_ = bytes;
  }
  if (std::getenv("DEJA_PERF_MAP")) {
    const std::string path = fmt::format("/tmp/perf-{}.map", getpid());
    perf_map_ = open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  }
}

JitBuffer::~JitBuffer() {
  if (base_) munmap(base_, capacity_);
  if (perf_map_ >= 0) close(perf_map_);
}

void* JitBuffer::add(std::span<const uint8_t> code) {
  const size_t start = (used_ + 15) & ~size_t{15};
  if (!base_ || start + code.size() > capacity_) return nullptr;
  std::memcpy(base_ + start, code.data(), code.size());
  used_ = start + code.size();
  return base_ + start;
}

void JitBuffer::note_for_perf(const void* start, size_t size, uint64_t guest_rip) {
  if (perf_map_ < 0) return;
  const std::string line = fmt::format("{:x} {:x} deja-block-{:x}\n", reinterpret_cast<uintptr_t>(start), size, guest_rip);
  (void)!write(perf_map_, line.data(), line.size());
}

}  // namespace interp

using interp::Block;
using interp::Op;
namespace x64 = interp::x64;

namespace {
// Displacement of a member from the object's start, computed at run time (InterpBackend is not
// standard-layout, so offsetof does not apply).
template <typename T>
int32_t member_offset(const InterpBackend* self, const T* member) {
  return int32_t(reinterpret_cast<const char*>(member) - reinterpret_cast<const char*>(self));
}
}  // namespace

bool InterpBackend::compile_block(Block& block) {
  if (!jit_) jit_ = std::make_unique<interp::JitBuffer>();
  if (!jit_->ok()) return false;
  using x64::rax;
  using x64::rbx;
  using x64::rdi;
  using x64::rsi;
  x64::Assembler a;
  a.push(rbx);  // also aligns the stack for the calls below
  a.mov(8, rbx, rdi);
  x64::Label ended;
  for (const Op& op : block.ops) {
    a.mov(8, rdi, rbx);
    a.mov_imm64(rsi, reinterpret_cast<uint64_t>(&op));
    a.call_abs(reinterpret_cast<uint64_t>(op.jit_fn));
    a.test(8, rax, rax);
    a.jcc(x64::kE, ended);
  }
  a.bind(ended);
  a.load(8, rax, x64::at(rbx, member_offset(this, &running_op_)));
  a.pop(rbx);
  a.ret();

  // Room first: a full buffer drops every block (their code with it) before this one joins the cache.
  if (jit_->used() + a.size() + 16 > jit_->capacity()) {
    blocks_.clear();
    jit_->reset();
  }
  void* code = jit_->add(a.code);
  if (!code) return false;
  block.code = reinterpret_cast<Block::Code>(code);
  block.code_bytes = uint32_t(a.size());
  jit_->note_for_perf(code, a.size(), block.rip);
  return true;
}

const Op* InterpBackend::run_block(const Block& block) {
  if (block.code) {
    const Op* last = block.code(this);
    if (jit_trap_) [[unlikely]] {
      const uint8_t trap = jit_trap_;
      jit_trap_ = 0;
      if (trap == kJitFault) throw jit_fault_;
      throw ExitRequest{};
    }
    return last;
  }
  const Op* op = block.ops.data();
  do {
    running_op_ = op;
    op = op->fn(*this, op);
  } while (op);
  return running_op_;
}

}  // namespace deja
