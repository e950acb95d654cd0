#!/usr/bin/env bash
# The CUDA backend on a real NVIDIA GPU (docs: issue "Train on one NVIDIA GPU"). CI has no GPU: there
# every kernel runs on the CPU simulation (test_cuda); this script is what to run where a GPU exists.
#   1. checks that a GPU and driver are visible (nvidia-smi); without one it says so and exits 2;
#   2. builds build-gpu/ with -DBACKPROP_CUDA=ON (nvcc for sm_75, sm_80, sm_86, sm_89, sm_90);
#   3. runs the stages (by default in this order, --stage to choose): device-tests, the kernels on
#      the device against the CPU backend (test_cuda_device, with BP_REQUIRE_GPU=1 so a missing
#      device fails, not skips); end-to-end, tiny-chat trained with `backprop train --device cuda`
#      and the same run with --device cpu, over its f32 weights and over them held in bf16 (the
#      16-bit GEMM path: bf16, or f16 on a Turing card), both step-1 and final losses printed, a
#      failure when they differ by more than bf16 allows (below); two-gpu (only where nvidia-smi
#      lists 2 or more GPUs), the same run data-parallel with `train --nproc 2`, one rank per GPU
#      and the gradients summed over NCCL, against one process on one GPU; bench, the GPU benchmark
#      (bench_cuda) and its comparison with transformers + PEFT and PyTorch eager
#      (scripts/gpu_bench_compare.py), with the issue's targets beside the figures; sim-tests, the
#      simulated kernel tests (test_cuda), last since CI runs them on every commit.
# Every stage after the build runs even when an earlier one failed (a first run on a new card should
# show all it can); the script ends with the list of failed stages and exit 1 when there are any.
# Record what it prints in docs/benchmarks.md; never report GPU results you did not see.
#
# Usage: scripts/gpu_check.sh [--prebuilt DIR] [--stage NAME[,NAME]]... [--out DIR] [--budget SECONDS]
#   --prebuilt DIR  no build: run the binaries of a bundle made by scripts/gpu_bundle.sh on another
#                   machine (DIR: the folder holding backprop-gpu-bundle.tar.xz, the .tar.xz itself,
#                   or an unpacked tree). For GPU machines without our build dependencies
#                   (docs/gpu_first_run.md). The bundle's libraries go on LD_LIBRARY_PATH of our
#                   programs only, with the folder of this machine's libcublasLt.so.13 (searched for,
#                   or BP_CUBLAS_DIR); the bundle is checked to be self-contained first.
#   --stage NAMES   run only these stages, in the order given (repeatable or comma-separated;
#                   default all, most telling first): device-tests, end-to-end, two-gpu, bench (one model
#                   after the other, BP_BENCH_SHAPES), sim-tests (test_cuda, in BP_TEST_SHARDS
#                   parallel gtest shards). The machine's facts (nvidia-smi, backprop info, python)
#                   are always printed first.
#   --out DIR       write each stage's log there (info.log, sim-tests.log, device-tests.log,
#                   bench.log, bench_cuda.jsonl, end-to-end.log) and summary.txt (each stage's
#                   result and seconds): 7 files, under the 8 a device call brings back.
#   --budget S      (or BP_BUDGET_S) the whole script ends within S seconds, unpacking included: every
#                   program is stopped when the budget runs out, less BP_BUDGET_RESERVE_S (default
#                   10: the summary, and the KILL 5 s after a SIGTERM a program did not obey); a
#                   stage or model that would start with under BP_STAGE_MIN_S (default 20) left is
#                   skipped and says so. For a device call whose limit must also leave time to rerun
#                   (docs/gpu_first_run.md).
# BP_TIMEOUT_S: each of our programs is stopped after this many seconds (default 420 with --prebuilt,
# inside a device call's 10 minutes, so a hung kernel leaves time and logs for the rest; none else),
# or sooner when the budget ends first.
# Exit: 0 every stage passed; 1 a stage (or the bundle) failed, or was STOPPED by the budget; 2 no GPU
# (nothing was run); 3 none failed or was stopped, but the budget left a stage (or a model) out.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=${BACKPROP_JOBS:-$(nproc)}
ALL_STAGES=(device-tests end-to-end two-gpu bench sim-tests)
prebuilt="" out_dir="" stages=() budget=${BP_BUDGET_S:-}
while [ $# -gt 0 ]; do
  case $1 in
    --prebuilt) prebuilt=$2; shift 2 ;;
    --out) out_dir=$2; shift 2 ;;
    --stage) IFS=, read -r -a more <<<"$2"; stages+=("${more[@]}"); shift 2 ;;
    --budget) budget=$2; shift 2 ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 0 ;;
    *) echo "gpu_check: unknown argument $1 (--help)" >&2; exit 1 ;;
  esac
