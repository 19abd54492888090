#!/usr/bin/env bash
# Checks that kvm-deja/patches carry kvm/kvm_deja_abi.h byte for byte, and that scripts/kvm-deja-build.sh refuses bad input with a clear message.
set -u
root="$1"
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

# The kernel's copy is a new file in the patch series: its lines are the '+' lines of that file's hunk.
mirror="$(awk '/^diff --git a\/arch\/x86\/kvm\/kvm_deja_abi.h/{f=1; next} f && /^diff --git/{f=0} f && /^\+\+\+/{next} f && /^\+/{print substr($0, 2)}' \
  "$root"/kvm-deja/patches/*.patch)"
if [[ -z "$mirror" ]]; then
  fail "no patch in kvm-deja/patches adds arch/x86/kvm/kvm_deja_abi.h"
elif ! diff <(echo "$mirror") "$root/kvm/kvm_deja_abi.h" >/dev/null; then
  diff <(echo "$mirror") "$root/kvm/kvm_deja_abi.h" | head -20
  fail "arch/x86/kvm/kvm_deja_abi.h in kvm-deja/patches differs from kvm/kvm_deja_abi.h: regenerate the patch"
fi

expect_refusal() {  # label, expected message part, command...
  local label="$1" want="$2"; shift 2
  local out st
  out="$("$@" 2>&1)"; st=$?
  [[ $st != 0 && "$out" == *"$want"* ]] || fail "$label: status $st, output '$out' (expected a failure saying '$want')"
}
build="$root/scripts/kvm-deja-build.sh"
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
expect_refusal "other kernel series" "for Linux 6.1" "$build" --kernel 5.10.0-30-amd64 --out "$scratch"
expect_refusal "missing headers" "install linux-headers-6.1.0-999-amd64" "$build" --kernel 6.1.0-999-amd64 --out "$scratch"
expect_refusal "bad kernel version" "MAJOR.MINOR" "$build" --kernel banana --out "$scratch"
expect_refusal "install: unknown parameter" "unknown module parameter" "$root/scripts/kvm-deja-install.sh" -- deja_x=1

[[ $failures == 0 ]] && echo "kvm-deja ABI header mirrored; build script refusals are clear"
exit $((failures != 0))
