/* Guest "avx": x86-64-v3's additions with known results (AVX, AVX2, FMA, F16C, BMI1, BMI2, MOVBE, LZCNT) and the
   XSAVE state an OS manages: CR4.OSXSAVE and XCR0 enabled as Linux does, CPUID's run-time bits (OSXSAVE, leaf 0DH's
   size) before and after, an XSAVE/XRSTOR round trip, and a YMM upper half kept across the serial output's port
   exits, where recording and replay compare the whole vCPU state. Every part runs only where CPUID has the feature.
   Only the operations' results are printed: the flags the SDM leaves undefined stay out of the output. */
#include "runtime/runtime.h"

#define CPUID1_ECX_FMA (1u << 12)
#define CPUID1_ECX_MOVBE (1u << 22)
#define CPUID1_ECX_XSAVE (1u << 26)
#define CPUID1_ECX_OSXSAVE (1u << 27)
#define CPUID1_ECX_AVX (1u << 28)
#define CPUID1_ECX_F16C (1u << 29)
#define CPUID7_EBX_BMI1 (1u << 3)
#define CPUID7_EBX_AVX2 (1u << 5)
#define CPUID7_EBX_BMI2 (1u << 8)
#define CPUID81_ECX_LZCNT (1u << 5)
#define CR4_OSXSAVE (1ull << 18)

typedef uint64_t ymm[4];

static void print_ymm(const char *what, const ymm v) {
  printf(" %s=%016lx:%016lx:%016lx:%016lx", what, v[3], v[2], v[1], v[0]);
}

/* YMM15's upper half carries this across every port exit from here on (legacy SSE code leaves bits 128-255 alone). */
static const ymm kept = {0x0123456789abcdefull, 0xfedcba9876543210ull, 0x1111222233334444ull, 0x5555666677778888ull};

static int enable_avx_state(void) {
  const struct cpuid_regs leaf1 = cpuid(1, 0);
  if (!(leaf1.ecx & CPUID1_ECX_XSAVE) || !(leaf1.ecx & CPUID1_ECX_AVX)) {
    printf("xsave: not available\n");
    return 0;
  }
  const uint32_t size_before = cpuid(0xd, 0).ebx;
  uint64_t cr4;
  __asm__ volatile("mov %%cr4, %0" : "=r"(cr4));
  __asm__ volatile("mov %0, %%cr4" : : "r"(cr4 | CR4_OSXSAVE));
  __asm__ volatile("xsetbv" : : "a"(7), "d"(0), "c"(0));  /* XCR0: x87, SSE and AVX state */
  uint32_t xcr0_low, xcr0_high;
  __asm__ volatile("xgetbv" : "=a"(xcr0_low), "=d"(xcr0_high) : "c"(0));
  printf("xsave: OSXSAVE %u -> %u, CPUID.0DH:EBX %u -> %u, XCR0=%#x\n", !!(leaf1.ecx & CPUID1_ECX_OSXSAVE),
         !!(cpuid(1, 0).ecx & CPUID1_ECX_OSXSAVE), size_before, cpuid(0xd, 0).ebx, xcr0_low);
  __asm__ volatile("vmovdqu %0, %%ymm15" : : "m"(kept) : "xmm15");
  return 1;
}

static void avx(void) {
  static const ymm a = {0x3ff8000000000000ull, 0x4004000000000000ull, 0xc008000000000000ull, 0x4011000000000000ull};
  static const ymm b = {0x3fd0000000000000ull, 0x3fd0000000000000ull, 0x3fe0000000000000ull, 0xbff0000000000000ull};
  ymm sum, swapped;
  uint32_t signs;
  __asm__ volatile(
      "vmovupd %[a], %%ymm0\n\t"
      "vaddpd %[b], %%ymm0, %%ymm1\n\t"               /* 1.75, 2.75, -2.5, 3.25 */
      "vmovupd %%ymm1, %[sum]\n\t"
      "vperm2f128 $0x01, %%ymm1, %%ymm1, %%ymm2\n\t"  /* the lanes swapped */
      "vmovupd %%ymm2, %[swapped]\n\t"
      "vmovmskpd %%ymm2, %[signs]\n\t"
      : [sum] "=m"(sum), [swapped] "=m"(swapped), [signs] "=r"(signs)
      : [a] "m"(a), [b] "m"(b)
      : "xmm0", "xmm1", "xmm2");
  printf("avx:");
  print_ymm("vaddpd", sum);
  print_ymm("vperm2f128", swapped);
  printf(" vmovmskpd=%#x\n", signs);
}

