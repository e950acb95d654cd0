#!/usr/bin/env bash
# ARM64 (aarch64: Graviton, Ampere, Linux on Apple Silicon) on an x86-64 Debian 12 machine:
# cross-builds with Debian's g++-aarch64-linux-gnu against arm64 libraries installed through
# multiarch, then runs the core, ops and model tests under qemu-user. The CPU kernels run their
# generic variant there (4-lane GCC vectors = NEON; no ARM-specific variant yet).
#   BP_ARM64_INSTALL=0   skip the package installation (needs root otherwise)
#   BP_ARM64_LAYERS      test layers to run (default: core ops model)
#   BP_JOBS              build parallelism (default: all cores)
# docs/portability.md records when it last ran and what it gave.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=${BP_JOBS:-$(nproc)}
layers=${BP_ARM64_LAYERS:-core ops model}
# The library's dependencies (scripts/setup.sh's list), arm64 builds.
arm64_pkgs=(libopenblas-openmp-dev libfmt-dev libspdlog-dev nlohmann-json3-dev libcli11-dev libtomlplusplus-dev
            libpcre2-dev libicu-dev libcpp-httplib-dev libssl-dev libgtest-dev libgmock-dev zlib1g-dev libbrotli-dev)
if [ "${BP_ARM64_INSTALL:-1}" = 1 ]; then
  dpkg --add-architecture arm64
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends g++-aarch64-linux-gnu \
    qemu-user-static "${arm64_pkgs[@]/%/:arm64}"
fi
start=$(date +%s)
cmake -S . -B build-arm64 -DCMAKE_TOOLCHAIN_FILE=scripts/cmake/aarch64-linux-gnu.cmake -DCMAKE_BUILD_TYPE=Release \
  -DBACKPROP_CUDA=OFF -DBACKPROP_BUILD_BENCH=OFF >/dev/null
targets=()
regex=""
for l in $layers; do
  targets+=("test_$l")
  regex="${regex:+$regex|}^$l\$"
done
cmake --build build-arm64 -j"$jobs" --target "${targets[@]}"
echo "arm64 build: $(( $(date +%s) - start )) s"
file build-arm64/tests/test_core | sed 's/,.*//' || true
start=$(date +%s)
status=0
# One thread per test process, passive waits: multi-threaded OpenMP/OpenBLAS under qemu-user on
# 2 cores crawled (a 0.05 s test ran for minutes; 4 s with one thread). gtest's death tests fork
# and exec, which qemu-user without a binfmt registration cannot do: BP_ARM64_CTEST_ARGS can
# leave them out (-E Interrupt.First).
(cd build-arm64 && OMP_WAIT_POLICY=passive GOMP_SPINCOUNT=0 OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 ctest -L "$regex" -j"$jobs" --output-on-failure \
  --timeout "${BP_ARM64_TEST_TIMEOUT:-600}" ${BP_ARM64_CTEST_ARGS:-}) || status=$?
echo "arm64 tests under qemu-user: $(( $(date +%s) - start )) s, status $status"
exit $status
