#!/usr/bin/env bash
# Install every Debian package backpropagate needs, then configure and build.
# Idempotent and non-interactive; run as root on a fresh Debian 12 machine.
#   scripts/setup.sh            -> packages for building and running; builds build/backprop only (the
#                                  README's first command: `backprop train` needs nothing else built) and,
#                                  with Open MPI installed, the data-parallel plugin libbp_collective_mpi.so
#   scripts/setup.sh --test     -> also the test oracles (python3-torch, npm packages); builds every
#                                  target of build/ (the tests, benchmarks and test helpers scripts/test.sh runs)
set -euo pipefail
cd "$(dirname "$0")/.."

want_tests=0
build_type=${BACKPROP_BUILD_TYPE:-Release}
for arg in "$@"; do
  case "$arg" in
    --test) want_tests=1 ;;
    --no-build) no_build=1 ;;
    *) echo "setup.sh: unknown argument $arg" >&2; exit 1 ;;
  esac
done

pkgs=(build-essential cmake pkg-config git
      libopenblas-dev libopenblas-openmp-dev nlohmann-json3-dev libcli11-dev libspdlog-dev libfmt-dev
      libtomlplusplus-dev libcpp-httplib-dev libpcre2-dev libicu-dev libssl-dev
      libgtest-dev libgmock-dev libbenchmark-dev clang-format-14 libomp-dev libdnnl-dev
      pybind11-dev python3-dev python3-venv python3-setuptools python3-wheel python3-pip
      openmpi-bin libopenmpi-dev
      # libdnnl-dev's CMake package runs find_package(OpenCL REQUIRED) (Debian builds oneDNN with
      # its OpenCL GPU runtime) but only Recommends the OpenCL headers, which --no-install-recommends
      # leaves out: without them configuring fails on a fresh machine (seen 2026-12-08).
      ocl-icd-opencl-dev)
if [ "$want_tests" = 1 ]; then
  pkgs+=(python3-torch python3-numpy)
  # The sanitizer build of scripts/test.sh (clang compiles it faster than gcc) and its runtimes.
  pkgs+=(clang-14 libclang-rt-14-dev)
  # The Python package's tests (tests/python: pytest; tqdm for its progress bar).
  pkgs+=(python3-pytest python3-tqdm)
  # Python Jinja2, what transformers renders chat templates with (tests/oracles/render_jinja2.py).
  pkgs+=(python3-jinja2)
  # Browser test of `backprop ui` (tests/ui/browser_test.mjs drives it with playwright-core from npm).
  pkgs+=(chromium)
  # Node may already come from elsewhere (its npm then conflicts with Debian's); only add it when absent.
  command -v node >/dev/null 2>&1 || pkgs+=(nodejs)
  command -v npm >/dev/null 2>&1 || pkgs+=(npm)
  pkgs+=(ca-certificates)
fi

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

if [ "$want_tests" = 1 ] && [ -f tests/oracles/package.json ]; then
  (cd tests/oracles && { [ -d node_modules ] && [ node_modules -nt package-lock.json ] || npm ci --no-audit --no-fund --loglevel=error; })
fi

[ "${no_build:-0}" = 1 ] && exit 0
jobs=$(nproc)
# Where the CUDA toolkit is installed, the CUDA backend must be built (nvcc for sm_75/80/86/89/90): ON
# makes a toolkit CMake cannot use fail the configure step instead of quietly building CPU only.
cuda_args=()
if [[ "${BACKPROP_CMAKE_ARGS:-}" != *BACKPROP_CUDA* ]] && { [ -x /usr/local/cuda/bin/nvcc ] || command -v nvcc >/dev/null; }; then
  cuda_args=(-DBACKPROP_CUDA=ON)
fi
cmake -S . -B build -DCMAKE_BUILD_TYPE="$build_type" "${cuda_args[@]}" ${BACKPROP_CMAKE_ARGS:-} >/dev/null
# The same configuration either way, so a later `setup.sh --test` (or `cmake --build build`) only adds
# the targets left out here. backprop links the whole library, the CUDA backend included where built.
targets=(--target backprop)
[ "$want_tests" = 1 ] && targets=()
cmake --build build -j"$jobs" "${targets[@]}"
