"""The quick start in Python: fine-tune the bundled demo model on the bundled conversations, watch
the loss, and export the adapter as a GGUF file.

    PYTHONPATH=build/python python3 examples/python/quickstart.py        # from the CMake build
    .venv/bin/python examples/python/quickstart.py                       # after `pip install .`

Use your own model and data the same way: Trainer("Qwen/Qwen2.5-0.5B-Instruct", ...) and a JSONL
file, or a list of dicts.
"""

import json
import logging
import os
import sys

import backpropagate as bp

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
MODEL = os.path.join(ROOT, "models", "tiny-chat")
DATA = os.path.join(ROOT, "examples", "quickstart_sharegpt.jsonl")
STEPS = int(os.environ.get("QUICKSTART_STEPS", "30"))
OUTPUT = os.environ.get("QUICKSTART_OUTPUT", "runs")

logging.basicConfig(level=logging.INFO, format="%(asctime)s [%(levelname)s] %(message)s")

trainer = bp.Trainer(MODEL, output=OUTPUT, steps=STEPS, lora_r=8, lr=1e-3, max_seq_length=128, batch_size=4)

# Does it fit? The same plan as `backprop estimate-vram`.
plan = trainer.estimate_vram()
print(f"memory plan: {plan.total_bytes / 2**20:.1f} MiB, fits: {plan.fits}")

# Rows can come from Python too: a list of dicts, a generator, a datasets.Dataset.
with open(DATA, encoding="utf-8") as f:
    rows = [json.loads(line) for line in f]

losses = []


def on_record(record):
    if record["type"] == "step":
        losses.append(record["loss"])
    # returning False here would stop the run with a checkpoint (resume with trainer.train(resume=...))


try:
    result = trainer.train(rows, callback=on_record)
except bp.OutOfMemoryError as e:  # every error is a BackpropError with .code, .suggestion, ...
    sys.exit(f"out of memory: {e.message}\n{e.suggestion}")

print(f"run {result.run_id}: loss {losses[0]:.3f} -> {result.final_loss:.3f}; adapter in {result.adapter_path}")
exported = trainer.export(format="gguf", quantization="q8_0")
print("exported:", ", ".join(exported.written))
