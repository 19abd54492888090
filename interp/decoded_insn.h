// The interpreter's compact pre-decoded instruction and the decode cache keyed by guest-physical address.
#pragma once

#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

namespace deja::interp {

enum class OpKind : uint8_t { kNone, kGpr, kGprHigh8, kSeg, kCr, kDr, kXmm, kMem, kImm, kPtr, kOther, kMmx };

constexpr uint8_t kNoReg = 0xff;

// Where an operand is encoded, for VEX instructions (the AVX executor runs some of them on the host with the same
// encoding and needs to know which register field each operand came from).
enum class OpEnc : uint8_t { kOther, kModrmReg, kModrmRm, kVvvv, kIs4, kImm };

// The CPUID feature a VEX instruction needs (DecodedInsn::isa), besides the OS support for AVX state.
enum class VexIsa : uint8_t { kNone, kAvx, kAvx2, kFma, kF16c, kBmi1, kBmi2, kAes, kPclmul };
constexpr uint8_t kRipBase = 16;  // base register value meaning RIP-relative

struct Operand {
  OpKind kind = OpKind::kNone;
  uint8_t size = 0;       // bytes (memory operands of LGDT etc. report their own width)
  uint8_t reg = kNoReg;   // register number within its class (GPR 0-15, segment 0-5 in ES..GS order, CRn, XMMn/YMMn, MMn)
  uint8_t base = kNoReg;  // memory: base GPR or kRipBase
  uint8_t index = kNoReg; // memory: index GPR, or (insn_flags::kVsib) the number of the XMM/YMM index register
  uint8_t scale = 0;
  uint8_t seg = 3;        // memory: effective segment (ES=0 CS=1 SS=2 DS=3 FS=4 GS=5)
  OpEnc enc = OpEnc::kOther;
  int64_t disp = 0;       // memory displacement, or immediate value (sign-extended where the encoding says)
  uint16_t ptr_sel = 0;   // far pointer selector (JMP ptr16:32)
};

namespace insn_flags {
constexpr uint16_t kRep = 1, kRepne = 2, kLock = 4, kRexW = 8, kSegOverride = 16, kOpsizePrefix = 32;
// VEX-encoded (kRexW then holds VEX.W), with VEX.L = 1; a gather's memory operand has a vector index (VSIB).
constexpr uint16_t kVex = 64, kVexL = 128, kVsib = 256;
}

// Everything the executor needs, resolved once at decode time.
struct DecodedInsn {
  uint16_t mnemonic = 0;  // ZydisMnemonic
  uint8_t length = 0;
  uint8_t opsize = 0;     // effective operand size in bits
  uint8_t addrsize = 0;   // effective address size in bits
  uint8_t mode = 0;       // decode mode tag (see InterpBackend::decode_mode())
  uint8_t operand_count = 0;  // visible operands
  uint8_t opcode = 0;
  uint8_t opcode_map = 0;  // ZydisOpcodeMap
  uint8_t modrm = 0;       // the ModRM byte, where there is one (x87 forms and FOP come from it)
  uint8_t seg_override = 0xff;
  uint16_t flags = 0;
  bool valid = false;      // false: the bytes do not decode (#UD)
  uint8_t vex_pp = 0;      // VEX: the implied prefix (0 none, 1 66, 2 F3, 3 F2)
  VexIsa isa = VexIsa::kNone;  // VEX: the feature it needs
  uint8_t xinuse = 0;      // the XINUSE bits (xcr0::) the instruction sets when it completes (xinuse_set_by)
  Operand op[4];
};

// Decoded instructions per guest-physical page. An entry stays valid until a store into the page
// (from the guest, checked through `has_code`) or a VMM write drops the whole page.
//
// The cache holds at most `capacity_bytes` (slot tables plus decoded entries): a guest that
// executes more distinct code than that (a NOP sled through all of RAM, zeroed memory) makes it
// drop everything and start again, as QEMU flushes its translation buffer when it is full. Only
// speed depends on the cache, never what the guest sees.
class DecodeCache {
 public:
  static constexpr uint64_t kDefaultCapacityBytes = uint64_t{128} << 20;

