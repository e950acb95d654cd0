#!/usr/bin/python3
"""Independent PyTorch oracle for PiSSA's initialisation (tests/model/pissa_test.cpp).

Written from PEFT's pissa_init (tuners/lora/layer.py): for a base weight W [out, in] and a LoRA of
rank r and scale s, torch.linalg.svd(W) = U S Vh, A = diag(sqrt(S_r / s)) Vh_r, B = U_r diag(sqrt(S_r / s)),
and the base becomes W - s B A. Singular vectors are only defined up to sign, so the oracle reports
the sign-free products: B A [out, in] and the residual [out, in], in float64.

Usage: pissa_svd.py DIR
  DIR/spec.json    {"r": r, "scale": s, "tensors": [{"name", "shape", "offset"}, ...]}
  DIR/tensors.bin  little-endian float32 values of each W, back to back
  DIR/result.json  {"arrays": [{"name", "shape", "offset"}]} with "ba:NAME" and "residual:NAME"
  DIR/result.bin   float64 values of those arrays
"""
import json
import os
import struct
import sys

import torch


def main():
    d = sys.argv[1]
    spec = json.load(open(os.path.join(d, "spec.json")))
    raw = open(os.path.join(d, "tensors.bin"), "rb").read()
    r, s = spec["r"], spec["scale"]
    out, table, off = [], [], 0
    for t in spec["tensors"]:
        rows, cols = t["shape"]
        vals = struct.unpack_from("<%df" % (rows * cols), raw, t["offset"] * 4)
        W = torch.tensor(vals, dtype=torch.float64).reshape(rows, cols)
        V, S, Uh = torch.linalg.svd(W, full_matrices=False)
        Sr = S[:r] / s
        A = torch.diag(torch.sqrt(Sr)) @ Uh[:r]
        B = V[:, :r] @ torch.diag(torch.sqrt(Sr))
        for name, a in (("ba:" + t["name"], B @ A), ("residual:" + t["name"], W - s * (B @ A))):
            flat = a.reshape(-1).tolist()
            out.append(struct.pack("<%dd" % len(flat), *flat))
            table.append({"name": name, "shape": list(a.shape), "offset": off})
            off += len(flat)
    open(os.path.join(d, "result.bin"), "wb").write(b"".join(out))
    json.dump({"arrays": table}, open(os.path.join(d, "result.json"), "w"))


if __name__ == "__main__":
    main()
