// Differential tests of interp/alu against the host CPU: every ALU function, random and edge inputs, undefined flags masked per the SDM.
#include <gtest/gtest.h>

#include <cpuid.h>
#include <csetjmp>
#include <csignal>
#include <cstdint>
#include <random>

#include "interp/alu.h"

namespace deja::interp {
namespace {

constexpr uint64_t kReservedOne = 0x2;  // RFLAGS bit 1 always reads as 1
constexpr int kIterations = 20000;

// The stack adjustment keeps PUSHF/POPF clear of the red zone, where the compiler may keep locals.
#define DEJA_FLAGS_IN "lea -128(%%rsp), %%rsp\n\tpush %[fin]\n\tpopfq\n\t"
#define DEJA_FLAGS_OUT "\n\tpushfq\n\tpop %[fout]\n\tlea 128(%%rsp), %%rsp"

struct HostOut {
  uint64_t value;
  uint64_t flags;
};

// Inputs biased toward the boundaries where flag logic goes wrong (0, 1, sign bit, all ones, nibble carries).
class Inputs {
 public:
  explicit Inputs(uint64_t seed) : rng_(seed) {}
  uint64_t value(unsigned width) {
    const uint64_t mask = width_mask(width);
    const uint64_t sign = uint64_t{1} << (width - 1);
    switch (rng_() % 12) {
      case 0: return 0;
      case 1: return 1;
      case 2: return mask;
      case 3: return sign;
      case 4: return sign - 1;
      case 5: return sign + 1;
      case 6: return rng_() & 0x1f;
      case 7: return (mask - (rng_() & 0xf)) & mask;
      case 8: return (uint64_t{0xf} << (rng_() % (width - 3))) & mask;
      default: return rng_() & mask;
    }
  }
  uint64_t flags() { return (rng_() & kArithFlags) | kReservedOne; }
  uint64_t below(uint64_t n) { return rng_() % n; }

