#!/usr/bin/python3
"""PyTorch side of the preference benchmark (bench/bench_preference.cpp): a DPO step as TRL's
DPOTrainer takes it with a PEFT LoRA model, against an SFT step on the same tokens.

The model is tests/oracles/torch_train_bench.py's (the oracle Llama of torch_llama.py in float32,
random weights, LoRA r 16 on all seven projections); the micro-batch is bench_preference's: two
sequences of a --prompt-token prompt and a --completion-token completion (random ids, the
completion labelled), packed with a block-diagonal causal mask.
  sft  the two sequences as SFT samples: token-mean NLL, backward.
  dpo  TRL's recipe: the reference log-probabilities under torch.no_grad() with the adapter
       switched off (PEFT's disable_adapter(); no second model), then one forward of chosen and
       rejected together (TRL's concatenated_forward), the sigmoid loss with beta 0.1, backward.
Eager float32 and, with --bf16, under torch.autocast("cpu", dtype=torch.bfloat16). AdamW is left out
on both sides, as in bench_preference. 1 warm-up, then --steps rounds of one SFT and one DPO step;
dpo_over_sft is the median of the rounds' ratios.

Usage: torch_dpo_bench.py --model smollm135m|qwen2.5-0.5b [--layers N] [--prompt 64]
                          [--completion 192] [--steps 5] [--threads 2] [--bf16]
Prints one JSON line: model, layers, threads, dtype, sft_s, dpo_s, dpo_over_sft.
"""
import argparse
import contextlib
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_llama  # noqa: E402
import torch_train_bench  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", choices=sorted(torch_train_bench.SHAPES), required=True)
    ap.add_argument("--layers", type=int, default=0)
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--completion", type=int, default=192)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--bf16", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch_llama.DT = torch.float32
    shape = torch_train_bench.SHAPES[args.model]
    layers = args.layers or shape["layers"]
    spec, tensors, lora = torch_train_bench.build(shape, layers)
    model = torch_llama.Llama(spec, tensors)
    # B = 0 would make policy and reference equal; give B values so the loss has a gradient.
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for t in lora[1::2]:
            t.copy_(torch.randn(t.shape, generator=g) * 0.01)

    gen = torch.Generator().manual_seed(1234)
    P, C = args.prompt, args.completion
    prompt = torch.randint(0, shape["vocab"], (P,), generator=gen)
    ids, labels = [], []
    for _ in range(2):  # chosen, rejected
        comp = torch.randint(0, shape["vocab"], (C,), generator=gen)
        seq = torch.cat((prompt, comp))
        lab = torch.full((P + C,), -100, dtype=torch.long)
        lab[P - 1:P + C - 1] = comp  # position t predicts token t + 1: the completion's tokens
        ids.append(seq)
        labels.append(lab)
    T = 2 * (P + C)
    batch = {"tokens": torch.cat(ids), "positions": torch.cat([torch.arange(P + C)] * 2),
             "labels": torch.cat(labels), "cu_seqlens": [0, P + C, T]}
    beta = 0.1
    autocast = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if args.bf16 else contextlib.nullcontext

    def zero():
        for t in lora:
            t.grad = None

    def sft():
        zero()
        with autocast():
            loss, _, _ = torch_llama.loss_of(model, batch)
        loss.float().backward()

    def dpo():
        zero()
        with torch.no_grad(), autocast():
            saved, model.lora = model.lora, None  # PEFT's disable_adapter()
            try:
                ref, _, _ = torch_llama.sequence_logps(model, batch)
            finally:
                model.lora = saved
        with autocast():
            pol, _, _ = torch_llama.sequence_logps(model, batch)
            h = (pol[0] - ref[0]) - (pol[1] - ref[1])
            loss = -torch.nn.functional.logsigmoid(beta * h.float())
        loss.backward()

    # Interleaved rounds (one SFT step, then one DPO step), as bench_preference does: a shared
    # machine's speed drifts by a quarter over minutes, so the ratio is the median of each round's.
    sft(), dpo()  # warm-up
    ts, td = [], []
    for _ in range(args.steps):
        for fn, out in ((sft, ts), (dpo, td)):
            t0 = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t0)
    sft_s, dpo_s = statistics.median(ts), statistics.median(td)
    ratio = statistics.median(d / s for s, d in zip(ts, td))
    print(json.dumps({"impl": "torch", "model": args.model, "layers": layers, "threads": args.threads,
                      "dtype": "bf16 autocast" if args.bf16 else "f32 eager", "prompt": P, "completion": C,
                      "sft_s": sft_s, "dpo_s": dpo_s, "dpo_over_sft": ratio, "torch": torch.__version__}))


if __name__ == "__main__":
    main()
