// AVX/AVX2/FMA/F16C datapath: floating point as the host's own VEX instruction in a generated stub under the guest's MXCSR; permutations, variable shifts and the reciprocal approximations in portable C++.
#include "interp/avx.h"

#include <cpuid.h>
#include <sys/mman.h>

#include <array>
#include <cmath>
#include <cstring>
#include <mutex>
#include <unordered_map>

namespace deja::interp::avx {
namespace {

// The stubs' code: a few 64 KiB RWX chunks, filled once and never freed (a stub is ~90 bytes; the distinct
// VEX floating-point encodings, immediates included, are a few tens of thousands at most).
class StubBuffer {
 public:
  using Fn = uint32_t (*)(HostOperands* ops, uint32_t run_mxcsr);

  Fn get(const HostInsn& insn) {
    const uint64_t key = uint64_t(insn.map) | uint64_t(insn.opcode) << 8 | uint64_t(insn.pp) << 16 |
                         uint64_t(insn.w) << 18 | uint64_t(insn.l) << 19 | uint64_t(insn.vvvv) << 20 |
                         uint64_t(insn.is4) << 21 | uint64_t(insn.imm + 1) << 24;
    std::lock_guard guard(lock_);
    if (auto it = stubs_.find(key); it != stubs_.end()) return it->second;
    Fn fn = emit(insn);
    stubs_.emplace(key, fn);
    return fn;
  }

