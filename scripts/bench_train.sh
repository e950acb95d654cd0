#!/usr/bin/env bash
# End-to-end LoRA training speed: backprop (bench/bench_train.cpp) next to the PyTorch oracle
# (tests/oracles/torch_train_bench.py) doing the same steps with the same threads, in the same run,
# interleaved per model so both see the same machine load. PyTorch runs twice: eager f32 and under
# torch.autocast("cpu", dtype=torch.bfloat16) (issue 41: what a PyTorch user runs on a CPU with bf16
# dot products). Prints tokens/s, the ratios backprop / torch f32 and backprop / torch bf16, and
# model-FLOPs utilisation against OpenBLAS sgemm measured in the same run and, where backprop's bf16
# GEMMs run on oneDNN, against oneDNN's bf16 matmul rate too (MFU bf16: the peak of a bf16 base,
# issue 41); torch's rows: against its own matmul rate, in bf16 for the autocast row.
#
# Usage: scripts/bench_train.sh [smollm135m] [qwen2.5-0.5b]      (default: both)
# Both sides run with scripts/runtime_env.sh (passive OpenMP waits, OpenBLAS kernels for this CPU)
# and the same OpenBLAS build: backprop links Debian's OpenMP build; torch loads the system
# libblas.so.3 (the pthread build by default), so it gets the OpenMP build's folder on
# LD_LIBRARY_PATH too. TORCH_BLAS=system leaves torch on the system's choice.
# Environment (passed to both sides):
#   BUILD_DIR (build)  BP_BENCH_THREADS (2)  BP_BENCH_STEPS (3, after 1 warm-up)  BP_BENCH_SEQ (512)
#   BACKPROPAGATE_RUNTIME__CPU_KERNELS (auto; generic|avx2|avx512 forces backprop's kernel variant)
#   BP_BENCH_SMOL_LAYERS (30 = full)  BP_BENCH_QWEN_LAYERS (8 of 24; same layer shapes and head)
#   BP_BENCH_BASE_DTYPE (f32; bf16 holds backprop's frozen weights in bf16, whose GEMMs take the CPU
#     GEMM engine's bf16 path)  BACKPROPAGATE_RUNTIME__CPU_GEMM (auto|openblas|onednn)
#   BP_BENCH_IDLE_BELOW (unset; e.g. 1.0): before each side's run, wait (at most 15 minutes) until the
#     1-minute load average is under this value, and print the load each run started at
# Needs a Release build of bench_train:
#   cmake -S . -B build -DCMAKE_BUILD_TYPE=Release && cmake --build build -j2 --target bench_train
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/runtime_env.sh
BUILD_DIR=${BUILD_DIR:-build}
TORCH_BLAS=${TORCH_BLAS:-same}
OPENMP_BLAS_DIR=/usr/lib/x86_64-linux-gnu/openblas-openmp
torch_env=()
if [ "$TORCH_BLAS" = same ] && [ -d "$OPENMP_BLAS_DIR" ]; then
  torch_env=(env "LD_LIBRARY_PATH=$OPENMP_BLAS_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}")
