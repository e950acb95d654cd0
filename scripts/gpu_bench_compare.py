#!/usr/bin/python3
"""The other side of the GPU training benchmark (issue 18): Hugging Face transformers + PEFT and
PyTorch eager doing the LoRA steps that bench/bench_cuda.cpp did, on the same GPU in the same run,
and the comparison table scripts/gpu_check.sh prints.

Reads backprop's results (bench_cuda --json FILE: one JSON object per model, with the model's
config.json, sequence length and bf16 GEMM rate) and for each model trains, with random weights:
  transformers+PEFT  AutoModelForCausalLM.from_config (bf16), PEFT LoRA r/alpha of backprop's run on
                     q,k,v,o,gate,up,down, dropout 0, AdamW over the LoRA weights, labels = inputs
                     (the model's own shifted cross-entropy), SDPA attention (the library default);
  torch eager        tests/oracles/torch_llama.py (plain torch, explicit attention mask, full
                     logits + log_softmax) in bf16 with the same LoRA, AdamW over the LoRA weights.
Each: 1 warm-up step, --steps timed steps of one sequence of the run's length, wall time with the
device synchronised. A row whose libraries are missing says exactly what is missing and is skipped
(no package index is reachable where this project is developed; the GPU machine may lack them).

Prints, per model: tokens/s, step time and MFU (backprop's model-FLOP count over backprop's
measured bf16 GEMM rate, so the rows share one yardstick) of each row, then the ratio
backprop / transformers+PEFT and backprop's MFU beside the issue's targets (2x, 40%).

--device cpu runs the same rows on the CPU in float32 (the CI check of this script on a tiny model).
Usage: gpu_bench_compare.py --backprop-json FILE [--device cuda|cpu] [--shapes a,b] [--seq N]
                            [--steps 5] [--hf-gradient-checkpointing]
"""
import argparse
import contextlib
import importlib.util
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ORACLES = os.path.join(HERE, "..", "tests", "oracles")
TARGET_RATIO, TARGET_MFU = 2.0, 0.40
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def missing_for(row, device):
    """What this python lacks for a row: a list of human-readable items (empty = can run)."""
    missing = []
    if importlib.util.find_spec("torch") is None:
        return ["torch (python module)"] + (["transformers", "peft"] if row == "hf" else [])
    import torch
    if device == "cuda" and not torch.cuda.is_available():
        missing.append("torch with CUDA (torch %s: torch.cuda.is_available() is False)" % torch.__version__)
    if device == "cuda" and row == "eager" and not hasattr(torch, "set_default_device"):
        missing.append("torch >= 2.0 for the eager row on CUDA (torch.set_default_device; have %s)" % torch.__version__)
    if row == "hf":
        missing += [m for m in ("transformers", "peft") if importlib.util.find_spec(m) is None]
    return missing


def time_steps(step, steps, sync):
    step()  # warm-up
    sync()
    t0 = time.perf_counter()
    loss = 0.0
    for _ in range(steps):
        loss = step()
    sync()
    return (time.perf_counter() - t0) / steps, loss


