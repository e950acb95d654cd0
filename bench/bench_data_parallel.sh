#!/usr/bin/env bash
# Data-parallel scaling on one machine (issue 40; docs/benchmarks.md "Data-parallel"): full
# fine-tuning of the SmolLM-135M shape (hidden 576, intermediate 1536, 30 layers, 9 query / 3 KV
# heads, vocab 49152, tied embeddings; random weights from --init-from-config, stories260K's
# tokenizer, whose ids all fit the vocabulary) at sequence 256, global batch 4, as
#   1 process x 2 threads   (backprop train --threads 2)
#   2 ranks  x 1 thread     (backprop train --nproc 2 --threads 1: mpirun, ZeRO-1 on)
#   the same with --overlap-communication true (each layer's gradients reduced under the backward)
# and prints each one's tokens/s over the steps after the first (from the step records' times in
# metrics.jsonl) and its final loss (the two must agree: the same global batch); for the ranks, the
# time in collectives per step beside it (the step records' comm_s, comm_gradient_s,
# comm_parameter_s, comm_bytes: core/collective.h CommTotals).
# Usage: bench/bench_data_parallel.sh [BACKPROP] [STEPS]   (defaults: build/backprop, 4)
set -euo pipefail
cd "$(dirname "$0")/.."
backprop=${1:-build/backprop}
steps=${2:-4}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
model=$work/smollm-135m-shape
mkdir -p "$model"
cp "${BP_SHARED_DIR:-/work/shared}"/models/stories260K/tokenizer* "$model"/ 2>/dev/null || true
cat >"$model/config.json" <<'JSON'
{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 576,
 "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9,
 "num_key_value_heads": 3, "vocab_size": 49152, "max_position_embeddings": 2048,
 "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": true,
 "hidden_act": "silu", "torch_dtype": "float32"}
JSON
python3 - "$work/data.jsonl" <<'PY'
import json, sys
who = ["Lily", "Tom", "Ben", "Sue", "Max"]
with open(sys.argv[1], "w") as f:
    for i in range(64):
        text = " ".join(f"{who[(i + k) % 5]} saw a bird number {k % 7} and it was happy." for k in range(40))
        f.write(json.dumps({"text": text}) + "\n")
PY
args=(train --device cpu --init-from-config "$model/config.json" --mode full --data "$work/data.jsonl"
  --steps "$steps" --batch-size 4 --micro-batch-size 2 --max-seq-length 256 --holdout 0 --lr 1e-4
  --warmup-steps 0 --save-every 0 --seed 1 --no-monitor)
rate() { # tokens/s over steps 2.. of the run under $1, and the final loss
  python3 - "$1" <<'PY'
import json, os, sys
root = sys.argv[1]
run = [os.path.join(root, d) for d in os.listdir(root)][0]
steps = [json.loads(l) for l in open(os.path.join(run, "metrics.jsonl")) if '"type":"step"' in l]
toks = sum(s["tokens"] for s in steps[1:])
dt = steps[-1]["time"] - steps[0]["time"]
line = f"{toks / dt:8.1f} tokens/s over steps 2-{len(steps)} ({dt / (len(steps) - 1):.2f} s/step), final loss {steps[-1]['loss']:.6f}"
if "comm_s" in steps[-1]:  # data-parallel: the time in collectives per step (rank 0's step records)
    later = steps[1:]
    mean = lambda k: sum(s[k] for s in later) / len(later)
    if "comm_overlap_s" in steps[-1]:
        line += (f"\n    overlap: reductions under the backward {mean('comm_overlap_s'):.3f} s/step, "
                 f"waited after it {mean('comm_wait_s'):.3f} s/step")
    line += (f"\n    collectives {mean('comm_s'):.3f} s/step ({100 * mean('comm_s') / mean('step_s'):.1f}% of the step): "
             f"gradients {mean('comm_gradient_s'):.3f} s, parameters (ZeRO-1) {mean('comm_parameter_s'):.3f} s; "
             f"{mean('comm_bytes') / 2**20:.1f} MiB sent per step by rank 0")
print(line)
PY
}
echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores"
"$backprop" "${args[@]}" --threads 2 --output "$work/one" >"$work/one.log" 2>&1 || { cat "$work/one.log"; exit 1; }
echo "1 process x 2 threads: $(rate "$work/one")"
"$backprop" "${args[@]}" --threads 1 --nproc 2 --output "$work/two" >"$work/two.log" 2>&1 || { cat "$work/two.log"; exit 1; }
echo "2 ranks  x 1 thread:   $(rate "$work/two")"
"$backprop" "${args[@]}" --threads 1 --nproc 2 --overlap-communication true --output "$work/overlap" \
  >"$work/overlap.log" 2>&1 || { cat "$work/overlap.log"; exit 1; }
echo "2 ranks  x 1 thread, overlap with the backward: $(rate "$work/overlap")"
