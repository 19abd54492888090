#!/usr/bin/env bash
# Runs inside scripts/kvm-nested.sh --kvm-deja: the KVM tests with the module, then scripts/kvm-deja-install.sh swapping it for stock KVM and back (refusing while /dev/kvm is open).
set -u
kvm_tests="$1"
install="$2"
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
ok() { echo "ok:   $*"; }
gtest() {  # expectation ("1" module traps RDTSC, "0" it does not), filter
  local out
  out="$(DEJA_REQUIRE_KVM=1 DEJA_EXPECT_KVM_DEJA="$1" "$kvm_tests" --gtest_filter="$2" 2>&1)"
  local status=$?
  if [[ $status != 0 ]] || grep -q '\[  SKIPPED \]\|\[  FAILED  \]' <<<"$out"; then
    echo "$out" | grep -E '\[  (FAILED|SKIPPED) |Failure|error|Expected|Which is|actual' | head -20
    fail "kvm_tests $2 with DEJA_EXPECT_KVM_DEJA=$1 (status $status)"
  else
    ok "kvm_tests $2 with DEJA_EXPECT_KVM_DEJA=$1: $(grep -o '\[  PASSED  \] [0-9]* tests\?' <<<"$out")"
  fi
}
status_is() {  # expected --status prefix, label
  local got
  got="$("$install" --status)"
  [[ "$got" == "$1"* ]] && ok "$2: $got" || fail "$2: --status says '$got', expected '$1...'"
}

[[ -n "${DEJA_KVM_DEJA_MODULES:-}" ]] || { echo "FAIL: DEJA_KVM_DEJA_MODULES unset: not run by kvm-nested.sh --kvm-deja"; exit 1; }
status_is "kvm-deja is loaded" "harness loaded kvm-deja"
# Every KVM backend test must pass with the module loaded and its exits enabled.
gtest 1 "KvmTest.*:KvmDejaTest.*"

# While a VM (here: an open /dev/kvm) exists, neither direction may touch the modules.
exec 3<>/dev/kvm
out="$("$install" --uninstall 2>&1)"; st=$?
[[ $st == 1 && "$out" == *"refusing"*"in use"* ]] && ok "uninstall refused while /dev/kvm is open" ||
  fail "uninstall with /dev/kvm open: status $st, '$out'"
out="$("$install" --modules "$DEJA_KVM_DEJA_MODULES" 2>&1)"; st=$?
[[ $st == 1 && "$out" == *"refusing"* ]] && ok "install refused while /dev/kvm is open" ||
  fail "install with /dev/kvm open: status $st, '$out'"
exec 3>&-
status_is "kvm-deja is loaded" "still kvm-deja after the refusals"

"$install" --uninstall || fail "--uninstall failed"
status_is "stock kvm is loaded" "after --uninstall"
gtest 0 "KvmDejaTest.*"

"$install" --modules "$DEJA_KVM_DEJA_MODULES" -- deja_rdtsc=0 || fail "install with deja_rdtsc=0 failed"
status_is "kvm-deja is loaded: deja_rdtsc=N" "module parameter deja_rdtsc=0"
gtest 0 "KvmDejaTest.*"
"$install" --uninstall || fail "--uninstall failed"

"$install" --modules "$DEJA_KVM_DEJA_MODULES" || fail "install failed"
status_is "kvm-deja is loaded: deja_rdtsc=Y" "reinstalled"
gtest 1 "KvmDejaTest.*"

out="$("$install" --modules "$DEJA_KVM_DEJA_MODULES" -- deja_bogus=1 2>&1)"; st=$?
[[ $st == 1 && "$out" == *"unknown module parameter"* ]] && ok "unknown parameter refused" || fail "deja_bogus=1: status $st, '$out'"

[[ $failures == 0 ]] && echo "kvm-deja: tests, install, uninstall and refusals pass"
exit $((failures != 0))
