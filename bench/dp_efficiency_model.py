#!/usr/bin/env python3
"""A model (not a measurement) of data-parallel efficiency for this implementation's traffic
(docs/benchmarks.md "Data-parallel efficiency: a model"; issue 40). Prints the table the docs
quote. Every input is a named constant below with where it comes from; change them and rerun.

Traffic (docs/architecture.md "The reduction order"): per step each rank sends 2·(N−1)/N of the
f32 gradient buffer B = 4·trainable bytes — all-reduce: all-to-all (N−1)/N·B, then all-gather
(N−1)/N·B; ZeRO-1: the reduce-scatter's (N−1)/N·B, then the updated parameters' all-gather
(N−1)/N·B. On CUDA the gradients go GPU to GPU over NCCL; ZeRO-1's parameter all-gather goes
through the host (device → host copy of the rank's chunk, MPI all-gather, host → device copy of
the whole buffer). Nothing overlaps the backward pass (the "overlap" column is an upper bound for
a reduction that ran entirely under the backward).

Usage: bench/dp_efficiency_model.py [HOST_ALLGATHER_GBPS]  (default 10: an assumption, see below)
"""
import sys

# --- shapes (trainable values; total parameters for the FLOPs) -----------------------------------
def llama_params(hidden, inter, layers, heads, kv_heads, vocab, tied):
    hd = hidden // heads
    kv = kv_heads * hd
    layer = hidden * hidden * 2 + hidden * kv * 2 + hidden * inter * 3 + 2 * hidden
    return layers * layer + vocab * hidden * (1 if tied else 2) + hidden


def lora_params(hidden, inter, layers, heads, kv_heads, r):
    kv = kv_heads * (hidden // heads)
    per = r * ((hidden + hidden) * 2 + (hidden + kv) * 2 + (hidden + inter) * 3)  # q,o; k,v; gate,up,down
    return layers * per


# SmolLM-135M (HuggingFaceTB/SmolLM-135M config.json; bench/bench_data_parallel.sh's shape)
SMOL = dict(hidden=576, inter=1536, layers=30, heads=9, kv_heads=3, vocab=49152, tied=True)
# Llama-3.1-8B (meta-llama/Llama-3.1-8B config.json)
LLAMA8B = dict(hidden=4096, inter=14336, layers=32, heads=32, kv_heads=8, vocab=128256, tied=False)

# --- hardware (sources in docs/benchmarks.md) ------------------------------------------------------
H100_BF16_FLOPS = 989e12  # H100 SXM dense BF16 tensor core (NVIDIA H100 datasheet)
MFU = 0.40  # model FLOPs utilisation assumed (Llama 3 paper, Table 4: 38-43% on H100)
NVLINK_GBPS = 450 * 0.65  # 900 GB/s bidirectional = 450 one way (datasheet) x 65% achieved (sendrecv, A100)
PCIE_GBPS = 64 * 0.80  # PCIe 5.0 x16: 64 GB/s one way (PCI-SIG), 80% achieved (assumed)
ETH25_GBPS = 25 / 8 * 0.93  # 25 GbE line rate 3.125 GB/s (IEEE 802.3by), 93% after TCP/IP headers (assumed)
# ZeRO-1's parameter all-gather through host memory over MPI's shared-memory transport on one GPU
# server: assumed 10 GB/s per rank (this 2-core VM measured 0.11 GB/s under load 5: docs).
HOST_ALLGATHER_GBPS = float(sys.argv[1]) if len(sys.argv) > 1 else 10.0

TOKENS_PER_GPU = 8 * 2048  # tokens per rank per optimizer step (8 sequences of 2048: assumed)


def compute_s(total_params, lora):
    # 6·P per token for full fine-tuning (Kaplan et al. 2020); 4·P for LoRA (no dW of the frozen
    # weights: forward 2P + backward dx 2P; the adapter's own FLOPs are negligible).
    flops = (4 if lora else 6) * total_params * TOKENS_PER_GPU
    return flops / (H100_BF16_FLOPS * MFU)


def backward_share(lora):
    return 0.5 if lora else 2 / 3


def scenario(name, tc, lora, grad_s, param_s=0.0):
    """tc: compute seconds; grad_s: the gradients' reduction (and, unsharded, the all-gather of the
    summed gradients); param_s: ZeRO-1's parameter all-gather, which no backward can hide."""
    comm = grad_s + param_s
    exposed = max(0.0, grad_s - backward_share(lora) * tc) + param_s
    return name, comm, tc / (tc + comm), tc / (tc + exposed)


def main():
    rows = []
    for label, shape in (("SmolLM-135M", SMOL), ("Llama-3.1-8B", LLAMA8B)):
        total = llama_params(**shape)
        for lora in (True, False):
            T = lora_params(shape["hidden"], shape["inter"], shape["layers"], shape["heads"], shape["kv_heads"], 16) \
                if lora else total
            B = 4 * T
            tc = compute_s(total, lora)
            what = f"{label} {'LoRA r16' if lora else 'full'}"
            # 8 GPUs, one node, NVSwitch: each rank sends 2·(N−1)/N·B over NCCL on NVLink.
            n = 8
            frac = (n - 1) / n
            unsharded = scenario("8 GPUs NVLink, unsharded", tc, lora, 2 * frac * B / (NVLINK_GBPS * 1e9))
            # ZeRO-1: the reduce-scatter on NVLink, the parameter all-gather through the host (today's
            # path): the rank's chunk to the host, the MPI all-gather, the whole buffer back.
            host = B / n / (PCIE_GBPS * 1e9) + frac * B / (HOST_ALLGATHER_GBPS * 1e9) + B / (PCIE_GBPS * 1e9)
            zero = scenario("8 GPUs NVLink, ZeRO-1", tc, lora, frac * B / (NVLINK_GBPS * 1e9), host)
            # 2 nodes, one GPU each, 25 GbE: each rank sends 2·(1/2)·B = B through its NIC.
            two = scenario("2 nodes x 1 GPU, 25 GbE", tc, lora, B / (ETH25_GBPS * 1e9))
            # 2 nodes x 8 GPUs, the same flat algorithm over 16 ranks: per phase each of a node's 8
            # ranks sends 8 chunks of B/16 to the other node, 4·B through the node's one NIC; 8·B a step.
            flat = scenario("2 nodes x 8 GPUs, 25 GbE", tc, lora, 8 * B / (ETH25_GBPS * 1e9))
            for sc in (unsharded, zero, two, flat):
                rows.append((what, T, B, tc) + sc)
    print(f"# model inputs: {TOKENS_PER_GPU} tokens/rank/step, MFU {MFU:.0%} of {H100_BF16_FLOPS / 1e12:.0f} TFLOPS, "
          f"NVLink {NVLINK_GBPS:.0f} GB/s, PCIe {PCIE_GBPS:.0f} GB/s, 25 GbE {ETH25_GBPS:.2f} GB/s, "
          f"host all-gather {HOST_ALLGATHER_GBPS:.2f} GB/s")
    print("| model | trainable | gradient B | compute/step | setup | comm/step | efficiency | with overlap (bound) |")
    print("|---|---|---|---|---|---|---|---|")
    for what, T, B, tc, name, comm, e, eo in rows:
        print(f"| {what} | {T / 1e6:.1f} M | {B / 1e6:,.0f} MB | {tc * 1e3:,.0f} ms | {name} | {comm * 1e3:,.1f} ms | "
              f"{e:.0%} | {eo:.0%} |")


if __name__ == "__main__":
    main()