def version_tuple(text):
    """'5.17.0' -> (5, 17); '4.57.0.dev0' -> (4, 57)."""
    parts = []
    for p in text.split(".")[:2]:
        digits = "".join(c for c in p if c.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def hf_config_kwargs(cfg, seq, version):
    """AutoConfig.for_model keywords for backprop's model config, for this transformers version.
    transformers 5 keeps every RoPE setting in rope_parameters (config.rope_theta is gone; a legacy
    rope_theta keyword is folded in with setdefault, which a class default could shadow), 4.x takes
    rope_theta. use_cache off: a training step has no use for the KV cache 5.x would otherwise build."""
    kw = dict(vocab_size=cfg["vocab_size"], hidden_size=cfg["hidden_size"],
              intermediate_size=cfg["intermediate_size"], num_hidden_layers=cfg["num_hidden_layers"],
              num_attention_heads=cfg["num_attention_heads"], num_key_value_heads=cfg["num_key_value_heads"],
              max_position_embeddings=max(int(cfg["max_position_embeddings"]), seq),
              rms_norm_eps=float(cfg["rms_norm_eps"]), tie_word_embeddings=bool(cfg["tie_word_embeddings"]),
              use_cache=False)
    if version >= (5, 0):
        kw["rope_parameters"] = {"rope_type": "default", "rope_theta": float(cfg["rope_theta"])}
    else:
        kw["rope_theta"] = float(cfg["rope_theta"])
    return kw


def hf_rope_theta(conf):
    params = getattr(conf, "rope_parameters", None)
    if isinstance(params, dict) and "rope_theta" in params:
        return float(params["rope_theta"])
    return float(getattr(conf, "rope_theta", float("nan")))


def hf_dtype_kwargs(dtype, version):
    """from_config's dtype keyword: `dtype` since transformers 4.56 (where `torch_dtype` became a
    deprecated alias), `torch_dtype` before."""
    return {"dtype": dtype} if version >= (4, 56) else {"torch_dtype": dtype}


def hf_peft_row(cfg, seq, steps, rank, alpha, device, ckpt):
    import torch
    import transformers
    import peft
    version = version_tuple(transformers.__version__)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    conf = transformers.AutoConfig.for_model(cfg["model_type"], **hf_config_kwargs(cfg, seq, version))
    if hf_rope_theta(conf) != float(cfg["rope_theta"]):
        raise ValueError("transformers %s made rope_theta %s of %s" % (
            transformers.__version__, hf_rope_theta(conf), cfg["rope_theta"]))
    torch.manual_seed(0)
    # Built on the device itself where torch can (>= 2.0: torch.device is a context manager): a random
    # init of 1.5B weights on the host costs the GPU machine's time.
    on_device = torch.device(device) if hasattr(torch, "set_default_device") else contextlib.nullcontext()
    with on_device:
        model = transformers.AutoModelForCausalLM.from_config(conf, **hf_dtype_kwargs(dtype, version))
    model = model.to(device)
    if ckpt:
        model.gradient_checkpointing_enable()
        model.enable_input_require_grads()
    lcfg = peft.LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=0.0, target_modules=LORA_TARGETS,
                           task_type="CAUSAL_LM")
    model = peft.get_peft_model(model, lcfg)
    model.train()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4, weight_decay=0.0)
    ids = torch.randint(0, cfg["vocab_size"], (1, seq), device=device)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        return loss.item()

    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    attention = getattr(model.config, "_attn_implementation", None) or "default"
    return time_steps(step, steps, sync) + ("transformers %s (%s attention), peft %s, torch %s" % (
        transformers.__version__, attention, peft.__version__, torch.__version__),)


def eager_row(cfg, seq, steps, rank, alpha, device):
    import torch
    sys.path.insert(0, ORACLES)
    import torch_llama
    import torch_train_bench
    torch_train_bench.RANK, torch_train_bench.ALPHA = rank, alpha
    shape = dict(hidden=cfg["hidden_size"], inter=cfg["intermediate_size"], layers=cfg["num_hidden_layers"],
                 heads=cfg["num_attention_heads"], kv_heads=cfg["num_key_value_heads"], vocab=cfg["vocab_size"],
                 bias=cfg["model_type"] == "qwen2", theta=cfg["rope_theta"], eps=cfg["rms_norm_eps"])
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    torch_llama.DT = dtype
    spec, tensors, _ = torch_train_bench.build(shape, shape["layers"])  # on the host, seeded
    spec["lora"] = {"r": rank, "alpha": alpha}
    lora = []
    for name, t in list(tensors.items()):
        trainable = t.requires_grad
        tensors[name] = t.detach().to(device=device, dtype=dtype).requires_grad_(trainable)
        if trainable:
            lora.append(tensors[name])
    if device == "cuda":
        torch.set_default_device("cuda")  # the oracle's own aranges and masks
    try:
        model = torch_llama.Llama(spec, tensors)
        ids = torch.randint(0, shape["vocab"], (seq,), device=device)
        labels = torch.cat((ids[1:], torch.tensor([-100], device=device)))
        batch = {"tokens": ids, "positions": torch.arange(seq, device=device), "labels": labels,
                 "cu_seqlens": [0, seq]}
        opt = torch.optim.AdamW(lora, lr=1e-4, weight_decay=0.0)

        def step():
            opt.zero_grad(set_to_none=True)
            loss, _, _ = torch_llama.loss_of(model, batch)
            loss.backward()
            opt.step()
            return loss.item()

        sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
        return time_steps(step, steps, sync) + ("torch %s" % torch.__version__,)
    finally:
        if device == "cuda":
            torch.set_default_device("cpu")


