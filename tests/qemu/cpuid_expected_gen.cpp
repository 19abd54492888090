// Prints what the cpuid guest must print under a deja CPU model (argv[1], core/cpu_model.cpp), to keep cpuid.expected-deja honest.
#include "core/cpu_model.h"
#include <cstdio>
#include <cstring>
using namespace deja;
static const CpuModel* model = nullptr;
#define m (*model)
static void leaf(uint32_t l, uint32_t s) { auto r = m.cpuid(l, s); printf("leaf %08x.%u: eax=%08x ebx=%08x ecx=%08x edx=%08x\n", l, s, r.eax, r.ebx, r.ecx, r.edx); }
int main(int argc, char** argv) {
  model = argc > 1 ? CpuModel::find(argv[1]) : nullptr;
  if (!model) { fprintf(stderr, "usage: %s MODEL (one of %s)\n", argv[0], CpuModel::names().c_str()); return 2; }
  auto l0 = m.cpuid(0,0); char v[13]={}; memcpy(v,&l0.ebx,4); memcpy(v+4,&l0.edx,4); memcpy(v+8,&l0.ecx,4);
  printf("vendor: \"%s\"\n", v); printf("max basic leaf: %08x\n", l0.eax);
  leaf(0,0); leaf(1,0); if (l0.eax>=7) leaf(7,0); else printf("leaf %08x.0: above max basic leaf\n", 7u);
  uint32_t mx = m.cpuid(0x80000000,0).eax; printf("max extended leaf: %08x\n", mx);
  for (uint32_t l=0x80000000; l<=0x80000008; ++l) { if (l<=mx) leaf(l,0); else printf("leaf %08x.0: above max extended leaf\n", l); }
  char b[49]={}; for (int i=0;i<3;++i){auto r=m.cpuid(0x80000002+i,0); memcpy(b+16*i,&r.eax,4);memcpy(b+16*i+4,&r.ebx,4);memcpy(b+16*i+8,&r.ecx,4);memcpy(b+16*i+12,&r.edx,4);}
  printf("brand: \"%s\"\n", b);
  auto l1=m.cpuid(1,0); uint32_t fam=(l1.eax>>8)&0xf, mod=(l1.eax>>4)&0xf; if(fam==0xf||fam==6) mod|=(l1.eax>>12)&0xf0; if(fam==0xf) fam+=(l1.eax>>20)&0xff;
  printf("family/model/stepping: %u/%u/%u\n", fam, mod, l1.eax&0xf);
  auto e1=m.cpuid(0x80000001,0);
  printf("features: sse2=%u rdrand=%u hypervisor=%u longmode=%u nx=%u\n", (l1.edx>>26)&1, (l1.ecx>>30)&1, (l1.ecx>>31)&1, (e1.edx>>29)&1, (e1.edx>>20)&1);
}
