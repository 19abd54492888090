// The VEX executor of the software CPU: AVX, AVX2, FMA and F16C on YMM registers (integer lanes through interp/sse.h, floating point on the host through interp/avx.h), gathers, masked moves, VZEROUPPER.
//
// A VEX.128 instruction zeroes bits 128-255 of its destination register; a VEX.256 one works on both 128-bit
// lanes, the SSE datapaths running once per lane with separate sources. Memory operands need no alignment except
// for VMOVAPS/VMOVAPD/VMOVDQA and the non-temporal moves (16 or 32 bytes, #GP otherwise).
#include <Zydis/Zydis.h>

#include <algorithm>
#include <cstring>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "interp/avx.h"
#include "interp/interp_backend.h"
#include "interp/simd_ops.h"
#include "interp/sse.h"
#include "interp/sse4.h"

namespace deja {

using interp::DecodedInsn;
using interp::OpEnc;
using interp::Operand;
using interp::OpKind;
using interp::avx::Ymm;
using interp::sse::Xmm;

namespace {

constexpr uint8_t kUd = 6, kNm = 7, kGp = 13, kXm = 19;
constexpr size_t kXmmOffset = 160, kMxcsrOffset = 24;

bool is_shift(interp::sse::IntOp op) {
  using IO = interp::sse::IntOp;
  return op == IO::kPsllw || op == IO::kPslld || op == IO::kPsllq || op == IO::kPsrlw || op == IO::kPsrld ||
         op == IO::kPsrlq || op == IO::kPsraw || op == IO::kPsrad;
}

// Floating-point instructions run on the host (avx::run_host).
bool runs_on_host(ZydisMnemonic m) {
  switch (m) {
    case ZYDIS_MNEMONIC_VADDPS: case ZYDIS_MNEMONIC_VADDPD: case ZYDIS_MNEMONIC_VADDSS: case ZYDIS_MNEMONIC_VADDSD:
    case ZYDIS_MNEMONIC_VSUBPS: case ZYDIS_MNEMONIC_VSUBPD: case ZYDIS_MNEMONIC_VSUBSS: case ZYDIS_MNEMONIC_VSUBSD:
    case ZYDIS_MNEMONIC_VMULPS: case ZYDIS_MNEMONIC_VMULPD: case ZYDIS_MNEMONIC_VMULSS: case ZYDIS_MNEMONIC_VMULSD:
    case ZYDIS_MNEMONIC_VDIVPS: case ZYDIS_MNEMONIC_VDIVPD: case ZYDIS_MNEMONIC_VDIVSS: case ZYDIS_MNEMONIC_VDIVSD:
    case ZYDIS_MNEMONIC_VMINPS: case ZYDIS_MNEMONIC_VMINPD: case ZYDIS_MNEMONIC_VMINSS: case ZYDIS_MNEMONIC_VMINSD:
    case ZYDIS_MNEMONIC_VMAXPS: case ZYDIS_MNEMONIC_VMAXPD: case ZYDIS_MNEMONIC_VMAXSS: case ZYDIS_MNEMONIC_VMAXSD:
    case ZYDIS_MNEMONIC_VSQRTPS: case ZYDIS_MNEMONIC_VSQRTPD: case ZYDIS_MNEMONIC_VSQRTSS: case ZYDIS_MNEMONIC_VSQRTSD:
    case ZYDIS_MNEMONIC_VADDSUBPS: case ZYDIS_MNEMONIC_VADDSUBPD: case ZYDIS_MNEMONIC_VHADDPS: case ZYDIS_MNEMONIC_VHADDPD:
    case ZYDIS_MNEMONIC_VHSUBPS: case ZYDIS_MNEMONIC_VHSUBPD:
    case ZYDIS_MNEMONIC_VCMPPS: case ZYDIS_MNEMONIC_VCMPPD: case ZYDIS_MNEMONIC_VCMPSS: case ZYDIS_MNEMONIC_VCMPSD:
    case ZYDIS_MNEMONIC_VCVTDQ2PD: case ZYDIS_MNEMONIC_VCVTDQ2PS: case ZYDIS_MNEMONIC_VCVTPD2DQ: case ZYDIS_MNEMONIC_VCVTPD2PS:
    case ZYDIS_MNEMONIC_VCVTPS2DQ: case ZYDIS_MNEMONIC_VCVTPS2PD: case ZYDIS_MNEMONIC_VCVTSD2SS: case ZYDIS_MNEMONIC_VCVTSS2SD:
    case ZYDIS_MNEMONIC_VCVTTPD2DQ: case ZYDIS_MNEMONIC_VCVTTPS2DQ:
    case ZYDIS_MNEMONIC_VROUNDPS: case ZYDIS_MNEMONIC_VROUNDPD: case ZYDIS_MNEMONIC_VROUNDSS: case ZYDIS_MNEMONIC_VROUNDSD:
    case ZYDIS_MNEMONIC_VDPPS: case ZYDIS_MNEMONIC_VDPPD:
    case ZYDIS_MNEMONIC_VCVTPH2PS: case ZYDIS_MNEMONIC_VCVTPS2PH:
      return true;
    default:
      return false;
  }
}

bool is_fma(const DecodedInsn& insn) { return insn.isa == interp::VexIsa::kFma; }

// FMA's PD and SD forms are VEX.W1; every other host instruction here is W0 or ignores W (so a guest in 32-bit
// mode, where W may be ignored, still gets a host encoding that is valid in 64-bit mode).
bool fma_double(ZydisMnemonic m) {
  const char* name = ZydisMnemonicGetString(m);
  const size_t n = std::strlen(name);
  return n > 2 && name[n - 1] == 'd' && (name[n - 2] == 'p' || name[n - 2] == 's');
}

uint8_t imm8(const DecodedInsn& insn) {
  for (int i = 0; i < insn.operand_count; ++i)
    if (insn.op[i].kind == OpKind::kImm) return uint8_t(insn.op[i].disp);
  return 0;
}

template <typename T, size_t N>
std::array<T, N> elements(const Ymm& y) {
  std::array<T, N> out;
  std::memcpy(out.data(), &y, sizeof(T) * N);
  return out;
}
template <typename T, size_t N>
Ymm from_elements(const std::array<T, N>& e) {
  Ymm y;
  std::memcpy(static_cast<void*>(&y), e.data(), sizeof(T) * N);
  return y;
}

}  // namespace

uint16_t interp::avx::legacy_mnemonic(uint16_t vex) {
  static const std::vector<uint16_t> table = [] {
    std::unordered_map<std::string_view, uint16_t> by_name;
    for (int m = 1; m <= ZYDIS_MNEMONIC_MAX_VALUE; ++m) by_name.emplace(ZydisMnemonicGetString(ZydisMnemonic(m)), uint16_t(m));
    std::vector<uint16_t> legacy(ZYDIS_MNEMONIC_MAX_VALUE + 1, ZYDIS_MNEMONIC_INVALID);
    for (int m = 1; m <= ZYDIS_MNEMONIC_MAX_VALUE; ++m) {
      const std::string_view name = ZydisMnemonicGetString(ZydisMnemonic(m));
      if (!name.starts_with('v')) continue;
      if (auto it = by_name.find(name.substr(1)); it != by_name.end()) legacy[size_t(m)] = it->second;
    }
    return legacy;
  }();
  return vex < table.size() ? table[vex] : uint16_t(ZYDIS_MNEMONIC_INVALID);
}

void InterpBackend::exec_avx(const DecodedInsn& insn) {
  using interp::VexIsa;
  if (insn.isa == VexIsa::kBmi1 || insn.isa == VexIsa::kBmi2) return exec_bmi(insn);
  // #UD: VEX outside protected mode, the model without the feature, the OS without AVX state (CR4.OSXSAVE,
  // XCR0.SSE and XCR0.AVX); then #NM for CR0.TS. (CR0.EM and CR4.OSFXSR do not apply to VEX.)
  if (!(s_.cr0 & cr0::kPe) || (s_.rflags & rflags::kVm) || !vex_features_[size_t(insn.isa)] ||
      !(s_.cr4 & cr4::kOsxsave) || (~s_.xcr0 & (xcr0::kSse | xcr0::kAvx)))
    raise_ud(insn, false);
  if (s_.cr0 & cr0::kTs) raise(kNm);

  const auto mnemonic = ZydisMnemonic(insn.mnemonic);
  const bool wide = insn.flags & interp::insn_flags::kVexL;  // (for the instructions with a 256-bit form)
  const Operand& dst = insn.op[0];
  const unsigned registers = mode64() ? 16 : 8;

  auto xmm_at = [&](unsigned n) { return s_.fxsave.data() + kXmmOffset + 16 * n; };
  auto ymm_get = [&](unsigned n) {
    Ymm y;
    std::memcpy(static_cast<void*>(&y.lane[0]), xmm_at(n), 16);
    std::memcpy(static_cast<void*>(&y.lane[1]), s_.ymmh.data() + 16 * n, 16);
    return y;
  };
  // Writes the whole register: a 128-bit result has its upper lane zero already.
  auto ymm_set = [&](unsigned n, const Ymm& y) {
    std::memcpy(xmm_at(n), &y.lane[0], 16);
    std::memcpy(s_.ymmh.data() + 16 * n, &y.lane[1], 16);
  };
  auto narrow = [&](Ymm y) {  // a VEX.128 result: bits 128-255 zero
    if (!wide) y.lane[1] = Xmm{};
    return y;
  };
  auto mxcsr = [&] {
    uint32_t value;
    std::memcpy(&value, s_.fxsave.data() + kMxcsrOffset, 4);
    return value;
  };
  auto set_mxcsr = [&](uint32_t value) { std::memcpy(s_.fxsave.data() + kMxcsrOffset, &value, 4); };
  const bool aligned = mnemonic == ZYDIS_MNEMONIC_VMOVAPS || mnemonic == ZYDIS_MNEMONIC_VMOVAPD ||
                       mnemonic == ZYDIS_MNEMONIC_VMOVDQA || mnemonic == ZYDIS_MNEMONIC_VMOVNTPS ||
                       mnemonic == ZYDIS_MNEMONIC_VMOVNTPD || mnemonic == ZYDIS_MNEMONIC_VMOVNTDQ ||
                       mnemonic == ZYDIS_MNEMONIC_VMOVNTDQA;
  // Memory: `n` bytes (zero-extended to 32) at operand i.
  auto read_bytes = [&](const Operand& op, unsigned n) {
    const uint64_t address = effective_address(op, insn);
    if (aligned && (address & (n - 1))) raise(kGp, 0, true);
    uint8_t bytes[32] = {};
    for (unsigned at = 0; at < n; at += 8) {
      const unsigned chunk = std::min(8u, n - at);
      const uint64_t v = read_mem(op.seg, address + at, chunk);
      std::memcpy(bytes + at, &v, chunk);
    }
    Ymm y;
    std::memcpy(static_cast<void*>(&y), bytes, 32);
    return y;
  };
  auto write_bytes = [&](const Operand& op, const Ymm& y, unsigned n) {
    const uint64_t address = effective_address(op, insn);
    if (aligned && (address & (n - 1))) raise(kGp, 0, true);
    probe_write(op.seg, address, n);  // (all or nothing)
    uint8_t bytes[32];
    std::memcpy(bytes, &y, 32);
    for (unsigned at = 0; at < n; at += 8) {
      const unsigned chunk = std::min(8u, n - at);
      uint64_t v = 0;
      std::memcpy(&v, bytes + at, chunk);
      write_mem(op.seg, address + at, chunk, v);
    }
  };
  // Operand i as a vector: a register whole, memory its size, a GPR zero-extended.
  auto load = [&](int i) -> Ymm {
    const Operand& op = insn.op[i];
    if (op.kind == OpKind::kXmm) return ymm_get(op.reg);
    if (op.kind == OpKind::kMem) return read_bytes(op, op.size);
    if (op.kind == OpKind::kGpr) {
      Ymm y;
      y.lane[0].lo = reg_read(op.reg, op.size);
      return y;
    }
    raise_ud(insn, true);
  };
  // Stores `y` into operand i: a register whole (narrowed for VEX.128), memory its size.
  auto store = [&](int i, const Ymm& y) {
    const Operand& op = insn.op[i];
    if (op.kind == OpKind::kXmm) ymm_set(op.reg, narrow(y));
    else if (op.kind == OpKind::kMem) write_bytes(op, y, op.size);
    else raise_ud(insn, true);
  };
  auto store_xmm = [&](int i, const Xmm& x) {  // an XMM result: bits 128-255 zero
    Ymm y;
    y.lane[0] = x;
    const Operand& op = insn.op[i];
    if (op.kind == OpKind::kXmm) ymm_set(op.reg, y);
    else write_bytes(op, y, op.size);
  };
  auto per_lane = [&](const Ymm& a, const Ymm& b, auto&& f) {
    Ymm r;
    for (int l = 0; l < (wide ? 2 : 1); ++l) r.lane[l] = f(a.lane[l], b.lane[l], l);
    return r;
  };
  auto fault_xm = [&] { raise((s_.cr4 & cr4::kOsxmmexcpt) ? kXm : kUd); };

  // ---- floating point on the host --------------------------------------------------------------------------
  if (runs_on_host(mnemonic) || is_fma(insn)) {
    interp::avx::HostInsn h;
    h.map = insn.opcode_map;
    h.opcode = insn.opcode;
    h.pp = insn.vex_pp;
    h.l = wide;
    h.w = is_fma(insn) && fma_double(mnemonic);
    interp::avx::HostOperands ops;
    for (int i = 0; i < insn.operand_count; ++i) {
      const Operand& op = insn.op[i];
      if (op.kind == OpKind::kImm) {
        h.imm = int16_t(uint8_t(op.disp));
        continue;
      }
      // The destination's old value as an input too (FMA, and the scalar forms' upper bits come from it).
      const Ymm value = (i == 0 && op.kind == OpKind::kMem) ? Ymm{} : load(i);
      switch (op.enc) {
        case OpEnc::kModrmReg: ops.reg = value; break;
        case OpEnc::kVvvv: ops.vvvv = value; h.vvvv = true; break;
        case OpEnc::kModrmRm: ops.rm = value; break;
        case OpEnc::kIs4: ops.is4 = value; h.is4 = true; break;
        default: raise_ud(insn, true);
      }
    }
    const interp::avx::HostResult r = interp::avx::run_host(h, ops, mxcsr());
    set_mxcsr(r.mxcsr);
    if (r.fault) fault_xm();
    const Ymm& result = dst.enc == OpEnc::kModrmRm ? ops.rm : ops.reg;
    if (dst.kind == OpKind::kMem) write_bytes(dst, result, dst.size);
    else ymm_set(dst.reg, result);
    return;
  }

  // The packed-integer operations of SSE2-SSE4.2 (interp/sse.h, interp/sse4.h), once a lane.
  const uint16_t legacy = interp::avx::legacy_mnemonic(insn.mnemonic);
  if (const auto op = interp::int_op_of(legacy)) {
    const Ymm a = load(1);
    if (insn.op[2].kind == OpKind::kImm) {  // shifts by an immediate
      const uint8_t count = uint8_t(insn.op[2].disp);
      store(0, per_lane(a, a, [&](Xmm x, Xmm, int) { return interp::sse::shift_imm(*op, x, count); }));
    } else if (is_shift(*op)) {  // by the count in an XMM register or m128, both lanes
      const Xmm count = load(2).lane[0];
      store(0, per_lane(a, a, [&](Xmm x, Xmm, int) { return interp::sse::int_binary(*op, x, count); }));
    } else {
      store(0, per_lane(a, load(2), [&](Xmm x, Xmm y, int) { return interp::sse::int_binary(*op, x, y); }));
    }
    return;
  }
  if (const auto op = interp::ext_op_of(legacy)) {
    // One source (PABS*, PMOVSX/PMOVZX, PHMINPOSUW) or two. A 256-bit PMOVSX/PMOVZX widens the low 16 bytes of
    // its source: its upper lane from the bytes after those of the lower one.
    const bool unary = insn.operand_count == 2;
    const Ymm a = unary ? Ymm{} : load(1), b = load(unary ? 1 : 2);
    const bool widens = *op >= interp::sse::ExtOp::kPmovsxbw && *op <= interp::sse::ExtOp::kPmovzxdq;
    store(0, per_lane(a, b, [&](Xmm x, Xmm y, int l) {
            if (widens && l == 1) y = interp::sse::psrldq(b.lane[0], uint8_t(interp::sse::pmov_source_bytes(*op)));
            return interp::sse::ext_binary(*op, x, y);
          }));
    return;
  }

  switch (mnemonic) {
    // ---- moves ----
    case ZYDIS_MNEMONIC_VMOVAPS: case ZYDIS_MNEMONIC_VMOVAPD: case ZYDIS_MNEMONIC_VMOVDQA:
    case ZYDIS_MNEMONIC_VMOVUPS: case ZYDIS_MNEMONIC_VMOVUPD: case ZYDIS_MNEMONIC_VMOVDQU:
    case ZYDIS_MNEMONIC_VMOVNTPS: case ZYDIS_MNEMONIC_VMOVNTPD: case ZYDIS_MNEMONIC_VMOVNTDQ:
    case ZYDIS_MNEMONIC_VMOVNTDQA: case ZYDIS_MNEMONIC_VLDDQU:
      store(0, load(1));
      return;
    case ZYDIS_MNEMONIC_VMOVD: case ZYDIS_MNEMONIC_VMOVQ: {
      const Operand& src = insn.op[1];
      if (dst.kind == OpKind::kXmm) {
        const unsigned n = src.kind == OpKind::kXmm ? 8 : src.size;
        const uint64_t v = load(1).lane[0].lo;
        store_xmm(0, Xmm{n == 8 ? v : v & 0xffffffffu, 0});
      } else if (dst.kind == OpKind::kGpr) {
        reg_write(dst.reg, dst.size, ymm_get(src.reg).lane[0].lo);
      } else {
        write_bytes(dst, ymm_get(src.reg), dst.size);
      }
      return;
    }
    case ZYDIS_MNEMONIC_VMOVSS: case ZYDIS_MNEMONIC_VMOVSD: {
      const uint64_t low = mnemonic == ZYDIS_MNEMONIC_VMOVSD ? ~0ull : 0xffffffffull;
      if (insn.operand_count == 3) {  // xmm1, xmm2, xmm3: xmm3's low element, xmm2's others
        Xmm r = ymm_get(insn.op[1].reg).lane[0];
        r.lo = (r.lo & ~low) | (ymm_get(insn.op[2].reg).lane[0].lo & low);
        store_xmm(0, r);
      } else if (dst.kind == OpKind::kXmm) {
        store_xmm(0, Xmm{load(1).lane[0].lo & low, 0});
      } else {
        write_bytes(dst, ymm_get(insn.op[1].reg), dst.size);
      }
      return;
    }
    case ZYDIS_MNEMONIC_VMOVLPS: case ZYDIS_MNEMONIC_VMOVLPD: case ZYDIS_MNEMONIC_VMOVHPS: case ZYDIS_MNEMONIC_VMOVHPD: {
      const bool high = mnemonic == ZYDIS_MNEMONIC_VMOVHPS || mnemonic == ZYDIS_MNEMONIC_VMOVHPD;
      if (dst.kind == OpKind::kMem) {
        const Xmm s = ymm_get(insn.op[1].reg).lane[0];
        Ymm y;
        y.lane[0].lo = high ? s.hi : s.lo;
        write_bytes(dst, y, 8);
      } else {
        Xmm r = ymm_get(insn.op[1].reg).lane[0];
        (high ? r.hi : r.lo) = load(2).lane[0].lo;
        store_xmm(0, r);
      }
      return;
    }
    case ZYDIS_MNEMONIC_VMOVHLPS:
      store_xmm(0, Xmm{ymm_get(insn.op[2].reg).lane[0].hi, ymm_get(insn.op[1].reg).lane[0].hi});
      return;
    case ZYDIS_MNEMONIC_VMOVLHPS:
      store_xmm(0, Xmm{ymm_get(insn.op[1].reg).lane[0].lo, ymm_get(insn.op[2].reg).lane[0].lo});
      return;
    case ZYDIS_MNEMONIC_VMOVDDUP: {
      const Ymm s = load(1);
      store(0, per_lane(s, s, [](Xmm x, Xmm, int) { return Xmm{x.lo, x.lo}; }));
      return;
    }
    case ZYDIS_MNEMONIC_VMOVSLDUP: case ZYDIS_MNEMONIC_VMOVSHDUP: {
      const bool odd = mnemonic == ZYDIS_MNEMONIC_VMOVSHDUP;
      const Ymm s = load(1);
      store(0, per_lane(s, s, [&](Xmm x, Xmm, int) {
              const uint64_t a = odd ? x.lo >> 32 : x.lo & 0xffffffffu, b = odd ? x.hi >> 32 : x.hi & 0xffffffffu;
              return Xmm{a | a << 32, b | b << 32};
            }));
      return;
    }
    case ZYDIS_MNEMONIC_VPMOVMSKB: case ZYDIS_MNEMONIC_VMOVMSKPS: case ZYDIS_MNEMONIC_VMOVMSKPD: {
      const Ymm s = ymm_get(insn.op[1].reg);
      uint32_t mask = 0;
      for (int l = 0; l < (wide ? 2 : 1); ++l) {
        if (mnemonic == ZYDIS_MNEMONIC_VPMOVMSKB) mask |= interp::sse::pmovmskb(s.lane[l]) << (16 * l);
        else if (mnemonic == ZYDIS_MNEMONIC_VMOVMSKPS) mask |= interp::sse::movmskps(s.lane[l]) << (4 * l);
        else mask |= interp::sse::movmskpd(s.lane[l]) << (2 * l);
      }
      reg_write(dst.reg, dst.size, mask);
      return;
    }
    // Both put what they zero in its initial configuration (XINUSE: AVX, and for VZEROALL SSE too, as Intel's do).
    case ZYDIS_MNEMONIC_VZEROUPPER:
      std::fill(s_.ymmh.begin(), s_.ymmh.begin() + 16 * registers, uint8_t{0});
      s_.xinuse &= ~xcr0::kAvx;
      return;
    case ZYDIS_MNEMONIC_VZEROALL:
      std::fill(s_.ymmh.begin(), s_.ymmh.begin() + 16 * registers, uint8_t{0});
      std::fill(s_.fxsave.begin() + kXmmOffset, s_.fxsave.begin() + long(kXmmOffset + 16 * registers), uint8_t{0});
      s_.xinuse &= ~(xcr0::kSse | xcr0::kAvx);
      return;
    case ZYDIS_MNEMONIC_VLDMXCSR: {
      const uint32_t value = uint32_t(read_mem(dst.seg, effective_address(dst, insn), 4));
      if (value & ~interp::sse::mxcsr::kWritable) raise(kGp, 0, true);
      set_mxcsr(value);
      return;
    }
    case ZYDIS_MNEMONIC_VSTMXCSR:
      write_mem(dst.seg, effective_address(dst, insn), 4, mxcsr());
      return;

    // ---- broadcasts, inserts, extracts, permutations ----
    case ZYDIS_MNEMONIC_VBROADCASTSS: case ZYDIS_MNEMONIC_VBROADCASTSD: case ZYDIS_MNEMONIC_VPBROADCASTB:
    case ZYDIS_MNEMONIC_VPBROADCASTW: case ZYDIS_MNEMONIC_VPBROADCASTD: case ZYDIS_MNEMONIC_VPBROADCASTQ: {
      const unsigned n = mnemonic == ZYDIS_MNEMONIC_VPBROADCASTB ? 1 : mnemonic == ZYDIS_MNEMONIC_VPBROADCASTW ? 2
                       : (mnemonic == ZYDIS_MNEMONIC_VBROADCASTSD || mnemonic == ZYDIS_MNEMONIC_VPBROADCASTQ) ? 8 : 4;
      const uint64_t v = load(1).lane[0].lo;
      uint8_t bytes[32];
      for (unsigned at = 0; at < 32; at += n) std::memcpy(bytes + at, &v, n);
      Ymm y;
      std::memcpy(static_cast<void*>(&y), bytes, 32);
      store(0, y);
      return;
    }
    case ZYDIS_MNEMONIC_VBROADCASTF128: case ZYDIS_MNEMONIC_VBROADCASTI128: {
      const Xmm x = load(1).lane[0];
      store(0, Ymm{{x, x}});
      return;
    }
    case ZYDIS_MNEMONIC_VINSERTF128: case ZYDIS_MNEMONIC_VINSERTI128: {
      Ymm r = load(1);
      r.lane[imm8(insn) & 1] = load(2).lane[0];
      store(0, r);
      return;
    }
    case ZYDIS_MNEMONIC_VEXTRACTF128: case ZYDIS_MNEMONIC_VEXTRACTI128:
      store_xmm(0, load(1).lane[imm8(insn) & 1]);
      return;
    case ZYDIS_MNEMONIC_VPERM2F128: case ZYDIS_MNEMONIC_VPERM2I128:
      store(0, interp::avx::perm2x128(load(1), load(2), imm8(insn)));
      return;
    case ZYDIS_MNEMONIC_VPERMD: case ZYDIS_MNEMONIC_VPERMPS:
      store(0, interp::avx::permd(load(1), load(2)));
      return;
    case ZYDIS_MNEMONIC_VPERMQ: case ZYDIS_MNEMONIC_VPERMPD:
      store(0, interp::avx::permq(load(1), imm8(insn)));
      return;
    case ZYDIS_MNEMONIC_VPERMILPS: {
      const Ymm a = load(1);
      const bool by_imm = insn.op[2].kind == OpKind::kImm;
      const Ymm control = by_imm ? Ymm{} : load(2);
      const uint8_t order = imm8(insn);
      const auto s = elements<uint32_t, 8>(a), c = elements<uint32_t, 8>(control);
      std::array<uint32_t, 8> r{};
      for (int i = 0; i < 8; ++i) r[i] = s[(i & 4) | (by_imm ? (order >> (2 * (i & 3))) & 3 : c[i] & 3)];
      store(0, from_elements(r));
      return;
    }
    case ZYDIS_MNEMONIC_VPERMILPD: {
      const Ymm a = load(1);
      const bool by_imm = insn.op[2].kind == OpKind::kImm;
      const Ymm control = by_imm ? Ymm{} : load(2);
      const uint8_t order = imm8(insn);
      Ymm r;
      for (unsigned i = 0; i < 4; ++i) r.set_q(i, a.q((i & 2) | (by_imm ? (order >> i) & 1 : (control.q(i) >> 1) & 1)));
      store(0, r);
      return;
    }
    case ZYDIS_MNEMONIC_VPSHUFD: case ZYDIS_MNEMONIC_VPSHUFHW: case ZYDIS_MNEMONIC_VPSHUFLW: {
      const Ymm s = load(1);
      const uint8_t order = imm8(insn);
      store(0, per_lane(s, s, [&](Xmm x, Xmm, int) {
              return mnemonic == ZYDIS_MNEMONIC_VPSHUFD ? interp::sse::pshufd(x, order)
                     : mnemonic == ZYDIS_MNEMONIC_VPSHUFHW ? interp::sse::pshufhw(x, order)
                                                            : interp::sse::pshuflw(x, order);
            }));
      return;
    }
    case ZYDIS_MNEMONIC_VSHUFPS: case ZYDIS_MNEMONIC_VSHUFPD: {
      const uint8_t order = imm8(insn);
      store(0, per_lane(load(1), load(2), [&](Xmm x, Xmm y, int l) {
              return mnemonic == ZYDIS_MNEMONIC_VSHUFPS ? interp::sse::shufps(x, y, order)
                                                        : interp::sse::shufpd(x, y, uint8_t(order >> (2 * l)));
            }));
      return;
    }
    case ZYDIS_MNEMONIC_VPSLLDQ: case ZYDIS_MNEMONIC_VPSRLDQ: {
      const uint8_t bytes = imm8(insn);
      const Ymm s = load(1);
      store(0, per_lane(s, s, [&](Xmm x, Xmm, int) {
              return mnemonic == ZYDIS_MNEMONIC_VPSLLDQ ? interp::sse::pslldq(x, bytes) : interp::sse::psrldq(x, bytes);
            }));
      return;
    }
    case ZYDIS_MNEMONIC_VPSLLVD: case ZYDIS_MNEMONIC_VPSLLVQ: case ZYDIS_MNEMONIC_VPSRLVD: case ZYDIS_MNEMONIC_VPSRLVQ:
    case ZYDIS_MNEMONIC_VPSRAVD: {
      using VS = interp::avx::VarShift;
      const VS op = mnemonic == ZYDIS_MNEMONIC_VPSLLVD ? VS::kSllD : mnemonic == ZYDIS_MNEMONIC_VPSLLVQ ? VS::kSllQ
                  : mnemonic == ZYDIS_MNEMONIC_VPSRLVD ? VS::kSrlD : mnemonic == ZYDIS_MNEMONIC_VPSRLVQ ? VS::kSrlQ
                                                                                                       : VS::kSraD;
      store(0, per_lane(load(1), load(2), [&](Xmm x, Xmm n, int) { return interp::avx::shift_variable(op, x, n); }));
      return;
    }

    case ZYDIS_MNEMONIC_VPALIGNR: {
      const uint8_t bytes = imm8(insn);
      store(0, per_lane(load(1), load(2), [&](Xmm x, Xmm y, int) { return interp::sse::palignr(x, y, bytes); }));
      return;
    }
    case ZYDIS_MNEMONIC_VMPSADBW: {  // (the upper lane takes its offsets from imm8[5:3])
      const uint8_t control = imm8(insn);
      store(0, per_lane(load(1), load(2),
                        [&](Xmm x, Xmm y, int l) { return interp::sse::mpsadbw(x, y, uint8_t(control >> (3 * l))); }));
      return;
    }
    case ZYDIS_MNEMONIC_VPCMPESTRI: case ZYDIS_MNEMONIC_VPCMPESTRM: case ZYDIS_MNEMONIC_VPCMPISTRI:
    case ZYDIS_MNEMONIC_VPCMPISTRM: {
      // As the legacy forms (interp/sse4.h), except that the mask result zeroes bits 128-255 of YMM0.
      const uint8_t control = imm8(insn);
      const Xmm a = load(0).lane[0], b = load(1).lane[0];
      const bool explicit_lengths = mnemonic == ZYDIS_MNEMONIC_VPCMPESTRI || mnemonic == ZYDIS_MNEMONIC_VPCMPESTRM;
      const bool rex_w = insn.flags & interp::insn_flags::kRexW;
      const unsigned length_a = explicit_lengths ? interp::sse::explicit_length(s_.gpr[kRax], rex_w, control)
                                                 : interp::sse::implicit_length(a, control);
      const unsigned length_b = explicit_lengths ? interp::sse::explicit_length(s_.gpr[kRdx], rex_w, control)
                                                 : interp::sse::implicit_length(b, control);
      const auto r = interp::sse::string_compare(a, length_a, b, length_b, control, s_.rflags);
      if (mnemonic == ZYDIS_MNEMONIC_VPCMPESTRI || mnemonic == ZYDIS_MNEMONIC_VPCMPISTRI) {
        s_.gpr[kRcx] = interp::sse::string_index(r, control);
      } else {
        Ymm y;
        y.lane[0] = interp::sse::string_mask(r, control);
        ymm_set(0, y);
      }
      s_.rflags = r.rflags | 2;
      return;
    }

    // ---- blends ----
    case ZYDIS_MNEMONIC_VBLENDPS: case ZYDIS_MNEMONIC_VBLENDPD: case ZYDIS_MNEMONIC_VPBLENDD: case ZYDIS_MNEMONIC_VPBLENDW: {
      // Element i from the second source where bit i of imm8 is set (VPBLENDW: bit i mod 8, in each lane).
      const unsigned size = mnemonic == ZYDIS_MNEMONIC_VBLENDPD ? 8 : mnemonic == ZYDIS_MNEMONIC_VPBLENDW ? 2 : 4;
      const uint8_t select = imm8(insn);
      const Ymm a = load(1), b = load(2);
      uint8_t ra[32], rb[32];
      std::memcpy(ra, &a, 32);
      std::memcpy(rb, &b, 32);
      for (unsigned i = 0; i < 32 / size; ++i)
        if ((select >> (size == 2 ? i & 7 : i)) & 1) std::memcpy(ra + i * size, rb + i * size, size);
      Ymm r;
      std::memcpy(static_cast<void*>(&r), ra, 32);
      store(0, r);
      return;
    }
    case ZYDIS_MNEMONIC_VBLENDVPS: case ZYDIS_MNEMONIC_VBLENDVPD: case ZYDIS_MNEMONIC_VPBLENDVB: {
      // Element i from the second source where the sign bit of element i of the fourth operand is set.
      const unsigned size = mnemonic == ZYDIS_MNEMONIC_VBLENDVPS ? 4 : mnemonic == ZYDIS_MNEMONIC_VBLENDVPD ? 8 : 1;
      const Ymm a = load(1), b = load(2), mask = load(3);
      uint8_t ra[32], rb[32], rm[32];
      std::memcpy(ra, &a, 32);
      std::memcpy(rb, &b, 32);
      std::memcpy(rm, &mask, 32);
      for (unsigned i = 0; i < 32 / size; ++i)
        if (rm[i * size + size - 1] & 0x80) std::memcpy(ra + i * size, rb + i * size, size);
      Ymm r;
      std::memcpy(static_cast<void*>(&r), ra, 32);
      store(0, r);
      return;
    }

    // ---- tests ----
    case ZYDIS_MNEMONIC_VPTEST: case ZYDIS_MNEMONIC_VTESTPS: case ZYDIS_MNEMONIC_VTESTPD: {
      // ZF: (a AND b) is zero, CF: (NOT a AND b) is zero, over all bits (VPTEST) or the sign bits; OF, AF, SF and
      // PF cleared.
      const Ymm a = load(0), b = load(1);
      const uint64_t sign = mnemonic == ZYDIS_MNEMONIC_VPTEST ? ~0ull
                            : mnemonic == ZYDIS_MNEMONIC_VTESTPS ? 0x8000000080000000ull : 0x8000000000000000ull;
      uint64_t and_bits = 0, andn_bits = 0;
      for (unsigned i = 0; i < (wide ? 4u : 2u); ++i) {
        and_bits |= a.q(i) & b.q(i) & sign;
        andn_bits |= ~a.q(i) & b.q(i) & sign;
      }
      s_.rflags &= ~interp::kArithFlags;
      if (and_bits == 0) s_.rflags |= interp::kZf;
      if (andn_bits == 0) s_.rflags |= interp::kCf;
      return;
    }

    // ---- with general registers ----
    case ZYDIS_MNEMONIC_VPEXTRB: case ZYDIS_MNEMONIC_VPEXTRW: case ZYDIS_MNEMONIC_VPEXTRD: case ZYDIS_MNEMONIC_VPEXTRQ:
    case ZYDIS_MNEMONIC_VEXTRACTPS: {
      const unsigned n = mnemonic == ZYDIS_MNEMONIC_VPEXTRB ? 1 : mnemonic == ZYDIS_MNEMONIC_VPEXTRW ? 2
                       : mnemonic == ZYDIS_MNEMONIC_VPEXTRQ ? 8 : 4;
      const Ymm s = ymm_get(insn.op[1].reg);
      uint8_t bytes[16];
      std::memcpy(bytes, &s.lane[0], 16);
      uint64_t v = 0;
      std::memcpy(&v, bytes + (imm8(insn) & (16 / n - 1)) * n, n);
      if (dst.kind == OpKind::kGpr) {
        reg_write(dst.reg, dst.size >= 4 ? dst.size : 4, v);  // (a byte or word zero-extended)
      } else {
        Ymm y;
        y.lane[0].lo = v;
        write_bytes(dst, y, n);
      }
      return;
    }
    case ZYDIS_MNEMONIC_VPINSRB: case ZYDIS_MNEMONIC_VPINSRW: case ZYDIS_MNEMONIC_VPINSRD: case ZYDIS_MNEMONIC_VPINSRQ: {
      const unsigned n = mnemonic == ZYDIS_MNEMONIC_VPINSRB ? 1 : mnemonic == ZYDIS_MNEMONIC_VPINSRW ? 2
                       : mnemonic == ZYDIS_MNEMONIC_VPINSRQ ? 8 : 4;
      const Operand& src = insn.op[2];
      const uint64_t v = src.kind == OpKind::kMem ? read_mem(src.seg, effective_address(src, insn), n) : s_.gpr[src.reg];
      Xmm r = ymm_get(insn.op[1].reg).lane[0];
      uint8_t bytes[16];
      std::memcpy(bytes, &r, 16);
      std::memcpy(bytes + (imm8(insn) & (16 / n - 1)) * n, &v, n);
      std::memcpy(static_cast<void*>(&r), bytes, 16);
      store_xmm(0, r);
      return;
    }
    case ZYDIS_MNEMONIC_VINSERTPS: {
      // imm8[7:6]: the source element (a register source), [5:4]: where it goes, [3:0]: elements zeroed.
      const uint8_t control = imm8(insn);
      const Operand& src = insn.op[2];
      uint32_t value;
      if (src.kind == OpKind::kMem) {
        value = uint32_t(read_mem(src.seg, effective_address(src, insn), 4));
      } else {
        const auto e = elements<uint32_t, 4>(ymm_get(src.reg));
        value = e[control >> 6];
      }
      auto r = elements<uint32_t, 4>(ymm_get(insn.op[1].reg));
      r[(control >> 4) & 3] = value;
      for (int i = 0; i < 4; ++i)
        if ((control >> i) & 1) r[i] = 0;
      store_xmm(0, from_elements(r).lane[0]);
      return;
    }
    case ZYDIS_MNEMONIC_VCVTSI2SS: case ZYDIS_MNEMONIC_VCVTSI2SD: {
      const Operand& src = insn.op[2];
      const uint64_t value = src.kind == OpKind::kMem ? read_mem(src.seg, effective_address(src, insn), src.size)
                                                      : reg_read(src.reg, src.size);
      const auto r = interp::sse::cvtsi2f(mnemonic == ZYDIS_MNEMONIC_VCVTSI2SD, ymm_get(insn.op[1].reg).lane[0], value,
                                         src.size * 8, mxcsr());
      set_mxcsr(r.mxcsr);
      if (r.fault) fault_xm();
      store_xmm(0, r.value);
      return;
    }
    case ZYDIS_MNEMONIC_VCVTSS2SI: case ZYDIS_MNEMONIC_VCVTTSS2SI: case ZYDIS_MNEMONIC_VCVTSD2SI:
    case ZYDIS_MNEMONIC_VCVTTSD2SI: {
      const bool dbl = mnemonic == ZYDIS_MNEMONIC_VCVTSD2SI || mnemonic == ZYDIS_MNEMONIC_VCVTTSD2SI;
      const bool truncate = mnemonic == ZYDIS_MNEMONIC_VCVTTSS2SI || mnemonic == ZYDIS_MNEMONIC_VCVTTSD2SI;
      const auto r = interp::sse::cvtf2si(dbl ? interp::sse::FpForm::kSd : interp::sse::FpForm::kSs, truncate,
                                          load(1).lane[0], dst.size * 8, mxcsr());
      set_mxcsr(r.mxcsr);
      if (r.fault) fault_xm();
      reg_write(dst.reg, dst.size, r.value);
      return;
    }
    case ZYDIS_MNEMONIC_VCOMISS: case ZYDIS_MNEMONIC_VCOMISD: case ZYDIS_MNEMONIC_VUCOMISS: case ZYDIS_MNEMONIC_VUCOMISD: {
      const bool dbl = mnemonic == ZYDIS_MNEMONIC_VCOMISD || mnemonic == ZYDIS_MNEMONIC_VUCOMISD;
      const bool quiet = mnemonic == ZYDIS_MNEMONIC_VUCOMISS || mnemonic == ZYDIS_MNEMONIC_VUCOMISD;
      const auto r = interp::sse::fp_comis(dbl ? interp::sse::FpForm::kSd : interp::sse::FpForm::kSs, quiet,
                                           ymm_get(dst.reg).lane[0], load(1).lane[0], s_.rflags, mxcsr());
      set_mxcsr(r.mxcsr);
      if (r.fault) fault_xm();
      s_.rflags = r.rflags | 2;
      return;
    }

    // ---- reciprocal approximations (defined in software: interp/avx.h) ----
    case ZYDIS_MNEMONIC_VRCPPS: case ZYDIS_MNEMONIC_VRSQRTPS: case ZYDIS_MNEMONIC_VRCPSS: case ZYDIS_MNEMONIC_VRSQRTSS: {
      const bool scalar = mnemonic == ZYDIS_MNEMONIC_VRCPSS || mnemonic == ZYDIS_MNEMONIC_VRSQRTSS;
      const bool sqrt = mnemonic == ZYDIS_MNEMONIC_VRSQRTPS || mnemonic == ZYDIS_MNEMONIC_VRSQRTSS;
      auto r = elements<uint32_t, 8>(scalar ? load(1) : Ymm{});
      const auto s = elements<uint32_t, 8>(load(scalar ? 2 : 1));
      for (unsigned i = 0; i < (scalar ? 1u : wide ? 8u : 4u); ++i) r[i] = sqrt ? interp::avx::rsqrt(s[i]) : interp::avx::rcp(s[i]);
      Ymm y = from_elements(r);
      if (scalar) y.lane[1] = Xmm{};
      store(0, y);
      return;
    }

    // ---- masked moves ----
    case ZYDIS_MNEMONIC_VMASKMOVPS: case ZYDIS_MNEMONIC_VMASKMOVPD: case ZYDIS_MNEMONIC_VPMASKMOVD:
    case ZYDIS_MNEMONIC_VPMASKMOVQ: {
      // Only the elements whose mask element has its sign bit set are accessed (loads read the others as zero);
      // a store checks every access it makes before it makes any.
      const unsigned size = (mnemonic == ZYDIS_MNEMONIC_VMASKMOVPD || mnemonic == ZYDIS_MNEMONIC_VPMASKMOVQ) ? 8 : 4;
      const unsigned count = (wide ? 32 : 16) / size;
      const bool to_memory = dst.kind == OpKind::kMem;
      const Operand& m = to_memory ? dst : insn.op[2];
      const Ymm mask = load(1);
      uint8_t mask_bytes[32];
      std::memcpy(mask_bytes, &mask, 32);
      const uint64_t address = effective_address(m, insn);
      auto selected = [&](unsigned i) { return (mask_bytes[i * size + size - 1] & 0x80) != 0; };
      if (to_memory) {
        const Ymm value = load(2);
        uint8_t bytes[32];
        std::memcpy(bytes, &value, 32);
        for (unsigned i = 0; i < count; ++i)
          if (selected(i)) probe_write(m.seg, address + i * size, size);
        for (unsigned i = 0; i < count; ++i) {
          if (!selected(i)) continue;
          uint64_t v = 0;
          std::memcpy(&v, bytes + i * size, size);
          write_mem(m.seg, address + i * size, size, v);
        }
      } else {
        uint8_t bytes[32] = {};
        for (unsigned i = 0; i < count; ++i) {
          if (!selected(i)) continue;
          const uint64_t v = read_mem(m.seg, address + i * size, size);
          std::memcpy(bytes + i * size, &v, size);
        }
        Ymm y;
        std::memcpy(static_cast<void*>(&y), bytes, 32);
        store(0, y);
      }
      return;
    }
    case ZYDIS_MNEMONIC_VMASKMOVDQU: {
      // The bytes of the first source whose byte in the second has its top bit set, to DS:rDI (or its override).
      const Xmm value = ymm_get(dst.reg).lane[0], mask = ymm_get(insn.op[1].reg).lane[0];
      uint8_t v[16], k[16];
      std::memcpy(v, &value, 16);
      std::memcpy(k, &mask, 16);
      uint64_t address = s_.gpr[kRdi];
      if (insn.addrsize == 32) address &= 0xffffffffu;
      else if (insn.addrsize == 16) address &= 0xffff;
      const int seg = insn.seg_override != 0xff ? insn.seg_override : 3;
      for (unsigned i = 0; i < 16; ++i)
        if (k[i] & 0x80) probe_write(seg, address + i, 1);
      for (unsigned i = 0; i < 16; ++i)
        if (k[i] & 0x80) write_mem(seg, address + i, 1, v[i]);
      return;
    }

    // ---- gathers ----
    case ZYDIS_MNEMONIC_VGATHERDPS: case ZYDIS_MNEMONIC_VGATHERDPD: case ZYDIS_MNEMONIC_VGATHERQPS:
    case ZYDIS_MNEMONIC_VGATHERQPD: case ZYDIS_MNEMONIC_VPGATHERDD: case ZYDIS_MNEMONIC_VPGATHERDQ:
    case ZYDIS_MNEMONIC_VPGATHERQD: case ZYDIS_MNEMONIC_VPGATHERQQ: {
      const Operand& m = insn.op[1];
      const Operand& mask_op = insn.op[2];
      if (dst.reg == mask_op.reg || dst.reg == m.index || mask_op.reg == m.index) raise_ud(insn, false);
      const bool qword_index = mnemonic == ZYDIS_MNEMONIC_VGATHERQPS || mnemonic == ZYDIS_MNEMONIC_VGATHERQPD ||
                               mnemonic == ZYDIS_MNEMONIC_VPGATHERQD || mnemonic == ZYDIS_MNEMONIC_VPGATHERQQ;
      const unsigned size = m.size;  // 4 or 8: the element
      // Elements: as many as the wider of the data and index vectors holds of its own kind.
      const unsigned count = (wide ? 32u : 16u) / (qword_index || size == 8 ? 8u : 4u);
      const Ymm index = ymm_get(m.index);
      Ymm data = ymm_get(dst.reg), mask = ymm_get(mask_op.reg);
      uint8_t data_bytes[32], mask_bytes[32];
      std::memcpy(data_bytes, &data, 32);
      std::memcpy(mask_bytes, &mask, 32);
      uint64_t base = uint64_t(m.disp);
      if (m.base == interp::kRipBase) base += insn_rip_ + insn.length;
      else if (m.base != interp::kNoReg) base += s_.gpr[m.base];
      // In element order; a fault leaves the elements before it gathered (their mask cleared) and the rest as
      // they were; completion zeroes the whole mask and bits past the vector length (docs/interp-alu.md).
      auto commit = [&](bool complete) {
        std::memcpy(static_cast<void*>(&data), data_bytes, 32);
        std::memcpy(static_cast<void*>(&mask), mask_bytes, 32);
        if (complete) {
          mask = Ymm{};
          if (count * size < 32) data.lane[1] = Xmm{};
          if (count * size < 16) data.lane[0].hi = 0;
        }
        ymm_set(dst.reg, data);
        ymm_set(mask_op.reg, mask);
      };
      for (unsigned i = 0; i < count; ++i) {
        if (!(mask_bytes[i * size + size - 1] & 0x80)) continue;
        const int64_t scaled = (qword_index ? int64_t(index.q(i)) : int64_t(int32_t(elements<uint32_t, 8>(index)[i]))) * m.scale;
        uint64_t address = base + uint64_t(scaled);
        if (insn.addrsize == 32) address &= 0xffffffffu;
        uint64_t v;
        try {
          v = read_mem(m.seg, address, size);
        } catch (const GuestException&) {
          commit(false);
          throw;
        }
        std::memcpy(data_bytes + i * size, &v, size);
        std::memset(mask_bytes + i * size, 0, size);
      }
      commit(true);
      return;
    }
    default:
      break;
  }
  raise_ud(insn, true);
}

}  // namespace deja
