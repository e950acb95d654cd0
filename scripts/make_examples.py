#!/usr/bin/python3
"""Generates the quickstart fine-tuning datasets in examples/ (see examples/README.md).

Usage: /usr/bin/python3 scripts/make_examples.py [--seed 2024] [--train 400] [--holdout 50] [--pairs 64]
                                                [--pair-holdout 32]
                                                [--out examples]

Both datasets ask the reading-comprehension questions the base model (models/tiny-chat) was
pre-trained on, e.g. "Tom has a red ball. Mia is in the park. Where is Mia?". The base model
answers with a full sentence ("Mia is in the park."); the datasets teach a new answer format,
which the model cannot produce before fine-tuning, so exact match on the held-out prompts goes
from 0 to (nearly) all of them:
  quickstart_sharegpt.jsonl  ShareGPT rows, answer "Answer: in the park."
  quickstart_alpaca.jsonl    Alpaca rows (instruction = question, input = context), answer "in the park"
Each has a *_holdout.jsonl part whose prompts never occur in the training part. The preference
sets (docs/preference.md) ask new questions of the same kind:
  preference/pairs.jsonl     {"prompt", "chosen", "rejected"}: chosen "Answer: <the right fact>.",
                             rejected "Answer: <another fact of the same text>."
  preference/kto.jsonl       the same pairs unpaired: {"prompt", "completion", "label": true|false}
  preference/pairs_holdout.jsonl  more pairs of the same kind whose prompts occur in no other file
                             (--eval-data for the README's DPO run)
Python 3 standard library only; the same seed writes the same bytes.
"""
import argparse
import json
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from corpus_words import make_reading_question  # noqa: E402


def unique_questions(rng, n, seen):
    """n (context, question, short answer) whose prompt text is not in `seen` (updated)."""
    out = []
    while len(out) < n:
        context, q, _, short, _ = make_reading_question(rng)
        key = context + " " + q
        if key in seen:
            continue
        seen.add(key)
        out.append((context, q, short))
    return out


def sharegpt_row(context, q, short):
    return {"conversations": [{"from": "human", "value": f"{context} {q}"},
                              {"from": "gpt", "value": f"Answer: {short}."}]}


def alpaca_row(context, q, short):
    return {"instruction": q, "input": context, "output": short}


def preference_questions(rng, n, seen):
    """n (prompt, right short answer, wrong short answer): the wrong one answers another question
    about the same text, so only reading the question tells them apart."""
    out = []
    while len(out) < n:
        context, q, _, short, qas = make_reading_question(rng)
        wrong = sorted({s for _, _, s in qas if s != short})
        key = context + " " + q
        if key in seen or not wrong:
            continue
        seen.add(key)
        out.append((key, short, rng.choice(wrong)))
    return out


def write(path, rows):
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seed", type=int, default=2024)
    ap.add_argument("--train", type=int, default=400)
    ap.add_argument("--holdout", type=int, default=50)
    ap.add_argument("--pairs", type=int, default=64)
    ap.add_argument("--pair-holdout", type=int, default=32)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
    args = ap.parse_args()
    rng = random.Random(args.seed)
    os.makedirs(args.out, exist_ok=True)
    shared = set()
    for name, make in (("sharegpt", sharegpt_row), ("alpaca", alpaca_row)):
        seen = shared if name == "sharegpt" else set()
        holdout = unique_questions(rng, args.holdout, seen)  # drawn first, so training never repeats them
        train = unique_questions(rng, args.train, seen)
        write(os.path.join(args.out, f"quickstart_{name}.jsonl"), [make(*x) for x in train])
        write(os.path.join(args.out, f"quickstart_{name}_holdout.jsonl"), [make(*x) for x in holdout])
    # Drawn last (the quickstart files stay the same bytes) and never a quickstart prompt.
    pairs = preference_questions(rng, args.pairs, shared)
    os.makedirs(os.path.join(args.out, "preference"), exist_ok=True)
    write(os.path.join(args.out, "preference", "pairs.jsonl"),
          [{"prompt": p, "chosen": f"Answer: {c}.", "rejected": f"Answer: {r}."} for p, c, r in pairs])
    write(os.path.join(args.out, "preference", "kto.jsonl"),
          [{"prompt": p, "completion": f"Answer: {a}.", "label": good}
           for p, c, r in pairs for a, good in ((c, True), (r, False))])
    # Drawn after the pairs (every file above keeps its bytes), never a prompt of theirs.
    held = preference_questions(rng, args.pair_holdout, shared)
    write(os.path.join(args.out, "preference", "pairs_holdout.jsonl"),
          [{"prompt": p, "chosen": f"Answer: {c}.", "rejected": f"Answer: {r}."} for p, c, r in held])


if __name__ == "__main__":
    main()
