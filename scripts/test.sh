#!/usr/bin/env bash
# Runs every test: installs dependencies, builds (normal and sanitizer builds), runs CTest in both.
# KVM-backend tests run directly where this host's KVM passes deja's usability check (`deja selftest --kvm-only`),
# else inside scripts/kvm-nested.sh (nested SVM under QEMU TCG).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
jobs=$(nproc)

# Compiles go through ccache when it is there (scripts/setup.sh installs it): a CI machine that keeps its home
# between runs rebuilds only what changed; CMake reads these variables when it first configures a build tree.
if command -v ccache >/dev/null; then
  export CMAKE_C_COMPILER_LAUNCHER=ccache CMAKE_CXX_COMPILER_LAUNCHER=ccache CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=true
fi
# Each stage's wall time, so a slow CI run says where its minutes went.
started=$SECONDS stage_started=$SECONDS
stage() {
  echo "test.sh: $1 took $((SECONDS - stage_started)) s (total $((SECONDS - started)) s)"
  stage_started=$SECONDS
}

cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j"$jobs"
stage "the build"
(cd build && ctest --output-on-failure -j"$jobs" --timeout 1800)
stage "the tests"

# Every build type builds with warnings as errors (Release: -O3 finds warnings -O2 does not). The Release
# build compiles what ships, the deja tool and every library it links: the tests are compiled with
# warnings as errors in the two builds above and below, and CI's 45 minutes do not leave room for a third
# compile of them.
cmake -S . -B build-release -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build-release -j"$jobs" --target deja
stage "the Release build of deja"

# Sanitizer build: unit tests, the decoder/executor fuzzer and the trace-reader fuzz tests under ASan/UBSan
# (guest runs are left to the normal build: the software CPU under ASan is too slow for them).
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DDEJA_SANITIZE=ON >/dev/null
cmake --build build-asan -j"$jobs"
stage "the sanitizer build"
(cd build-asan && ASAN_OPTIONS=detect_leaks=0 ctest --output-on-failure -j"$jobs" -LE "qemu|kvm|nested|guests|bench|distro" --timeout 1800)
stage "the sanitizer tests"

# Coverage-guided fuzzing: each libFuzzer target for a fixed budget from the seed corpus (tests/fuzz/).
scripts/fuzz.sh "${DEJA_FUZZ_SECONDS:-45}"
stage "fuzzing"
