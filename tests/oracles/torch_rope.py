"""Independent RoPE oracle for tests/ops/rope_test.cpp, written against PyTorch the way Hugging
Face transformers computes it (LlamaRotaryEmbedding, _compute_default_rope_parameters,
_compute_llama3_parameters, rotate_half, apply_rotary_pos_emb), all in float32.

usage: /usr/bin/python3 torch_rope.py IN.json OUT.json
IN is a list of cases (one interpreter start for all: importing torch takes seconds), each
IN:  {"head_dim", "n_heads", "theta", "llama3": null | {"factor", "low_freq_factor",
      "high_freq_factor", "original_max_position_embeddings"}, "positions": [T], "x": [T*H*D], "dy": [...]}
OUT is the list of results, each
OUT: {"inv_freq": [D/2], "y": [T*H*D], "dx": [T*H*D]}   dx = d(sum(dy * y))/dx by autograd.
"""
import json
import math
import sys

try:
    import torch
except ImportError as e:  # the C++ test turns this exit code and message into a failure
    sys.stderr.write(f"torch_rope.py: PyTorch is not importable with {sys.executable}: {e}\n")
    sys.exit(3)


def default_inv_freq(base, dim):
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))


def llama3_inv_freq(inv_freq, factor, low_freq_factor, high_freq_factor, old_context_len):
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    inv_freq_llama = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth_factor = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed_inv_freq = (1 - smooth_factor) * inv_freq_llama / factor + smooth_factor * inv_freq_llama
    is_medium_freq = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium_freq, smoothed_inv_freq, inv_freq_llama)


def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def run_case(cfg):
    D, H = cfg["head_dim"], cfg["n_heads"]
    inv_freq = default_inv_freq(cfg["theta"], D)
    if cfg.get("llama3"):
        s = cfg["llama3"]
        inv_freq = llama3_inv_freq(inv_freq, s["factor"], s["low_freq_factor"], s["high_freq_factor"],
                                   s["original_max_position_embeddings"])
    positions = torch.tensor(cfg["positions"], dtype=torch.int64)[None, :]  # [1, T]
    T = positions.shape[1]
    # LlamaRotaryEmbedding.forward
    inv_freq_expanded = inv_freq[None, :, None].float().expand(positions.shape[0], -1, 1)
    position_ids_expanded = positions[:, None, :].float()
    freqs = (inv_freq_expanded.float() @ position_ids_expanded.float()).transpose(1, 2)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos(), emb.sin()  # [1, T, D]
    # apply_rotary_pos_emb on q laid out [batch, heads, seq, head_dim]
    x = torch.tensor(cfg["x"], dtype=torch.float32).view(1, T, H, D).transpose(1, 2).contiguous()
    x.requires_grad_(True)
    cos_u, sin_u = cos.unsqueeze(1), sin.unsqueeze(1)
    y = (x * cos_u) + (rotate_half(x) * sin_u)
    dy = torch.tensor(cfg["dy"], dtype=torch.float32).view(1, T, H, D).transpose(1, 2)
    (y * dy).sum().backward()
    return {
        "inv_freq": inv_freq.tolist(),
        "y": y.detach().transpose(1, 2).reshape(-1).tolist(),
        "dx": x.grad.transpose(1, 2).reshape(-1).tolist(),
    }


def main():
    with open(sys.argv[1]) as f:
        cases = json.load(f)
    with open(sys.argv[2], "w") as f:
        json.dump([run_case(c) for c in cases], f)


if __name__ == "__main__":
    main()
