// Locating the bundled Linux guest's files (written by guest-linux/ at build time) and its default command line.
#include "tools/linux_guest.h"

#include <sys/stat.h>

#include <cstdlib>
#include <fstream>

#include "core/cpu_model.h"

namespace deja {
namespace {

bool is_file(const std::string& path) {
  struct stat info {};
  return stat(path.c_str(), &info) == 0 && S_ISREG(info.st_mode);
}

}  // namespace

std::string linux_guest_cmdline() {
  // console=ttyS0: the 16550 is the only console. tsc_early_khz: the CPU model's TSC rate, so Linux need not
  // calibrate against the PIT through slow port I/O; tsc=reliable: no watchdog against a clocksource deja lacks.
  // acpi=off, pci=conf1: no ACPI tables or BIOS, PCI through mechanism #1. quiet cryptomgr.notests: half the boot's
  // instructions go to console output and crypto self-tests. panic=-1 reboot=triple: a panic reboots at once
  // through a triple fault, which stops deja (the default reboot methods end in the real-mode BIOS, which deja
  // lacks).
  return fmt::format("console=ttyS0 tsc_early_khz={} tsc=reliable acpi=off pci=conf1 nokaslr quiet "
                     "cryptomgr.notests panic=-1 reboot=triple",
                     CpuModel::kTscHz / 1000);
}

Result<LinuxGuest> find_linux_guest() {
  const char* env = std::getenv("DEJA_LINUX_GUEST_DIR");
  const std::string dir = env && *env ? env : DEJA_LINUX_GUEST_DIR;
  LinuxGuest guest;
  guest.initramfs = dir + "/initramfs.cpio";
  guest.disk = dir + "/disk.img";
  guest.cmdline = linux_guest_cmdline();
  const std::string kernel_file = dir + "/kernel.path";
  std::ifstream in(kernel_file);
  if (!in || !std::getline(in, guest.kernel) || !is_file(guest.initramfs)) {
    return fail(ErrorKind::kInvalidArgument,
                "--linux: the bundled Linux guest is not built in {} (build the 'linux-guest' target; it needs "
                "linux-image-amd64 and busybox-static, which scripts/setup.sh installs)",
                dir);
  }
  if (!is_file(guest.kernel)) {
    return fail(ErrorKind::kInvalidArgument,
                "--linux: the kernel the guest was built for, {}, is gone (named in {}): rebuild the 'linux-guest' "
                "target",
                guest.kernel, kernel_file);
  }
  return guest;
}

}  // namespace deja
