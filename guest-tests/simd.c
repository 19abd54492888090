/* Guest "simd": MMX (on the x87 registers), SSE3, SSSE3, SSE4.1 and SSE4.2 with known results, and AMD's legacy
   performance counters, which software that does not know the vendor programs (read back as 0, as KVM without a
   PMU and QEMU's TCG answer). Every part runs only where CPUID has the feature, and prints what it computed. */
#include "runtime/runtime.h"

#define CPUID1_EDX_MMX (1u << 23)
#define CPUID1_ECX_SSE3 (1u << 0)
#define CPUID1_ECX_SSSE3 (1u << 9)
#define CPUID1_ECX_SSE41 (1u << 19)
#define CPUID1_ECX_SSE42 (1u << 20)

typedef long long v2di __attribute__((vector_size(16)));

static uint64_t lo(v2di v) { return (uint64_t)v[0]; }
static uint64_t hi(v2di v) { return (uint64_t)v[1]; }

static void mmx(void) {
  uint64_t sum, madd, packed, x87_after, tags;
  uint16_t status;
  __asm__ volatile(
      "fninit\n\t"
      "fld1\n\t"                                   /* TOP = 7: the first MMX instruction moves it to 0 */
      "movq %[a], %%mm0\n\t"
      "movq %[b], %%mm1\n\t"
      "paddusw %%mm1, %%mm0\n\t"
      "movq %%mm0, %[sum]\n\t"
      "movq %[a], %%mm2\n\t"
      "pmaddwd %[b], %%mm2\n\t"
      "movq %%mm2, %[madd]\n\t"
      "packsswb %%mm2, %%mm0\n\t"
      "movq %%mm0, %[packed]\n\t"
      "fnstsw %[status]\n\t"
      "sub $32, %%rsp\n\t"
      "fnstenv (%%rsp)\n\t"
      "movzwl 8(%%rsp), %k[tags]\n\t"
      /* The image cleared: its pointers and reserved halves differ between CPUs (QEMU's TCG zeroes them), and a
         trace recorded on the software CPU replays on such a KVM only if memory never shows the difference. */
      "movq $0, (%%rsp)\n\t"
      "movq $0, 8(%%rsp)\n\t"
      "movq $0, 16(%%rsp)\n\t"
      "movq $0, 24(%%rsp)\n\t"
      "add $32, %%rsp\n\t"
      "emms\n\t"
      "fld1\n\t"                                   /* the x87 again after EMMS */
      "fadd %%st(0), %%st(0)\n\t"
      "sub $16, %%rsp\n\t"
      "fistpq (%%rsp)\n\t"
      "pop %[x87]\n\t"
      "add $8, %%rsp\n\t"
      : [sum] "=m"(sum), [madd] "=m"(madd), [packed] "=m"(packed), [status] "=m"(status), [tags] "=&r"(tags),
        [x87] "=&r"(x87_after)
      : [a] "m"((uint64_t){0x7fff000100028000ull}), [b] "m"((uint64_t){0x0002fffe7ffe8000ull})
      : "rax", "mm0", "mm1", "mm2", "memory");
  printf("mmx: paddusw=%#018lx pmaddwd=%#018lx packsswb=%#018lx\n", sum, madd, packed);
  /* (FNSTENV's tag word follows the registers' contents: 10, special, for the two MMX registers written.) */
  printf("mmx: after the MMX instructions FSW=%#06x tags=%#06lx; the x87 after EMMS: 1+1=%lu\n", status, tags,
         x87_after);
}

static void sse3(void) {
  v2di a = {0x3ff0000040000000ll, 0x4008000040800000ll};  /* singles 2, 1.875, 4, 2.125; doubles 1, 3 */
  v2di hadd = a, dup;
  __asm__("haddps %1, %0" : "+x"(hadd) : "x"(a));
  __asm__("movshdup %1, %0" : "=x"(dup) : "x"(a));
  printf("sse3: haddps=%016lx:%016lx movshdup=%016lx:%016lx\n", hi(hadd), lo(hadd), hi(dup), lo(dup));
}

