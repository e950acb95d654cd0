#!/usr/bin/python3
"""Independent oracle for LoRA merge and the file formats (used by merge_test.cpp).

Reads safetensors files with a from-scratch parser (json + numpy), the PEFT adapter folder and
adapter_config.json, computes W + scale * B @ A in float64 for every lora_A/lora_B pair, and
compares with the merged Hugging Face folder. Prints "OK <n_checked> <max_abs_diff>" or fails.

usage: merge_oracle.py BASE_DIR ADAPTER_DIR MERGED_DIR TOLERANCE
"""
import json
import math
import os
import struct
import sys

import numpy as np


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        b, end = e["data_offsets"]
        raw = data[8 + n + b:8 + n + end]
        if e["dtype"] == "F32":
            a = np.frombuffer(raw, dtype="<f4").astype(np.float64)
        elif e["dtype"] == "F16":
            a = np.frombuffer(raw, dtype="<f2").astype(np.float64)
        elif e["dtype"] == "BF16":
            u = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
            a = u.view(np.float32).astype(np.float64)
        else:
            raise SystemExit(f"oracle: unexpected dtype {e['dtype']} for {name}")
        out[name] = (a.reshape(e["shape"]), e["dtype"])
    return out


def read_model(d):
    idx = os.path.join(d, "model.safetensors.index.json")
    if os.path.exists(idx):
        out = {}
        for shard in sorted(set(json.load(open(idx))["weight_map"].values())):
            out.update(read_safetensors(os.path.join(d, shard)))
        return out
    return read_safetensors(os.path.join(d, "model.safetensors"))


def main():
    base_dir, adapter_dir, merged_dir, tol = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
    base = read_model(base_dir)
    merged = read_model(merged_dir)
    cfg = json.load(open(os.path.join(adapter_dir, "adapter_config.json")))
    r, alpha = cfg["r"], cfg["lora_alpha"]
    scale = alpha / math.sqrt(r) if cfg.get("use_rslora") else alpha / r
    ad = read_safetensors(os.path.join(adapter_dir, "adapter_model.safetensors"))
    prefix = "base_model.model."
    expected = {k: v[0] for k, v in base.items()}
    n = 0
    for name, (a, _) in ad.items():
        if not name.endswith(".lora_A.weight"):
            continue
        module = name[len(prefix):-len(".lora_A.weight")]
        b = ad[name.replace(".lora_A.", ".lora_B.")][0]
        expected[module + ".weight"] = expected[module + ".weight"] + scale * (b @ a)
        n += 1
    if n == 0:
        raise SystemExit("oracle: adapter has no lora_A tensors")
    if set(expected) != set(merged):
        raise SystemExit(f"oracle: tensor names differ: {sorted(set(expected) ^ set(merged))}")
    worst = 0.0
    for k, want in expected.items():
        got = merged[k][0]
        if got.shape != want.shape:
            raise SystemExit(f"oracle: {k} shape {got.shape} != {want.shape}")
        d = np.abs(got - want) - tol * (1 + np.abs(want))
        if d.max() > 0:
            raise SystemExit(f"oracle: {k} differs by {np.abs(got - want).max()}")
        worst = max(worst, float(np.abs(got - want).max()))
    print(f"OK {n} {worst}")


main()