static void avx2(void) {
  static const char text[64] __attribute__((aligned(32))) = "deja records and replays x86-64-v3 guests";
  static const ymm ramp = {0x0706050403020100ull, 0x0f0e0d0c0b0a0908ull, 0x1716151413121110ull, 0x1f1e1d1c1b1a1918ull};
  ymm shuffled, permuted, minimum;
  uint32_t zero_bytes;
  /* The body of glibc's AVX2 strlen: compare 32 bytes with zero, take the mask. */
  __asm__ volatile(
      "vpxor %%xmm0, %%xmm0, %%xmm0\n\t"
      "vpcmpeqb 32+%[text], %%ymm0, %%ymm1\n\t"
      "vpmovmskb %%ymm1, %[zero_bytes]\n\t"
      "vmovdqu %[ramp], %%ymm2\n\t"
      "vpshufb %[text], %%ymm2, %%ymm3\n\t"           /* in-lane byte shuffle by the text's low bits */
      "vmovdqu %%ymm3, %[shuffled]\n\t"
      "vpermq $0x1b, %%ymm2, %%ymm4\n\t"              /* quadwords reversed across the lanes */
      "vmovdqu %%ymm4, %[permuted]\n\t"
      "vpminub %[text], %%ymm4, %%ymm5\n\t"
      "vmovdqu %%ymm5, %[minimum]\n\t"
      : [shuffled] "=m"(shuffled), [permuted] "=m"(permuted), [minimum] "=m"(minimum), [zero_bytes] "=r"(zero_bytes)
      : [text] "m"(text), [ramp] "m"(ramp)
      : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5");
  printf("avx2: vpmovmskb=%#010x", zero_bytes);
  print_ymm("vpshufb", shuffled);
  print_ymm("vpermq", permuted);
  print_ymm("vpminub", minimum);
  printf("\n");
}

static void fma(void) {
  /* (1 + 2^-27)(1 - 2^-27) - 1 = -2^-54 fused; a separate multiply rounds the product to 1 and gives 0. */
  static const ymm a = {0x3ff0000002000000ull, 0x4000000000000000ull, 0x3ff0000002000000ull, 0x3ff8000000000000ull};
  static const ymm b = {0x3feffffffc000000ull, 0x4008000000000000ull, 0x3feffffffc000000ull, 0x3ff8000000000000ull};
  static const ymm c = {0xbff0000000000000ull, 0x3ff0000000000000ull, 0xbff0000000000000ull, 0x0000000000000000ull};
  ymm fused;
  __asm__ volatile(
      "vmovupd %[c], %%ymm0\n\t"
      "vmovupd %[a], %%ymm1\n\t"
      "vfmadd231pd %[b], %%ymm1, %%ymm0\n\t"
      "vmovupd %%ymm0, %[fused]\n\t"
      : [fused] "=m"(fused)
      : [a] "m"(a), [b] "m"(b), [c] "m"(c)
      : "xmm0", "xmm1");
  printf("fma:");
  print_ymm("vfmadd231pd", fused);
  printf("\n");
}

static void f16c(void) {
  /* 1.0, 65504 (the largest half), 1e-5 (a subnormal half), 1/3, -0.0, 70000 (overflows to infinity), 2, 0.1 */
  static const uint32_t singles[8] = {0x3f800000, 0x477fe000, 0x3727c5ac, 0x3eaaaaab,
                                      0x80000000, 0x4788b800, 0x40000000, 0x3dcccccd};
  uint64_t halves[2];
  ymm back;
  __asm__ volatile(
      "vmovups %[singles], %%ymm0\n\t"
      "vcvtps2ph $0, %%ymm0, %%xmm1\n\t"
      "vmovdqu %%xmm1, %[halves]\n\t"
      "vcvtph2ps %%xmm1, %%ymm2\n\t"
      "vmovups %%ymm2, %[back]\n\t"
      : [halves] "=m"(halves), [back] "=m"(back)
      : [singles] "m"(singles)
      : "xmm0", "xmm1", "xmm2");
  printf("f16c: vcvtps2ph=%016lx:%016lx", halves[1], halves[0]);
  print_ymm("vcvtph2ps", back);
  printf("\n");
}

static void bmi1(void) {
  const uint64_t x = 0x00f0ff0012345600ull;
  uint64_t andn, bextr, blsi, blsmsk, blsr, tzcnt;
  __asm__("andn %2, %1, %0" : "=r"(andn) : "r"(x), "r"(~0ull >> 4) : "cc");
  __asm__("bextr %2, %1, %0" : "=r"(bextr) : "r"(x), "r"((uint64_t)(12u << 8 | 8u)) : "cc");  /* 12 bits from 8 */
  __asm__("blsi %1, %0" : "=r"(blsi) : "r"(x) : "cc");
  __asm__("blsmsk %1, %0" : "=r"(blsmsk) : "r"(x) : "cc");
  __asm__("blsr %1, %0" : "=r"(blsr) : "r"(x) : "cc");
  __asm__("tzcnt %1, %0" : "=r"(tzcnt) : "r"(x) : "cc");
  printf("bmi1: andn=%#lx bextr=%#lx blsi=%#lx blsmsk=%#lx blsr=%#lx tzcnt=%lu\n", andn, bextr, blsi, blsmsk, blsr,
         tzcnt);
}

static void bmi2(void) {
  const uint64_t x = 0x8000f0f012345678ull;
  uint64_t bzhi, pdep, pext, rorx, sarx, shlx, shrx, high, low;
  __asm__("bzhi %2, %1, %0" : "=r"(bzhi) : "r"(x), "r"(20ull) : "cc");
  __asm__("pdep %2, %1, %0" : "=r"(pdep) : "r"(0x2dull), "r"(0xff00ff00ull));
  __asm__("pext %2, %1, %0" : "=r"(pext) : "r"(x), "r"(0xffff0000ffull));
  __asm__("rorx $12, %1, %0" : "=r"(rorx) : "r"(x));
  __asm__("sarx %2, %1, %0" : "=r"(sarx) : "r"(x), "r"(8ull));
  __asm__("shlx %2, %1, %0" : "=r"(shlx) : "r"(x), "r"(68ull));  /* the count is taken modulo 64 */
  __asm__("shrx %2, %1, %0" : "=r"(shrx) : "r"(x), "r"(8ull));
  __asm__("mulx %3, %1, %0" : "=r"(high), "=r"(low) : "d"(x), "r"(0x123456789ull));
  printf("bmi2: bzhi=%#lx pdep=%#lx pext=%#lx rorx=%#lx sarx=%#lx shlx=%#lx shrx=%#lx mulx=%#lx:%#lx\n", bzhi, pdep,
         pext, rorx, sarx, shlx, shrx, high, low);
}

static void movbe_lzcnt(int movbe, int lzcnt) {
  const uint64_t x = 0x0000123456789abcull;
  if (movbe) {
    uint64_t swapped;
    __asm__("movbe %1, %0" : "=r"(swapped) : "m"(x));
    printf("movbe: %#lx\n", swapped);
  } else {
    printf("movbe: not available\n");
  }
  if (lzcnt) {
    uint64_t count, zero_count;
    __asm__("lzcnt %1, %0" : "=r"(count) : "r"(x) : "cc");
    __asm__("lzcnt %1, %0" : "=r"(zero_count) : "r"(0ull) : "cc");
    printf("lzcnt: %lu of %#lx, %lu of 0\n", count, x, zero_count);
  } else {
    printf("lzcnt: not available\n");
  }
}

/* XSAVE, then XRSTOR after the register is cleared: YMM3 comes back. The area is cleared afterwards: the header and
   legacy-area details an implementation may write differently (XSTATE_BV of components in their initial state,
   MXCSR_MASK, the x87 pointers) never reach memory that recording and replay compare. */
static uint8_t xsave_area[1024] __attribute__((aligned(64)));

static void xsave_round_trip(void) {
  static const ymm value = {0xa5a5a5a5a5a5a5a5ull, 0x0102030405060708ull, 0x1122334455667788ull, 0x99aabbccddeeff00ull};
  ymm back;
  memset(xsave_area, 0, sizeof xsave_area);
  __asm__ volatile(
      "vmovdqu %[value], %%ymm3\n\t"
      "xsave %[area]\n\t"
      "vpxor %%xmm3, %%xmm3, %%xmm3\n\t"
      "xrstor %[area]\n\t"
      "vmovdqu %%ymm3, %[back]\n\t"
      : [back] "=m"(back), [area] "+m"(xsave_area)
      : [value] "m"(value), "a"(7), "d"(0)
      : "xmm3", "memory");
  memset(xsave_area, 0, sizeof xsave_area);
  printf("xrstor:");
  print_ymm("ymm3", back);
  printf("\n");
}

int guest_main(void) {
  const struct cpuid_regs leaf1 = cpuid(1, 0), leaf7 = cpuid(7, 0), leaf81 = cpuid(0x80000001, 0);
  const int avx_state = enable_avx_state();
  if (avx_state) {
    xsave_round_trip();
    avx();
  } else {
    printf("xrstor: not available\navx: not available\n");
  }
  if (avx_state && (leaf7.ebx & CPUID7_EBX_AVX2)) avx2(); else printf("avx2: not available\n");
  if (avx_state && (leaf1.ecx & CPUID1_ECX_FMA)) fma(); else printf("fma: not available\n");
  if (avx_state && (leaf1.ecx & CPUID1_ECX_F16C)) f16c(); else printf("f16c: not available\n");
  if (leaf7.ebx & CPUID7_EBX_BMI1) bmi1(); else printf("bmi1: not available\n");
  if (leaf7.ebx & CPUID7_EBX_BMI2) bmi2(); else printf("bmi2: not available\n");
  movbe_lzcnt(leaf1.ecx & CPUID1_ECX_MOVBE, leaf81.ecx & CPUID81_ECX_LZCNT);
  if (avx_state) {
    ymm after;
    __asm__ volatile("vmovdqu %%ymm15, %0\n\tvzeroupper" : "=m"(after));
    printf("ymm15 across the port exits: %s\n", __builtin_memcmp(after, kept, sizeof after) ? "changed" : "kept");
  } else {
    printf("ymm15 across the port exits: not available\n");
  }
  return 0;
}
