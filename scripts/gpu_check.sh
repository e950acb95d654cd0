#!/usr/bin/env bash
# The CUDA backend on a real NVIDIA GPU (docs: issue "Train on one NVIDIA GPU"). CI has no GPU: there
# every kernel runs on the CPU simulation (test_cuda); this script is what to run where a GPU exists.
#   1. checks that a GPU and driver are visible (nvidia-smi); without one it says so and exits 2;
#   2. builds build-gpu/ with -DBACKPROP_CUDA=ON (nvcc for sm_80, sm_86, sm_89, sm_90);
#   3. runs the simulated kernel tests (test_cuda) and the same kernels on the device against the
#      CPU backend (test_cuda_device, with BP_REQUIRE_GPU=1 so a missing device fails, not skips);
#   4. runs the GPU benchmark when there is one (none yet: the script says so).
# Record what it prints in docs/benchmarks.md; never report GPU results you did not see.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=${BACKPROP_JOBS:-$(nproc)}

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
  echo "gpu_check: no NVIDIA GPU is visible on this machine (nvidia-smi is missing or lists no GPU)." >&2
  echo "gpu_check: nothing was run. The CUDA kernels are tested without a GPU by test_cuda (scripts/test.sh)." >&2
  exit 2
fi
nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total --format=csv

echo "== build (build-gpu, BACKPROP_CUDA=ON) =="
cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DBACKPROP_CUDA=ON >/dev/null
cmake --build build-gpu -j"$jobs" --target backprop test_cuda test_cuda_device
./build-gpu/backprop info | sed -n '1,40p'

echo "== CUDA kernels on the simulation (test_cuda) =="
./build-gpu/tests/test_cuda
echo "== CUDA kernels on the device against the CPU backend (test_cuda_device) =="
BP_REQUIRE_GPU=1 ./build-gpu/tests/test_cuda_device

echo "== GPU benchmark =="
if [ -x build-gpu/bench/bench_cuda ]; then
  ./build-gpu/bench/bench_cuda
else
  echo "no GPU benchmark is built yet (bench/ has no CUDA benchmark); training on --device cuda is not wired yet"
fi
