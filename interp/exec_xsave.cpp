// The XSAVE feature set of the software CPU: XSAVE/XSAVEOPT/XSAVEC, XRSTOR, XGETBV/XSETBV, and CPUID's answers that follow CR4 and XCR0.
//
// State components: 0 x87, 1 SSE (XMM and MXCSR), 2 AVX (the upper halves of YMM0-15). A model that reports
// XGETBV with ECX = 1 (CPUID.(EAX=0DH,ECX=1):EAX[2]) has the init optimization as Intel's processors have it:
// CpuState::xinuse, set by the instructions that write a component (interp/decode_cache.cpp, xinuse_set_by) and
// cleared by VZEROUPPER, VZEROALL and XRSTOR, is what XSAVE, XSAVEOPT and XSAVEC write into XSTATE_BV, and XSAVEOPT
// and XSAVEC leave a component that is not in use unwritten. XSAVEOPT never uses the modified optimization: it
// writes every component in use, so its output never depends on which XRSTOR came before. The earlier models
// report all of XCR0 in use at all times and write every requested component (docs/cpu-models.md, "XINUSE").
#include <Zydis/Zydis.h>

#include <algorithm>
#include <array>
#include <cstring>

#include "interp/interp_backend.h"
#include "interp/sse.h"

namespace deja {

using interp::DecodedInsn;

namespace {

constexpr uint8_t kNm = 7, kGp = 13;
constexpr size_t kMxcsrOffset = 24, kXmmOffset = 160, kHeaderOffset = 512, kAvxOffset = 576, kAvxBytes = 256;
constexpr uint64_t kSupportedXcr0 = xcr0::kX87 | xcr0::kSse | xcr0::kAvx;
constexpr uint64_t kCompacted = uint64_t{1} << 63;

}  // namespace

bool InterpBackend::model_has(uint32_t leaf, int reg, int bit) const {
  const CpuidResult r = model_.cpuid(leaf, 0);
  const uint32_t regs[4] = {r.eax, r.ebx, r.ecx, r.edx};
  return (regs[reg] >> bit) & 1;
}

CpuidResult InterpBackend::cpuid(uint32_t leaf, uint32_t subleaf) const {
  return model_.cpuid(leaf, subleaf, s_.cr4, s_.xcr0);
}

void InterpBackend::exec_xsave(const DecodedInsn& insn) {
  const auto mnemonic = ZydisMnemonic(insn.mnemonic);
  if (!model_has(1, 2, 26) || (insn.flags & interp::insn_flags::kLock)) raise_ud(insn, false);
  if (mnemonic == ZYDIS_MNEMONIC_XSAVES || mnemonic == ZYDIS_MNEMONIC_XSAVES64 || mnemonic == ZYDIS_MNEMONIC_XRSTORS ||
      mnemonic == ZYDIS_MNEMONIC_XRSTORS64)
    raise_ud(insn, false);  // (no model offers XSAVES: it needs IA32_XSS)
  if (!(s_.cr4 & cr4::kOsxsave)) raise_ud(insn, false);
  const CpuidResult xsave_features = model_.cpuid(0xd, 1);
  const bool tracks_xinuse = xsave_features.eax & 0x4;
  uint32_t mxcsr;
  std::memcpy(&mxcsr, s_.fxsave.data() + kMxcsrOffset, 4);
  if (mnemonic == ZYDIS_MNEMONIC_XGETBV) {
    const uint32_t index = uint32_t(s_.gpr[kRcx]);
    if (index != 0 && !(index == 1 && tracks_xinuse)) raise(kGp, 0, true);
    // XCR0, or XINUSE & XCR0, with SSE in use while MXCSR is not its initial 1F80H (as Intel's report it).
    const uint64_t value =
        index == 0 ? s_.xcr0 : (s_.xinuse | (mxcsr != interp::sse::mxcsr::kDefault ? xcr0::kSse : 0)) & s_.xcr0;
    s_.gpr[kRax] = value & 0xffffffffu;
    s_.gpr[kRdx] = value >> 32;
    return;
  }
  if (mnemonic == ZYDIS_MNEMONIC_XSETBV) {
    if ((s_.cr0 & cr0::kPe) && cpl() != 0) raise(kGp, 0, true);
    const uint64_t value = (s_.gpr[kRdx] << 32) | (s_.gpr[kRax] & 0xffffffffu);
    const CpuidResult supported = model_.cpuid(0xd, 0);
    const uint64_t allowed = ((uint64_t(supported.edx) << 32) | supported.eax) & kSupportedXcr0;
    if (s_.gpr[kRcx] & 0xffffffffu) raise(kGp, 0, true);
    if ((value & ~allowed) || !(value & xcr0::kX87) || ((value & xcr0::kAvx) && !(value & xcr0::kSse)))
      raise(kGp, 0, true);
    s_.xcr0 = value;
    return;
  }

  const bool save = mnemonic != ZYDIS_MNEMONIC_XRSTOR && mnemonic != ZYDIS_MNEMONIC_XRSTOR64;
  const bool compact = mnemonic == ZYDIS_MNEMONIC_XSAVEC || mnemonic == ZYDIS_MNEMONIC_XSAVEC64;
  if ((mnemonic == ZYDIS_MNEMONIC_XSAVEOPT || mnemonic == ZYDIS_MNEMONIC_XSAVEOPT64) && !(xsave_features.eax & 0x1))
    raise_ud(insn, false);
  if (compact && !(xsave_features.eax & 0x2)) raise_ud(insn, false);
  if (s_.cr0 & cr0::kTs) raise(kNm);
  const interp::Operand& m = insn.op[0];
  if (m.kind != interp::OpKind::kMem) raise_ud(insn, false);
  const uint64_t address = effective_address(m, insn);
  if (address & 63) raise(kGp, 0, true);
  const uint64_t rfbm = ((s_.gpr[kRdx] << 32) | (s_.gpr[kRax] & 0xffffffffu)) & s_.xcr0;
  const unsigned vector_registers = mode64() ? 16 : 8;

  auto read_bytes = [&](uint64_t offset, uint8_t* out, size_t n) {
    for (size_t i = 0; i < n; i += 8) {
      const uint64_t chunk = read_mem(m.seg, address + offset + i, unsigned(std::min<size_t>(8, n - i)));
      std::memcpy(out + i, &chunk, std::min<size_t>(8, n - i));
    }
  };
  auto write_bytes = [&](uint64_t offset, const uint8_t* in, size_t n) {
    for (size_t i = 0; i < n; i += 8) {
      uint64_t chunk = 0;
      std::memcpy(&chunk, in + i, std::min<size_t>(8, n - i));
      write_mem(m.seg, address + offset + i, unsigned(std::min<size_t>(8, n - i)), chunk);
    }
  };

  if (save) {
    // XSTATE_BV: XINUSE for the requested components (all of them in use in the earlier models). The standard
    // format (XSAVE, XSAVEOPT) writes back the other bits as read and nothing else of the header; the compacted one
    // (XSAVEC) has SSE in use while MXCSR is not 1F80H, and XCOMP_BV = RFBM | bit 63.
    const bool optimized = tracks_xinuse && mnemonic != ZYDIS_MNEMONIC_XSAVE && mnemonic != ZYDIS_MNEMONIC_XSAVE64;
    uint64_t in_use = tracks_xinuse ? s_.xinuse : s_.xcr0;
    if (compact && mxcsr != interp::sse::mxcsr::kDefault) in_use |= xcr0::kSse;
    uint64_t header[2] = {0, 0};
    if (!compact) header[0] = read_mem(m.seg, address + kHeaderOffset, 8);
    const uint64_t xstate_bv = (header[0] & ~rfbm) | (in_use & rfbm);
    // What is written: every requested component, or (XSAVEOPT, XSAVEC) those in use.
    const uint64_t written = optimized ? rfbm & in_use : rfbm;
    const size_t end = (rfbm & xcr0::kAvx) ? kAvxOffset + kAvxBytes : kHeaderOffset + (compact ? 16 : 8);
    probe_write(m.seg, address, unsigned(end));
    if (written & xcr0::kX87) {
      // Bytes 0-23 and 32-159, as FXSAVE writes them (the reserved bytes of each register slot zero), with the
      // recording CPU's quirks.
      std::array<uint8_t, 160> x87{};
      std::memcpy(x87.data(), s_.fxsave.data(), x87.size());
      for (size_t slot = 32; slot < 160; slot += 16) std::fill(x87.begin() + long(slot) + 10, x87.begin() + long(slot) + 16, uint8_t{0});
      if (quirks_.fxsave_no_x87_pointers) std::fill(x87.begin() + 8, x87.begin() + 24, uint8_t{0});
      const bool skip_fop = quirks_.fxsave_no_x87_pointers;
      write_bytes(0, x87.data(), skip_fop ? 6 : 24);
      if (skip_fop) write_bytes(8, x87.data() + 8, 16);
      for (size_t slot = 32; slot < 160; slot += 16) {
        write_bytes(slot, x87.data() + slot, quirks_.fxsave_skips_reserved_bytes ? 10 : 16);
      }
    }
    // MXCSR and MXCSR_MASK go with SSE state, and for the standard format with AVX state too, in use or not.
    if ((written & xcr0::kSse) || (!compact && (rfbm & (xcr0::kSse | xcr0::kAvx)))) {
      const uint32_t mask = interp::sse::mxcsr::kWritable;
      uint8_t words[8];
      std::memcpy(words, &mxcsr, 4);
      std::memcpy(words + 4, &mask, 4);
      write_bytes(kMxcsrOffset, words, 8);
    }
    if (written & xcr0::kSse) write_bytes(kXmmOffset, s_.fxsave.data() + kXmmOffset, 16 * vector_registers);
    if (written & xcr0::kAvx) write_bytes(kAvxOffset, s_.ymmh.data(), 16 * vector_registers);
    header[0] = xstate_bv;
    header[1] = compact ? rfbm | kCompacted : 0;
    write_bytes(kHeaderOffset, reinterpret_cast<const uint8_t*>(header), compact ? 16 : 8);
    return;
  }

  // XRSTOR. The header decides the form and is checked first; then every requested component is loaded, or
  // initialized where XSTATE_BV does not have it. Everything is read before anything changes.
  uint8_t header[64];
  read_bytes(kHeaderOffset, header, sizeof header);
  uint64_t xstate_bv, xcomp_bv;
  std::memcpy(&xstate_bv, header, 8);
  std::memcpy(&xcomp_bv, header + 8, 8);
  const bool compacted = xcomp_bv & kCompacted;
  if (compacted) {
    if (!(xsave_features.eax & 0x2) || (xcomp_bv & ~kCompacted & ~s_.xcr0) || (xstate_bv & ~xcomp_bv) ||
        std::any_of(header + 16, header + 64, [](uint8_t b) { return b != 0; }))
      raise(kGp, 0, true);
  } else if ((xstate_bv & ~s_.xcr0) || std::any_of(header + 8, header + 24, [](uint8_t b) { return b != 0; })) {
    raise(kGp, 0, true);
  }
  const uint64_t load = rfbm & xstate_bv;
  std::array<uint8_t, 512> legacy = s_.fxsave;
  std::array<uint8_t, 256> upper = s_.ymmh;
  std::array<uint8_t, 512> image{};
  if (load & (xcr0::kX87 | xcr0::kSse)) read_bytes(0, image.data(), 416);
  // MXCSR: the standard form loads it whenever SSE or AVX state is requested, the compacted one with SSE state.
  const bool load_mxcsr = compacted ? (load & xcr0::kSse) : (rfbm & (xcr0::kSse | xcr0::kAvx));
  uint32_t mxcsr_value = interp::sse::mxcsr::kDefault;
  if (load_mxcsr) {
    mxcsr_value = uint32_t(read_mem(m.seg, address + kMxcsrOffset, 4));
    if (mxcsr_value & ~interp::sse::mxcsr::kWritable) raise(kGp, 0, true);
  }
  if (load & xcr0::kAvx) {
    // The AVX component sits at offset 576 in both formats (it is the first extended one).
    read_bytes(kAvxOffset, upper.data(), 16 * vector_registers);
  }
  if (rfbm & xcr0::kX87) {
    if (load & xcr0::kX87) {
      std::memcpy(legacy.data(), image.data(), 24);
      std::memcpy(legacy.data() + 32, image.data() + 32, 128);
    } else {
      // The initial configuration: FCW 037FH, everything else zero (every register empty).
      std::fill(legacy.begin(), legacy.begin() + 24, uint8_t{0});
      std::fill(legacy.begin() + 32, legacy.begin() + 160, uint8_t{0});
      legacy[0] = 0x7f;
      legacy[1] = 0x03;
    }
  }
  if (rfbm & xcr0::kSse) {
    if (load & xcr0::kSse) std::memcpy(legacy.data() + kXmmOffset, image.data() + kXmmOffset, 16 * vector_registers);
    else std::fill(legacy.begin() + kXmmOffset, legacy.begin() + long(kXmmOffset + 16 * vector_registers), uint8_t{0});
  }
  if (load_mxcsr || (compacted && (rfbm & xcr0::kSse))) std::memcpy(legacy.data() + kMxcsrOffset, &mxcsr_value, 4);
  if ((rfbm & xcr0::kAvx) && !(load & xcr0::kAvx)) std::fill(upper.begin(), upper.begin() + 16 * vector_registers, uint8_t{0});
  s_.fxsave = legacy;
  s_.ymmh = upper;
  // A requested component is in use exactly when it was loaded; the others keep their XINUSE.
  s_.xinuse = (s_.xinuse & ~rfbm) | load;
}

}  // namespace deja
