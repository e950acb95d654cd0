#!/usr/bin/python3
"""Independent PyTorch oracle for the transformer (tests/model/parity_test.cpp).

A plain-torch re-implementation of the Hugging Face Llama / Mistral / Qwen2 / Qwen3 / Phi-3 /
SmolLM3 forward pass (modeling_llama.py conventions: RMSNorm, rotate_half RoPE with optional llama3
or linear scaling, grouped KV heads, SwiGLU MLP, q/k/v bias, per-head q/k norm, tied or untied LM
head; modeling_phi3.py: fused qkv_proj / gate_up_proj as HF stores them, partial rotary, LongRoPE
with its per-forward short/long choice and attention factor; modeling_smollm3.py: layers without
RoPE), and of Gemma 2 / Gemma 3 (modeling_gemma2.py / modeling_gemma3.py, with "gemma" in the
config: embeddings times sqrt(hidden_size) in the weights' dtype, RMSNorm times (1 + w),
post-attention and pre/post feed-forward norms, GeGLU with gelu_pytorch_tanh, scale
query_pre_attn_scalar^-1/2, sliding-window layers from layer_types, Gemma 3's local RoPE base,
Gemma 2's attention and final soft-caps) plus PEFT-style
LoRA (y = x W^T + b + scale * B(A(dropout(x))), dropout 0 here). It shares no code with the C++
implementation. It runs in float64 so its numbers are a reference for the f32 C++ ones.

Packed batches: tokens of several samples are concatenated; cu_seqlens gives the boundaries,
positions restart per sample, labels == -100 are ignored. Attention uses an explicit [T, T] mask
(same sample and key <= query), which is fine for the tiny models of the tests. Optional config
keys: "layer_windows" (per layer, 0 = full attention; else the sliding-window causal mask of
transformers' masking_utils: key kv_idx visible to query q_idx when kv_idx > q_idx - window),
"attention_scale" (0 = 1/sqrt(head_dim); Gemma's query_pre_attn_scalar ** -0.5) and
"attention_softcap" (0 = none; else scores -> softcap * tanh(scores / softcap) after the scale and
before the mask, as Gemma 2's attn_logit_softcapping).

Mixture-of-Experts (Qwen3-MoE, Mixtral; "moe" in the config: num_experts, top_k, norm_topk_prob,
block ("mlp" / "block_sparse_moe"), the experts' projection names, aux_coef): a layer whose
<block>.gate.weight exists is the sparse block of modeling_qwen3_moe.py / modeling_mixtral.py (router
logits, softmax in float, topk, renormalised when norm_topk_prob, each expert over the tokens that
chose it via a one-hot mask, index_add_ of the weighted outputs); the load-balancing loss is
transformers' load_balancing_loss_func over every sparse layer's logits concatenated, added to the
loss times aux_coef (result "aux_loss"; "loss" stays the mean NLL).

With "preference" in spec.json (method, settings, references, step sizes) the loss is the
preference method's (preference_loss) instead of the mean NLL: tests/train/preference_parity_test.cpp.

Usage: torch_llama.py IN_DIR OUT_DIR [IN_DIR OUT_DIR ...]   (several cases share one torch start-up)
  IN_DIR/spec.json    config, tensor table, batch, mode, lora settings, optional adamw settings
  IN_DIR/tensors.bin  little-endian float32 values of every tensor in the table, back to back
  OUT_DIR/result.json loss, counts, adamw losses and a table of output arrays
  OUT_DIR/result.bin  float64 values of those arrays (logits, gradients)
Only the standard library, torch and json are needed (no safetensors, no transformers).
"""
import json
import math
import os
import struct
import sys

import torch

DT = torch.float64


def load_spec(in_dir):
    with open(os.path.join(in_dir, "spec.json")) as f:
        spec = json.load(f)
    raw = open(os.path.join(in_dir, "tensors.bin"), "rb").read()
    tensors = {}
    for t in spec["tensors"]:
        n = 1
        for s in t["shape"]:
            n *= s
        off = t["offset"] * 4
        vals = struct.unpack_from("<%df" % n, raw, off)
        tensors[t["name"]] = torch.tensor(vals, dtype=DT).reshape(t["shape"])
    return spec, tensors