static void ssse3(void) {
  v2di bytes = {0x0706050403020100ll, 0x0f0e0d0c0b0a0908ll}, reverse = {0x08090a0b0c0d0e0fll, 0x0001020304050607ll};
  v2di shuffled = bytes, aligned = bytes, absolute = {-5ll, 0x80000000fffffff6ll};
  __asm__("pshufb %1, %0" : "+x"(shuffled) : "x"(reverse));
  __asm__("palignr $5, %1, %0" : "+x"(aligned) : "x"(reverse));
  __asm__("pabsd %0, %0" : "+x"(absolute));
  printf("ssse3: pshufb=%016lx:%016lx palignr=%016lx:%016lx pabsd=%016lx:%016lx\n", hi(shuffled), lo(shuffled),
         hi(aligned), lo(aligned), hi(absolute), lo(absolute));
}

static void sse41(void) {
  v2di a = {0x4004000000000000ll, 0xc00c000000000000ll};  /* 2.5, -3.5 */
  v2di rounded, words = {0x0005000300070001ll, 0x0002000900040006ll}, minpos, mul = {0x0000000700000003ll, 0x00000000fffffffell};
  uint8_t zf, cf;
  __asm__("roundpd $0, %1, %0" : "=x"(rounded) : "x"(a));  /* to nearest even: 2, -4 */
  __asm__("phminposuw %1, %0" : "=x"(minpos) : "x"(words));
  __asm__("pmulld %0, %0" : "+x"(mul));
  __asm__("ptest %2, %3; setz %0; setc %1" : "=r"(zf), "=r"(cf) : "x"(a), "x"(words) : "cc");
  printf("sse4.1: roundpd=%016lx:%016lx phminposuw=%#lx pmulld=%016lx:%016lx ptest zf=%u cf=%u\n", hi(rounded),
         lo(rounded), lo(minpos), hi(mul), lo(mul), zf, cf);
}

static void sse42(void) {
  static const char text[] __attribute__((aligned(16))) = "deja: record and replay\0\0\0\0\0\0\0\0\0";
  static const char set[16] __attribute__((aligned(16))) = "xyz:";
  uint32_t crc = 0xffffffff;
  for (const char *p = text; *p; ++p) __asm__("crc32b %1, %0" : "+r"(crc) : "m"(*p));
  v2di chunk, tail, needle;
  __builtin_memcpy(&chunk, text, 16);
  __builtin_memcpy(&tail, text + 16, 16);
  __builtin_memcpy(&needle, set, 16);
  uint32_t index, length;
  /* Equal any (0x00): the first of the text's bytes in the set, as strpbrk does. Equal each (0x08) against an
     empty string: the first element where both are past their ends, i.e. the second chunk's length. */
  __asm__("pcmpistri $0x00, %1, %2" : "=c"(index) : "x"(chunk), "x"(needle) : "cc");
  __asm__("pcmpistri $0x08, %1, %2" : "=c"(length) : "x"(tail), "x"((v2di){0, 0}) : "cc");
  printf("sse4.2: crc32c=%#010x pcmpistri any=%u each=%u\n", ~crc, index, length);
}

int guest_main(void) {
  const struct cpuid_regs leaf1 = cpuid(1, 0);
  if (leaf1.edx & CPUID1_EDX_MMX) mmx(); else printf("mmx: not available\n");
  if (leaf1.ecx & CPUID1_ECX_SSE3) sse3(); else printf("sse3: not available\n");
  if (leaf1.ecx & CPUID1_ECX_SSSE3) ssse3(); else printf("ssse3: not available\n");
  if (leaf1.ecx & CPUID1_ECX_SSE41) sse41(); else printf("sse4.1: not available\n");
  if (leaf1.ecx & CPUID1_ECX_SSE42) sse42(); else printf("sse4.2: not available\n");
  /* What kvm-unit-tests does at start-up on a CPU that is not GenuineIntel: AMD's four legacy counters. */
  uint64_t read_back = 0;
  for (uint32_t i = 0; i < 4; ++i) {
    wrmsr(0xc0010000 + i, 0);
    wrmsr(0xc0010004 + i, 0x1234);
    read_back |= rdmsr(0xc0010000 + i) | rdmsr(0xc0010004 + i);
  }
  printf("perf counters: PERF_CTL0-3 and PERF_CTR0-3 read back %#lx\n", read_back);
  return 0;
}
