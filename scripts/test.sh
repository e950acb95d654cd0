#!/usr/bin/env bash
# The whole test suite on a fresh Debian 12 machine (run as root, or as a user with sudo):
#   1. scripts/setup.sh --test: installs every package (and the npm oracles), builds build/;
#   2. a second build with AddressSanitizer + UBSan (build-asan/, CPU only, compiled by clang-14:
#      twice as fast as gcc 12 with both sanitizers) running the layers core, cli and fuzz by default
#      (test labels; cli runs whole training runs, export, doctor and the quick start through the
#      sanitized binary; fuzz replays every libFuzzer target of tests/fuzz over its seeds and fixed
#      mutations, docs/fuzzing.md). Times: docs/benchmarks.md "CI time";
#      BACKPROP_ASAN_LAYERS="all" runs every layer under the sanitizers (slower: the model and op
#      tests do real arithmetic), BACKPROP_ASAN_LAYERS="" skips the sanitizer run;
#   3. the full suite in build/ last, so the closing lines are its ctest summary; it includes the
#      numeric suites rerun under each OpenBLAS kernel set and CPU kernel variant this CPU runs
#      (tests/CMakeLists.txt numeric_*, over the OPENBLAS_CORETYPE runtime_env.sh exports).
# BACKPROP_JOBS overrides the parallelism (default: all cores).
set -euo pipefail
cd "$(dirname "$0")/.."
# In-process tests get the runtime environment the backprop binary gives itself (passive OpenMP
# waits, OpenBLAS kernels for this CPU): scripts/runtime_env.sh, sourced once setup.sh has built
# build/backprop (it asks the binary for the OpenBLAS core type).
bash scripts/setup.sh --test
source scripts/runtime_env.sh
jobs=${BACKPROP_JOBS:-$(nproc)}
layers=${BACKPROP_ASAN_LAYERS-core cli fuzz}
status=0

if [ -n "$layers" ]; then
  echo "== sanitizer build (build-asan: ASan + UBSan, CPU only; layers: $layers) =="
  # clang-14 (setup.sh --test installs it with its sanitizer runtimes): gcc 12 with
  # -fsanitize=address,undefined took 22 s on cli/doctor.cpp, clang 10 s (2026-12-07, Zen 5).
  # -O1 -g1: half the compile time of RelWithDebInfo's -O2 -g (measured 61 s -> 30 s on
  # cmd_export.cpp), still with line numbers in sanitizer reports.
  # BACKPROP_PCH=OFF: build/ precompiles the common headers (cmake/precompiled.h), which would hide
  # a file that forgets to include one; here every library, CLI and core/cli/fuzz test file must
  # include what it uses (measured: with them this build took 874 s instead of ~930 s; the
  # sanitizers' instrumentation, not parsing, is most of its time).
  cmake -S . -B build-asan -DCMAKE_C_COMPILER=clang-14 -DCMAKE_CXX_COMPILER=clang++-14 -DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG" \
        -DBACKPROP_SANITIZE=ON -DBACKPROP_CUDA=OFF -DBACKPROP_BUILD_BENCH=OFF -DBACKPROP_PCH=OFF >/dev/null
  if [ "$layers" = all ]; then
    cmake --build build-asan -j"$jobs"
    label_args=()
  else
    targets=(backprop)
    regex=""
    for l in $layers; do
      [ -d "tests/$l" ] || continue
      targets+=("test_$l")
      regex="${regex:+$regex|}^$l\$"
    done
    cmake --build build-asan -j"$jobs" --target "${targets[@]}"
    label_args=(-L "$regex")
  fi
  ( cd build-asan && ASAN_OPTIONS=halt_on_error=1:detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
      ctest -j"$jobs" --output-on-failure --timeout 900 "${label_args[@]}" ) || status=1
fi

echo "== test suite (build) =="
( cd build && ctest -j"$jobs" --output-on-failure --timeout 900 ) || status=1
exit $status
