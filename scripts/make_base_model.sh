#!/usr/bin/env bash
# Remakes the demo base model models/tiny-chat from nothing but this repository
# (models/README.md explains every choice). Needs a built `backprop` (build/backprop) and
# /usr/bin/python3 (standard library only).
#
#   scripts/make_base_model.sh            full recipe (about 35 minutes on one core of a 2-core machine)
#   STEPS=20 scripts/make_base_model.sh   a short trial run (does not overwrite the model
#                                         unless INSTALL=1)
#
# Steps: 1. generate the corpus (scripts/make_corpus.py, seed 1234);
#        2. (tokenizer files are in models/tiny-chat already; scripts/make_tokenizer.py made
#           them from llama2.c's 512-token tokenizer, see models/README.md);
#        3. `backprop train --mode full --init-from-config models/tiny-chat/config.json` from a
#           random initialisation;
#        4. copy the trained model.safetensors into models/tiny-chat and record the run's summary.
set -euo pipefail
cd "$(dirname "$0")/.."

BACKPROP=${BACKPROP:-build/backprop}
WORK=${WORK:-build/tiny-chat-work}
SEED=${SEED:-1234}
ROWS=${ROWS:-40000}
STEPS=${STEPS:-5000}
BATCH=${BATCH:-8}
LR=${LR:-3e-3}
WARMUP=${WARMUP:-60}
THREADS=${THREADS:-1}
INSTALL=${INSTALL:-$([ "$STEPS" = 5000 ] && echo 1 || echo 0)}

# backprop sets its runtime environment itself (src/cli/main.cpp); sourced here too so the
# recipe's log shows it. Only speed settings.
source scripts/runtime_env.sh

mkdir -p "$WORK"
corpus="$WORK/corpus.jsonl"
/usr/bin/python3 scripts/make_corpus.py --seed "$SEED" --rows "$ROWS" --out "$corpus"
echo "corpus: $corpus ($(wc -c <"$corpus") bytes, sha256 $(sha256sum "$corpus" | cut -c1-16)...)"

"$BACKPROP" train --mode full --init-from-config models/tiny-chat/config.json \
  --data "$corpus" --steps "$STEPS" --batch-size "$BATCH" --max-seq-length 512 \
  --lr "$LR" --lr-scheduler cosine --warmup-steps "$WARMUP" --weight-decay 0.01 \
  --holdout 0.0025 --eval-every 400 --save-every 200 --seed 1 --threads "$THREADS" \
  --output "$WORK/runs" --json >"$WORK/summary.json"

run_dir=$(/usr/bin/python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["output_dir"])' "$WORK/summary.json")
echo "run folder: $run_dir"
/usr/bin/python3 -c 'import json,sys; s=json.load(open(sys.argv[1])); print({k: s.get(k) for k in ("steps_done","tokens","seconds","final_loss","initial_eval_loss","final_eval_loss")})' "$WORK/summary.json"
if [ "$INSTALL" = 1 ]; then
  cp "$run_dir/model/model.safetensors" models/tiny-chat/model.safetensors
  cp "$WORK/summary.json" models/tiny-chat/training_summary.json
  echo "installed models/tiny-chat/model.safetensors ($(wc -c <models/tiny-chat/model.safetensors) bytes)"
fi
