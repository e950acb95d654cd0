#!/usr/bin/env bash
# Peak resident memory of a QLoRA run next to its memory plan (issue 17: a Qwen2.5-0.5B-shaped run
# at q4_k within 5% of its plan). Writes a model folder of the real shape with random bf16 weights
# (scripts/make_shaped_model.py; LAYERS of the real 24 layers, full 151,936-token vocabulary), a
# dataset whose rows all tokenize to the same length (so every micro-batch is the one the plan is
# for: the plan is sized for the longest samples), runs `backprop train` under /usr/bin/time and
# prints the plan (from the run's log: the tensors the allocator will hold plus the process's own
# memory measured when the plan is made), the peak RSS and their ratio.
#
#   scripts/measure_qlora_memory.sh                       # q4_k, 8 layers, 2 steps
#   BASE=q8_0 LAYERS=24 STEPS=3 scripts/measure_qlora_memory.sh
#
# Environment: BACKPROP (build/backprop), SHAPE (qwen2.5-0.5b | smollm-135m), LAYERS (8), BASE
# (q4_k), STEPS (2), MICRO (2 sequences per micro-batch), REPEAT (6: prompt length, in copies of a
# 13-word sentence), THREADS (2), KEEP=1 keeps the work folder.
set -euo pipefail
cd "$(dirname "$0")/.."
BACKPROP=${BACKPROP:-build/backprop}
SHAPE=${SHAPE:-qwen2.5-0.5b}
LAYERS=${LAYERS:-8}
BASE=${BASE:-q4_k}
STEPS=${STEPS:-2}
MICRO=${MICRO:-2}
REPEAT=${REPEAT:-6}
THREADS=${THREADS:-2}
[[ -x "$BACKPROP" ]] || { echo "missing $BACKPROP (build the backprop target first)" >&2; exit 1; }
work=$(mktemp -d)
[[ "${KEEP:-0}" = 1 ]] || trap 'rm -rf "$work"' EXIT
/usr/bin/python3 scripts/make_shaped_model.py --shape "$SHAPE" --layers "$LAYERS" --out "$work/model" >/dev/null
/usr/bin/python3 - "$REPEAT" >"$work/data.jsonl" <<'PY'
import json, sys
prompt = " ".join(["Ruby is at the library. Jack likes berries. Rosa has a blue kite."] * int(sys.argv[1]))
for _ in range(16):
    print(json.dumps({"instruction": "Where is Ruby?", "input": prompt, "output": "at the library"}))
PY
source scripts/runtime_env.sh
echo "date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')  load: $(cut -d' ' -f1-3 /proc/loadavg)  $SHAPE, $LAYERS layers, base $BASE"
/usr/bin/time -f '%M' -o "$work/maxrss_kib" "$BACKPROP" train --model "$work/model" --data "$work/data.jsonl" \
  --base-dtype "$BASE" --steps "$STEPS" --batch-size "$MICRO" --micro-batch-size "$MICRO" --threads "$THREADS" \
  --save-every 0 --output "$work/runs" >"$work/stdout" 2>"$work/stderr" ||
  { tail -20 "$work/stderr" >&2; exit 1; }
plan_line=$(grep -m1 'memory plan for' "$work/stderr")
echo "${plan_line#*\[info\] }" | cut -c1-400
/usr/bin/python3 - "$plan_line" "$(cat "$work/maxrss_kib")" <<'PY'
import re, sys
units = {"bytes": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
def field(name):
    m = re.search(name + r" ([0-9.]+) (bytes|KiB|MiB|GiB)", sys.argv[1])
    return float(m.group(1)) * units[m.group(2)]
total, resident = field("= total"), field("resident")
rss = int(sys.argv[2]) * 1024
print("plan: tensors %.1f MiB + process %.1f MiB = resident %.1f MiB; peak RSS %.1f MiB; RSS / plan resident %.3f "
      "(RSS / tensors alone %.3f)" % (total / 2**20, (resident - total) / 2**20, resident / 2**20, rss / 2**20,
                                      rss / resident, rss / total))
PY
