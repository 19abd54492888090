#!/usr/bin/env bash
# Drives tests/guests/kvm_suite.py: software-CPU steps on this host, KVM steps with /dev/kvm (nested if need be).
# Usage: kvm_matrix.sh [--kvm-deja CACHE_DIR] DEJA GUESTS SOURCES WORK NAMES...
# --kvm-deja: the nested guest loads the kvm-deja modules (built for its kernel, cached in CACHE_DIR) and the
# suite expects exact RDTSC replay on KVM.
set -euo pipefail
nested_opts=()
suite_opts=()
if [[ "${1:-}" == --kvm-deja ]]; then
  nested_opts=(--kvm-deja --kvm-deja-cache "$2")
  suite_opts=(--kvm-deja)
  shift 2
fi
deja="$1" guests="$2" sources="$3" work="$4"; shift 4
if [[ ${#nested_opts[@]} == 0 ]] && ! "$deja" selftest --kvm-only >/dev/null 2>&1; then
  # Nested, the kvm-deja matrix (kvm.deja.guests) runs every guest on KVM and checks the stock behaviour with
  # DEJA_KVM_DEJA=off in the same boot: a second nested boot for stock KVM alone would only cost CI 9 minutes.
  echo "skipped: this host's KVM is not usable directly (deja selftest --kvm-only); kvm.deja.guests runs the matrix nested"
  exit 77
fi
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
rm -rf "$work"; mkdir -p "$work"
suite=(python3 "$here/kvm_suite.py" --deja "$deja" --guests "$guests" --sources "$sources" --work "$work" "${suite_opts[@]}")
status=0
"${suite[@]}" --phase host-before "$@" || status=1
"$root/scripts/kvm-nested.sh" --direct-if-usable "$deja" "${nested_opts[@]}" --timeout 2400 --share "$work" -- \
  "${suite[@]}" --phase nested "$@" || status=1
"${suite[@]}" --phase host-after "$@" || status=1
exit $status
