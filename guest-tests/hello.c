/* Guest "hello": the smallest end-to-end check of boot, serial output, Multiboot command line and exit. */
#include "runtime/runtime.h"

int guest_main(void) {
  const struct boot_info *bi = boot_info();
  printf("Hello from deja guest\n");
  printf("command line: \"%s\"\n", bi->args);
  printf("multiboot: %s\n", bi->multiboot ? "yes" : "no");
  return bi->multiboot ? 0 : 1;
}