 private:
  std::mt19937_64 rng_;
};

template <typename T>
constexpr unsigned kWidth = sizeof(T) * 8;

#define DEJA_HOST_BINARY(NAME, INSN)                                                              \
  template <typename T>                                                                          \
  HostOut NAME(T a, T b, uint64_t fin) {                                                         \
    uint64_t fout;                                                                               \
    asm(DEJA_FLAGS_IN INSN " %[b], %[a]" DEJA_FLAGS_OUT                                          \
        : [a] "+r"(a), [fout] "=&r"(fout)                                                        \
        : [b] "r"(b), [fin] "r"(fin)                                                             \
        : "cc");                                                                                 \
    return {static_cast<uint64_t>(a), fout};                                                     \
  }
DEJA_HOST_BINARY(host_add, "add")
DEJA_HOST_BINARY(host_or, "or")
DEJA_HOST_BINARY(host_adc, "adc")
DEJA_HOST_BINARY(host_sbb, "sbb")
DEJA_HOST_BINARY(host_and, "and")
DEJA_HOST_BINARY(host_sub, "sub")
DEJA_HOST_BINARY(host_xor, "xor")
DEJA_HOST_BINARY(host_cmp, "cmp")
DEJA_HOST_BINARY(host_test, "test")
DEJA_HOST_BINARY(host_imul2, "imul")
DEJA_HOST_BINARY(host_bsf, "bsf")
DEJA_HOST_BINARY(host_bsr, "bsr")
DEJA_HOST_BINARY(host_tzcnt, "tzcnt")
DEJA_HOST_BINARY(host_lzcnt, "lzcnt")
DEJA_HOST_BINARY(host_popcnt, "popcnt")
DEJA_HOST_BINARY(host_bt, "bt")
DEJA_HOST_BINARY(host_bts, "bts")
DEJA_HOST_BINARY(host_btr, "btr")
DEJA_HOST_BINARY(host_btc, "btc")

#define DEJA_HOST_UNARY(NAME, INSN)                                                          \
  template <typename T>                                                                     \
  HostOut NAME(T a, uint64_t fin) {                                                         \
    uint64_t fout;                                                                          \
    asm(DEJA_FLAGS_IN INSN " %[a]" DEJA_FLAGS_OUT : [a] "+r"(a), [fout] "=&r"(fout) : [fin] "r"(fin) : "cc"); \
    return {static_cast<uint64_t>(a), fout};                                                \
  }
DEJA_HOST_UNARY(host_inc, "inc")
DEJA_HOST_UNARY(host_dec, "dec")
DEJA_HOST_UNARY(host_neg, "neg")
DEJA_HOST_UNARY(host_not, "not")

#define DEJA_HOST_SHIFT(NAME, INSN)                                                                   \
  template <typename T>                                                                              \
  HostOut NAME(T a, uint8_t count, uint64_t fin) {                                                   \
    uint64_t fout;                                                                                   \
    asm(DEJA_FLAGS_IN INSN " %%cl, %[a]" DEJA_FLAGS_OUT                                              \
        : [a] "+r"(a), [fout] "=&r"(fout)                                                            \
        : "c"(count), [fin] "r"(fin)                                                                 \
        : "cc");                                                                                     \
    return {static_cast<uint64_t>(a), fout};                                                         \
  }
DEJA_HOST_SHIFT(host_rol, "rol")
DEJA_HOST_SHIFT(host_ror, "ror")
DEJA_HOST_SHIFT(host_rcl, "rcl")
DEJA_HOST_SHIFT(host_rcr, "rcr")
DEJA_HOST_SHIFT(host_shl, "shl")
DEJA_HOST_SHIFT(host_shr, "shr")
DEJA_HOST_SHIFT(host_sar, "sar")

#define DEJA_HOST_DOUBLE_SHIFT(NAME, INSN)                                                            \
  template <typename T>                                                                              \
  HostOut NAME(T dst, T src, uint8_t count, uint64_t fin) {                                          \
    uint64_t fout;                                                                                   \
    asm(DEJA_FLAGS_IN INSN " %%cl, %[src], %[dst]" DEJA_FLAGS_OUT                                    \
        : [dst] "+r"(dst), [fout] "=&r"(fout)                                                        \
        : [src] "r"(src), "c"(count), [fin] "r"(fin)                                                 \
        : "cc");                                                                                     \
    return {static_cast<uint64_t>(dst), fout};                                                       \
  }
DEJA_HOST_DOUBLE_SHIFT(host_shld, "shld")
DEJA_HOST_DOUBLE_SHIFT(host_shrd, "shrd")

struct HostWide {
  uint64_t lo, hi, flags;
};
#define DEJA_HOST_WIDE(NAME, INSN)                                                                 \
  template <typename T>                                                                           \
  HostWide NAME(T a, T b, uint64_t fin) {                                                         \
    uint64_t rax = a, rdx = 0, fout;                                                              \
    asm(DEJA_FLAGS_IN INSN " %[b]" DEJA_FLAGS_OUT                                                 \
        : "+a"(rax), "+d"(rdx), [fout] "=&r"(fout)                                                \
        : [b] "r"(b), [fin] "r"(fin)                                                              \
        : "cc");                                                                                  \
    constexpr unsigned w = kWidth<T>;                                                             \
    if constexpr (w == 8) return {rax & 0xff, (rax >> 8) & 0xff, fout};                           \
    return {rax & width_mask(w), rdx & width_mask(w), fout};                                      \
  }
DEJA_HOST_WIDE(host_mul, "mul")
DEJA_HOST_WIDE(host_imul1, "imul")

// Division faults (#DE) arrive as SIGFPE; the handler jumps back so the test can record the fault.
sigjmp_buf g_division_fault;
void on_sigfpe(int) { siglongjmp(g_division_fault, 1); }

template <typename T, bool kSigned>
DivResult host_divide(uint64_t hi, uint64_t lo, uint64_t divisor) {
  constexpr unsigned w = kWidth<T>;
  struct sigaction action {}, previous{};
  action.sa_handler = on_sigfpe;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_NODEFER;
  sigaction(SIGFPE, &action, &previous);
  volatile uint64_t rax = lo, rdx = hi;
  DivResult out;
  if (sigsetjmp(g_division_fault, 1) == 0) {
    uint64_t a = rax, d = rdx;
    if constexpr (w == 8) a = ((hi & 0xff) << 8) | (lo & 0xff);
    const T b = static_cast<T>(divisor);
    if constexpr (kSigned) {
      asm volatile("idiv %[b]" : "+a"(a), "+d"(d) : [b] "r"(b) : "cc");
    } else {
      asm volatile("div %[b]" : "+a"(a), "+d"(d) : [b] "r"(b) : "cc");
    }
    if constexpr (w == 8) {
      out = {a & 0xff, (a >> 8) & 0xff, false};
    } else {
      out = {a & width_mask(w), d & width_mask(w), false};
    }
  } else {
    out = {0, 0, true};
  }
  sigaction(SIGFPE, &previous, nullptr);
  return out;
}

template <typename T>
void expect_same(const char* what, uint64_t a, uint64_t b, uint64_t fin, uint64_t extra, AluResult deja,
                 HostOut host, uint64_t undefined_flags) {
  const uint64_t compare = ~undefined_flags & kArithFlags;
  EXPECT_EQ(deja.value, host.value & width_mask(kWidth<T>))
      << what << " width " << kWidth<T> << " a=" << std::hex << a << " b=" << b << " extra=" << extra << " flags=" << fin;
  EXPECT_EQ(deja.flags & compare, host.flags & compare)
      << what << " width " << kWidth<T> << " a=" << std::hex << a << " b=" << b << " extra=" << extra << " flags=" << fin;
}

bool host_has_lzcnt() {
  unsigned eax, ebx, ecx, edx;
  if (!__get_cpuid(0x80000001, &eax, &ebx, &ecx, &edx)) return false;
  return ecx & (1u << 5);
}

template <typename T>
void check_binary(Inputs& in) {
  constexpr unsigned w = kWidth<T>;
  struct Case {
    BinaryOp op;
    HostOut (*host)(T, T, uint64_t);
    const char* name;
    uint64_t undefined;
  };
  const Case cases[] = {
      {BinaryOp::kAdd, host_add<T>, "add", 0}, {BinaryOp::kOr, host_or<T>, "or", kAf},
      {BinaryOp::kAdc, host_adc<T>, "adc", 0}, {BinaryOp::kSbb, host_sbb<T>, "sbb", 0},
      {BinaryOp::kAnd, host_and<T>, "and", kAf}, {BinaryOp::kSub, host_sub<T>, "sub", 0},
      {BinaryOp::kXor, host_xor<T>, "xor", kAf}, {BinaryOp::kCmp, host_cmp<T>, "cmp", 0},
      {BinaryOp::kTest, host_test<T>, "test", kAf},
  };
  for (const Case& c : cases) {
    for (int i = 0; i < kIterations / 4; ++i) {
      const uint64_t a = in.value(w), b = in.value(w), fin = in.flags();
      HostOut host = c.host(static_cast<T>(a), static_cast<T>(b), fin);
      if (c.op == BinaryOp::kCmp || c.op == BinaryOp::kTest) host.value = a;
      expect_same<T>(c.name, a, b, fin, 0, alu_binary(c.op, a, b, w, fin), host, c.undefined);
    }
  }
}

TEST(AluHost, BinaryOps) {
  Inputs in(1);
  check_binary<uint8_t>(in);
  check_binary<uint16_t>(in);
  check_binary<uint32_t>(in);
  check_binary<uint64_t>(in);
}

template <typename T>
void check_unary(Inputs& in) {
  constexpr unsigned w = kWidth<T>;
  for (int i = 0; i < kIterations / 4; ++i) {
    const uint64_t a = in.value(w), fin = in.flags();
    expect_same<T>("inc", a, 0, fin, 0, alu_inc(a, w, fin), host_inc<T>(static_cast<T>(a), fin), 0);
    expect_same<T>("dec", a, 0, fin, 0, alu_dec(a, w, fin), host_dec<T>(static_cast<T>(a), fin), 0);
    expect_same<T>("neg", a, 0, fin, 0, alu_neg(a, w, fin), host_neg<T>(static_cast<T>(a), fin), 0);
    expect_same<T>("not", a, 0, fin, 0, alu_not(a, w, fin), host_not<T>(static_cast<T>(a), fin), 0);
  }
}

TEST(AluHost, IncDecNegNot) {
  Inputs in(2);
  check_unary<uint8_t>(in);
  check_unary<uint16_t>(in);
  check_unary<uint32_t>(in);
  check_unary<uint64_t>(in);
}

template <typename T>
void check_shifts(Inputs& in) {
  constexpr unsigned w = kWidth<T>;
  struct Case {
    ShiftOp op;
    HostOut (*host)(T, uint8_t, uint64_t);
    const char* name;
  };
  const Case cases[] = {
      {ShiftOp::kRol, host_rol<T>, "rol"}, {ShiftOp::kRor, host_ror<T>, "ror"}, {ShiftOp::kRcl, host_rcl<T>, "rcl"},
      {ShiftOp::kRcr, host_rcr<T>, "rcr"}, {ShiftOp::kShl, host_shl<T>, "shl"}, {ShiftOp::kSal, host_shl<T>, "sal"},
      {ShiftOp::kShr, host_shr<T>, "shr"}, {ShiftOp::kSar, host_sar<T>, "sar"},
  };
  for (const Case& c : cases) {
    for (int i = 0; i < kIterations / 4; ++i) {
      const uint64_t a = in.value(w), fin = in.flags();
      // Every raw count 0..255 occurs: the masking (and the 9/17 modulus of RCL/RCR) is under test too.
      const uint8_t count = static_cast<uint8_t>(i < 256 ? i : in.below(256));
      const unsigned masked = count & (w == 64 ? 63 : 31);
      uint64_t undefined = 0;
      if (masked != 0) {
        const bool rotate = c.op == ShiftOp::kRol || c.op == ShiftOp::kRor || c.op == ShiftOp::kRcl || c.op == ShiftOp::kRcr;
        if (!rotate) undefined |= kAf;
        if (masked != 1) undefined |= kOf;
        if ((c.op == ShiftOp::kShl || c.op == ShiftOp::kSal || c.op == ShiftOp::kShr) && masked >= w) undefined |= kCf;
      }
      expect_same<T>(c.name, a, count, fin, 0, alu_shift(c.op, a, count, w, fin), c.host(static_cast<T>(a), count, fin),
                     undefined);
    }
  }
}

TEST(AluHost, ShiftsAndRotates) {
  Inputs in(3);
  check_shifts<uint8_t>(in);
  check_shifts<uint16_t>(in);
  check_shifts<uint32_t>(in);
  check_shifts<uint64_t>(in);
}

template <typename T>
void check_double_shifts(Inputs& in) {
  constexpr unsigned w = kWidth<T>;
  for (int i = 0; i < kIterations / 2; ++i) {
    const uint64_t dst = in.value(w), src = in.value(w), fin = in.flags();
    const uint8_t count = static_cast<uint8_t>(i < 256 ? i : in.below(256));
    const unsigned masked = count & (w == 64 ? 63 : 31);
    if (masked > w) continue;  // result and flags undefined (16-bit only); docs/interp-alu.md has deja's choice
    uint64_t undefined = 0;
    if (masked != 0) undefined |= kAf;
    if (masked > 1) undefined |= kOf;
    expect_same<T>("shld", dst, src, fin, count, alu_shld(dst, src, count, w, fin),
                   host_shld<T>(static_cast<T>(dst), static_cast<T>(src), count, fin), undefined);
    expect_same<T>("shrd", dst, src, fin, count, alu_shrd(dst, src, count, w, fin),
                   host_shrd<T>(static_cast<T>(dst), static_cast<T>(src), count, fin), undefined);
  }
}

TEST(AluHost, DoubleShifts) {
  Inputs in(4);
  check_double_shifts<uint16_t>(in);
  check_double_shifts<uint32_t>(in);
  check_double_shifts<uint64_t>(in);
}

// deja's documented choice for 16-bit SHLD/SHRD counts above 16: the 48-bit dst:src:dst is shifted.
TEST(AluDocumented, DoubleShift16BeyondWidth) {
  EXPECT_EQ(alu_shld(0x1234, 0x5678, 20, 16, kReservedOne).value, 0x6781u);
  EXPECT_EQ(alu_shrd(0x1234, 0x5678, 20, 16, kReservedOne).value, 0x4567u);
}

template <typename T>
void check_multiply(Inputs& in) {
  constexpr unsigned w = kWidth<T>;
  const uint64_t undefined = kSf | kZf | kAf | kPf;
  for (int i = 0; i < kIterations / 4; ++i) {
    const uint64_t a = in.value(w), b = in.value(w), fin = in.flags();
    const WideResult mul = alu_mul(a, b, w, fin);
    const HostWide host_m = host_mul<T>(static_cast<T>(a), static_cast<T>(b), fin);
    EXPECT_EQ(mul.lo, host_m.lo) << "mul " << w << std::hex << " a=" << a << " b=" << b;
    EXPECT_EQ(mul.hi, host_m.hi) << "mul " << w << std::hex << " a=" << a << " b=" << b;
    EXPECT_EQ(mul.flags & ~undefined & kArithFlags, host_m.flags & ~undefined & kArithFlags) << "mul " << w << std::hex << a << " " << b;
    const WideResult imul = alu_imul_wide(a, b, w, fin);
    const HostWide host_i = host_imul1<T>(static_cast<T>(a), static_cast<T>(b), fin);
    EXPECT_EQ(imul.lo, host_i.lo) << "imul " << w << std::hex << " a=" << a << " b=" << b;
    EXPECT_EQ(imul.hi, host_i.hi) << "imul " << w << std::hex << " a=" << a << " b=" << b;
    EXPECT_EQ(imul.flags & ~undefined & kArithFlags, host_i.flags & ~undefined & kArithFlags) << "imul " << w << std::hex << a << " " << b;
    if constexpr (w != 8) {
      expect_same<T>("imul2", a, b, fin, 0, alu_imul(a, b, w, fin), host_imul2<T>(static_cast<T>(a), static_cast<T>(b), fin),
                     undefined);
    }
  }
}

TEST(AluHost, Multiply) {
  Inputs in(5);
  check_multiply<uint8_t>(in);
  check_multiply<uint16_t>(in);
  check_multiply<uint32_t>(in);
  check_multiply<uint64_t>(in);
}

template <typename T>
void check_divide(Inputs& in) {
  constexpr unsigned w = kWidth<T>;
  int faults = 0;
  for (int i = 0; i < kIterations / 4; ++i) {
    // Small high halves make non-faulting divisions common; the edge values make faults common too.
    const uint64_t hi = (i % 3 == 0) ? in.value(w) : in.below(4) == 0 ? width_mask(w) : in.below(3);
    const uint64_t lo = in.value(w), divisor = in.value(w);
    for (bool is_signed : {false, true}) {
      const DivResult deja = is_signed ? alu_idiv(hi, lo, divisor, w) : alu_div(hi, lo, divisor, w);
      const DivResult host = is_signed ? host_divide<T, true>(hi, lo, divisor) : host_divide<T, false>(hi, lo, divisor);
      faults += host.fault;
      EXPECT_EQ(deja.fault, host.fault) << (is_signed ? "idiv " : "div ") << w << std::hex << " " << hi << ":" << lo << " / " << divisor;
      if (!host.fault) {
        EXPECT_EQ(deja.quotient, host.quotient) << (is_signed ? "idiv " : "div ") << w << std::hex << " " << hi << ":" << lo << " / " << divisor;
        EXPECT_EQ(deja.remainder, host.remainder) << (is_signed ? "idiv " : "div ") << w << std::hex << " " << hi << ":" << lo << " / " << divisor;
      }
    }
  }
  EXPECT_GT(faults, 0) << "the generator never produced a #DE case for width " << w;
  // The one quotient overflow that a careless signed division misses: INT_MIN / -1.
  const uint64_t sign = uint64_t{1} << (w - 1);
  const uint64_t min_hi = w == 8 ? 0xff : width_mask(w);
  EXPECT_TRUE(alu_idiv(min_hi, sign, width_mask(w), w).fault);
  EXPECT_TRUE((host_divide<T, true>(min_hi, sign, width_mask(w)).fault));
}

TEST(AluHost, Divide) {
  Inputs in(6);
  check_divide<uint8_t>(in);
  check_divide<uint16_t>(in);
  check_divide<uint32_t>(in);
  check_divide<uint64_t>(in);
}

template <typename T>
void check_bits(Inputs& in, bool lzcnt) {
  constexpr unsigned w = kWidth<T>;
  for (int i = 0; i < kIterations / 4; ++i) {
    const uint64_t src = in.value(w), old = in.value(w), fin = in.flags();
    if constexpr (w != 8) {
      const uint64_t scan_undefined = kCf | kOf | kSf | kAf | kPf;
      expect_same<T>("bsf", src, old, fin, 0, alu_bit_scan(BitScanOp::kBsf, src, old, w, fin),
                     host_bsf<T>(static_cast<T>(old), static_cast<T>(src), fin), scan_undefined);
      expect_same<T>("bsr", src, old, fin, 0, alu_bit_scan(BitScanOp::kBsr, src, old, w, fin),
                     host_bsr<T>(static_cast<T>(old), static_cast<T>(src), fin), scan_undefined);
      const uint64_t count_undefined = kOf | kSf | kAf | kPf;
      expect_same<T>("tzcnt", src, old, fin, 0, alu_bit_scan(BitScanOp::kTzcnt, src, old, w, fin),
                     host_tzcnt<T>(static_cast<T>(old), static_cast<T>(src), fin), count_undefined);
      if (lzcnt) {
        expect_same<T>("lzcnt", src, old, fin, 0, alu_bit_scan(BitScanOp::kLzcnt, src, old, w, fin),
                       host_lzcnt<T>(static_cast<T>(old), static_cast<T>(src), fin), count_undefined);
      }
      expect_same<T>("popcnt", src, old, fin, 0, alu_bit_scan(BitScanOp::kPopcnt, src, old, w, fin),
                     host_popcnt<T>(static_cast<T>(old), static_cast<T>(src), fin), 0);
      const unsigned bit = static_cast<unsigned>(in.below(w));
      // AMD leaves ZF undefined for BT* as well as OF/SF/AF/PF; deja keeps all of them.
      const uint64_t bt_undefined = kOf | kSf | kAf | kPf | kZf;
      const T bit_reg = static_cast<T>(bit);
      expect_same<T>("bt", src, bit, fin, 0, alu_bit_test(BitTestOp::kBt, src, bit, w, fin),
                     host_bt<T>(static_cast<T>(src), bit_reg, fin), bt_undefined);
      expect_same<T>("bts", src, bit, fin, 0, alu_bit_test(BitTestOp::kBts, src, bit, w, fin),
                     host_bts<T>(static_cast<T>(src), bit_reg, fin), bt_undefined);
      expect_same<T>("btr", src, bit, fin, 0, alu_bit_test(BitTestOp::kBtr, src, bit, w, fin),
                     host_btr<T>(static_cast<T>(src), bit_reg, fin), bt_undefined);
      expect_same<T>("btc", src, bit, fin, 0, alu_bit_test(BitTestOp::kBtc, src, bit, w, fin),
                     host_btc<T>(static_cast<T>(src), bit_reg, fin), bt_undefined);
    }
  }
}

TEST(AluHost, BitScanCountAndTest) {
  const bool lzcnt = host_has_lzcnt();
  if (!lzcnt) std::printf("host lacks LZCNT (it would run as BSR): LZCNT checked only by AluDocumented\n");
  Inputs in(7);
  check_bits<uint16_t>(in, lzcnt);
  check_bits<uint32_t>(in, lzcnt);
  check_bits<uint64_t>(in, lzcnt);
}

TEST(AluDocumented, BitScanZeroSourceKeepsDestination) {
  const AluResult bsf = alu_bit_scan(BitScanOp::kBsf, 0, 0xdead, 32, kReservedOne);
  EXPECT_EQ(bsf.value, 0xdeadu);
  EXPECT_TRUE(bsf.flags & kZf);
  const AluResult lz = alu_bit_scan(BitScanOp::kLzcnt, 0, 0xdead, 16, kReservedOne);
  EXPECT_EQ(lz.value, 16u);
  EXPECT_TRUE(lz.flags & kCf);
  EXPECT_FALSE(lz.flags & kZf);
  const AluResult lz1 = alu_bit_scan(BitScanOp::kLzcnt, 0x8000, 0, 16, kReservedOne);
  EXPECT_EQ(lz1.value, 0u);
  EXPECT_TRUE(lz1.flags & kZf);
  EXPECT_EQ(alu_bit_scan(BitScanOp::kLzcnt, 1, 0, 64, kReservedOne).value, 63u);
}

// SETcc on the host for every condition and every combination of the five flags conditions read.
template <unsigned kCc>
bool host_condition(uint64_t fin) {
  uint8_t out;
#define DEJA_SETCC(N, INSN) \
  if constexpr (kCc == N) asm("lea -128(%%rsp), %%rsp\n\tpush %[fin]\n\tpopfq\n\t" INSN " %[out]\n\tlea 128(%%rsp), %%rsp" : [out] "=r"(out) : [fin] "r"(fin) : "cc");
  DEJA_SETCC(0, "seto") DEJA_SETCC(1, "setno") DEJA_SETCC(2, "setb") DEJA_SETCC(3, "setae")
  DEJA_SETCC(4, "sete") DEJA_SETCC(5, "setne") DEJA_SETCC(6, "setbe") DEJA_SETCC(7, "seta")
  DEJA_SETCC(8, "sets") DEJA_SETCC(9, "setns") DEJA_SETCC(10, "setp") DEJA_SETCC(11, "setnp")
  DEJA_SETCC(12, "setl") DEJA_SETCC(13, "setge") DEJA_SETCC(14, "setle") DEJA_SETCC(15, "setg")
#undef DEJA_SETCC
  return out != 0;
}

template <unsigned... kCcs>
void check_conditions(std::integer_sequence<unsigned, kCcs...>) {
  const uint64_t bits[] = {kCf, kPf, kZf, kSf, kOf};
  for (unsigned combo = 0; combo < 32; ++combo) {
    uint64_t fin = kReservedOne;
    for (unsigned i = 0; i < 5; ++i)
      if (combo & (1u << i)) fin |= bits[i];
    const bool deja[] = {condition_holds(kCcs, fin)...};
    const bool host[] = {host_condition<kCcs>(fin)...};
    for (unsigned cc = 0; cc < sizeof...(kCcs); ++cc) EXPECT_EQ(deja[cc], host[cc]) << "cc " << cc << " flags " << std::hex << fin;
  }
}

TEST(AluHost, ConditionCodes) { check_conditions(std::make_integer_sequence<unsigned, 16>{}); }

TEST(AluHelpers, SignExtendAndMask) {
  EXPECT_EQ(sign_extend(0x80, 8), 0xffffffffffffff80ull);
  EXPECT_EQ(sign_extend(0x7fff, 16), 0x7fffull);
  EXPECT_EQ(sign_extend(0x80000000, 32), 0xffffffff80000000ull);
  EXPECT_EQ(sign_extend(0x8000000000000000ull, 64), 0x8000000000000000ull);
  EXPECT_EQ(width_mask(16), 0xffffull);
  EXPECT_EQ(width_mask(64), ~0ull);
  EXPECT_TRUE(parity_even(0x03));
  EXPECT_FALSE(parity_even(0x07));
}

}  // namespace
}  // namespace deja::interp