def rotary_dim(cfg):
    """modeling_rope_utils: dim = int(head_dim * partial_rotary_factor)."""
    return int(cfg["head_dim"] * cfg.get("partial_rotary_factor", 1.0))


def longrope_attention_factor(cfg):
    """_compute_longrope_parameters: with original_max_position_embeddings in the config the scale
    is max_position_embeddings / original, else rope_scaling's factor; sqrt(1 + ln s / ln orig)."""
    sc = cfg["rope_scaling"]
    if cfg.get("original_max_position_embeddings"):
        orig = cfg["original_max_position_embeddings"]
        factor = cfg["max_position_embeddings"] / orig
    else:
        orig = cfg["max_position_embeddings"]
        factor = sc.get("factor", 1.0)
    if sc.get("attention_factor") is not None:
        return sc["attention_factor"], orig
    return (1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(orig))), orig


def rope_inv_freq(cfg, seq_len=0, theta=None, scaled=True):
    d = rotary_dim(cfg)
    base = theta or cfg["rope_theta"]
    inv = 1.0 / (base ** (torch.arange(0, d, 2, dtype=DT) / d))
    sc = cfg.get("rope_scaling") if scaled else None
    if sc and sc.get("rope_type", sc.get("type")) == "longrope":
        # longrope_frequency_update: long factors once max(position_ids) + 1 passes the original length
        _, orig = longrope_attention_factor(cfg)
        ext = sc["long_factor"] if seq_len > orig else sc["short_factor"]
        inv = 1.0 / (torch.tensor(ext, dtype=DT) * base ** (torch.arange(0, d, 2, dtype=DT) / d))
    if sc and sc.get("rope_type", sc.get("type")) == "linear":
        inv = inv / sc["factor"]
    if sc and sc.get("rope_type", sc.get("type")) == "llama3":
        factor = sc["factor"]
        lo, hi = sc["low_freq_factor"], sc["high_freq_factor"]
        old = sc["original_max_position_embeddings"]
        low_wavelen, high_wavelen = old / lo, old / hi
        wavelen = 2 * math.pi / inv
        inv_l = torch.where(wavelen > low_wavelen, inv / factor, inv)
        smooth = (old / wavelen - lo) / (hi - lo)
        smoothed = (1 - smooth) * inv_l / factor + smooth * inv_l
        medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
        inv = torch.where(medium, smoothed, inv_l)
    return inv


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def rms_norm(x, w, eps, offset=0.0):
    var = x.pow(2).mean(-1, keepdim=True)
    return x * torch.rsqrt(var + eps) * (offset + w)


def gelu_tanh(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x.pow(3))))


def softcap(x, cap):
    return torch.tanh(x / cap) * cap if cap else x


