#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz/, clang 16 from Debian) and runs each for a fixed budget from its seed corpus.
#   scripts/fuzz.sh [SECONDS_PER_TARGET]     (default 45; FUZZ_TARGETS="fuzz_cli ..." to run only some)
# The seed corpus in tests/fuzz/corpus/ is copied first, so what a run discovers never changes the tree; a crash,
# a leak or an input over the memory or time limit fails the run, with the input kept in build-fuzz/artifacts/.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-45}"
targets=(${FUZZ_TARGETS:-fuzz_trace_reader fuzz_image_loader fuzz_cli fuzz_interp})
CC=clang-16 CXX=clang++-16 cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDEJA_FUZZ=ON \
  -DDEJA_WERROR=ON >/dev/null  # warnings are errors in this build too: clang sees some that GCC does not
cmake --build build-fuzz -j"$(nproc)" --target fuzzers
mkdir -p build-fuzz/artifacts
# Targets run side by side, one per core: each is single-threaded, and its budget is wall time.
fuzz_one() {  # target: runs it, prints its summary to build-fuzz/TARGET.summary, exit status = pass/fail
  local target="$1" seeds work
  seeds="tests/fuzz/corpus/${target#fuzz_}"
  case "$target" in fuzz_trace_reader) seeds=tests/fuzz/corpus/trace ;; fuzz_image_loader) seeds=tests/fuzz/corpus/image ;; esac
  work="$(mktemp -d)"
  cp -r "$seeds"/. "$work"/
  local status=0
  {
    echo "fuzz: $target for ${seconds} s from $(ls "$seeds" | wc -l) seeds"
    if ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1 "build-fuzz/tests/fuzz/$target" "$work" \
        -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=65536 -print_final_stats=1 \
        -artifact_prefix="build-fuzz/artifacts/$target-" 2>"build-fuzz/$target.log"; then
      grep -E "stat::number_of_executed_units|stat::peak_rss_mb" "build-fuzz/$target.log" | tr '\n' ' '
      grep -oE "cov: [0-9]+" "build-fuzz/$target.log" | tail -1
    else
      status=1
      echo "fuzz: $target FAILED (build-fuzz/$target.log, inputs in build-fuzz/artifacts/):"
      tail -40 "build-fuzz/$target.log"
    fi
  } >"build-fuzz/$target.summary"
  rm -rf "$work"
  return $status
}
passed=0 failed=0
parallel=$(nproc)
for ((i = 0; i < ${#targets[@]}; i += parallel)); do
  batch=("${targets[@]:i:parallel}")
  pids=()
  for target in "${batch[@]}"; do fuzz_one "$target" & pids+=($!); done
  for j in "${!batch[@]}"; do
    if wait "${pids[$j]}"; then passed=$((passed + 1)); else failed=$((failed + 1)); fi
    cat "build-fuzz/${batch[$j]}.summary"
  done
done
echo "fuzz: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
