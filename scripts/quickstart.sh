#!/usr/bin/env bash
# The main job for a new user: install dependencies, build, then record and replay the bundled `hello` guest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j"$(nproc)"
mkdir -p build/traces
trace=build/traces/hello.trace
echo "== deja record -o $trace build/guest-tests/hello.elf"
status=0
build/deja record -o "$trace" --cmdline "quickstart" build/guest-tests/hello.elf || status=$?
# The guest reports success through isa-debug-exit with value 0: exit status (0 << 1) | 1 = 1.
[ "$status" -eq 1 ] || { echo "quickstart: recording failed (exit status $status)" >&2; exit 1; }
echo "== deja replay $trace"
status=0
build/deja replay "$trace" || status=$?
[ "$status" -eq 1 ] || { echo "quickstart: replay failed (exit status $status)" >&2; exit 1; }
echo "== deja verify $trace"
build/deja verify "$trace"
echo "quickstart: recorded, replayed and verified build/guest-tests/hello.elf"
