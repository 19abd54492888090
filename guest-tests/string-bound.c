/* Guest "string-bound" (benchmark): glibc's AVX2 string and memory functions' loops (memset, memcpy, strlen, memchr, memcmp) over buffers of varying sizes, ending in a checksum. */
#include "runtime/runtime.h"

/* The functions below follow the AVX2 string functions of glibc 2.36 (sysdeps/x86_64/multiarch; memmove with
   32-byte vectors): the same instructions in the same loops (VMOVDQU/VMOVDQA, VPBROADCASTB, VPCMPEQB, VPMINUB,
   VPOR, VPAND, VPMOVMSKB, TZCNT, SARX, VZEROUPPER), with simpler edges. A distribution's user space spends much
   of its time there. One iteration works on 2-6 KiB in each function: about 2,500 guest instructions; the
   default n = 400,000 is about 9.8e8 instructions; pass "n=NUMBER". The machine must have AVX2 and BMI2
   (x86-64-v3): the guest enables the AVX state (CR4.OSXSAVE, XCR0) as an OS does. */
#define DEFAULT_ITERATIONS 400000ull
#define BUFFER 16384

static uint8_t source[BUFFER + 256] __attribute__((aligned(64)));
static uint8_t target[BUFFER + 256] __attribute__((aligned(64)));
static uint8_t text[BUFFER + 256] __attribute__((aligned(64)));

static void memset_avx2(void *dst, int c, uint64_t n) {
  __asm__ volatile(
      "vmovd %k[c], %%xmm0\n\t"
      "vpbroadcastb %%xmm0, %%ymm0\n\t"
      "cmpq $32, %[n]\n\tjb 3f\n\t"
      "leaq -32(%[d], %[n]), %%rcx\n\t"      /* the last vector, stored last (overlapping) */
      "cmpq $128, %[n]\n\tjb 2f\n"
      "1:\n\t"
      "vmovdqu %%ymm0, (%[d])\n\tvmovdqu %%ymm0, 32(%[d])\n\tvmovdqu %%ymm0, 64(%[d])\n\tvmovdqu %%ymm0, 96(%[d])\n\t"
      "subq $-128, %[d]\n\taddq $-128, %[n]\n\tcmpq $128, %[n]\n\tjae 1b\n"
      "2:\n\t"
      "cmpq $32, %[n]\n\tjb 4f\n\t"
      "vmovdqu %%ymm0, (%[d])\n\taddq $32, %[d]\n\tsubq $32, %[n]\n\tjmp 2b\n"
      "4:\n\t"
      "vmovdqu %%ymm0, (%%rcx)\n\tjmp 5f\n"
      "3:\n\t"
      "testq %[n], %[n]\n\tjz 5f\n\t"
      "movb %b[c], -1(%[d], %[n])\n\tdecq %[n]\n\tjmp 3b\n"
      "5:\n\t"
      "vzeroupper"
      : [d] "+r"(dst), [n] "+r"(n)
      : [c] "r"(c)
      : "rcx", "xmm0", "cc", "memory");
}

