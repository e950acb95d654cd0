#!/usr/bin/python3
"""Independent PyTorch oracle for the attention, cross-entropy and AdamW ops.

Usage: /usr/bin/python3 torch_ops.py {attention|cross_entropy|adamw} DIR

DIR holds meta.json (shapes, hyper-parameters) and raw little-endian arrays: <name>.f32 / <name>.i32.
Results are written as <name>.out.f32 plus result.json for scalars. Everything is computed with
plain torch ops and autograd (no code shared with the C++ implementation):
  attention      packed causal GQA attention with a [T, T] per-sample mask; out, dq, dk, dv (f64)
  cross_entropy  F.cross_entropy(x @ W.T, ignore_index=-100, reduction='sum'); loss, dx, dW (f64)
  adamw          one torch.optim.AdamW step in f32 (PyTorch's own kernel order)
"""
import json
import math
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F


def load(d, name, dtype, shape):
    ext = "f32" if dtype == np.float32 else "i32"
    a = np.fromfile(os.path.join(d, f"{name}.{ext}"), dtype=dtype)
    return torch.from_numpy(a.reshape(shape).copy())


def save(d, name, t):
    t.detach().to(torch.float32).contiguous().numpy().tofile(os.path.join(d, f"{name}.out.f32"))


def attention(d, m):
    T, hq, hkv, hd = m["tokens"], m["n_heads"], m["n_kv_heads"], m["head_dim"]
    cu = load(d, "cu_seqlens", np.int32, [-1]).tolist()
    q = load(d, "q", np.float32, [T, hq, hd]).double().requires_grad_()
    k = load(d, "k", np.float32, [T, hkv, hd]).double().requires_grad_()
    v = load(d, "v", np.float32, [T, hkv, hd]).double().requires_grad_()
    dout = load(d, "dout", np.float32, [T, hq, hd]).double()
    # Block-diagonal causal mask over the whole packed run: same sample and key <= query.
    sample = torch.zeros(T, dtype=torch.long)
    for s in range(len(cu) - 1):
        sample[cu[s]:cu[s + 1]] = s
    pos = torch.arange(T)
    allowed = (sample[:, None] == sample[None, :]) & (pos[None, :] <= pos[:, None])
    group = hq // hkv
    kk = k.repeat_interleave(group, dim=1)  # query head h reads kv head h // group
    vv = v.repeat_interleave(group, dim=1)
    scores = torch.einsum("thd,shd->hts", q, kk) / math.sqrt(hd)
    scores = scores.masked_fill(~allowed[None], float("-inf"))
    p = torch.softmax(scores, dim=-1)
    out = torch.einsum("hts,shd->thd", p, vv)
    lse = torch.logsumexp(scores, dim=-1)  # [hq, T]
    (out * dout).sum().backward()
    save(d, "out", out)
    save(d, "lse", lse)
    save(d, "dq", q.grad)
    save(d, "dk", k.grad)
    save(d, "dv", v.grad)
    return {}


def cross_entropy(d, m):
    T, D, V = m["tokens"], m["dim"], m["vocab"]
    x = load(d, "x", np.float32, [T, D]).double().requires_grad_()
    W = load(d, "W", np.float32, [V, D]).double().requires_grad_()
    labels = load(d, "labels", np.int32, [T]).long()
    logits = x @ W.T
    loss = F.cross_entropy(logits, labels, ignore_index=-100, reduction="sum")
    (loss * m["grad_scale"]).backward()
    save(d, "dx", x.grad)
    save(d, "dW", W.grad)
    return {"loss_sum": loss.item(), "n_counted": int((labels != -100).sum().item())}


def adamw(d, m):
    n = m["numel"]
    p = torch.nn.Parameter(load(d, "param", np.float32, [n]))
    g = load(d, "grad", np.float32, [n])
    opt = torch.optim.AdamW([p], lr=m["lr"], betas=(m["beta1"], m["beta2"]), eps=m["eps"],
                            weight_decay=m["weight_decay"])
    for _ in range(m["steps"]):  # the same gradient every step: a short trajectory
        p.grad = g.clone()
        opt.step()
    st = opt.state[p]
    save(d, "param", p)
    save(d, "m", st["exp_avg"])
    save(d, "v", st["exp_avg_sq"])
    return {}


def main():
    if len(sys.argv) != 3 or sys.argv[1] not in ("attention", "cross_entropy", "adamw"):
        sys.exit("usage: torch_ops.py {attention|cross_entropy|adamw} DIR")
    op, d = sys.argv[1], sys.argv[2]
    with open(os.path.join(d, "meta.json")) as f:
        m = json.load(f)
    torch.set_num_threads(1)
    result = globals()[op](d, m)
    result["torch_version"] = torch.__version__
    with open(os.path.join(d, "result.json"), "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