def fmt_row(model, impl, tok_s, step_s, mfu, note=""):
    return "%-14s %-20s %10.1f %9.4f %7.1f%%  %s" % (model, impl, tok_s, step_s, 100 * mfu, note)


def compare(bp, args):
    model, seq = bp["model"], args.seq or bp["seq"]
    cfg, rank = bp["config"], bp["rank"]
    alpha = float(bp.get("alpha", 2 * rank))
    flops, gemm = bp["model_flops_per_step"], bp["gemm_flops_per_s"]
    if bp.get("mode") == "full":  # BP_BENCH_MODE=full: no scripted full fine-tuning on the python side yet
        print(fmt_row(model, "backprop", bp["tokens_per_s"], bp["step_s"], bp["mfu"],
                      "%s, full fine-tuning, %s GEMMs, checkpointing %s" % (
                          bp["device"], bp.get("matmul_dtype", "f32"),
                          "on" if bp["gradient_checkpointing"] else "off")))
        print("  %s: full fine-tuning: no transformers or torch row to compare with (only LoRA is scripted); "
              "backprop MFU %.1f%%" % (model, 100 * bp["mfu"]))
        return
    print(fmt_row(model, "backprop", bp["tokens_per_s"], bp["step_s"], bp["mfu"],
                  "%s, frozen %s, checkpointing %s" % (bp["device"], bp["base_dtype"],
                                                       "on" if bp["gradient_checkpointing"] else "off")))
    rates = {}
    rows = [("transformers+PEFT", "hf",
             lambda: hf_peft_row(cfg, seq, args.steps, rank, alpha, args.device, args.hf_gradient_checkpointing)),
            ("torch eager", "eager", lambda: eager_row(cfg, seq, args.steps, rank, alpha, args.device))]
    for label, key, run in rows:
        missing = missing_for(key, args.device)
        if missing:
            print("%-14s %-20s skipped: this python (%s) lacks %s" % (model, label, sys.executable, ", ".join(missing)))
            continue
        try:
            step_s, loss, versions = run()
        except Exception as e:  # a failing row must not hide the others
            print("%-14s %-20s failed: %s: %s" % (model, label, type(e).__name__, e))
            continue
        rates[key] = seq / step_s
        print(fmt_row(model, label, seq / step_s, step_s, flops / step_s / gemm if gemm else 0.0,
                      "loss %.3f; %s" % (loss, versions)))
    if seq != bp["seq"]:
        print("  note: --seq %d differs from backprop's run (%d): the ratio compares different work" % (seq, bp["seq"]))
    ratio = ("%.2fx" % (bp["tokens_per_s"] / rates["hf"])) if "hf" in rates else "n/a (no transformers+PEFT row)"
    eager = (", / torch eager %.2fx" % (bp["tokens_per_s"] / rates["eager"])) if "eager" in rates else ""
    print("  %s: backprop / transformers+PEFT %s (target %.2fx)%s; backprop MFU %.1f%% (target %d%%)" % (
        model, ratio, TARGET_RATIO, eager, 100 * bp["mfu"], round(100 * TARGET_MFU)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--backprop-json", required=True, help="bench_cuda --json output (one JSON object a line)")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--shapes", default="", help="comma-separated model names to compare (default: all)")
    ap.add_argument("--seq", type=int, default=0, help="sequence length (default: backprop's)")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--hf-gradient-checkpointing", action="store_true")
    args = ap.parse_args()
    with open(args.backprop_json) as f:
        results = [json.loads(line) for line in f if line.strip()]
    wanted = [s for s in args.shapes.split(",") if s]
    print("%-14s %-20s %10s %9s %8s  %s" % ("model", "implementation", "tok/s", "step s", "MFU", "notes"))
    for bp in results:
        if not wanted or bp["model"] in wanted:
            compare(bp, args)
    print("MFU: backprop's model FLOPs per step / step time / the bf16 GEMM rate backprop measured on the "
          "model's shapes in the same run (cuBLASLt on a card); the same yardstick for every row.")


if __name__ == "__main__":
    main()