 private:
  Fn emit(const HostInsn& insn) {
    // A fixed array, not a vector: GCC 12 at -O3 reports a false overflow for vector::insert of an initializer
    // list here (-Wstringop-overflow), and a stub is under 100 bytes.
    std::array<uint8_t, 128> c;
    size_t n = 0;
    auto bytes = [&](std::initializer_list<uint8_t> b) {
      for (uint8_t byte : b) c[n++] = byte;
    };
    bytes({0x48, 0x83, 0xec, 0x08});              // sub rsp, 8
    bytes({0x0f, 0xae, 0x1c, 0x24});              // stmxcsr [rsp]          (the host's)
    bytes({0xc5, 0xfe, 0x6f, 0x07});              // vmovdqu ymm0, [rdi]
    bytes({0xc5, 0xfe, 0x6f, 0x4f, 0x20});        // vmovdqu ymm1, [rdi+32]
    bytes({0xc5, 0xfe, 0x6f, 0x57, 0x40});        // vmovdqu ymm2, [rdi+64]
    bytes({0xc5, 0xfe, 0x6f, 0x5f, 0x60});        // vmovdqu ymm3, [rdi+96]
    bytes({0x89, 0x74, 0x24, 0x04});              // mov [rsp+4], esi
    bytes({0x0f, 0xae, 0x54, 0x24, 0x04});        // ldmxcsr [rsp+4]        (the guest's, masked)
    bytes({0xc4, uint8_t(0xe0 | insn.map),
           uint8_t((insn.w ? 0x80 : 0) | (insn.vvvv ? 0x0e : 0x0f) << 3 | (insn.l ? 4 : 0) | insn.pp), insn.opcode,
           0xc2});                                 // the instruction: reg ymm0, vvvv ymm1, rm ymm2
    if (insn.is4) c[n++] = 0x30;               // is4: ymm3
    else if (insn.imm >= 0) c[n++] = uint8_t(insn.imm);
    bytes({0x0f, 0xae, 0x5c, 0x24, 0x04});        // stmxcsr [rsp+4]
    bytes({0x0f, 0xae, 0x14, 0x24});              // ldmxcsr [rsp]
    bytes({0xc5, 0xfe, 0x7f, 0x07});              // vmovdqu [rdi], ymm0
    bytes({0xc5, 0xfe, 0x7f, 0x57, 0x40});        // vmovdqu [rdi+64], ymm2
    bytes({0x8b, 0x44, 0x24, 0x04});              // mov eax, [rsp+4]
    bytes({0x48, 0x83, 0xc4, 0x08});              // add rsp, 8
    bytes({0xc5, 0xf8, 0x77});                    // vzeroupper
    c[n++] = 0xc3;                                 // ret
    if (chunk_ == nullptr || used_ + n > kChunk) {
      void* p = mmap(nullptr, kChunk, PROT_READ | PROT_WRITE | PROT_EXEC, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (p == MAP_FAILED) return nullptr;
      chunk_ = static_cast<uint8_t*>(p);
      used_ = 0;
    }
    uint8_t* at = chunk_ + used_;
    std::memcpy(at, c.data(), n);
    used_ += (n + 15) & ~size_t{15};
    return reinterpret_cast<Fn>(at);
  }

  static constexpr size_t kChunk = 64 * 1024;
  std::mutex lock_;
  std::unordered_map<uint64_t, Fn> stubs_;
  uint8_t* chunk_ = nullptr;
  size_t used_ = 0;
};

StubBuffer& stubs() {
  static StubBuffer buffer;
  return buffer;
}

// As sse.cpp: the guest's rounding, DAZ and FTZ, no flags, every exception masked; raised flags folded into the
// guest MXCSR, the pre-computation exceptions (invalid, denormal, divide by zero) reported alone when one of
// them is unmasked.
uint32_t host_mxcsr(uint32_t guest) {
  return (guest & (sse::mxcsr::kRcMask | sse::mxcsr::kDaz | sse::mxcsr::kFtz)) | sse::mxcsr::kMasks;
}

HostResult settle(uint32_t guest, uint32_t host_after) {
  const uint32_t raised = host_after & sse::mxcsr::kFlags;
  const uint32_t masked = (guest & sse::mxcsr::kMasks) >> 7;
  const uint32_t pre = raised & (sse::mxcsr::kIe | sse::mxcsr::kDe | sse::mxcsr::kZe);
  if (pre & ~masked) return {guest | pre, true};
  return {guest | raised, (raised & ~masked) != 0};
}

uint32_t single_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float single_value(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

}  // namespace

HostResult run_host(const HostInsn& insn, HostOperands& ops, uint32_t guest_mxcsr) {
  StubBuffer::Fn fn = stubs().get(insn);
  if (!fn) return {guest_mxcsr | sse::mxcsr::kIe, true};  // (no executable memory: never seen; faults the guest)
  const uint32_t after = fn(&ops, host_mxcsr(guest_mxcsr));
  return settle(guest_mxcsr, after);
}

bool host_supports_avx() {
  static const bool supported = [] {
    unsigned eax, ebx, ecx, edx;
    if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return false;
    const unsigned needed = (1u << 12) | (1u << 27) | (1u << 28) | (1u << 29);  // FMA, OSXSAVE, AVX, F16C
    if ((ecx & needed) != needed) return false;
    if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) || !(ebx & (1u << 5))) return false;  // AVX2
    uint32_t xcr0_lo, xcr0_hi;
    asm volatile("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
    return (xcr0_lo & 6) == 6;
  }();
  return supported;
}

uint32_t rcp(uint32_t x) {
  const uint32_t sign = x & 0x80000000u, exponent = (x >> 23) & 0xff;
  if (exponent == 0xff) return (x & 0x7fffff) ? x | 0x400000 : sign;  // NaN quieted; 1/inf = 0
  if (exponent == 0) return sign | 0x7f800000u;                       // zero and denormals: infinity
  const uint32_t r = single_bits(float(1.0 / double(single_value(x))));
  return ((r >> 23) & 0xff) == 0 ? sign : r;                          // tiny results flushed
}

uint32_t rsqrt(uint32_t x) {
  const uint32_t sign = x & 0x80000000u, exponent = (x >> 23) & 0xff;
  if (exponent == 0xff && (x & 0x7fffff)) return x | 0x400000;
  if (exponent == 0) return sign | 0x7f800000u;
  if (sign) return 0xffc00000u;  // negative: the default NaN
  if (exponent == 0xff) return 0;
  return single_bits(float(1.0 / std::sqrt(double(single_value(x)))));
}

Ymm permd(const Ymm& index, const Ymm& src) {
  uint32_t s[8], idx[8], out[8];
  std::memcpy(s, &src, 32);
  std::memcpy(idx, &index, 32);
  for (int i = 0; i < 8; ++i) out[i] = s[idx[i] & 7];
  Ymm r;
  std::memcpy(static_cast<void*>(&r), out, 32);
  return r;
}

Ymm permq(const Ymm& src, uint8_t order) {
  Ymm r;
  for (unsigned i = 0; i < 4; ++i) r.set_q(i, src.q((order >> (2 * i)) & 3));
  return r;
}

Ymm perm2x128(const Ymm& a, const Ymm& b, uint8_t control) {
  const Xmm choices[4] = {a.lane[0], a.lane[1], b.lane[0], b.lane[1]};
  Ymm r;
  for (int half = 0; half < 2; ++half) {
    const uint8_t c = uint8_t(control >> (4 * half));
    r.lane[half] = (c & 8) ? Xmm{} : choices[c & 3];
  }
  return r;
}

Xmm shift_variable(VarShift op, Xmm a, Xmm counts) {
  if (op == VarShift::kSllQ || op == VarShift::kSrlQ) {
    auto shift = [&](uint64_t v, uint64_t n) -> uint64_t {
      if (n >= 64) return 0;
      return op == VarShift::kSllQ ? v << n : v >> n;
    };
    return {shift(a.lo, counts.lo), shift(a.hi, counts.hi)};
  }
  uint32_t v[4], n[4];
  std::memcpy(v, &a, 16);
  std::memcpy(n, &counts, 16);
  for (int i = 0; i < 4; ++i) {
    switch (op) {
      case VarShift::kSllD: v[i] = n[i] >= 32 ? 0 : v[i] << n[i]; break;
      case VarShift::kSrlD: v[i] = n[i] >= 32 ? 0 : v[i] >> n[i]; break;
      default: v[i] = uint32_t(int32_t(v[i]) >> (n[i] >= 32 ? 31 : n[i])); break;
    }
  }
  Xmm r;
  std::memcpy(static_cast<void*>(&r), v, 16);
  return r;
}

}  // namespace deja::interp::avx
