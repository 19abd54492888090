#!/usr/bin/env bash
# Drives tests/guests/kvm_suite.py: software-CPU steps on this host, KVM steps with /dev/kvm (nested if need be).
set -euo pipefail
deja="$1" guests="$2" sources="$3" work="$4"; shift 4
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
rm -rf "$work"; mkdir -p "$work"
suite=(python3 "$here/kvm_suite.py" --deja "$deja" --guests "$guests" --sources "$sources" --work "$work")
status=0
"${suite[@]}" --phase host-before "$@" || status=1
"$root/scripts/kvm-nested.sh" --direct-if-possible --timeout 2400 --share "$work" -- \
  "${suite[@]}" --phase nested "$@" || status=1
"${suite[@]}" --phase host-after "$@" || status=1
exit $status