static void memcpy_avx2(void *dst, const void *src, uint64_t n) {
  __asm__ volatile(
      "cmpq $32, %[n]\n\tjb 3f\n\t"
      "vmovdqu -32(%[s], %[n]), %%ymm4\n\t"  /* the last vector, loaded first, stored last */
      "leaq -32(%[d], %[n]), %%rcx\n"
      "1:\n\t"
      "cmpq $128, %[n]\n\tjb 2f\n\t"
      "vmovdqu (%[s]), %%ymm0\n\tvmovdqu 32(%[s]), %%ymm1\n\tvmovdqu 64(%[s]), %%ymm2\n\tvmovdqu 96(%[s]), %%ymm3\n\t"
      "vmovdqu %%ymm0, (%[d])\n\tvmovdqu %%ymm1, 32(%[d])\n\tvmovdqu %%ymm2, 64(%[d])\n\tvmovdqu %%ymm3, 96(%[d])\n\t"
      "subq $-128, %[s]\n\tsubq $-128, %[d]\n\taddq $-128, %[n]\n\tjmp 1b\n"
      "2:\n\t"
      "cmpq $32, %[n]\n\tjb 4f\n\t"
      "vmovdqu (%[s]), %%ymm0\n\tvmovdqu %%ymm0, (%[d])\n\taddq $32, %[s]\n\taddq $32, %[d]\n\tsubq $32, %[n]\n\tjmp 2b\n"
      "4:\n\t"
      "vmovdqu %%ymm4, (%%rcx)\n\tjmp 5f\n"
      "3:\n\t"
      "testq %[n], %[n]\n\tjz 5f\n\t"
      "movzbl -1(%[s], %[n]), %%eax\n\tmovb %%al, -1(%[d], %[n])\n\tdecq %[n]\n\tjmp 3b\n"
      "5:\n\t"
      "vzeroupper"
      : [d] "+r"(dst), [s] "+r"(src), [n] "+r"(n)
      :
      : "rax", "rcx", "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "cc", "memory");
}

static uint64_t strlen_avx2(const char *s) {
  uint64_t result;
  __asm__ volatile(
      "movq %[s], %%rdx\n\t"
      "movl %k[s], %%ecx\n\t"
      "andq $-32, %[s]\n\t"                  /* aligned reads never cross into an unmapped page */
      "andl $31, %%ecx\n\t"
      "vpxor %%xmm0, %%xmm0, %%xmm0\n\t"
      "vpcmpeqb (%[s]), %%ymm0, %%ymm1\n\t"
      "vpmovmskb %%ymm1, %%eax\n\t"
      "sarxl %%ecx, %%eax, %%eax\n\t"         /* the bytes before the string dropped */
      "testl %%eax, %%eax\n\tjz 1f\n\t"
      "tzcntl %%eax, %%eax\n\tjmp 9f\n"
      "1:\n\t"
      "addq $32, %[s]\n\t"
      "vmovdqa (%[s]), %%ymm1\n\tvpcmpeqb %%ymm1, %%ymm0, %%ymm1\n\tvpmovmskb %%ymm1, %%eax\n\t"
      "testl %%eax, %%eax\n\tjnz 8f\n\t"
      "testl $127, %k[s]\n\tjnz 1b\n"         /* to a 128-byte boundary, a vector at a time */
      "2:\n\t"                               /* four vectors a round: the minimum is zero where any byte is */
      "vmovdqa (%[s]), %%ymm1\n\tvpminub 32(%[s]), %%ymm1, %%ymm2\n\t"
      "vmovdqa 64(%[s]), %%ymm3\n\tvpminub 96(%[s]), %%ymm3, %%ymm4\n\t"
      "vpminub %%ymm2, %%ymm4, %%ymm5\n\tvpcmpeqb %%ymm5, %%ymm0, %%ymm5\n\tvpmovmskb %%ymm5, %%eax\n\t"
      "subq $-128, %[s]\n\t"
      "testl %%eax, %%eax\n\tjz 2b\n\t"
      "addq $-128, %[s]\n"
      "3:\n\t"
      "vpcmpeqb (%[s]), %%ymm0, %%ymm1\n\tvpmovmskb %%ymm1, %%eax\n\t"
      "testl %%eax, %%eax\n\tjnz 8f\n\t"
      "addq $32, %[s]\n\tjmp 3b\n"
      "8:\n\t"
      "tzcntl %%eax, %%eax\n\taddq %[s], %%rax\n\tsubq %%rdx, %%rax\n"
      "9:\n\t"
      "vzeroupper"
      : "=a"(result), [s] "+r"(s)
      :
      : "rcx", "rdx", "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "cc", "memory");
  return result;
}

/* The offset of the first byte `c` in [s, s + n), or n. */
static uint64_t memchr_avx2(const uint8_t *s, int c, uint64_t n) {
  uint64_t offset = 0;
  __asm__ volatile(
      "vmovd %k[c], %%xmm0\n\tvpbroadcastb %%xmm0, %%ymm0\n"
      "1:\n\t"
      "leaq 128(%[o]), %%rax\n\tcmpq %[n], %%rax\n\tja 3f\n\t"
      "vpcmpeqb (%[s], %[o]), %%ymm0, %%ymm1\n\tvpcmpeqb 32(%[s], %[o]), %%ymm0, %%ymm2\n\t"
      "vpcmpeqb 64(%[s], %[o]), %%ymm0, %%ymm3\n\tvpcmpeqb 96(%[s], %[o]), %%ymm0, %%ymm4\n\t"
      "vpor %%ymm1, %%ymm2, %%ymm5\n\tvpor %%ymm3, %%ymm4, %%ymm6\n\tvpor %%ymm5, %%ymm6, %%ymm5\n\t"
      "vpmovmskb %%ymm5, %%eax\n\ttestl %%eax, %%eax\n\tjnz 2f\n\t"
      "subq $-128, %[o]\n\tjmp 1b\n"
      "2:\n\t"                               /* in one of the four */
      "vpmovmskb %%ymm1, %%eax\n\ttestl %%eax, %%eax\n\tjnz 8f\n\taddq $32, %[o]\n\t"
      "vpmovmskb %%ymm2, %%eax\n\ttestl %%eax, %%eax\n\tjnz 8f\n\taddq $32, %[o]\n\t"
      "vpmovmskb %%ymm3, %%eax\n\ttestl %%eax, %%eax\n\tjnz 8f\n\taddq $32, %[o]\n\t"
      "vpmovmskb %%ymm4, %%eax\n\tjmp 8f\n"
      "3:\n\t"                               /* the rest, a byte at a time */
      "cmpq %[n], %[o]\n\tjae 9f\n\t"
      "cmpb %b[c], (%[s], %[o])\n\tje 9f\n\t"
      "incq %[o]\n\tjmp 3b\n"
      "8:\n\t"
      "tzcntl %%eax, %%eax\n\taddq %%rax, %[o]\n"
      "9:\n\t"
      "vzeroupper"
      : [o] "+r"(offset)
      : [s] "r"(s), [c] "r"(c), [n] "r"(n)
      : "rax", "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "cc", "memory");
  return offset;
}

/* memcmp's sign (-1, 0, 1) for n a multiple of 32. */
static int memcmp_avx2(const uint8_t *a, const uint8_t *b, uint64_t n) {
  int64_t result = 0;
  __asm__ volatile(
      "1:\n\t"
      "cmpq $128, %[n]\n\tjb 2f\n\t"
      "vmovdqu (%[b]), %%ymm1\n\tvpcmpeqb (%[a]), %%ymm1, %%ymm1\n\t"
      "vmovdqu 32(%[b]), %%ymm2\n\tvpcmpeqb 32(%[a]), %%ymm2, %%ymm2\n\t"
      "vmovdqu 64(%[b]), %%ymm3\n\tvpcmpeqb 64(%[a]), %%ymm3, %%ymm3\n\t"
      "vmovdqu 96(%[b]), %%ymm4\n\tvpcmpeqb 96(%[a]), %%ymm4, %%ymm4\n\t"
      "vpand %%ymm1, %%ymm2, %%ymm5\n\tvpand %%ymm3, %%ymm4, %%ymm6\n\tvpand %%ymm5, %%ymm6, %%ymm7\n\t"
      "vpmovmskb %%ymm7, %%ecx\n\tincl %%ecx\n\tjnz 3f\n\t"
      "subq $-128, %[a]\n\tsubq $-128, %[b]\n\taddq $-128, %[n]\n\tjmp 1b\n"
      "2:\n\t"
      "testq %[n], %[n]\n\tjz 9f\n"
      "3:\n\t"                               /* a vector at a time to the first difference */
      "vmovdqu (%[b]), %%ymm1\n\tvpcmpeqb (%[a]), %%ymm1, %%ymm1\n\tvpmovmskb %%ymm1, %%ecx\n\t"
      "incl %%ecx\n\tjnz 4f\n\t"
      "addq $32, %[a]\n\taddq $32, %[b]\n\tsubq $32, %[n]\n\tjnz 3b\n\tjmp 9f\n"
      "4:\n\t"
      "tzcntl %%ecx, %%ecx\n\tmovzbl (%[a], %%rcx), %%eax\n\tmovzbl (%[b], %%rcx), %%ecx\n\t"
      "subl %%ecx, %%eax\n\tmovslq %%eax, %[r]\n"
      "9:\n\t"
      "vzeroupper"
      : [a] "+r"(a), [b] "+r"(b), [n] "+r"(n), [r] "+r"(result)
      :
      : "rax", "rcx", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "cc", "memory");
  return result < 0 ? -1 : result > 0;
}

static void enable_avx(void) {
  uint32_t eax, ebx, ecx, edx;
  __asm__ volatile("cpuid" : "=a"(eax), "=b"(ebx), "=c"(ecx), "=d"(edx) : "a"(1), "c"(0));
  const int xsave_avx = (ecx & (1u << 26)) && (ecx & (1u << 28));
  __asm__ volatile("cpuid" : "=a"(eax), "=b"(ebx), "=c"(ecx), "=d"(edx) : "a"(7), "c"(0));
  if (!xsave_avx || !(ebx & (1u << 5)) || !(ebx & (1u << 8))) fail("string-bound: the CPU lacks AVX2 or BMI2");
  uint64_t cr4;
  __asm__ volatile("mov %%cr4, %0" : "=r"(cr4));
  __asm__ volatile("mov %0, %%cr4" : : "r"(cr4 | (1u << 18)));  /* CR4.OSXSAVE */
  __asm__ volatile("xsetbv" : : "a"(7), "d"(0), "c"(0));         /* XCR0: x87, SSE and AVX state */
}

static uint64_t workload(uint64_t iterations) {
  uint64_t state = 0x9e3779b97f4a7c15ull, checksum = 0;
  for (uint64_t i = 0; i < BUFFER; ++i) source[i] = (uint8_t)(i * 7 + (i >> 5));
  for (uint64_t i = 0; i < iterations; ++i) {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    const uint64_t n = 2048 + (state & 4095), offset = (state >> 16) & 63;
    const int c = (int)((state >> 24) & 0xff);
    memset_avx2(target + offset, c, n);
    memcpy_avx2(target + (offset ^ 17), source + offset, n);
    checksum = checksum * 31 + target[(state >> 32) % n];
    /* A string of about n bytes: its terminator moves from round to round. */
    text[n] = 1;
    memset_avx2(text, 'a' + (int)(i & 15), n);
    text[n - (state >> 40) % 64] = 0;
    checksum = checksum * 31 + strlen_avx2((const char *)text + (offset & 7));
    checksum = checksum * 31 + memchr_avx2(source, (int)((state >> 48) & 0xff), n);
    memcpy_avx2(target + (offset ^ 17), source + offset, n);
    if (i & 1) target[(offset ^ 17) + (state >> 8) % (n & ~31ull)] ^= 0x5a;
    checksum = checksum * 31 + (uint64_t)(memcmp_avx2(source + offset, target + (offset ^ 17), n & ~31ull) + 1);
  }
  return checksum;
}

int guest_main(void) {
  uint64_t iterations = boot_arg_u64("n", DEFAULT_ITERATIONS);
  enable_avx();
  printf("string-bound: n=%lu iterations\n", iterations);
  printf("string-bound: checksum=%#018lx\n", workload(iterations));
  return 0;
}