  explicit DecodeCache(uint64_t ram_bytes, uint64_t capacity_bytes = kDefaultCapacityBytes)
      : has_code_((ram_bytes + 4095) / 4096, 0), capacity_(capacity_bytes) {}

  // The cached entry for `gpa` decoded in `mode`, or nullptr.
  DecodedInsn* find(uint64_t gpa, uint8_t mode) {
    uint64_t pfn = gpa >> 12;
    Page* page = pfn == last_pfn_ ? last_page_ : lookup_page(pfn);
    if (!page) return nullptr;
    uint16_t slot = page->slot[gpa & 0xfff];
    if (slot == 0) return nullptr;
    DecodedInsn* insn = &page->insns[slot - 1];
    return insn->mode == mode ? insn : nullptr;
  }

  DecodedInsn* insert(uint64_t gpa, const DecodedInsn& insn);

  // Direct pointers into page `pfn` for the fetch fast path: valid until the next insert() into
  // that page or the next generation() change.
  bool view(uint64_t pfn, const uint16_t*& slots, DecodedInsn*& insns) {
    Page* page = pfn == last_pfn_ ? last_page_ : lookup_page(pfn);
    if (!page) return false;
    slots = page->slot.data();
    insns = page->insns.data();
    return true;
  }

  bool has_code(uint64_t pfn) const { return pfn < has_code_.size() && has_code_[pfn]; }

  // Drops the decoded code of page `pfn`. Pages are retired into a graveyard instead of freed,
  // because the instruction being executed may be the one whose store invalidated its own page.
  void invalidate(uint64_t pfn);
  // Drops the entries that may overlap guest-physical bytes [gpa, gpa+size) within one page: those
  // starting up to 14 bytes before. Cheap enough for code and hot data sharing a page.
  void invalidate_range(uint64_t gpa, unsigned size);
  void release_retired() {
    if (!graveyard_.empty()) graveyard_.clear();
  }
  void clear();
  uint64_t invalidations() const { return invalidations_; }
  uint64_t bytes() const { return bytes_; }  // what the live pages hold (retired ones excluded)
  uint64_t flushes() const { return flushes_; }  // times the cache was full and dropped everything
  uint64_t generation() const { return generation_; }  // bumps whenever any decoded page is dropped

 private:
  struct Page {
    std::vector<uint16_t> slot = std::vector<uint16_t>(4096, 0);
    std::vector<DecodedInsn> insns;
    uint64_t bytes() const { return sizeof(Page) + slot.capacity() * sizeof(uint16_t) + insns.capacity() * sizeof(DecodedInsn); }
  };
  Page* lookup_page(uint64_t pfn) {
    auto it = pages_.find(pfn);
    if (it == pages_.end()) return nullptr;
    last_pfn_ = pfn;
    last_page_ = it->second.get();
    return last_page_;
  }

  std::vector<uint8_t> has_code_;
  std::unordered_map<uint64_t, std::unique_ptr<Page>> pages_;
  std::vector<std::unique_ptr<Page>> graveyard_;
  uint64_t last_pfn_ = ~0ull;
  Page* last_page_ = nullptr;
  uint64_t invalidations_ = 0;
  uint64_t generation_ = 0;
  uint64_t capacity_;
  uint64_t bytes_ = 0;
  uint64_t flushes_ = 0;
};

}  // namespace deja::interp

namespace deja::interp {

// Decode modes (the tag stored in DecodedInsn::mode).
constexpr uint8_t kMode16 = 0, kMode32 = 1, kMode64 = 2;

// Decodes one instruction from `bytes` (at most `len` valid bytes) in `mode`. Returns false when
// more bytes are needed than `len` provides (the caller fetches the next page); an undecodable
// instruction returns true with out.valid = false.
bool decode_bytes(const uint8_t* bytes, size_t len, uint8_t mode, DecodedInsn& out);

const char* mnemonic_name(uint16_t mnemonic);

}  // namespace deja::interp
