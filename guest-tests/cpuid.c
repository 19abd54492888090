/* Guest "cpuid": prints the CPU model the guest sees, leaf by leaf, so a VMM's CPUID table can be compared exactly. */
#include "runtime/runtime.h"

static void print_leaf(uint32_t leaf, uint32_t subleaf) {
  struct cpuid_regs r = cpuid(leaf, subleaf);
  printf("leaf %08x.%u: eax=%08x ebx=%08x ecx=%08x edx=%08x\n", leaf, subleaf, r.eax, r.ebx, r.ecx, r.edx);
}

static void copy_register(char *dst, uint32_t value) {
  for (int i = 0; i < 4; ++i) dst[i] = (char)(value >> (8 * i));
}

int guest_main(void) {
  struct cpuid_regs l0 = cpuid(0, 0);
  char vendor[13];
  copy_register(vendor, l0.ebx); /* the vendor string is EBX, EDX, ECX */
  copy_register(vendor + 4, l0.edx);
  copy_register(vendor + 8, l0.ecx);
  vendor[12] = 0;
  uint32_t max_basic = l0.eax;
  printf("vendor: \"%s\"\n", vendor);
  printf("max basic leaf: %08x\n", max_basic);
  print_leaf(0, 0);
  print_leaf(1, 0);
  /* Leaves above the maximum answer with some other leaf's data (SDM vol. 2A, CPUID), so never show them as if real. */
  if (max_basic >= 7) print_leaf(7, 0);
  else printf("leaf %08x.0: above max basic leaf\n", 7u);

  uint32_t max_extended = cpuid(0x80000000, 0).eax;
  printf("max extended leaf: %08x\n", max_extended);
  for (uint32_t leaf = 0x80000000; leaf <= 0x80000008; ++leaf) {
    if (leaf <= max_extended) print_leaf(leaf, 0);
    else printf("leaf %08x.0: above max extended leaf\n", leaf);
  }
  char brand[49] = {0};
  if (max_extended >= 0x80000004) {
    for (uint32_t i = 0; i < 3; ++i) {
      struct cpuid_regs r = cpuid(0x80000002 + i, 0);
      copy_register(brand + 16 * i, r.eax);
      copy_register(brand + 16 * i + 4, r.ebx);
      copy_register(brand + 16 * i + 8, r.ecx);
      copy_register(brand + 16 * i + 12, r.edx);
    }
  }
  printf("brand: \"%s\"\n", brand);
  struct cpuid_regs l1 = cpuid(1, 0);
  /* SDM vol. 2A, CPUID leaf 1: extended family counts only for family 15, extended model for 6 and 15. */
  uint32_t family = (l1.eax >> 8) & 0xf, model = (l1.eax >> 4) & 0xf;
  if (family == 0xf || family == 0x6) model |= (l1.eax >> 12) & 0xf0;
  if (family == 0xf) family += (l1.eax >> 20) & 0xff;
  printf("family/model/stepping: %u/%u/%u\n", family, model, l1.eax & 0xf);
  printf("features: sse2=%u rdrand=%u hypervisor=%u longmode=%u nx=%u\n", (l1.edx >> 26) & 1, (l1.ecx >> 30) & 1,
         (l1.ecx >> 31) & 1, (cpuid(0x80000001, 0).edx >> 29) & 1, (cpuid(0x80000001, 0).edx >> 20) & 1);
  return 0;
}