class Llama:
    def __init__(self, spec, tensors):
        self.cfg = spec["config"]
        self.w = tensors
        self.lora = spec.get("lora")
        if self.lora:
            r, alpha = self.lora["r"], self.lora["alpha"]
            self.scale = alpha / math.sqrt(r) if self.lora.get("use_rslora") else alpha / r

    def linear(self, x, prefix, module):
        name = "%s.%s" % (prefix, module)
        y = x @ self.w[name + ".weight"].T
        if name + ".bias" in self.w:
            y = y + self.w[name + ".bias"]
        a = "base_model.model." + name + ".lora_A.weight"
        if self.lora and a in self.w:
            b = "base_model.model." + name + ".lora_B.weight"
            lora = (x @ self.w[a].T) @ self.w[b].T * self.scale
            m = "base_model.model." + name + ".lora_magnitude_vector"
            if not self.lora.get("use_dora"):
                return y + lora
            # DoRA as PEFT's DoraLinearLayer (no dropout): the norm of each row of W + s*B*A,
            # detached; the base output (bias removed) and the LoRA output scaled by m / norm.
            W = self.w[name + ".weight"]
            norm = torch.linalg.norm(W + self.scale * (self.w[b] @ self.w[a]), dim=1).detach()
            mag_norm_scale = (self.w[m] / norm).view(1, -1)
            base = x @ W.T
            y = y + (mag_norm_scale - 1) * base + mag_norm_scale * lora
        return y

    def sparse_moe(self, hn, prefix, moe):
        """The sparse MoE block: softmax over all experts, top-k, optional renormalisation, experts
        run on the tokens that chose them, outputs weighted and index-added."""
        E, k = moe["num_experts"], moe["top_k"]
        logits = self.linear(hn, prefix, "gate")
        self.router_logits.append(logits)
        probs = torch.softmax(logits, dim=-1)
        weights, chosen = torch.topk(probs, k, dim=-1)
        if moe["norm_topk_prob"]:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        self.router_choices.append(chosen)
        out = torch.zeros_like(hn)
        mask = torch.nn.functional.one_hot(chosen, num_classes=E).permute(2, 1, 0)  # [E, k, T]
        gname, uname, dname = moe["proj"]
        for e in range(E):
            slot, tok = torch.where(mask[e])
            if tok.numel() == 0:
                continue
            xe = hn[tok]
            ep = "%s.experts.%d" % (prefix, e)
            ye = self.linear(torch.nn.functional.silu(self.linear(xe, ep, gname)) * self.linear(xe, ep, uname), ep, dname)
            out.index_add_(0, tok, ye * weights[tok, slot, None])
        return out

    def aux_loss(self):
        """load_balancing_loss_func without an attention mask: num_experts * sum over the k choices
        and experts of (fraction of tokens choosing e as that choice) * (mean probability of e)."""
        moe = self.cfg["moe"]
        E, k = moe["num_experts"], moe["top_k"]
        logits = torch.cat(self.router_logits, dim=0)
        probs = torch.softmax(logits, dim=-1)
        _, chosen = torch.topk(probs, k, dim=-1)
        mask = torch.nn.functional.one_hot(chosen, E).to(DT)
        tokens_per_expert = mask.mean(dim=0)
        prob_per_expert = probs.mean(dim=0)
        return (tokens_per_expert * prob_per_expert.unsqueeze(0)).sum() * E

    def forward(self, tokens, positions, cu_seqlens):
        self.router_logits, self.router_choices = [], []
        c, w = self.cfg, self.w
        T = tokens.shape[0]
        H, Hkv, d = c["num_heads"], c["num_kv_heads"], c["head_dim"]
        eps = c["rms_norm_eps"]
        g = c.get("gemma")  # Gemma 2 / 3 settings, as config.json names them
        off = 1.0 if g else 0.0  # Gemma's RMSNorm: x_normed * (1 + w)
        sample = torch.zeros(T, dtype=torch.long)
        for s in range(len(cu_seqlens) - 1):
            sample[cu_seqlens[s]:cu_seqlens[s + 1]] = s
        idx = torch.arange(T)
        allowed = (sample[:, None] == sample[None, :]) & (idx[None, :] <= idx[:, None])
        windows = c.get("layer_windows") or [0] * c["num_layers"]
        scale = c.get("attention_scale") or 1.0 / math.sqrt(d)
        attn_cap = c.get("attention_softcap") or 0.0
        sc = c.get("rope_scaling")
        # LongRoPE's attention factor multiplies cos and sin (1 for every other rope type).
        af = longrope_attention_factor(c)[0] if sc and sc.get("rope_type", sc.get("type")) == "longrope" else 1.0
        max_pos = int(positions.max()) + 1

        def cos_sin(inv):
            freqs = positions.to(DT)[:, None] * inv[None, :]
            emb = torch.cat((freqs, freqs), dim=-1)
            return emb.cos()[:, None, :] * af, emb.sin()[:, None, :] * af

        rope_global = cos_sin(rope_inv_freq(c, max_pos))
        rope_local = rope_global
        if g:  # everything from config.json's keys, as modeling_gemma2/3 read them
            if g.get("rope_local_base_freq"):  # Gemma 3: local layers use their own base, unscaled
                rope_local = cos_sin(rope_inv_freq(c, max_pos, theta=g["rope_local_base_freq"], scaled=False))
            scale = g["query_pre_attn_scalar"] ** -0.5
            windows = [g["sliding_window"] if t == "sliding_attention" else 0 for t in g["layer_types"]]
            attn_cap = g.get("attn_logit_softcapping") or 0.0
        rot = rotary_dim(c)
        # SmolLM3Config: no_rope_layers[l] = 1 where layer l uses RoPE; by default every
        # no_rope_layer_interval-th layer has none.
        uses_rope = c.get("no_rope_layers")
        if uses_rope is None:
            every = c.get("no_rope_layer_interval", 4) if c.get("model_type") == "smollm3" else 0
            uses_rope = [int(every == 0 or (i + 1) % every != 0) for i in range(c["num_layers"])]

        def rope(x, cs):  # modeling_phi3 apply_rotary_pos_emb: rotate the first `rot` dims, pass the rest
            cos, sin = cs
            xr, xp = x[..., :rot], x[..., rot:]
            return torch.cat((xr * cos + rotate_half(xr) * sin, xp), dim=-1)

        x = w["model.embed_tokens.weight"][tokens]
        if g:  # the normalizer in the weights' dtype (Gemma3TextScaledWordEmbedding, Gemma2Model)
            x = x * torch.tensor(c["hidden_size"] ** 0.5, dtype=getattr(torch, g["torch_dtype"])).to(DT)
        for l in range(c["num_layers"]):
            p = "model.layers.%d" % l
            xn = rms_norm(x, w[p + ".input_layernorm.weight"], eps, off)
            if p + ".self_attn.qkv_proj.weight" in w:  # Phi-3: one qkv_proj, q rows then k then v
                qkv = self.linear(xn, p + ".self_attn", "qkv_proj")
                q = qkv[:, :H * d].reshape(T, H, d)
                k = qkv[:, H * d:(H + Hkv) * d].reshape(T, Hkv, d)
                v = qkv[:, (H + Hkv) * d:].reshape(T, Hkv, d)
            else:
                q = self.linear(xn, p + ".self_attn", "q_proj").view(T, H, d)
                k = self.linear(xn, p + ".self_attn", "k_proj").view(T, Hkv, d)
                v = self.linear(xn, p + ".self_attn", "v_proj").view(T, Hkv, d)
            if c["qk_norm"]:
                q = rms_norm(q, w[p + ".self_attn.q_norm.weight"], eps, off)
                k = rms_norm(k, w[p + ".self_attn.k_norm.weight"], eps, off)
            if uses_rope[l]:
                cs = rope_local if windows[l] else rope_global
                q, k = rope(q, cs), rope(k, cs)
            rep = H // Hkv
            k = k.repeat_interleave(rep, dim=1)  # query head h reads kv head h // rep
            v = v.repeat_interleave(rep, dim=1)
            scores = softcap(torch.einsum("thd,shd->hts", q, k) * scale, attn_cap)
            mask = allowed
            if windows[l]:  # sliding window: key s visible from query t when s > t - window
                mask = allowed & (idx[None, :] > idx[:, None] - windows[l])
            scores = scores.masked_fill(~mask[None], float("-inf"))
            attn = torch.einsum("hts,shd->thd", torch.softmax(scores, dim=-1), v).reshape(T, H * d)
            o = self.linear(attn, p + ".self_attn", "o_proj")
            if g:
                h = x + rms_norm(o, w[p + ".post_attention_layernorm.weight"], eps, off)
                hn = rms_norm(h, w[p + ".pre_feedforward_layernorm.weight"], eps, off)
            else:
                h = x + o
                hn = rms_norm(h, w[p + ".post_attention_layernorm.weight"], eps)
            moe = c.get("moe")
            if moe and p + "." + moe["block"] + ".gate.weight" in w:
                x = h + self.sparse_moe(hn, p + "." + moe["block"], moe)
                continue
            if p + ".mlp.gate_up_proj.weight" in w:  # Phi-3: gate_up_proj chunked, gate first
                gate, up = self.linear(hn, p + ".mlp", "gate_up_proj").chunk(2, dim=-1)
            else:
                gate = self.linear(hn, p + ".mlp", "gate_proj")
                up = self.linear(hn, p + ".mlp", "up_proj")
            act = gelu_tanh(gate) if g else torch.nn.functional.silu(gate)
            mlp = self.linear(act * up, p + ".mlp", "down_proj")
            if g:
                mlp = rms_norm(mlp, w[p + ".post_feedforward_layernorm.weight"], eps, off)
            x = h + mlp
        x = rms_norm(x, w["model.norm.weight"], eps, off)
        head = w["model.embed_tokens.weight"] if c["tie_word_embeddings"] else w["lm_head.weight"]
        logits = x @ head.T
        if g:
            logits = softcap(logits, g.get("final_logit_softcapping"))
        return logits