done
[ ${#stages[@]} -gt 0 ] || stages=("${ALL_STAGES[@]}")
for s in "${stages[@]}"; do
  [[ " ${ALL_STAGES[*]} " == *" $s "* ]] || { echo "gpu_check: unknown stage '$s' (one of: ${ALL_STAGES[*]})" >&2; exit 1; }
done
for n in "$budget" "${BP_TIMEOUT_S:-}" "${BP_BUDGET_RESERVE_S:-}" "${BP_STAGE_MIN_S:-}"; do
  [[ -z "$n" || "$n" =~ ^[0-9]+$ ]] || { echo "gpu_check: '$n' is not a whole number of seconds" >&2; exit 1; }
done
if [ -n "$out_dir" ]; then
  mkdir -p "$out_dir"
  out_dir=$(cd "$out_dir" && pwd)
fi
work_dir=$(mktemp -d)
trap 'rm -rf "$work_dir"' EXIT

# ---- the budget: seconds left for programs, and each program's time limit -------------------------
# SECONDS counts from the script's start. Without a budget, time_left is unbounded (a large number).
reserve=${BP_BUDGET_RESERVE_S:-10} stage_min=${BP_STAGE_MIN_S:-20}
time_left() {
  if [ -n "$budget" ]; then echo $((budget - reserve - SECONDS)); else echo 1000000000; fi
}
out_of_budget() { [ "$(time_left)" -lt "$stage_min" ]; }
# limited COMMAND...: runs it, stopped after BP_TIMEOUT_S or when the budget runs out, whichever
# comes first (timeout exits 124, or 137 after the KILL 5 s later). timed: the same in run_env.
limited() {
  local limit
  limit=$(time_left)
  [ -z "${BP_TIMEOUT_S:-}" ] || [ "$BP_TIMEOUT_S" -ge "$limit" ] || limit=$BP_TIMEOUT_S
  [ "$limit" -gt 0 ] || limit=1
  if [ -n "$budget" ] || [ -n "${BP_TIMEOUT_S:-}" ]; then
    timeout -k 5 "$limit" "$@"
  else
    "$@"
  fi
}
timed() { limited "${run_env[@]}" "$@"; }

# ---- where the programs come from: a bundle (--prebuilt) or build-gpu/ -----------------------------
# run_env: the environment our programs run in (never python's: the bundle's libstdc++ is older).
if [ -n "$prebuilt" ]; then
  source scripts/gpu_prebuilt.sh # prepare_bundle: unpack, find cuBLAS and the driver, verify
  prepare_bundle "$prebuilt" "$work_dir" || exit 1
  bin_dir=$BUNDLE_TREE/bin
  backprop=$bin_dir/backprop test_cuda=$bin_dir/test_cuda test_cuda_device=$bin_dir/test_cuda_device
  bench_cuda=$bin_dir/bench_cuda
  run_env=(env "LD_LIBRARY_PATH=$BUNDLE_LD_PATH" "BP_SOURCE_DIR=$PWD" "BP_SHARED_DIR=$BUNDLE_TREE/shared")
  : "${BP_TIMEOUT_S:=420}"
else
  backprop=./build-gpu/backprop test_cuda=./build-gpu/tests/test_cuda
  test_cuda_device=./build-gpu/tests/test_cuda_device bench_cuda=./build-gpu/bench/bench_cuda
  run_env=(env)
fi
[ -z "$budget" ] || echo "gpu_check: budget ${budget} s ($(time_left) s left for the stages: ${stages[*]})"

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
  echo "gpu_check: no NVIDIA GPU is visible on this machine (nvidia-smi is missing or lists no GPU)." >&2
  echo "gpu_check: nothing was run. The CUDA kernels are tested without a GPU by test_cuda (scripts/test.sh)." >&2
  exit 2
fi

if [ -z "$prebuilt" ]; then
  echo "== build (build-gpu, BACKPROP_CUDA=ON) =="
  cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DBACKPROP_CUDA=ON >/dev/null
  cmake --build build-gpu -j"$jobs" --target backprop test_cuda test_cuda_device
fi

# python for the comparison rows: the first that imports torch (on the GPU machines a plain python3
# holds PyTorch, /usr/bin/python3 may not; here Debian's /usr/bin/python3 does). BP_PYTHON wins.
pick_python() {
  local py
  for py in ${BP_PYTHON:-} python3 /opt/torch/.venv/bin/python3 /usr/bin/python3; do
    if command -v "$py" >/dev/null 2>&1 && "$py" -c 'import torch' >/dev/null 2>&1; then
      echo "$py"
      return
    fi
  done
  echo python3
}
python=$(pick_python)

failed=() skipped=() summary=()
summary_row() { summary+=("$(printf '%-24s %-7s %5d s' "$1" "$2" "$3")"); } # NAME RESULT SECONDS
# stage NAME LOG COMMAND...: runs it (its output also appended to OUT/LOG.log), records the result
# and goes on. Skipped, saying so, when the budget has under BP_STAGE_MIN_S left; a failure after
# which the budget is spent reads "STOPPED": a program was cut off by the budget, not found wrong.
stage() {
  local name=$1 log=/dev/null t0=$SECONDS result=passed
  [ -z "$out_dir" ] || log=$out_dir/$2.log
  shift 2
  if out_of_budget; then
    local left
    left=$(time_left)
    echo "gpu_check: stage '$name' skipped: $((left > 0 ? left : 0)) s of the budget left" \
      "(under BP_STAGE_MIN_S=$stage_min)" | tee -a "$log" >&2
    skipped+=("$name")
    summary_row "$name" skipped 0
    return
  fi
  local rc=0
  "$@" 2>&1 | tee -a "$log" || rc=${PIPESTATUS[0]}
  if [ "$rc" != 0 ]; then
    result=FAILED
    if [ -n "$budget" ] && [ "$(time_left)" -le 0 ]; then
      result=STOPPED
      echo "gpu_check: stage '$name' STOPPED: the budget of ${budget} s ran out (BP_BUDGET_S / --budget)" >&2
    elif [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
      echo "gpu_check: stage '$name' FAILED: exit $rc, stopped after BP_TIMEOUT_S=${BP_TIMEOUT_S:-} s" >&2
    else
      echo "gpu_check: stage '$name' FAILED (exit $rc)" >&2
    fi
    failed+=("$name")
  fi
  summary_row "$name" "$result" $((SECONDS - t0))
}

machine_facts() {
  nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total --format=csv
  [ -z "$prebuilt" ] || sed -n '1,8p' "$BUNDLE_TREE/MANIFEST.txt"
  timed "$backprop" info | sed -n '1,40p'
  echo "cores: $(nproc); python for the comparison rows: $python"
  timeout -k 5 60 "$python" - <<'PY' || true
import importlib
for m in ("torch", "transformers", "peft"):
    try:
        print("  %s %s" % (m, importlib.import_module(m).__version__))
    except Exception as e:
        print("  %s: not importable (%s)" % (m, e))
PY
}
stage info info machine_facts

# test_cuda in gtest shards run side by side (GTEST_TOTAL_SHARDS / GTEST_SHARD_INDEX): the
# simulation runs each kernel's threads one at a time, so more processes is what speeds it up.
# BP_TEST_SHARDS (default: the cores, at most 8), each with the remaining cores as OpenMP threads.
sim_tests() {
  local shards=${BP_TEST_SHARDS:-$(($(nproc) < 8 ? $(nproc) : 8))} i status=0 pids=()
  local threads=$(($(nproc) / shards > 0 ? $(nproc) / shards : 1))
  echo "test_cuda in $shards shards, $threads OpenMP threads each"
  for ((i = 0; i < shards; i++)); do
    GTEST_TOTAL_SHARDS=$shards GTEST_SHARD_INDEX=$i OMP_NUM_THREADS=$threads \
      timed "$test_cuda" --gtest_brief=1 >"$work_dir/shard-$i.log" 2>&1 &
    pids+=($!)
  done
  for ((i = 0; i < shards; i++)); do
    local rc=0
    wait "${pids[$i]}" || rc=$?
    echo "-- shard $i of $shards: exit $rc"
    cat "$work_dir/shard-$i.log"
    [ "$rc" = 0 ] || status=1
  done
  return "$status"
}
run_sim_tests() {
  echo "== CUDA kernels on the simulation (test_cuda) =="
  stage sim-tests sim-tests sim_tests
}
run_device_tests() {
  echo "== CUDA kernels on the device against the CPU backend (test_cuda_device) =="
  stage device-tests device-tests timed env BP_REQUIRE_GPU=1 "$test_cuda_device"
}

# bench/bench_cuda.cpp: --device cuda training through the Trainer on the Qwen2.5-0.5B and 1.5B
# shapes at sequence 2048, MFU against the bf16 GEMM rate our cuBLASLt path reaches on the model's
# shapes in the same run; scripts/gpu_bench_compare.py trains the same models with transformers +
# PEFT and PyTorch eager on this GPU (rows whose python modules are missing are skipped, naming
# them) and prints the ratio and MFU beside the issue's targets (2x, 40%). One model at a time, in
# the order of BP_BENCH_SHAPES, each a stage of its own in the summary (bench:MODEL), so that a
# budget that runs out keeps the figures of the models before.
# BP_BENCH_SHAPES, BP_BENCH_SEQ, BP_BENCH_STEPS, BP_BENCH_BASE_DTYPE, BP_BENCH_MODE (lora or full) and
# BP_BENCH_MATMUL_DTYPE pass through to bench_cuda (a full run is reported without comparison rows).
bench_json=${out_dir:-build-gpu}/bench_cuda.jsonl # kept: the figures to record in docs/benchmarks.md
[ -z "$prebuilt" ] || bench_json=${out_dir:-$work_dir}/bench_cuda.jsonl
bench_model() { # bench_model NAME: backprop's run of one model (appended to bench_json), then the others'
  timed env BP_BENCH_SHAPES="$1" "$bench_cuda" --json "$bench_json" || return 1
  limited env HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 "$python" scripts/gpu_bench_compare.py \
    --backprop-json "$bench_json" --shapes "$1" --steps "${BP_BENCH_STEPS:-5}"
}
run_bench() {
  echo "== GPU benchmark (LoRA training tokens/s and MFU; backprop vs transformers+PEFT and PyTorch eager) =="
  if [ -z "$prebuilt" ] && ! cmake --build build-gpu -j"$jobs" --target bench_cuda; then
    echo "gpu_check: bench_cuda could not be built (bench/ needs BACKPROP_BUILD_BENCH=ON and Google Benchmark:" \
      "apt install libbenchmark-dev); no GPU benchmark was run" >&2
    failed+=(bench)
    summary_row bench FAILED 0
    return
  fi
  rm -f "$bench_json"
  local model
  IFS=, read -r -a models <<<"${BP_BENCH_SHAPES:-qwen2.5-0.5b,qwen2.5-1.5b}"
  for model in "${models[@]}"; do
    stage "bench:$model" bench bench_model "$model"
  done
}

# The same LoRA run of tiny-chat on the card and on the CPU: 20 steps, no dropout (its masks
# are drawn per device the same way, but without it nothing but arithmetic differs), one seed.
# Tolerances: bf16 keeps 8 significant bits, a unit roundoff of 2^-9 ~ 0.2% per rounding; the step-1
# loss is the forward pass alone (roundings of inputs and weights, f32 accumulation, averaged over
# the batch's tokens): 1% (5 roundoffs). The final loss has 20 updates on top, each from gradients
# carrying the same relative error, which AdamW's normalised steps do not amplify: 3% relative. f32
# activations (what the kernels use today) agree far closer; the bounds are for the bf16 paths.
run_dir=$work_dir/runs
mkdir -p "$run_dir"
train_args=(--json --model models/tiny-chat --data examples/quickstart_sharegpt.jsonl --steps 20 --batch-size 4
  --max-seq-length 128 --holdout 0 --save-every 0 --lora-dropout 0 --seed 1 --lr 1e-3 --warmup-steps 0)
# "final_loss" from the summary train --json prints; "loss" of step 1 from the run's metrics.jsonl.
json_number() { sed -n "s/.*\"$1\": *\([-0-9.eE+]*\).*/\1/p" | head -1; }
within_relative() { # awk: |a - b| <= rel * |b|
  awk -v a="$1" -v b="$2" -v rel="$3" 'BEGIN { d = a - b; if (d < 0) d = -d; m = b < 0 ? -b : b; exit !(d <= rel * m) }'
}
end_to_end() { # end_to_end BASE_DTYPE: the run on the card against the run on the CPU
  local base=$1 device out what gpu cpu rel status=0
  for device in cuda cpu; do
    timed "$backprop" train --device "$device" --base-dtype "$base" --output "$run_dir/$base-$device" \
      "${train_args[@]}" >"$run_dir/$base-$device.json" || {
      echo "gpu_check: backprop train --device $device --base-dtype $base failed; it printed:" >&2
      cat "$run_dir/$base-$device.json" >&2
      return 1
    }
    json_number final_loss <"$run_dir/$base-$device.json" >"$run_dir/$base-$device.final"
    out=$(sed -n 's/.*"output_dir": *"\([^"]*\)".*/\1/p' "$run_dir/$base-$device.json" | head -1)
    grep '"type":"step"' "$out/metrics.jsonl" | head -1 | json_number loss >"$run_dir/$base-$device.first"
  done
  for what in first final; do
    gpu=$(cat "$run_dir/$base-cuda.$what") cpu=$(cat "$run_dir/$base-cpu.$what")
    rel=$([ "$what" = first ] && echo 0.01 || echo 0.03)
    if [ -z "$gpu" ] || [ -z "$cpu" ]; then
      echo "gpu_check: $base base: no $what loss read (cuda: '$gpu', cpu: '$cpu')" >&2
      status=1
    elif within_relative "$gpu" "$cpu" "$rel"; then
      echo "$base base, $what loss: cuda $gpu, cpu $cpu (within ${rel} relative)"
    else
      echo "gpu_check: $base base, $what loss differs past ${rel} relative: cuda $gpu, cpu $cpu" >&2
      status=1
    fi
  done
  return "$status"
}
end_to_end_both() {
  local base status=0
  for base in f32 bf16; do
    echo "== tiny-chat end to end over $base weights: --device cuda against --device cpu =="
    end_to_end "$base" || { echo "gpu_check: end to end over $base weights FAILED" >&2; status=1; }
  done
  return "$status"
}
run_end_to_end() { stage end-to-end end-to-end end_to_end_both; }

# Two GPUs: tiny-chat's LoRA run (f32 weights) data-parallel with `train --nproc 2`, each rank on
# its own GPU (CUDA_VISIBLE_DEVICES from its local rank) and the gradients summed GPU to GPU over
# NCCL (ops/collective_nccl.h: NCCL moves the bytes, the sums are added on the device in rank
# order), against one process on one GPU with the same global batch. The two sum the same terms in
# another f32 order: step-1 loss within 1e-5 relative, final loss within 1e-3. Skipped (passing)
# where nvidia-smi lists fewer than 2 GPUs; fails where there are 2 but no mpirun or no NCCL.
two_gpu() {
  local gpus out one two
  gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
  if [ "${gpus:-0}" -lt 2 ]; then
    echo "two-gpu: nvidia-smi lists ${gpus:-0} GPU(s); this stage needs 2: nothing to run"
    return 0
  fi
  command -v mpirun >/dev/null || { echo "gpu_check: two-gpu: mpirun not found (apt-get install openmpi-bin)" >&2; return 1; }
  for n in 1 2; do
    out=$run_dir/dp-$n
    rm -rf "$out"
    timed "$backprop" train --device cuda --base-dtype f32 --output "$out" $([ "$n" = 2 ] && echo --nproc 2) \
      "${train_args[@]}" >"$out.json" 2>"$out.log" || {
      echo "gpu_check: two-gpu: the run with $n process(es) failed; it printed:" >&2
      cat "$out.json" "$out.log" >&2
      return 1
    }
  done
  grep -q "data-parallel over 2 ranks (NCCL" "$run_dir/dp-2.log" "$run_dir/dp-2.json" || {
    echo "gpu_check: two-gpu: the 2-rank run did not sum over NCCL; its log:" >&2
    grep -i "nccl\|data-parallel" "$run_dir/dp-2.log" >&2 || true
    return 1
  }
  local status=0 what rel
  for what in first final; do
    rel=$([ "$what" = first ] && echo 1e-5 || echo 1e-3)
    one=$(grep '"type":"step"' "$(ls -d "$run_dir"/dp-1/*/ | head -1)/metrics.jsonl" |
      { [ "$what" = first ] && head -1 || tail -1; } | json_number loss)
    two=$(grep '"type":"step"' "$(ls -d "$run_dir"/dp-2/*/ | head -1)/metrics.jsonl" |
      { [ "$what" = first ] && head -1 || tail -1; } | json_number loss)
    if [ -n "$one" ] && [ -n "$two" ] && within_relative "$two" "$one" "$rel"; then
      echo "two GPUs, $what loss: 2 ranks $two, 1 process $one (within $rel relative)"
    else
      echo "gpu_check: two-gpu: $what loss of 2 ranks '$two' vs 1 process '$one' differs past $rel relative" >&2
      status=1
    fi
  done
  return "$status"
}
run_two_gpu() {
  echo "== two GPUs: train --nproc 2 over NCCL against one process =="
  stage two-gpu end-to-end two_gpu  # its log beside end-to-end's: --out keeps 7 files
}

for s in "${stages[@]}"; do
  case $s in
    device-tests) run_device_tests ;;
    end-to-end) run_end_to_end ;;
    two-gpu) run_two_gpu ;;
    bench) run_bench ;;
    sim-tests) run_sim_tests ;;
  esac
done

echo "== summary =="
printf '%s\n' "${summary[@]}" | tee "${out_dir:-$work_dir}/summary.txt"
if [ ${#failed[@]} -gt 0 ]; then
  echo "gpu_check: failed stages: ${failed[*]}${skipped[*]:+; left out for the budget: ${skipped[*]}}" >&2
  exit 1
fi
if [ ${#skipped[@]} -gt 0 ]; then
  echo "gpu_check: every stage that ran passed; left out for the budget: ${skipped[*]}" >&2
  exit 3
fi
echo "gpu_check: every stage passed"