fi
export BP_BENCH_THREADS=${BP_BENCH_THREADS:-2}
export BP_BENCH_STEPS=${BP_BENCH_STEPS:-3}
export BP_BENCH_SEQ=${BP_BENCH_SEQ:-512}
export BP_BENCH_SMOL_LAYERS=${BP_BENCH_SMOL_LAYERS:-30}
export BP_BENCH_QWEN_LAYERS=${BP_BENCH_QWEN_LAYERS:-8}
PY=/usr/bin/python3
BIN="$BUILD_DIR/bench/bench_train"
[[ -x "$BIN" ]] || { echo "missing $BIN (build the bench_train target first)" >&2; exit 1; }
models=("$@")
[[ ${#models[@]} -gt 0 ]] || models=(smollm135m qwen2.5-0.5b)
tmp=$(mktemp -d)
# Waits for the machine to go quiet when BP_BENCH_IDLE_BELOW is set; prints the load a run starts at.
wait_idle() {
  if [[ -n "${BP_BENCH_IDLE_BELOW:-}" ]]; then
    local waited=0
    while awk -v lim="$BP_BENCH_IDLE_BELOW" '{exit !($1 >= lim)}' /proc/loadavg && ((waited < 900)); do
      sleep 5
      waited=$((waited + 5))
    done
  fi
  echo "load before $1: $(cut -d' ' -f1-3 /proc/loadavg)"
}
trap 'rm -rf "$tmp"' EXIT

echo "date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')  load: $(cut -d' ' -f1-3 /proc/loadavg)  threads: $BP_BENCH_THREADS" \
  " steps: $BP_BENCH_STEPS (+1 warm-up)  seq: $BP_BENCH_SEQ"
echo "env: OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-} OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-}" \
  "OPENBLAS_THREAD_TIMEOUT=${OPENBLAS_THREAD_TIMEOUT:-} GOMP_SPINCOUNT=${GOMP_SPINCOUNT:-} torch BLAS: $TORCH_BLAS" \
  "BACKPROPAGATE_RUNTIME__CPU_KERNELS=${BACKPROPAGATE_RUNTIME__CPU_KERNELS:-auto}"
for m in "${models[@]}"; do
  case "$m" in
    smollm135m) layers=$BP_BENCH_SMOL_LAYERS ;;
    qwen2.5-0.5b) layers=$BP_BENCH_QWEN_LAYERS ;;
    *) echo "unknown model $m (smollm135m or qwen2.5-0.5b)" >&2; exit 1 ;;
  esac
  wait_idle "backprop $m"
  "$BIN" --benchmark_filter="^train/$m/" --benchmark_format=json >"$tmp/cpp_$m.json" 2>"$tmp/cpp_$m.err" ||
    { cat "$tmp/cpp_$m.err" >&2; exit 1; }
  grep -m1 '^cpu kernels:' "$tmp/cpp_$m.err" || true
  wait_idle "torch $m"
  "${torch_env[@]}" $PY tests/oracles/torch_train_bench.py --model "$m" --layers "$layers" --seq "$BP_BENCH_SEQ" \
    --steps "$BP_BENCH_STEPS" --threads "$BP_BENCH_THREADS" >"$tmp/torch_$m.json"
  wait_idle "torch bf16 $m"
  "${torch_env[@]}" $PY tests/oracles/torch_train_bench.py --model "$m" --layers "$layers" --seq "$BP_BENCH_SEQ" \
    --steps "$BP_BENCH_STEPS" --threads "$BP_BENCH_THREADS" --bf16 >"$tmp/torch16_$m.json"
  echo "load after $m: $(cut -d' ' -f1-3 /proc/loadavg)"
  $PY - "$tmp/cpp_$m.json" "$tmp/torch_$m.json" "$tmp/torch16_$m.json" <<'EOF'
import json, sys
cpp = json.load(open(sys.argv[1]))["benchmarks"]
tor = json.loads(open(sys.argv[2]).read().strip().splitlines()[-1])
t16 = json.loads(open(sys.argv[3]).read().strip().splitlines()[-1])
print("%-30s %7s %7s %9s %9s %9s %7s %8s %8s %8s %9s %8s" % ("%s, %d layers" % (tor["model"], tor["layers"]),
      "step s", "cpu s", "tok/s", "model GF/s", "GEMM GF/s", "MFU", "vs f32", "vs bf16", "faults", "bf16 GF/s",
      "MFU bf16"))
for b in cpp:
    mode = b["name"].split("/")[2]
    step = b["real_time"]  # seconds (Unit kSecond)
    mfu = b["modelGF/s"] / b["sgemmGF/s"]
    bf16 = b.get("bf16GF/s", 0.0)
    print("%-30s %7.2f %7.2f %9.0f %9.1f %9.1f %6.1f%% %7.2fx %7.2fx %8.0f %9s %8s" % ("backprop " + mode, step,
          b["cpu_s/step"], b["tok/s"], b["modelGF/s"], b["sgemmGF/s"], 100 * mfu, b["tok/s"] / tor["tokens_per_s"],
          b["tok/s"] / t16["tokens_per_s"], b["faults/step"], "%.1f" % bf16 if bf16 else "-",
          "%.1f%%" % (100 * b["modelGF/s"] / bf16) if bf16 else "-"))
gf = cpp[0]["model_GF"]
for name, t in (("torch (eager f32, no ckpt)", tor), ("torch (bf16 autocast, no ckpt)", t16)):
    print("%-30s %7.2f %7.2f %9.0f %9.1f %9.1f %6.1f%% %8s %8s %8.0f" % (name, t["step_s"], t["cpu_s_per_step"],
          t["tokens_per_s"], gf / t["step_s"], t["matmul_gflops"], 100 * gf / t["step_s"] / t["matmul_gflops"],
          "%.2fx" % (t["tokens_per_s"] / tor["tokens_per_s"]), "%.2fx" % (t["tokens_per_s"] / t16["tokens_per_s"]),
          t["faults_per_step"]))
print("  model FLOPs per step: %.1f GFLOP; backprop's MFU is against OpenBLAS sgemm (f32), MFU bf16 against oneDNN's"
      " bf16 matmul (where the engine runs it), torch's against its own matmul rate on the same shape (bf16 for the"
      " autocast row)" % gf)
print("  torch %s, BLAS %s" % (tor.get("torch", "?"), tor.get("blas", "?")))
EOF
done
