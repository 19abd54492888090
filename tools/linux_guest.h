// The bundled Linux guest (`deja run --linux`): the installed Debian kernel, the initramfs and disk the build makes.
#pragma once

#include <string>

#include "core/error.h"

namespace deja {

struct LinuxGuest {
  std::string kernel;  // /boot/vmlinuz-VERSION, the kernel whose modules the initramfs carries
  std::string initramfs;
  std::string disk;
  std::string cmdline;  // the default command line (the user's --append goes after it)
};

// The command line the bundled guest boots with on deja's PIC-only PC (docs/linux.md says why each part is there).
std::string linux_guest_cmdline();

// Finds the bundled guest: in $DEJA_LINUX_GUEST_DIR, else in the build tree's guest-linux/. A missing piece is an
// error that says how to build it.
Result<LinuxGuest> find_linux_guest();

}  // namespace deja
