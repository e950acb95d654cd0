#!/usr/bin/env bash
# The whole test suite on a fresh Debian 12 machine (run as root, or as a user with sudo):
#   1. scripts/setup.sh --test: installs every package (and the npm oracles), builds build/;
#   2. a second build with AddressSanitizer + UBSan (build-asan/, CPU only) and its tests;
#   3. the full suite in build/ last, so the closing lines are its ctest summary.
# Environment: BACKPROP_ASAN=0 skips step 2; BACKPROP_ASAN_EXCLUDE is a ctest -E regex of tests
# left out of the sanitizer run (default: none); BACKPROP_JOBS overrides the parallelism.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh --test
jobs=${BACKPROP_JOBS:-$(nproc)}
status=0

if [ "${BACKPROP_ASAN:-1}" = 1 ]; then
  echo "== sanitizer build (build-asan: ASan + UBSan, CPU only) =="
  cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DBACKPROP_SANITIZE=ON -DBACKPROP_CUDA=OFF \
        -DBACKPROP_BUILD_BENCH=OFF >/dev/null
  cmake --build build-asan -j"$jobs"
  exclude=()
  [ -n "${BACKPROP_ASAN_EXCLUDE:-}" ] && exclude=(-E "$BACKPROP_ASAN_EXCLUDE")
  # Leak checking stays on; halt_on_error makes the first report fail the test.
  ( cd build-asan && ASAN_OPTIONS=halt_on_error=1:detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
      ctest -j"$jobs" --output-on-failure --timeout 900 "${exclude[@]}" ) || status=1
fi

echo "== test suite (build) =="
( cd build && ctest -j"$jobs" --output-on-failure --timeout 900 ) || status=1
exit $status
