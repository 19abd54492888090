#!/usr/bin/env bash
# Checks that scripts/kvm-nested.sh passes a command's stdout, stderr, exit status and written files through faithfully.
set -u
harness="$1"
scratch="$2"  # a directory inside the shared project/build tree
mkdir -p "$scratch"
rm -f "$scratch/written-inside"
failures=0
check() { if [[ "$2" != "$3" ]]; then echo "FAIL: $1: expected '$3', got '$2'"; failures=$((failures + 1)); fi; }

out="$(mktemp)"; err="$(mktemp)"
"$harness" --timeout 600 -- sh -c 'echo "to stdout"; echo "to stderr" >&2; test -c /dev/kvm && echo kvm > "$1"/written-inside; exit 7' sh "$scratch" >"$out" 2>"$err"
status=$?
check "exit status" "$status" 7
check "stdout" "$(cat "$out")" "to stdout"
check "stderr" "$(grep -v '^kvm-nested' "$err")" "to stderr"
check "file written inside appears on the host" "$(cat "$scratch/written-inside" 2>/dev/null)" "kvm"

# An environment failure is 125 with a message, never the command's status.
DEJA_NESTED_KERNEL=/nonexistent/vmlinuz "$harness" -- true >"$out" 2>"$err"
status=$?
check "broken environment status" "$status" 125
grep -q "kvm-nested:" "$err" || { echo "FAIL: no kvm-nested message for a broken environment"; failures=$((failures + 1)); }

rm -f "$out" "$err"
[[ $failures == 0 ]] && echo "harness passes output, status and files through"
exit $((failures != 0))
