#!/bin/sh
# Runs one guest under QEMU (TCG), captures its serial output, and checks output and exit status.
#
# usage: run-qemu.sh [--append ARGS] [--cpu MODEL] [--input FILE] [--timeout SECONDS] [--qemu-arg ARG]...
#                    GUEST.elf EXPECTED
#   --qemu-arg ARG passed to QEMU as is (repeatable), e.g. "-device" "loader,file=..."
#   --input FILE   bytes for the guest's COM1 receiver, sent once the guest prints a line containing
#                  "ready for input" (a 16550 drops bytes received before its FIFO is enabled)
# Exit status: 0 pass, 1 fail, 77 skip (no qemu-system-x86_64).
set -u

qemu=$(command -v qemu-system-x86_64) || {
  echo "SKIP: qemu-system-x86_64 not found in PATH (Debian package qemu-system-x86)"
  exit 77
}

append="" cpu="" input="" timeout_s=60
extra_file=$(mktemp "${TMPDIR:-/tmp}/deja-qemu-args.XXXXXX") || exit 1
trap 'rm -f "$extra_file"' EXIT
while [ $# -gt 2 ]; do
  case "$1" in
    --append) append="$2"; shift 2 ;;
    --cpu) cpu="$2"; shift 2 ;;
    --input) input="$2"; shift 2 ;;
    --timeout) timeout_s="$2"; shift 2 ;;
    --qemu-arg) printf '%s\n' "$2" >> "$extra_file"; shift 2 ;;
    *) echo "run-qemu.sh: unknown option '$1'" >&2; exit 1 ;;
  esac
done
if [ $# -ne 2 ]; then
  echo "usage: run-qemu.sh [--append ARGS] [--cpu MODEL] [--input FILE] [--timeout S] GUEST.elf EXPECTED" >&2
  exit 1
fi
guest="$1" expected="$2"
# NAME.expected (exact bytes) is preferred; guests whose output varies have NAME.expected-re instead.
if [ ! -e "$expected" ] && [ -e "$expected-re" ]; then
  expected="$expected-re"
fi
here=$(cd "$(dirname "$0")" && pwd)

for f in "$guest" "$expected"; do
  [ -r "$f" ] || { echo "FAIL: cannot read $f (build the 'guests' target first?)"; exit 1; }
done
if [ -n "$input" ] && [ ! -r "$input" ]; then
  echo "FAIL: cannot read serial input file $input"; exit 1
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/deja-qemu.XXXXXX") || exit 1
mv "$extra_file" "$work/extra-args"
trap 'rm -rf "$work"' EXIT
out="$work/serial.out"
: > "$out"

set -- "$qemu" -accel tcg -m 256M -kernel "$guest" \
  -device isa-debug-exit,iobase=0xf4,iosize=4 -serial stdio -display none -monitor none -no-reboot
[ -n "$cpu" ] && set -- "$@" -cpu "$cpu"
[ -n "$append" ] && set -- "$@" -append "$append"
while IFS= read -r arg; do set -- "$@" "$arg"; done < "$work/extra-args"

if [ -n "$input" ]; then
  mkfifo "$work/stdin"
  # Feeder: waits for the guest's readiness line, sends the bytes, then holds the pipe open so QEMU
  # never sees EOF while the guest still runs.
  (
    waited=0
    until grep -q "ready for input" "$out" 2>/dev/null; do
      sleep 0.05
      waited=$((waited + 1))
      [ "$waited" -gt $((timeout_s * 20)) ] && exit 0
    done
    cat "$input"
    sleep "$timeout_s"
  ) > "$work/stdin" &
  feeder=$!
  timeout "$timeout_s" "$@" < "$work/stdin" > "$out" 2> "$work/qemu.err"
  status=$?
  kill "$feeder" 2>/dev/null
  wait "$feeder" 2>/dev/null
else
  timeout "$timeout_s" "$@" < /dev/null > "$out" 2> "$work/qemu.err"
  status=$?
fi

failed=0
if [ "$status" -eq 124 ]; then
  echo "FAIL: $guest did not exit within ${timeout_s}s"
  failed=1
elif [ "$status" -ne 1 ]; then
  echo "FAIL: $guest exited with status $status; isa-debug-exit success is 1 (guest wrote 0), failure 3"
  failed=1
fi
if ! python3 "$here/check_output.py" "$expected" "$out"; then
  failed=1
fi
if [ "$failed" -ne 0 ]; then
  echo "---- serial output of $guest ----"
  cat "$out"
  echo "---- qemu stderr ----"
  cat "$work/qemu.err"
  exit 1
fi
echo "PASS: $(basename "$guest")"
exit 0
