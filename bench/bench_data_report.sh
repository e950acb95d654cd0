#!/bin/bash
# `backprop data report` on a synthetic file of N rows (default 1,000,000; issue 43: minutes, not
# hours, in bounded memory): ShareGPT-style chat rows of ~40 words with 1% exact duplicates, 1%
# near-duplicates (one word appended) and a 10,000-row eval file, 1% of it copied from training.
# Prints the wall time, rows/s and peak RSS (GNU time), and the report's counts.
# Run: bash bench/bench_data_report.sh [N]
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-1000000}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
/usr/bin/python3 - "$N" "$tmp" <<'EOF'
import json, random, sys
n, d = int(sys.argv[1]), sys.argv[2]
rng = random.Random(1)
words = ["w%d" % i for i in range(5000)]
def q():
    return " ".join(rng.choice(words) for _ in range(40))
rows = []  # the first 10,000 rows' (question, answer), for the copies
def row(t, a):
    return json.dumps({"messages": [{"role": "user", "content": t}, {"role": "assistant", "content": a}]}) + "\n"
with open(d + "/train.jsonl", "w") as f:
    for i in range(n):
        r = rng.random()
        if r < 0.01 and rows:
            t, a = rng.choice(rows)                    # an exact duplicate
        elif r < 0.02 and rows:
            t, a = rng.choice(rows)
            t += " again"                              # a near-duplicate
        else:
            t, a = q(), "Answer %d." % (i % 97)
        if len(rows) < 10000:
            rows.append((t, a))
        f.write(row(t, a))
with open(d + "/eval.jsonl", "w") as f:
    for i in range(10000):
        f.write(row(*rows[i]) if i % 100 == 0 else row(q(), "Answer %d." % (i % 97)))
EOF
ls -l "$tmp/train.jsonl" | awk '{printf "train file: %.1f MB\n", $5 / 1e6}'
/usr/bin/time -f "%e s wall, %M KiB peak RSS" ./build/backprop data report "$tmp/train.jsonl" \
  --eval-data "$tmp/eval.jsonl" --json >"$tmp/report.json" 2>"$tmp/time.txt" || true
tail -1 "$tmp/time.txt"
/usr/bin/python3 - "$tmp/report.json" "$tmp/time.txt" "$N" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
secs = float(open(sys.argv[2]).read().strip().splitlines()[-1].split()[0])
print("rows/s: %.0f" % (int(sys.argv[3]) / secs))
print("counts:", json.dumps(r["counts"]))
EOF
