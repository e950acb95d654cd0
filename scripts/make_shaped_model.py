#!/usr/bin/env python3
"""Writes a Hugging Face model folder with the shape of a real model and random bf16 weights
(no download): config.json, model.safetensors and the tokenizer files of models/tiny-chat (its
512 ids are a subset of any vocabulary, so the data tokenizes; the embedding keeps the real
model's full vocabulary size). Used by scripts/measure_qlora_memory.sh to measure a
Qwen2.5-0.5B-shaped run without its weights.

  /usr/bin/python3 scripts/make_shaped_model.py --shape qwen2.5-0.5b --layers 8 --out DIR

Needs torch (Debian's python3-torch) for bf16; the safetensors layout is written by hand.
"""
import argparse
import json
import os
import shutil
import struct

import torch

SHAPES = {
    # name: (architecture, model_type, hidden, intermediate, layers, heads, kv_heads, vocab, bias, theta, eps)
    "qwen2.5-0.5b": ("Qwen2ForCausalLM", "qwen2", 896, 4864, 24, 14, 2, 151936, True, 1000000.0, 1e-6),
    "smollm-135m": ("LlamaForCausalLM", "llama", 576, 1536, 30, 9, 3, 49152, False, 10000.0, 1e-5),
}


def tensors(shape, layers, gen):
    arch, mtype, d, f, _, h, kv, v, bias, theta, eps = shape
    hd = d // h

    def w(*dims):
        return (torch.randn(*dims, generator=gen) * 0.02).to(torch.bfloat16)

    out = {"model.embed_tokens.weight": w(v, d), "model.norm.weight": torch.ones(d, dtype=torch.bfloat16)}
    for i in range(layers):
        p = f"model.layers.{i}."
        out[p + "input_layernorm.weight"] = torch.ones(d, dtype=torch.bfloat16)
        out[p + "post_attention_layernorm.weight"] = torch.ones(d, dtype=torch.bfloat16)
        out[p + "self_attn.q_proj.weight"] = w(h * hd, d)
        out[p + "self_attn.k_proj.weight"] = w(kv * hd, d)
        out[p + "self_attn.v_proj.weight"] = w(kv * hd, d)
        out[p + "self_attn.o_proj.weight"] = w(d, h * hd)
        if bias:
            out[p + "self_attn.q_proj.bias"] = w(h * hd)
            out[p + "self_attn.k_proj.bias"] = w(kv * hd)
            out[p + "self_attn.v_proj.bias"] = w(kv * hd)
        out[p + "mlp.gate_proj.weight"] = w(f, d)
        out[p + "mlp.up_proj.weight"] = w(f, d)
        out[p + "mlp.down_proj.weight"] = w(d, f)
    return out


def write_safetensors(path, named):
    header, offset, blobs = {}, 0, []
    for name, t in named.items():
        data = t.contiguous().view(torch.int16).numpy().tobytes()
        header[name] = {"dtype": "BF16", "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(raw)))
        fh.write(raw)
        for b in blobs:
            fh.write(b)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", choices=sorted(SHAPES), default="qwen2.5-0.5b")
    ap.add_argument("--layers", type=int, default=0, help="0 = the real model's layer count")
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    shape = SHAPES[a.shape]
    arch, mtype, d, f, real_layers, h, kv, v, bias, theta, eps = shape
    layers = a.layers or real_layers
    os.makedirs(a.out, exist_ok=True)
    here = os.path.dirname(os.path.abspath(__file__))
    tiny = os.path.join(here, "..", "models", "tiny-chat")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(tiny, name), os.path.join(a.out, name))
    cfg = {
        "architectures": [arch], "model_type": mtype, "hidden_size": d, "intermediate_size": f,
        "num_hidden_layers": layers, "num_attention_heads": h, "num_key_value_heads": kv, "head_dim": d // h,
        "vocab_size": v, "max_position_embeddings": 32768, "rms_norm_eps": eps, "rope_theta": theta,
        "tie_word_embeddings": True, "attention_bias": bias, "hidden_act": "silu", "torch_dtype": "bfloat16",
        "bos_token_id": 1, "eos_token_id": 2,
    }
    with open(os.path.join(a.out, "config.json"), "w") as fh:
        json.dump(cfg, fh, indent=2)
    gen = torch.Generator().manual_seed(a.seed)
    write_safetensors(os.path.join(a.out, "model.safetensors"), tensors(shape, layers, gen))
    print(f"{a.out}: {a.shape} shape, {layers} layers, vocab {v}, random bf16 weights")


if __name__ == "__main__":
    main()
