# Shared by the Python package's tests (tests/CMakeLists.txt runs each file with pytest, with
# PYTHONPATH=build/python and the paths below in the environment).
import json
import os
import pathlib
import subprocess

import pytest

SRC = pathlib.Path(os.environ.get("BP_SOURCE_DIR", pathlib.Path(__file__).resolve().parents[2]))
BIN = pathlib.Path(os.environ.get("BP_BINARY_DIR", SRC / "build"))
BACKPROP = os.environ.get("BP_BACKPROP_EXE", str(BIN / "backprop"))
MODEL = str(SRC / "models" / "tiny-chat")
DATA = str(SRC / "examples" / "quickstart_sharegpt.jsonl")

# A tiny, fast run (as tests/train/monitor_run_test.cpp's): CPU, one thread, no held-out set.
TINY = dict(steps=2, batch_size=2, max_seq_length=64, lora_r=4, lora_alpha=8, threads=1, holdout=0,
            device="cpu", warmup_steps=0, save_every=0)
# The same settings as `backprop train` flags.
TINY_FLAGS = ["--steps", "2", "--batch-size", "2", "--max-seq-length", "64", "--lora-r", "4", "--lora-alpha", "8",
              "--threads", "1", "--holdout", "0", "--device", "cpu", "--warmup-steps", "0", "--save-every", "0"]


def rows(n=None):
    with open(DATA, encoding="utf-8") as f:
        out = [json.loads(line) for line in f if line.strip()]
    return out if n is None else out[:n]


def cli(*args, check=True):
    """Runs the backprop binary; returns (exit code, stdout, stderr)."""
    p = subprocess.run([BACKPROP, *map(str, args)], capture_output=True, text=True, timeout=300)
    if check and p.returncode != 0:
        raise AssertionError(f"backprop {' '.join(map(str, args))} exited {p.returncode}:\n{p.stdout}\n{p.stderr}")
    return p.returncode, p.stdout, p.stderr


def cli_json(*args, check=True):
    code, out, err = cli("--json", *args, check=check)
    return code, json.loads(out)


def file_bytes(folder):
    """Every file under `folder` by relative path, with its bytes."""
    folder = pathlib.Path(folder)
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def metrics(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl"), encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


@pytest.fixture
def runs_dir(tmp_path):
    return str(tmp_path / "runs")
