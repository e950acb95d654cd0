#!/usr/bin/python3
"""Independent NumPy/PyTorch oracle for multi-run adapter merging (src/train/adapter_merge.h).

Usage: /usr/bin/python3 adapter_merge.py DIR

DIR/meta.json: {"tensors": [{"shape": [r, in], "is_b": false}, ...], "run_index": i,
                "ties_trim": t, "dare_drop": p, "seed": s}
DIR/merged_K.f32, DIR/fresh_K.f32: tensor K of the merged-so-far and the fresh adapter.
Writes <mode>_K.out.f32 for mode in slao/linear/ties/dare, ortho_K.out.f32 (A tensors of the
merged adapter orthonormalised) and result.json with the B cosine. Written from the formulas in
the header, with NumPy/torch primitives (argsort, torch.linalg.qr); no code shared with C++.
"""
import json
import math
import os
import sys

import numpy as np
import torch

MASK64 = (1 << 64) - 1


def splitmix64(x):
    x = (x + 0x9E3779B97F4A7C15) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def trim(v, frac):
    v = v.copy()
    n = int(math.floor(frac * v.size))
    if n:
        v[np.argsort(np.abs(v), kind="stable")[:n]] = 0
    return v


def main():
    d = sys.argv[1]
    m = json.load(open(os.path.join(d, "meta.json")))
    i = m["run_index"]
    lam = min(max(1 / math.sqrt(i), 0.1), 1.0)
    num = dot = nb1 = nb2 = 0.0
    for k, t in enumerate(m["tensors"]):
        x = np.fromfile(os.path.join(d, f"merged_{k}.f32"), dtype=np.float32).astype(np.float64)
        y = np.fromfile(os.path.join(d, f"fresh_{k}.f32"), dtype=np.float32).astype(np.float64)
        out = {}
        out["slao"] = x + lam * (y - x) if t["is_b"] else y
        out["linear"] = x + (y - x) / i
        t1, t2 = trim(x, m["ties_trim"]), trim(y, m["ties_trim"])
        gamma = np.sign(t1 + t2)
        agree1 = (np.sign(t1) == gamma) & (t1 != 0) & (gamma != 0)
        agree2 = (np.sign(t2) == gamma) & (t2 != 0) & (gamma != 0)
        cnt = agree1.astype(int) + agree2.astype(int)
        s = np.where(agree1, t1, 0) + np.where(agree2, t2, 0)
        out["ties"] = np.where(cnt > 0, s / np.maximum(cnt, 1), 0)
        if t["is_b"]:
            stream = splitmix64(m["seed"] ^ ((k * 0x9E3779B97F4A7C15) & MASK64))
            u = np.array([(splitmix64((stream + e) & MASK64) >> 11) * 2.0**-53 for e in range(x.size)])
            delta = np.where(u < m["dare_drop"], 0.0, (y - x) / (1 - m["dare_drop"]))
            out["dare"] = x + lam * delta
            dot += float(x @ y)
            nb1 += float(x @ x)
            nb2 += float(y @ y)
        else:
            out["dare"] = y
            a = torch.from_numpy(x.reshape(t["shape"]))
            q, r = torch.linalg.qr(a.T)  # a.T = q r; rows of q.T span the row space of a
            q = q * torch.sign(torch.diagonal(r))  # the convention with a positive diagonal
            q.T.contiguous().numpy().astype(np.float32).tofile(os.path.join(d, f"ortho_{k}.out.f32"))
        for mode, v in out.items():
            np.asarray(v, dtype=np.float32).tofile(os.path.join(d, f"{mode}_{k}.out.f32"))
    cos = dot / math.sqrt(nb1 * nb2) if nb1 > 0 and nb2 > 0 else (1.0 if nb1 == nb2 == 0 else 0.0)
    json.dump({"b_cosine": cos, "lambda": lam}, open(os.path.join(d, "result.json"), "w"))


if __name__ == "__main__":
    main()