def loss_of(model, batch):
    logits = model.forward(batch["tokens"], batch["positions"], batch["cu_seqlens"])
    labels = batch["labels"]
    mask = labels != -100
    lp = torch.log_softmax(logits, dim=-1)
    nll = -lp[mask].gather(1, labels[mask][:, None]).squeeze(1)
    return nll.mean(), logits, int(mask.sum())


def sequence_logps(model, batch):
    """Each packed sequence's summed log-probability of its labelled tokens, and their count."""
    logits = model.forward(batch["tokens"], batch["positions"], batch["cu_seqlens"])
    lp = torch.log_softmax(logits, dim=-1)
    labels = batch["labels"]
    cu = batch["cu_seqlens"]
    sums, counts = [], []
    for s in range(len(cu) - 1):
        lab = labels[cu[s]:cu[s + 1]]
        m = lab != -100
        sums.append(lp[cu[s]:cu[s + 1]][m].gather(1, lab[m][:, None]).sum())
        counts.append(int(m.sum()))
    return sums, counts, logits


def preference_loss(model, batch, p):
    """The preference losses written from their papers' formulas as TRL implements them (DPO
    sigmoid/ipo/hinge with label smoothing, ORPO, SimPO, KTO with a given reference point z);
    every term a mean over the step's examples, ORPO's NLL a mean over its chosen tokens."""
    F = torch.nn.functional
    logps, counts, logits = sequence_logps(model, batch)
    method, beta, n_ex = p["method"], p.get("beta", 0.1), p["n_examples"]
    ls = p.get("label_smoothing", 0.0)
    terms = []
    if method in ("dpo", "orpo", "simpo"):
        for i in range(len(logps) // 2):
            pc, pr = logps[2 * i], logps[2 * i + 1]
            nc, nr = counts[2 * i], counts[2 * i + 1]
            if method == "dpo":
                rc, rr = p["ref_c"][i], p["ref_r"][i]
                if p["dpo_loss"] == "ipo":
                    h = (pc / nc - rc / nc) - (pr / nr - rr / nr)
                    terms.append((h - 1 / (2 * beta)) ** 2)
                elif p["dpo_loss"] == "hinge":
                    h = (pc - rc) - (pr - rr)
                    terms.append(torch.relu(1 - beta * h))
                else:
                    h = (pc - rc) - (pr - rr)
                    terms.append(-F.logsigmoid(beta * h) * (1 - ls) - F.logsigmoid(-beta * h) * ls)
            elif method == "orpo":
                a, b = pc / nc, pr / nr
                log_odds = (a - b) - (torch.log1p(-torch.exp(a)) - torch.log1p(-torch.exp(b)))
                terms.append(-p["orpo_lambda"] * F.logsigmoid(log_odds))
            else:
                u = beta * (pc / nc - pr / nr) - p["simpo_gamma"]
                terms.append(-F.logsigmoid(u) * (1 - ls) - F.logsigmoid(-u) * ls)
    else:  # kto
        z = p["kto_z"]
        for i, lp in enumerate(logps):
            r = lp - p["ref_c"][i]
            if p["desirable"][i]:
                terms.append(p["kto_desirable_weight"] * (1 - torch.sigmoid(beta * (r - z))))
            else:
                terms.append(p["kto_undesirable_weight"] * (1 - torch.sigmoid(beta * (z - r))))
    loss = sum(terms) / n_ex
    if method == "orpo":
        loss = loss - sum(logps[0::2]) / p["chosen_tokens"]
    return loss, logits, sum(counts)


def trainable_names(spec, tensors):
    if spec["mode"] == "full":
        return [t["name"] for t in spec["tensors"] if "lora_" not in t["name"]]
    return [t["name"] for t in spec["tensors"] if "lora_" in t["name"]]


def run_case(in_dir, out_dir):
    spec, tensors = load_spec(in_dir)
    b = spec["batch"]
    batch = {k: torch.tensor(b[k], dtype=torch.long) for k in ("tokens", "positions", "labels")}
    batch["cu_seqlens"] = list(b["cu_seqlens"])
    names = trainable_names(spec, tensors)
    for n in names:
        tensors[n].requires_grad_(True)
    model = Llama(spec, tensors)

    if "preference" in spec:
        loss, logits, n_counted = preference_loss(model, batch, spec["preference"])
    else:
        loss, logits, n_counted = loss_of(model, batch)
    total = loss
    moe = spec["config"].get("moe")
    aux = None
    if moe and model.router_logits:
        aux = model.aux_loss()
        total = loss + moe["aux_coef"] * aux
    total.backward()
    arrays = [("logits", logits.detach())]
    for l, chosen in enumerate(model.router_choices):
        arrays.append(("route:%d" % l, chosen.to(DT)))
    for n in names:
        g = tensors[n].grad
        arrays.append(("grad:" + n, g if g is not None else torch.zeros_like(tensors[n])))

    result = {"loss": loss.item(), "n_counted": n_counted, "arrays": []}
    if aux is not None:
        result["aux_loss"] = aux.item()
    adam = spec.get("adamw")
    if adam:
        # Fresh copies so the trajectory starts from the same weights as the C++ run.
        for n in names:
            tensors[n] = tensors[n].detach().clone().requires_grad_(True)
        model = Llama(spec, tensors)
        opt = torch.optim.AdamW([tensors[n] for n in names], lr=adam["lr"], betas=(adam["beta1"], adam["beta2"]),
                                eps=adam["eps"], weight_decay=adam["weight_decay"])
        losses = []
        for _ in range(adam["steps"]):
            opt.zero_grad()
            l, _, _ = loss_of(model, batch)
            l.backward()
            opt.step()
            losses.append(l.item())
        result["adamw_losses"] = losses

    os.makedirs(out_dir, exist_ok=True)
    off = 0
    with open(os.path.join(out_dir, "result.bin"), "wb") as f:
        for name, a in arrays:
            flat = a.detach().reshape(-1).to(DT).tolist()
            f.write(struct.pack("<%dd" % len(flat), *flat))
            result["arrays"].append({"name": name, "shape": list(a.shape), "offset": off})
            off += len(flat)
    with open(os.path.join(out_dir, "result.json"), "w") as f:
        json.dump(result, f)


def main():
    args = sys.argv[1:]
    if not args or len(args) % 2:
        sys.exit("usage: torch_llama.py IN_DIR OUT_DIR [IN_DIR OUT_DIR ...]")
    for i in range(0, len(args), 2):
        run_case(args[i], args[i + 1])


if __name__ == "__main__":
    main()
