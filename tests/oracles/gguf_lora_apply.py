#!/usr/bin/python3
"""Independent consumer of a GGUF LoRA adapter: applies it to its base GGUF as llama.cpp does and
compares the result with a merged GGUF written by backprop.

Usage: /usr/bin/python3 gguf_lora_apply.py BASE.gguf ADAPTER.gguf MERGED.gguf OUT.json

The files are parsed by @huggingface/gguf (tests/oracles/gguf_read.mjs, run with node): metadata,
tensor shapes (ne), types and offsets. Tensor bytes are read here with NumPy at
tensor_data_offset + offset and decoded by gguf_dequant.py (f32, f16, bf16, q8_0, q4_0, q4_K,
q5_K, q6_K). For every pair "<name>.lora_a" / "<name>.lora_b" the checks of llama.cpp's
llama-adapter.cpp are made (general.type "adapter", adapter.type "lora", the architecture of the
base, a.ne[0] == W.ne[0], b.ne[1] == W.ne[1], a.ne[1] == b.ne[0]) and
    W' = W + (adapter.lora.alpha / r) * B @ A        (r = a.ne[1])
is computed in float64 on the base tensor as stored (llama.cpp's row order: no q/k permutation is
undone, the adapter must already match it). OUT.json: the checks, and per tensor the largest
|W' - merged| and |W' - W|. No code is shared with backprop.
"""
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gguf_dequant import decode_tensor, read_layout  # noqa: E402  (the same independent decoder)


def read_gguf(path):
    return read_layout(path), np.fromfile(path, dtype=np.uint8)


def tensor(info, raw, name):
    t = next(t for t in info["tensors"] if t["name"] == name)
    v = decode_tensor(info, raw, t)
    if v is None:
        raise SystemExit(f"{name}: ggml type {t['dtype']} not decoded by this oracle")
    return v.astype(np.float64).reshape(list(reversed(t["shape"]))), t["shape"]  # row-major: outermost first


def meta(info, key):
    return info["metadata"][key]["value"] if key in info["metadata"] else None


def main():
    base_path, adapter_path, merged_path, out_path = sys.argv[1:5]
    base, base_raw = read_gguf(base_path)
    ad, ad_raw = read_gguf(adapter_path)
    merged, merged_raw = read_gguf(merged_path)
    res = {
        "general_type": meta(ad, "general.type"),
        "adapter_type": meta(ad, "adapter.type"),
        "alpha_type": ad["metadata"].get("adapter.lora.alpha", {}).get("type"),
        "arch_matches": meta(ad, "general.architecture") == meta(base, "general.architecture"),
        "shape_errors": [],
        "tensors": {},
    }
    alpha = meta(ad, "adapter.lora.alpha")
    names = sorted({t["name"][:-len(".lora_a")] for t in ad["tensors"] if t["name"].endswith(".lora_a")})
    for name in names:
        A, a_ne = tensor(ad, ad_raw, name + ".lora_a")
        B, b_ne = tensor(ad, ad_raw, name + ".lora_b")
        W, w_ne = tensor(base, base_raw, name)
        if a_ne[0] != w_ne[0] or b_ne[1] != w_ne[1] or a_ne[1] != b_ne[0]:
            res["shape_errors"].append(f"{name}: W ne {w_ne}, lora_a ne {a_ne}, lora_b ne {b_ne}")
            continue
        Wp = W + (alpha / a_ne[1]) * (B @ A)
        M, _ = tensor(merged, merged_raw, name)
        res["tensors"][name] = {"max_diff_merged": float(np.abs(Wp - M).max()),
                                "max_change": float(np.abs(Wp - W).max())}
    with open(out_path, "w") as f:
        json.dump(res, f)


if __name__ == "__main__":
    main()
