#!/usr/bin/python3
"""PyTorch side of the end-to-end training benchmark (bench/bench_train.cpp, scripts/bench_train.sh).

Reuses the oracle model of tests/oracles/torch_llama.py (plain-torch HF Llama / Qwen2 forward with
PEFT-style LoRA, eager attention with an explicit mask, full [T x V] logits + log_softmax loss) in
float32 instead of its float64 default, and times the same LoRA training steps as the C++
benchmark: zero_grad + loss + backward + torch.optim.AdamW step over the LoRA A/B tensors only
(frozen weights get no gradient), r=16, alpha=32, all seven projections, one packed sequence of
--seq tokens with random ids, 1 warm-up step then --steps timed steps (wall time).

With --bf16 the forward runs under torch.autocast("cpu", dtype=torch.bfloat16) (what a PyTorch user
runs on a CPU with bf16 dot products: matmuls in bf16 through oneDNN, weights and AdamW f32).

Also measures torch's own matmul rate on the layer's MLP shape (T x D x F) in the same process (in
bf16 with --bf16).

Usage: torch_train_bench.py --model smollm135m|qwen2.5-0.5b [--layers N] [--seq 512] [--steps 3]
                            [--threads 2] [--bf16]
Prints one JSON line: model, layers, seq, threads, step_s (mean wall), cpu_s_per_step (process CPU, all
threads), faults_per_step (minor page faults), tokens_per_s, matmul_gflops.
"""
import argparse
import contextlib
import json
import math
import os
import resource
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_llama  # noqa: E402

SHAPES = {
    # hidden, intermediate, layers, heads, kv heads, vocab, qkv bias, rope theta, rms eps
    "smollm135m": dict(hidden=576, inter=1536, layers=30, heads=9, kv_heads=3, vocab=49152, bias=False,
                       theta=10000.0, eps=1e-5),
    "qwen2.5-0.5b": dict(hidden=896, inter=4864, layers=24, heads=14, kv_heads=2, vocab=151936, bias=True,
                         theta=1000000.0, eps=1e-6),
}
RANK, ALPHA = 16, 32.0


def build(shape, layers, seed=0):
    """Spec and tensors in torch_llama's layout: HF names, PEFT names for LoRA."""
    g = torch.Generator().manual_seed(seed)
    D, F, V = shape["hidden"], shape["inter"], shape["vocab"]
    H, Hkv = shape["heads"], shape["kv_heads"]
    d = D // H
    cfg = dict(num_layers=layers, num_heads=H, num_kv_heads=Hkv, head_dim=d, rms_norm_eps=shape["eps"],
               rope_theta=shape["theta"], rope_scaling=None, qk_norm=False, tie_word_embeddings=True)
    t = {}

    def normal(*s):
        return torch.randn(*s, generator=g) * 0.02

    t["model.embed_tokens.weight"] = normal(V, D)
    t["model.norm.weight"] = torch.ones(D)
    mods = {"self_attn.q_proj": (H * d, D), "self_attn.k_proj": (Hkv * d, D), "self_attn.v_proj": (Hkv * d, D),
            "self_attn.o_proj": (D, H * d), "mlp.gate_proj": (F, D), "mlp.up_proj": (F, D), "mlp.down_proj": (D, F)}
    lora = []
    for l in range(layers):
        p = "model.layers.%d." % l
        t[p + "input_layernorm.weight"] = torch.ones(D)
        t[p + "post_attention_layernorm.weight"] = torch.ones(D)
        for m, (out, inp) in mods.items():
            t[p + m + ".weight"] = normal(out, inp)
            if shape["bias"] and m in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"):
                t[p + m + ".bias"] = torch.zeros(out)
            bound = 1.0 / math.sqrt(inp)
            a = (torch.rand(RANK, inp, generator=g) * 2 - 1) * bound
            b = torch.zeros(out, RANK)
            t["base_model.model." + p + m + ".lora_A.weight"] = a.requires_grad_(True)
            t["base_model.model." + p + m + ".lora_B.weight"] = b.requires_grad_(True)
            lora += [a, b]
    spec = {"config": cfg, "lora": {"r": RANK, "alpha": ALPHA}}
    return spec, t, lora


def matmul_gflops(M, K, N, min_s=1.0, dtype=torch.float32):
    a, w = torch.randn(M, K).to(dtype), torch.randn(N, K).to(dtype)
    a @ w.T
    calls, t0 = 0, time.perf_counter()
    while True:
        a @ w.T
        calls += 1
        s = time.perf_counter() - t0
        if s >= min_s:
            return 2.0 * M * N * K * calls / s / 1e9


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", choices=sorted(SHAPES), required=True)
    ap.add_argument("--layers", type=int, default=0)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--bf16", action="store_true",
                    help='the step under torch.autocast("cpu", dtype=torch.bfloat16), as a PyTorch user would '
                         "run it on a CPU with bf16 dot products; weights and AdamW stay f32")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch_llama.DT = torch.float32  # the oracle computes in float64 by default; train in float32
    autocast = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if args.bf16 else contextlib.nullcontext
    shape = SHAPES[args.model]
    layers = args.layers or shape["layers"]
    spec, tensors, lora = build(shape, layers)
    model = torch_llama.Llama(spec, tensors)
    gen = torch.Generator().manual_seed(1234)
    ids = torch.randint(0, shape["vocab"], (args.seq,), generator=gen)
    labels = torch.cat((ids[1:], torch.tensor([-100])))
    batch = {"tokens": ids, "positions": torch.arange(args.seq), "labels": labels, "cu_seqlens": [0, args.seq]}
    opt = torch.optim.AdamW(lora, lr=1e-4, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)

    def step():
        opt.zero_grad()
        with autocast():
            loss, _, _ = torch_llama.loss_of(model, batch)
        loss.float().backward()
        opt.step()
        return loss.item()

    step()  # warm-up
    t0, c0 = time.perf_counter(), time.process_time()
    f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    loss = 0.0
    for _ in range(args.steps):
        loss = step()
    step_s = (time.perf_counter() - t0) / args.steps
    cpu_s = (time.process_time() - c0) / args.steps
    faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0) / args.steps
    print(json.dumps({"impl": "torch", "model": args.model, "layers": layers, "seq": args.seq, "threads": args.threads,
                      "steps": args.steps, "step_s": step_s, "cpu_s_per_step": cpu_s, "faults_per_step": faults, "tokens_per_s": args.seq / step_s, "loss": loss,
                      "torch": torch.__version__, "blas": loaded_blas(),
                      "dtype": "bf16 autocast" if args.bf16 else "f32 eager",
                      "matmul_gflops": matmul_gflops(args.seq, shape["hidden"], shape["inter"],
                                                     dtype=torch.bfloat16 if args.bf16 else torch.float32)}))


def loaded_blas():
    """The BLAS library this process mapped (the system's libblas.so.3 choice, or LD_LIBRARY_PATH's)."""
    with open("/proc/self/maps") as f:
        for line in f:
            if "blas" in line:
                return line.split()[-1]
    return ""


if __name__ == "__main__":
    main()
