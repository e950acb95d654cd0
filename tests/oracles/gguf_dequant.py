#!/usr/bin/python3
"""Independent GGUF tensor decoder: every tensor of a GGUF file as float32.

Usage: /usr/bin/python3 gguf_dequant.py FILE.gguf OUT_DIR

The layout (tensor names, ne, ggml types, offsets, data start) comes from @huggingface/gguf
(tests/oracles/gguf_read.mjs, run with node); the bytes are decoded here with NumPy from ggml's
block layouts (ggml-common.h / ggml-quants.c, written from the format description, no code shared
with backprop):
  f32, f16, bf16 (the high half of an f32)
  q8_0  32 values: f16 d, int8 q[32]                         x = d*q
  q4_0  32 values: f16 d, u8 qs[16]                          x = d*(nibble - 8), low nibbles first
  q4_K  256 values: f16 d, f16 dmin, u8 scales[12], u8 qs[128]; 8 sub-blocks of 32 with 6-bit
        scale/min pairs: x = d*sc*nibble - dmin*m
  q5_K  256 values: f16 d, f16 dmin, u8 scales[12], u8 qh[32], u8 qs[128]; as q4_K plus a 5th bit
  q6_K  256 values: u8 ql[128], u8 qh[64], int8 scales[16], f16 d; x = d*sc*(6-bit q - 32)
Writes OUT_DIR/<tensor name>.f32 (row-major values) and OUT_DIR/index.json (name -> type).
"""
import json
import os
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
F32, F16, Q4_0, Q8_0, Q4_K, Q5_K, Q6_K, BF16 = 0, 1, 2, 8, 12, 13, 14, 30
BLOCK = {Q4_0: (32, 18), Q8_0: (32, 34), Q4_K: (256, 144), Q5_K: (256, 176), Q6_K: (256, 210)}


def f16(b):
    return b.copy().view(np.float16).astype(np.float32)


def scale_min_k4(j, q):
    if j < 4:
        return q[j] & 63, q[j + 4] & 63
    return (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4)


def q4_0(b):
    d = f16(b[0:2])[0]
    qs = b[2:18].astype(np.int32)
    return np.concatenate([(qs & 0xF) - 8, (qs >> 4) - 8]).astype(np.float32) * d


def q8_0(b):
    return f16(b[0:2])[0] * b[2:34].copy().view(np.int8).astype(np.float32)


def k_quant_45(b, five):
    d, dmin = f16(b[0:2])[0], f16(b[2:4])[0]
    sc = b[4:16].astype(np.int32)
    qh = b[16:48].astype(np.int32) if five else None
    qs = (b[48:176] if five else b[16:144]).astype(np.int32)
    out = []
    for c in range(4):  # 64 values per chunk: low nibbles of 32 bytes, then high nibbles
        q = qs[32 * c:32 * c + 32]
        for half, nib in ((0, q & 0xF), (1, q >> 4)):
            s, m = scale_min_k4(2 * c + half, sc)
            if five:
                nib = nib + np.where(qh & (1 << (2 * c + half)), 16, 0)
            out.append(np.float32(d * np.float32(s)) * nib.astype(np.float32) - np.float32(dmin * np.float32(m)))
    return np.concatenate(out)


def q6_k(b):
    ql, qh = b[0:128].astype(np.int32), b[128:192].astype(np.int32)
    sc = b[192:208].copy().view(np.int8).astype(np.float32)
    d = f16(b[208:210])[0]
    y = np.zeros(256, np.float32)
    for n in range(2):
        L, H, S = ql[64 * n:64 * n + 64], qh[32 * n:32 * n + 32], sc[8 * n:8 * n + 8]
        for l in range(32):
            i = l // 16
            q = [((L[l] & 0xF) | (((H[l] >> 0) & 3) << 4)) - 32, ((L[l + 32] & 0xF) | (((H[l] >> 2) & 3) << 4)) - 32,
                 ((L[l] >> 4) | (((H[l] >> 4) & 3) << 4)) - 32, ((L[l + 32] >> 4) | (((H[l] >> 6) & 3) << 4)) - 32]
            for k in range(4):
                y[128 * n + l + 32 * k] = np.float32(d * S[i + 2 * k]) * np.float32(q[k])
    return y


DECODE = {Q4_0: q4_0, Q8_0: q8_0, Q4_K: lambda b: k_quant_45(b, False), Q5_K: lambda b: k_quant_45(b, True),
          Q6_K: q6_k}


def read_layout(path):
    """The @huggingface/gguf view of the file (gguf_read.mjs)."""
    return json.loads(subprocess.run(["node", os.path.join(HERE, "gguf_read.mjs"), path], check=True,
                                     capture_output=True, text=True).stdout)


def decode_tensor(info, raw, t):
    """Tensor `t` of the layout as float32 values, or None for a type not decoded here."""
    n = int(np.prod(t["shape"]))
    start = info["tensor_data_offset"] + t["offset"]
    ty = t["dtype"]
    if ty == F32:
        return raw[start:start + 4 * n].copy().view(np.float32)
    if ty == F16:
        return f16(raw[start:start + 2 * n])
    if ty == BF16:
        return (raw[start:start + 2 * n].copy().view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    if ty in DECODE:
        per, nbytes = BLOCK[ty]
        blocks = raw[start:start + nbytes * (n // per)].reshape(-1, nbytes)
        return np.concatenate([DECODE[ty](b) for b in blocks])
    return None


def main():
    path, out_dir = sys.argv[1:3]
    info = read_layout(path)
    raw = np.fromfile(path, dtype=np.uint8)
    os.makedirs(out_dir, exist_ok=True)
    index = {}
    for t in info["tensors"]:
        v = decode_tensor(info, raw, t)
        if v is None:
            continue  # a type this oracle does not decode: left out of the index
        v.astype(np.float32).tofile(os.path.join(out_dir, t["name"] + ".f32"))
        index[t["name"]] = t["dtype"]
    with open(os.path.join(out_dir, "index.json"), "w") as f:
        json.dump(index, f)


if __name__ == "__main__":
    main()
