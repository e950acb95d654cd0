// Memory plan: replays the allocations of Model::forward_backward (see memory_plan.h).
//
// The replay mirrors, in order, every Tensor the transformer allocates and frees
// (model/transformer.cpp forward_layer, model/transformer_backward.cpp backward_layer and
// forward_backward) and the allocations inside the ops it calls:
//   Batch              tokens, positions, labels [T] and cu_seqlens [S+1] int32, the whole step
//   rms_norm_forward   rstd [N] (when kept) then y [N, D]; with Gemma's (1 + w) the norm's weight
//                      made for the call (Model::norm_weight) [D] before them, freed after the op (also
//                      around each rms_norm_backward)
//   linear_forward     y [T, out]; LoRA: xa [T, r], freed at the end unless saved for backward;
//                      with dropout, the kernel's scratch (CPU: xd [T, in]; CUDA: none), transient
//   linear_backward    LoRA: dxa [T, r]; with dropout the kernel's scratch (CPU: xd and dxd
//                      [T, in]; CUDA: the dA kernel's per-slice partials, DeviceScratch) (all transient)
//   DoRA               forward: the norm's temporaries (A·Wᵀ and Bᵀ [r, out], A·Aᵀ and I [r, r],
//                      n² [out], transient), then z [T, out] and c, 1/n [out], saved with xa;
//                      backward: dy ⊙ c [T, out] for the op's call; with dropout, forward the
//                      dropout kernel's scratch for xd·Wᵀ, backward (c − 1) ⊙ dy [T, out] and the
//                      scratch; over a held W also xd (forward) or dy·W (backward) [T, in] and an
//                      identity [in, in] (ops/linear.h "DoRA"), all transient
//   (PiSSA adds no activations: its initial A and B live on the host, in `weights` on the CPU)
//   LoRA input groups  (q/k/v, gate/up: Model::lora_group_A) one xa [T, Σr] before the members'
//                      forward (with dropout then the kernel's scratch, transient), kept until the
//                      last member's backward, and one dxa [T, Σr] from before the first member's
//                      backward to lora_group_backward (with dropout its scratch, or on CUDA the
//                      dA kernel's partials for r = Σr, transient, while dxa is live); the members
//                      allocate no xa or dxa of their own; a fused module (Phi-3) is a group
//                      whose xa and dxa are [T, r] (its members share A)
//   attention_forward  out [T, Hq·d], lse [Hq, T] (when kept), per-thread scratch (transient)
//   attention_backward delta [Hq, T], per-thread score blocks and per-head partial dk/dv (transient)
//   linear_cross_entropy: one logits chunk [min(chunk, window, T), V] (transient; window = the
//                      longest run of rows with labels the data can make, settings' ce_window_tokens)
// On a CUDA device the kernels also take device memory of their own inside one call (DeviceScratch
// below, from backend/cuda/kernel_wrappers.h); its attention keeps its tiles in shared memory (no
// per-thread scratch) and the cross-entropy's workspace replaces the front-end's logits chunk.
// cuBLASLt's workspace is not replayed: the allocator holds it from the first GEMM on, before any
// peak, so it is the plan's fixed gemm_workspace term.
// When one of those changes, change the replay with it; the test against the allocator's
// measured peak (tests/train/memory_plan_test.cpp) says when they disagree.
#include "train/memory_plan.h"

#include <omp.h>

#include <algorithm>
#include <array>
#include <string>
#include <vector>

#include "model/held_weights.h"
#include "ops/attention.h"
#include "ops/cpu_kernels.h"
#include "ops/device_compute.h"  // cuda_workspace::
#include "ops/linear.h"

namespace bp {

namespace {

enum Group { kSaved, kRecompute, kChunk, kWork, kNumGroups };

// A timeline of live bytes per group; remembers the split at the highest total.
class Replay {
 public:
  using Id = int;
  Id alloc(Group g, int64_t floats) { return alloc_bytes(g, static_cast<size_t>(floats) * sizeof(float)); }
  Id alloc_bytes(Group g, size_t bytes) {
    sizes_.push_back({g, bytes});
    live_[g] += bytes;
    total_ += bytes;
    if (total_ > peak_) {
      peak_ = total_;
      at_peak_ = live_;
      peak_phase_ = phase_;
    }
    return static_cast<Id>(sizes_.size() - 1);
  }
  void free(Id& id) {
    if (id < 0) return;
    auto& s = sizes_[static_cast<size_t>(id)];
    live_[s.first] -= s.second;
    total_ -= s.second;
    s.second = 0;
    id = -1;
  }
  // An allocation that lives only inside one op call.
  void transient(Group g, int64_t floats) { transient_bytes(g, static_cast<size_t>(floats) * sizeof(float)); }
  void transient_bytes(Group g, size_t bytes) {
    if (bytes == 0) return;
    Id id = alloc_bytes(g, bytes);
    free(id);
  }
  void set_phase(std::string p) { phase_ = std::move(p); }
  const std::array<size_t, kNumGroups>& at_peak() const { return at_peak_; }
  const std::string& peak_phase() const { return peak_phase_; }

 private:
  std::vector<std::pair<Group, size_t>> sizes_;
  std::array<size_t, kNumGroups> live_{}, at_peak_{};
  size_t total_ = 0, peak_ = 0;
  std::string phase_, peak_phase_;
};

using Id = Replay::Id;

// Bytes per element of the rounded activation operand the CPU's GEMMs against a weight held as
// `held` make for themselves (backend/cpu/linear.cpp: bf16 for oneDNN, bf16 widened back to f32
// for OpenBLAS, none on the f32 path or for other types). Counted for the LM head, whose operand
// (the logits' gradient, chunk × V) is the large one.
size_t cpu_bf16_operand_bytes(DType held) {
  if (held != DType::BF16) return 0;
  const std::string path = ops::cpu_gemm_info().held_bf16;
  return path == "bf16-onednn" ? 2 : path == "bf16-openblas" ? 4 : 0;
}

// Device memory the CUDA kernels take from the allocator for themselves inside one op call
// (backend/cuda/kernel_wrappers.h), in bytes; none on the CPU, whose kernels get every buffer from
// the op front-ends (counted by the replay). One function per place the wrappers allocate; a new
// device workspace is one more term here (tests/cuda/linear_bf16_cuda_test.cpp and
// linear_f16_cuda_test.cpp measure them; CudaTrainer.MemoryPlanCoversTheMeasuredPeakOnTheCard the
// whole plan).
struct DeviceScratch {
  bool cuda = false;
  DType held = DType::F32;   // frozen matrices (LoRA over a bf16, f16, q8_0, q4_K, ... base; f32 otherwise)
  DType head = DType::F32;   // the LM head as held
  bool f16 = false;          // the card's GEMMs against frozen weights take f16 (compute capability 7.5)
  bool f32_panels = false;   // some frozen matrix lies outside f16's range: its GEMMs take f32 panels
  bool gemm_copies = false;  // full mode's trained matrices read bf16 copies (held = head = BF16 then)
  // The projections' GEMMs take bf16 (a held or copied weight on a bf16 card: ops/linear.h
  // held_gemms_read_bf16), so RMSNorm, attention, RoPE and SwiGLU write their outputs' bf16 copies
  // (xn for q/k/v, attn for o, hn for gate/up, m for down; backward dgate and dup for gate/up, the
  // residual's gradients for o and down, dv (attention) and dq, dk (RoPE, or the q/k norms) for
  // q, k, v), which the GEMMs read instead of rounding.
  bool bf16_operands = false;

  // What one GEMM of x [T, in] with the frozen weight [out, in] holds besides its operands
  // (backend/cuda/device_workspace.h): the activation operand rounded to bf16 or f16 (x [T, in]
  // forward, dy [T, out] for dx) and, for f16 and block types (bf16 too on an f16 card), the
  // weight's 16-bit panel. When some frozen matrix takes f32 panels (which ones is not modelled),
  // every GEMM counts the larger of the two paths.
  // operand_given: the producer's bf16 copy is read, nothing is rounded.
  size_t linear_gemm(int64_t T, int64_t in, int64_t out, bool dx, bool operand_given = false) const {
    if (!cuda) return 0;
    const size_t narrow = (operand_given ? 0 : cuda_workspace::held_gemm_operand_bytes(held, T, dx ? out : in, f16)) +
                          cuda_workspace::held_gemm_panel_bytes(held, out, in, f16);
    if (!f32_panels || held == DType::F32) return narrow;
    return std::max(narrow, cuda_workspace::held_gemm_f32_panel_bytes(out, in));
  }
  // The backward of a matrix trained through its bf16 copy: dy rounded to bf16 once for dx and dW,
  // x for dW (held_linear_backward), each unless its producer's copy is given.
  size_t linear_dW(int64_t T, int64_t in, int64_t out, bool dy_given, bool x_given) const {
    return cuda && gemm_copies ? cuda_workspace::narrow_dW_operand_bytes(T, in, out, dy_given, x_given) : 0;
  }
  // linear_cross_entropy's workspace (the device kernel walks whole windows of min(chunk, T) rows:
  // the label windows do not shrink it). An f32 head, or a bf16 one on a bf16 card:
  // cuda_workspace::cross_entropy_bytes. Any other held head: the f32 workspace plus one f32 panel
  // of the head (cross_entropy_held_workspace_bytes in backend/cuda/cross_entropy.cuh).
  size_t cross_entropy(int64_t T, int64_t chunk, int64_t V, int64_t D) const {
    return cuda_workspace::cross_entropy_head_bytes(head, f16, T, D, V, chunk, true);
  }
  // The LoRA dropout dA kernel's per-slice partials [S, r, in] when it splits the tokens
  // (backend/cuda/lora_dropout_split.h; none for one slice), while dxa is live.
  size_t lora_dropout_dA(int64_t T, int64_t in, int64_t r) const {
    return cuda ? cuda_workspace::lora_dropout_dA_bytes(T, in, r) : 0;
  }
};

struct Dims {
  int64_t T, D, F, V, qd, kvd, Hq, Hkv, d, L, r, chunk, attn_fwd_scratch, attn_bwd_scratch;
  bool qk_norm;
  bool fused_lora;   // LoRA on fused modules (Phi-3, model/lora.h): members share A, one xa [T, r]
  bool sandwich;     // Gemma: post-attention and post-feed-forward norms (o_out, down_out and their rstd)
  bool norm_offset;  // Gemma: every norm's (1 + w) made for its call
  bool ckpt;
  bool dora = false;  // DoRA on every adapted projection
  float dropout;
  int64_t ce_chunk_tokens;  // the setting itself (the device kernel ignores the label windows)
  DeviceScratch device;
  std::array<bool, kNumLinearRoles> lora{};
  // Mixture-of-Experts: per layer, a sparse MLP (ModelConfig::moe_layers); E experts, k per token,
  // each Fe wide (model/transformer_moe.cpp).
  std::vector<uint8_t> sparse;
  int64_t E = 0, k = 0, Fe = 0;
  bool router_lora = false;  // LoRA on the routers (model/lora.h LoraLayer::router_A)
  bool is_sparse(int64_t l) const {
    return l >= 0 && l < static_cast<int64_t>(sparse.size()) && sparse[static_cast<size_t>(l)];
  }
  int64_t in(LinearRole role) const {
    switch (role) {
      case LinearRole::O: return qd;
      case LinearRole::Down: return F;
      default: return D;
    }
  }
  int64_t out(LinearRole role) const {
    switch (role) {
      case LinearRole::Q: return qd;
      case LinearRole::K:
      case LinearRole::V: return kvd;
      case LinearRole::Gate:
      case LinearRole::Up: return F;
      default: return D;
    }
  }
  bool has_lora(LinearRole role) const { return lora[static_cast<size_t>(role)]; }
  // An input group whose LoRA products of x run once for the group (Model::lora_group_A): every
  // member adapted.
  bool grouped(const LinearInputGroup& g) const {
    for (int i = 0; i < g.count; ++i)
      if (!lora[static_cast<size_t>(g.first) + static_cast<size_t>(i)]) return false;
    return true;
  }
  // The group's xa columns: Σr, or a fused module's shared A's r (Model::lora_group_shared).
  int64_t group_r(const LinearInputGroup& g) const { return grouped(g) ? (fused_lora ? r : g.count * r) : 0; }
  // The scratch linear_forward / linear_backward allocate for a LoRA dropout kernel
  // (ops/linear.h lora_dropout_scratch_floats): the CPU's dropped input; the CUDA kernels take none.
  int64_t dropout_scratch(LinearRole role, bool backward) const {
    if (dropout <= 0 || device.cuda) return 0;
    return lora_dropout_scratch_floats(DeviceType::CPU, T, in(role), backward);
  }
};

// DoRA with dropout: the floats of one product against W on the dropped input (ops/linear.cpp
// dropped_base_forward / dropped_base_dx), beside z or (c − 1) ⊙ dy: the dropout kernel's scratch,
// and over a held W the [T, in] operand and the identity [in, in].
int64_t dora_dropout_floats(const Dims& m, LinearRole role, bool backward) {
  const int64_t in = m.in(role);
  return m.dropout_scratch(role, backward) + (m.device.held != DType::F32 ? m.T * in + in * in : 0);
}

// What one layer's forward keeps (ids into the replay), as Model::LayerActs.
struct Acts {
  Id x = -1;  // the layer input (owned by the caller's bookkeeping, freed with the acts)
  Id rstd1 = -1, xn = -1, q_pre = -1, k_pre = -1, rstd_q = -1, rstd_k = -1, q = -1, k = -1, v = -1;
  Id attn = -1, lse = -1, h = -1, rstd2 = -1, hn = -1, gate = -1, up = -1, m = -1;
  Id o_out = -1, rstd_o = -1, down_out = -1, rstd_f = -1;
  Id xn16 = -1, attn16 = -1, hn16 = -1, m16 = -1;  // full fine-tuning's bf16 copies, kept for dW
  std::array<Id, kNumLinearRoles> xa{-1, -1, -1, -1, -1, -1, -1};
  std::array<Id, kNumLinearRoles> dora{-1, -1, -1, -1, -1, -1, -1};  // DoRA's z, c and 1/n
  // A sparse layer: router logits, the routing (ids, weights), the dispatch (offsets, rows), and
  // in expert order gate, up, m and ys.
  Id logits = -1, ids = -1, weights = -1, dispatch = -1, moe_gate = -1, moe_up = -1, moe_m = -1, ys = -1;
  Id router_xa = -1;  // the router's LoRA xa [T, r]
};

// Model::moe_forward after hn: the router's logits, the routing and its dispatch, xs, gate and up
// (each expert's GEMM output a transient copied into its rows: at most T rows, one per token), m,
// ys (likewise), out = h's clone plus the scatter. Kept in `a` when keep, else freed at its end.
Id moe_fwd(Replay& R, const Dims& m, Acts& a, bool keep, Group g, Group out_group) {
  const Group kg = keep ? g : kWork;
  const int64_t N = m.T * m.k;
  a.logits = R.alloc(kg, m.T * m.E);
  R.transient_bytes(kWork, m.device.linear_gemm(m.T, m.D, m.E, false));
  if (m.router_lora) {  // its xa [T, r], kept or freed with the call
    a.router_xa = R.alloc(kg, m.T * m.r);
    if (m.dropout > 0 && !m.device.cuda)
      R.transient(kWork, lora_dropout_scratch_floats(DeviceType::CPU, m.T, m.D, false));
    if (!keep) R.free(a.router_xa);
  }
  a.ids = R.alloc_bytes(kg, static_cast<size_t>(N) * sizeof(int32_t));
  a.weights = R.alloc(kg, N);
  a.dispatch = R.alloc_bytes(kg, static_cast<size_t>(m.E + 1 + 2 * N) * sizeof(int32_t));
  Id xs = R.alloc(kWork, N * m.D);
  a.moe_gate = R.alloc(kg, N * m.Fe);
  a.moe_up = R.alloc(kg, N * m.Fe);
  R.transient(kWork, m.T * m.Fe);  // one expert's gate (then up) output before its copy
  // The experts' LoRA: each expert's xa [rows, r] (N rows in all per projection), kept or transient.
  // DoRA: each expert's z [rows, out], c and 1/n [out] (N rows and E experts in all), after its dora_scale.
  auto expert_xa = [&](LinearRole role) {
    const auto ri = static_cast<size_t>(role);
    if (!m.has_lora(role)) return;
    const int64_t out = role == LinearRole::Down ? m.D : m.Fe;
    if (m.dora) R.transient(kWork, 2 * m.r * out + 2 * m.r * m.r + out);
    if (keep) {
      a.xa[ri] = R.alloc(g, N * m.r);
      if (m.dora) a.dora[ri] = R.alloc(g, N * out + 2 * m.E * out);
    } else {
      R.transient(kWork, m.T * m.r + (m.dora ? m.T * out + 2 * out : 0));
    }
  };
  expert_xa(LinearRole::Gate), expert_xa(LinearRole::Up);
  R.free(xs);
  a.moe_m = R.alloc(kg, N * m.Fe);
  if (!keep) R.free(a.moe_gate), R.free(a.moe_up);
  a.ys = R.alloc(kg, N * m.D);
  R.transient(kWork, m.T * m.D);  // one expert's down output before its copy
  expert_xa(LinearRole::Down);
  Id out = R.alloc(out_group, m.T * m.D);
  if (!keep) R.free(a.logits), R.free(a.ids), R.free(a.weights), R.free(a.dispatch), R.free(a.moe_m), R.free(a.ys);
  return out;
}

// Model::moe_backward with dhn [T, D] live: the scatter's dys and dweights, down's dx (dm), SwiGLU's
// dgate and dup, xs gathered again and its gradient, the router's dlogits.
void moe_bwd(Replay& R, const Dims& m, Acts& a) {
  const int64_t N = m.T * m.k;
  Id dys = R.alloc(kWork, N * m.D), dweights = R.alloc(kWork, N);
  R.free(a.ys);
  Id dm = R.alloc(kWork, N * m.Fe);
  // An expert's dxa (DoRA: and its dy ⊙ c).
  if (m.has_lora(LinearRole::Down)) R.transient(kWork, m.T * m.r + (m.dora ? m.T * m.D : 0));
  R.free(dys), R.free(a.moe_m), R.free(a.xa[static_cast<size_t>(LinearRole::Down)]);
  R.free(a.dora[static_cast<size_t>(LinearRole::Down)]);
  Id dgate = R.alloc(kWork, N * m.Fe), dup = R.alloc(kWork, N * m.Fe);
  R.free(dm), R.free(a.moe_gate), R.free(a.moe_up);
  Id xs = R.alloc(kWork, N * m.D), dxs = R.alloc(kWork, N * m.D);
  if (m.has_lora(LinearRole::Gate) || m.has_lora(LinearRole::Up))
    R.transient(kWork, m.T * m.r + (m.dora ? m.T * m.Fe : 0));
  R.free(dgate), R.free(dup), R.free(xs);
  R.free(a.xa[static_cast<size_t>(LinearRole::Gate)]), R.free(a.xa[static_cast<size_t>(LinearRole::Up)]);
  R.free(a.dora[static_cast<size_t>(LinearRole::Gate)]), R.free(a.dora[static_cast<size_t>(LinearRole::Up)]);
  R.free(dxs);
  Id dlogits = R.alloc(kWork, m.T * m.E);
  R.transient_bytes(kWork, m.device.linear_gemm(m.T, m.D, m.E, true));
  if (m.router_lora) {  // the router's dxa [T, r] (and the dropout kernel's scratch)
    R.transient(kWork, m.T * m.r);
    if (m.dropout > 0 && !m.device.cuda)
      R.transient(kWork, lora_dropout_scratch_floats(DeviceType::CPU, m.T, m.D, true));
  }
  R.free(a.logits), R.free(a.ids), R.free(a.weights), R.free(a.dispatch), R.free(a.router_xa);
  R.free(dweights), R.free(dlogits);
}

// The weight a norm call multiplies by, made for the call (Model::norm_weight): [n] with Gemma's
// (1 + w), nothing (-1) otherwise. Freed after the op.
Id norm_w(Replay& R, const Dims& m, int64_t n) {
  return m.norm_offset ? R.alloc(kWork, n) : -1;
}

// A producer's bf16 copy of a GEMM input [n] (DeviceScratch::bf16_operands), or none (-1).
Id bf16_copy(Replay& R, const Dims& m, int64_t n, Group group = kWork) {
  return m.device.bf16_operands ? R.alloc_bytes(group, static_cast<size_t>(n) * 2) : -1;
}

// linear_forward: y, then (LoRA) xa, kept in `keep` or freed at the end of the op. x16: the bf16
// copy of x the producer made (-1: none, the GEMM rounds x itself). A grouped member's xa is the
// group's (group_fwd): none of its own.
Id linear_fwd(Replay& R, const Dims& m, LinearRole role, Group y_group, Acts* keep, Group keep_group, Id x16,
              bool in_group = false) {
  const bool given = x16 >= 0;
  Id y = R.alloc(y_group, m.T * m.out(role));
  Id dora = -1;
  if (m.dora && m.has_lora(role)) {  // ops/linear.cpp dora_scale, then z, c and 1/n
    R.transient(kWork, 2 * m.r * m.out(role) + 2 * m.r * m.r + m.out(role));
    dora = R.alloc(keep ? keep_group : kWork, m.T * m.out(role) + 2 * m.out(role));
    if (m.dropout > 0) R.transient(kWork, dora_dropout_floats(m, role, false));  // xd·Wᵀ into z
  }
  if (!m.has_lora(role) || in_group)
    R.transient_bytes(kWork, m.device.linear_gemm(m.T, m.in(role), m.out(role), false, given));
  if (m.has_lora(role) && !in_group) {
    const auto ri = static_cast<size_t>(role);
    Id xa = R.alloc(keep ? keep_group : kWork, m.T * m.r);
    if (m.dropout > 0) R.transient(kWork, m.dropout_scratch(role, false));                       // before the base GEMM
    R.transient_bytes(kWork, m.device.linear_gemm(m.T, m.in(role), m.out(role), false, given));  // the base GEMM
    if (keep)
      keep->xa[ri] = xa;
    else
      R.free(xa);
  }
  if (keep && dora >= 0)
    keep->dora[static_cast<size_t>(role)] = dora;
  else
    R.free(dora);
  return y;
}

// linear_backward's own temporaries (dx is allocated by the caller), then the transformer drops
// that projection's saved LoRA activations. dy16: dy's bf16 copy from its producer (-1: none); x16:
// x's, as the forward kept it (full fine-tuning).
void linear_bwd(Replay& R, const Dims& m, LinearRole role, Acts& a, Id dy16 = -1, Id x16 = -1, bool in_group = false) {
  const auto ri = static_cast<size_t>(role);
  const bool given = dy16 >= 0;
  Id dy_scaled = m.dora && m.has_lora(role) ? R.alloc(kWork, m.T * m.out(role)) : -1;  // DoRA's dy ⊙ c
  Id dy_dropped = -1;  // DoRA with dropout: (c − 1) ⊙ dy, live to the op's end; dropout'(·W) into dx
  if (m.dora && m.has_lora(role) && m.dropout > 0) {
    dy_dropped = R.alloc(kWork, m.T * m.out(role));
    R.transient(kWork, dora_dropout_floats(m, role, true));
  }
  // dx = dy·W; with a bf16 GEMM copy also dW += dyᵀ·x, the two sharing dy's bf16 copy.
  if (m.device.gemm_copies)
    R.transient_bytes(kWork, m.device.linear_dW(m.T, m.in(role), m.out(role), given, x16 >= 0));
  else
    R.transient_bytes(kWork, m.device.linear_gemm(m.T, m.in(role), m.out(role), true, given));
  if (m.has_lora(role) && !in_group) {  // a grouped member writes the group's dxa (backward_layer)
    Id dxa = R.alloc(kWork, m.T * m.r);
    R.transient(kWork, m.dropout_scratch(role, true));
    if (m.dropout > 0) R.transient_bytes(kWork, m.device.lora_dropout_dA(m.T, m.in(role), m.r));
    R.free(dxa);
  }
  R.free(dy_dropped);
  R.free(dy_scaled);
  R.free(a.xa[ri]);
  R.free(a.dora[ri]);
}

// lora_group_forward's xa_all [T, Σr] of a grouped input group, before its members' linear_forward:
// kept (as its last member's xa: the backward frees it there) or freed after the group. -1: not
// grouped.
Id group_fwd(Replay& R, const Dims& m, const LinearInputGroup& grp, Acts* keep, Group keep_group) {
  if (!m.grouped(grp)) return -1;
  Id xa_all = R.alloc(keep ? keep_group : kWork, m.T * m.group_r(grp));
  R.transient(kWork, m.dropout_scratch(grp.first, false));
  return xa_all;
}
// lora_group_backward's temporaries, while the group's dxa is live: with dropout the kernel's
// scratch (CPU) or the dA kernel's partials (CUDA), for r = Σr.
void group_bwd(Replay& R, const Dims& m, const LinearInputGroup& grp) {
  R.transient(kWork, m.dropout_scratch(grp.first, true));
  if (m.dropout > 0) R.transient_bytes(kWork, m.device.lora_dropout_dA(m.T, m.in(grp.first), m.group_r(grp)));
}
void group_fwd_done(Replay& R, const LinearInputGroup& grp, Id xa_all, Acts* keep) {
  if (xa_all < 0) return;
  const auto last = static_cast<size_t>(grp.first) + static_cast<size_t>(grp.count) - 1;
  if (keep)
    keep->xa[last] = xa_all;
  else
    R.free(xa_all);
}

// Model::forward_layer. keep = null: the checkpointed/inference path that frees as it goes.
// Returns the output, allocated in out_group.
Id forward_layer(Replay& R, const Dims& m, int64_t layer, Acts* keep, Group g, Group out_group) {
  const bool k = keep != nullptr;
  Acts local;
  Acts& a = k ? *keep : local;
  // Full fine-tuning keeps the producers' copies for dW's GEMMs and drops the f32 xn, hn and m
  // instead (Model::forward_layer done16).
  const bool keep16 = k && m.device.gemm_copies && m.device.bf16_operands;
  const Group g16 = keep16 ? g : kWork;
  auto done16 = [&](Id x16, Id& kept, Id* f32) {
    if (keep16) {
      kept = x16;
      if (f32) R.free(*f32);
    } else {
      R.free(x16);
    }
  };
  Id nw = norm_w(R, m, m.D);
  if (k) a.rstd1 = R.alloc(g, m.T);
  a.xn = R.alloc(g, m.T * m.D);
  Id x16 = bf16_copy(R, m, m.T * m.D, g16);
  R.free(nw);
  Id xa_all = group_fwd(R, m, kQkvGroup, keep, g);
  a.q = linear_fwd(R, m, LinearRole::Q, g, keep, g, x16, xa_all >= 0);
  a.k = linear_fwd(R, m, LinearRole::K, g, keep, g, x16, xa_all >= 0);
  a.v = linear_fwd(R, m, LinearRole::V, g, keep, g, x16, xa_all >= 0);
  done16(x16, a.xn16, &a.xn);
  group_fwd_done(R, kQkvGroup, xa_all, keep);
  if (m.qk_norm) {
    a.q_pre = a.q;
    nw = norm_w(R, m, m.d);
    if (k) a.rstd_q = R.alloc(g, m.T * m.Hq);
    a.q = R.alloc(g, m.T * m.qd);
    R.free(nw);
    if (!k) R.free(a.q_pre);
    a.k_pre = a.k;
    nw = norm_w(R, m, m.d);
    if (k) a.rstd_k = R.alloc(g, m.T * m.Hkv);
    a.k = R.alloc(g, m.T * m.kvd);
    R.free(nw);
    if (!k) R.free(a.k_pre);
  }
  a.attn = R.alloc(g, m.T * m.qd);
  if (k) a.lse = R.alloc(g, m.Hq * m.T);
  x16 = bf16_copy(R, m, m.T * m.qd, g16);
  R.transient(kWork, m.attn_fwd_scratch);
  if (!k) R.free(a.q), R.free(a.k), R.free(a.v);
  if (m.sandwich) {  // h = x + post_norm(o(attn))
    a.o_out = linear_fwd(R, m, LinearRole::O, g, keep, g, x16);
    nw = norm_w(R, m, m.D);
    if (k) a.rstd_o = R.alloc(g, m.T);
    a.h = R.alloc(g, m.T * m.D);
    R.free(nw);
    if (!k) R.free(a.o_out);
  } else {
    a.h = linear_fwd(R, m, LinearRole::O, g, keep, g, x16);
  }
  done16(x16, a.attn16, nullptr);
  if (!k) R.free(a.attn), R.free(a.xn);
  if (m.is_sparse(layer)) {  // Model::forward_layer's sparse branch
    if (k) a.rstd2 = R.alloc(g, m.T);
    a.hn = R.alloc(g, m.T * m.D);
    Id out = moe_fwd(R, m, a, k, g, out_group);
    if (!k) R.free(a.hn), R.free(a.h);
    return out;
  }
  nw = norm_w(R, m, m.D);
  if (k) a.rstd2 = R.alloc(g, m.T);
  a.hn = R.alloc(g, m.T * m.D);
  x16 = bf16_copy(R, m, m.T * m.D, g16);
  R.free(nw);
  xa_all = group_fwd(R, m, kGateUpGroup, keep, g);
  a.gate = linear_fwd(R, m, LinearRole::Gate, g, keep, g, x16, xa_all >= 0);
  a.up = linear_fwd(R, m, LinearRole::Up, g, keep, g, x16, xa_all >= 0);
  done16(x16, a.hn16, &a.hn);
  group_fwd_done(R, kGateUpGroup, xa_all, keep);
  if (!k) R.free(a.hn);
  x16 = bf16_copy(R, m, m.T * m.F, g16);
  a.m = R.alloc(g, m.T * m.F);
  if (!k) R.free(a.gate), R.free(a.up);
  Id out = -1;
  if (m.sandwich) {  // out = h + post_ffn_norm(down(m))
    a.down_out = linear_fwd(R, m, LinearRole::Down, g, keep, g, x16);
    nw = norm_w(R, m, m.D);
    if (k) a.rstd_f = R.alloc(g, m.T);
    out = R.alloc(out_group, m.T * m.D);
    R.free(nw);
    if (!k) R.free(a.down_out);
  } else {
    out = linear_fwd(R, m, LinearRole::Down, out_group, keep, g, x16);
  }
  done16(x16, a.m16, &a.m);
  if (!k) R.free(a.m), R.free(a.h);
  return out;
}

// backward_layer's dense MLP (down, SwiGLU, gate/up): returns dhn, the post-norm's dy.
Id dense_mlp_bwd(Replay& R, const Dims& m, Acts& a, Id& dout16) {
  Id ddown = -1;  // Gemma: down's dy, the post-feed-forward norm's dx (with its bf16 copy)
  if (m.sandwich) {
    ddown = R.alloc(kWork, m.T * m.D);
    Id nw = norm_w(R, m, m.D);
    dout16 = bf16_copy(R, m, m.T * m.D);
    R.free(nw);
    R.free(a.down_out), R.free(a.rstd_f);
  }
  Id dm = R.alloc(kWork, m.T * m.F);
  linear_bwd(R, m, LinearRole::Down, a, dout16, a.m16);
  R.free(dout16), R.free(ddown);
  R.free(a.m), R.free(a.m16);
  Id dgate = R.alloc(kWork, m.T * m.F), dup = R.alloc(kWork, m.T * m.F);
  Id dgate16 = bf16_copy(R, m, m.T * m.F), dup16 = bf16_copy(R, m, m.T * m.F);
  R.free(dm);
  R.free(a.gate), R.free(a.up);
  Id dhn = R.alloc(kWork, m.T * m.D);
  // A grouped input group's dxa [T, Σr], from before its first member to lora_group_backward.
  const bool gate_up = m.grouped(kGateUpGroup);
  Id dxa_all = gate_up ? R.alloc(kWork, m.T * m.group_r(kGateUpGroup)) : -1;
  linear_bwd(R, m, LinearRole::Gate, a, dgate16, a.hn16, gate_up);
  R.free(dgate), R.free(dgate16);
  linear_bwd(R, m, LinearRole::Up, a, dup16, a.hn16, gate_up);
  R.free(dup), R.free(dup16);
  if (gate_up) group_bwd(R, m, kGateUpGroup);
  R.free(dxa_all);
  return dhn;
}

// Model::backward_layer: dout live; its buffer becomes dh and then the layer's dx (returned: the
// same id), the dx of q/k/v and of gate/up are summed in place. Frees the activations as the code does; what
// the code leaves in LayerActs until the caller drops it (x, rstd1, rstd2, rstd_q, rstd_k) stays.
// dout16: dout's bf16 copy on entry (-1: none), the returned dx's on return (made when `below`, a
// layer under this one, reads it).
Id backward_layer(Replay& R, const Dims& m, int64_t layer, Acts& a, Id dout, Id& dout16, bool below) {
  Id dhn = -1;
  if (m.is_sparse(layer)) {
    dhn = R.alloc(kWork, m.T * m.D);
    moe_bwd(R, m, a);
    R.free(dout16);
  } else {
    dhn = dense_mlp_bwd(R, m, a, dout16);
  }
  R.free(a.hn), R.free(a.hn16);
  Id nw = norm_w(R, m, m.D);
  Id dh16 = m.sandwich ? -1 : bf16_copy(R, m, m.T * m.D);  // the post-norm backward's, o's dy
  R.free(nw);
  R.free(dhn);
  R.free(a.h);
  Id dattn = R.alloc(kWork, m.T * m.qd);
  Id do_out = -1;  // Gemma: o's dy, the post-attention norm's dx (with its bf16 copy)
  if (m.sandwich) {
    do_out = R.alloc(kWork, m.T * m.D);
    nw = norm_w(R, m, m.D);
    dh16 = bf16_copy(R, m, m.T * m.D);
    R.free(nw);
    R.free(a.o_out), R.free(a.rstd_o);
  }
  linear_bwd(R, m, LinearRole::O, a, dh16, a.attn16);
  R.free(dh16), R.free(a.attn16), R.free(do_out);
  Id dq = R.alloc(kWork, m.T * m.qd), dk = R.alloc(kWork, m.T * m.kvd), dv = R.alloc(kWork, m.T * m.kvd);
  Id dv16 = bf16_copy(R, m, m.T * m.kvd);  // the attention backward's, v's dy
  {
    Id delta = R.alloc(kWork, m.Hq * m.T);
    R.transient(kWork, m.attn_bwd_scratch);
    R.free(delta);
  }
  R.free(dattn);
  R.free(a.q), R.free(a.k), R.free(a.v), R.free(a.attn), R.free(a.lse);
  Id dq16 = -1, dk16 = -1;  // q's and k's dy: the q/k norms' backward writes them, else RoPE's
  if (m.qk_norm) {
    Id dq_pre = R.alloc(kWork, m.T * m.qd);
    nw = norm_w(R, m, m.d);
    dq16 = bf16_copy(R, m, m.T * m.qd);
    R.free(nw);
    R.free(dq);
    dq = dq_pre;
    Id dk_pre = R.alloc(kWork, m.T * m.kvd);
    nw = norm_w(R, m, m.d);
    dk16 = bf16_copy(R, m, m.T * m.kvd);
    R.free(nw);
    R.free(dk);
    dk = dk_pre;
    R.free(a.q_pre), R.free(a.k_pre);
  } else {
    dq16 = bf16_copy(R, m, m.T * m.qd);
    dk16 = bf16_copy(R, m, m.T * m.kvd);
  }
  Id dxn = R.alloc(kWork, m.T * m.D);
  const bool qkv = m.grouped(kQkvGroup);
  Id dxa_all = qkv ? R.alloc(kWork, m.T * m.group_r(kQkvGroup)) : -1;
  linear_bwd(R, m, LinearRole::Q, a, dq16, a.xn16, qkv);
  R.free(dq), R.free(dq16);
  linear_bwd(R, m, LinearRole::K, a, dk16, a.xn16, qkv);
  R.free(dk), R.free(dk16);
  linear_bwd(R, m, LinearRole::V, a, dv16, a.xn16, qkv);
  R.free(dv), R.free(dv16);
  if (qkv) group_bwd(R, m, kQkvGroup);
  R.free(dxa_all);
  R.free(a.xn), R.free(a.xn16);
  nw = norm_w(R, m, m.D);
  if (below && !m.sandwich) dout16 = bf16_copy(R, m, m.T * m.D);  // the input norm's backward, the down dy below
  R.free(nw);
  R.free(dxn);
  return dout;
}

void drop_acts(Replay& R, Acts& a) {
  R.free(a.x), R.free(a.rstd1), R.free(a.rstd2), R.free(a.rstd_q), R.free(a.rstd_k);
}

// Model::forward_backward.
std::array<size_t, kNumGroups> replay_forward_backward(const Dims& m, std::string* peak_phase) {
  Replay R;
  R.set_phase("forward");
  // The batch (model/transformer.h): tokens, positions and labels [T], cu_seqlens [S+1] (S <= T
  // samples), int32, live for the whole step (copied to the device when the model is there).
  Id batch = R.alloc_bytes(kSaved, static_cast<size_t>(4 * m.T + 1) * sizeof(int32_t));
  // Mixture-of-Experts: the load-balancing loss's statistics [E] x 2 (Model::MoeAux), live from
  // before the forward; its gradient [E] from after it.
  Id aux = m.sparse.empty() ? -1 : R.alloc(kSaved, 2 * m.E);
  Id x = R.alloc(kSaved, m.T * m.D);  // embedding output = input of layer 0
  std::vector<Id> inputs;
  std::vector<Acts> acts(static_cast<size_t>(m.L));
  for (int64_t l = 0; l < m.L; ++l) {
    R.set_phase(fmt::format("forward layer {}", l));
    if (m.ckpt) {
      inputs.push_back(x);
      x = forward_layer(R, m, l, nullptr, kWork, kSaved);
    } else {
      acts[static_cast<size_t>(l)].x = x;
      x = forward_layer(R, m, l, &acts[static_cast<size_t>(l)], kSaved, kSaved);
    }
  }
  Id aux_grad = m.sparse.empty() ? -1 : R.alloc(kSaved, m.E);
  R.set_phase("final norm and loss");
  Id final_nw = norm_w(R, m, m.D);  // live through the norm's forward and backward (train_pass)
  Id rstd = R.alloc(kWork, m.T);
  Id xf = R.alloc(kWork, m.T * m.D);
  Id dxf = R.alloc(kWork, m.T * m.D);
  if (m.device.cuda) {  // the kernel's own workspace (the front-end's chunk has no rows there)
    R.transient_bytes(kChunk, m.device.cross_entropy(m.T, m.ce_chunk_tokens, m.V, m.D));
  } else {
    // The chunk's logits; a head held in bf16 under a bf16 engine also rounds the logits' gradient
    // for dx = G·W while they live (backend/cpu/linear.cpp held_linear_backward: bf16 for oneDNN,
    // rounded and widened back to f32 for OpenBLAS).
    const size_t values = static_cast<size_t>(std::min(m.chunk, m.T) * m.V);
    R.transient_bytes(kChunk, values * (sizeof(float) + cpu_bf16_operand_bytes(m.device.head)));
  }
  R.free(xf);
  Id dx = R.alloc(kWork, m.T * m.D);
  Id dx16 = m.L > 0 && !m.sandwich ? bf16_copy(R, m, m.T * m.D) : -1;  // the final norm's backward, the top down's dy
  R.free(dxf), R.free(rstd), R.free(x), R.free(final_nw);
  for (int64_t l = m.L - 1; l >= 0; --l) {
    R.set_phase(fmt::format("backward layer {}", l));
    if (m.ckpt) {
      Acts a;
      a.x = inputs[static_cast<size_t>(l)];
      Id out = forward_layer(R, m, l, &a, kRecompute, kWork);
      R.free(out);
      dx = backward_layer(R, m, l, a, dx, dx16, l > 0);
      drop_acts(R, a);
    } else {
      dx = backward_layer(R, m, l, acts[static_cast<size_t>(l)], dx, dx16, l > 0);
      drop_acts(R, acts[static_cast<size_t>(l)]);
    }
  }
  R.free(aux), R.free(aux_grad);  // Model::train_pass drops them before the embedding's backward
  R.free(dx);
  R.free(batch);
  *peak_phase = R.peak_phase();
  return R.at_peak();
}

// Does the LoRA adapt the routers ("gate", or all-linear on a Mixture-of-Experts model)?
bool router_targeted(const ModelConfig& c, const LoraConfig& lora) {
  LoraConfig on = lora;
  on.moe = c.is_moe();
  return on.targets_router();
}

int64_t base_parameters(const ModelConfig& c) {
  return c.num_parameters();  // every expert of a sparse layer included
}

Dims dims_of(const ModelConfig& c, const MemorySettings& s) {
  Dims m{};
  m.T = s.micro_batch_tokens;
  m.D = c.hidden_size;
  m.F = c.intermediate_size;
  m.V = c.vocab_size;
  m.qd = c.q_dim();
  m.kvd = c.kv_dim();
  m.Hq = c.num_heads;
  m.Hkv = c.num_kv_heads;
  m.d = c.head_dim;
  m.L = c.num_layers;
  m.chunk = s.ce_window_tokens > 0 ? std::min(s.ce_chunk_tokens, s.ce_window_tokens) : s.ce_chunk_tokens;
  m.qk_norm = c.qk_norm;
  m.sandwich = c.sandwich_norms;
  m.norm_offset = c.norm_weight_offset != 0.0f;
  m.ckpt = s.gradient_checkpointing;
  const bool lora = s.mode == TrainMode::Lora;
  m.r = lora ? s.lora.r : 0;
  m.fused_lora = lora && c.fused_projections();
  m.dropout = lora ? s.lora.dropout : 0.0f;
  m.dora = lora && s.lora.use_dora;
  for (int t = 0; t < kNumLinearRoles; ++t)
    m.lora[static_cast<size_t>(t)] = lora && s.lora.targets(static_cast<LoraTarget>(t));
  m.ce_chunk_tokens = s.ce_chunk_tokens;
  m.sparse = c.moe_layers;
  m.E = c.num_experts;
  m.k = c.num_experts_per_tok;
  m.Fe = c.moe_intermediate_size;
  m.router_lora = lora && c.is_moe() && router_targeted(c, s.lora);
  m.device.cuda = s.device == DeviceType::CUDA;
  const bool copies = s.mode == TrainMode::Full && s.matmul_dtype == DType::BF16;
  m.device.gemm_copies = copies;
  m.device.held = lora ? s.base_dtype : copies ? DType::BF16 : DType::F32;
  m.device.head = lora ? s.head_dtype : copies ? DType::BF16 : DType::F32;
  m.device.f16 = m.device.cuda && ops::cuda_frozen_gemms_in_f16();
  m.device.f32_panels = m.device.f16 && s.frozen_f32_panels;
  m.device.bf16_operands = m.device.cuda && !m.device.f16 && m.device.held != DType::F32;
  if (m.device.cuda) return m;  // attention tiles live in shared memory on the device
  const int threads = s.threads > 0 ? s.threads : omp_get_max_threads();
  // Attention scratch (ops/attention.h), bounded by one sample spanning the micro-batch: the largest
  // layer's, a full-attention one unless every layer has a window (then the widest window's).
  AttentionShape attn = c.attention_shape(0);
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const AttentionShape layer = c.attention_shape(l);
    attn.window = attn.window == 0 || layer.window == 0 ? 0 : std::max(attn.window, layer.window);
  }
  m.attn_fwd_scratch = attention_forward_scratch_floats(m.T, attn, threads);
  m.attn_bwd_scratch = attention_backward_scratch_floats(m.T, attn, threads);
  return m;
}

// The replay adds up int64 sizes of T x (a model width) floats over every layer. ModelConfig keeps
// the weights below 2^48 parameters, but T (micro-batch x sequence length, up to 2^44 from the
// settings' bounds) times a width can still overflow 64 bits. This over-estimates, in long double,
// the sum of every allocation the replay makes (about 128 per layer, none wider than T x widest);
// past kMaxPlanBytes the plan is not computed. The answer is the estimate when too large, else 0.
constexpr long double kMaxPlanBytes = 1.0e18L;  // ~2^60: far past any memory, far below 2^63

long double plan_bytes_bound(const ModelConfig& c, const MemorySettings& s) {
  const long double T = static_cast<long double>(s.micro_batch_tokens);
  const long double widest = static_cast<long double>(
      std::max({c.hidden_size, c.intermediate_size, c.q_dim(), c.kv_dim(), c.num_heads, s.lora.r,
                c.num_experts_per_tok * std::max(c.moe_intermediate_size, c.hidden_size), c.num_experts}));
  const long double chunk = std::min<long double>(T, static_cast<long double>(s.ce_chunk_tokens));
  const long double threads = 4096;  // the settings' largest thread count
  const long double floats = T * widest * (128.0L * static_cast<long double>(c.num_layers) + 64.0L) +
                             chunk * static_cast<long double>(c.vocab_size) + threads * 4.0L * T * std::min(T, 4096.0L);
  // Weights, gradients and AdamW state: 16 bytes a parameter at most; LoRA adds r x (in + out) per
  // target (7 of them) and layer.
  const long double lora = 14.0L * static_cast<long double>(s.lora.r) * widest * static_cast<long double>(c.num_layers);
  return 4.0L * floats + 16.0L * (static_cast<long double>(base_parameters(c)) + lora);
}

}  // namespace

size_t gemm_copy_bytes(const ModelConfig& c) {
  const int64_t D = c.hidden_size, F = c.intermediate_size, qd = c.q_dim(), kvd = c.kv_dim();
  const int64_t layer = qd * D + 2 * kvd * D + D * qd + 3 * F * D;
  return static_cast<size_t>(c.num_layers * layer + c.vocab_size * D) * 2;
}

nlohmann::json MemoryPlan::to_json() const {
  return {{"weights", weights},
          {"trainable", trainable},
          {"gradients", gradients},
          {"optimizer_state", optimizer_state},
          {"gemm_workspace", gemm_workspace},
          {"saved_activations", saved_activations},
          {"recompute_buffers", recompute_buffers},
          {"cross_entropy_chunk", cross_entropy_chunk},
          {"workspace", workspace},
          {"activations", activations()},
          {"total", total()},
          {"process", process},
          {"resident", resident()},
          {"trainable_parameters", trainable_parameters},
          {"peak_phase", peak_phase}};
}

MemoryPlan plan_memory(const ModelConfig& cfg, const MemorySettings& s) {
  if (s.micro_batch_tokens < 1)
    throw Error(ErrorCode::INPUT_VALIDATION_FAILED,
                fmt::format("[memory_plan] micro-batch tokens must be >= 1, got {}", s.micro_batch_tokens));
  if (s.ce_chunk_tokens < 1)
    throw Error(ErrorCode::INPUT_VALIDATION_FAILED,
                fmt::format("[memory_plan] cross-entropy chunk must be >= 1 token, got {}", s.ce_chunk_tokens));
  if (s.mode == TrainMode::Lora) s.lora.validate_for(cfg);  // the names fit the model (MoE: no expert targets)
  if (const long double bound = plan_bytes_bound(cfg, s); bound > kMaxPlanBytes)
    throw Error(
        ErrorCode::INPUT_VALIDATION_FAILED,
        fmt::format("[memory_plan] a micro-batch of {} tokens (micro-batch size x max_seq_length) with a widest "
                    "tensor of {} (hidden_size, intermediate_size or num_attention_heads x head_dim) over {} "
                    "layers needs about {:.3g} bytes, past what the plan can count ({:.3g})",
                    s.micro_batch_tokens, std::max({cfg.hidden_size, cfg.intermediate_size, cfg.q_dim(), cfg.kv_dim()}),
                    cfg.num_layers, static_cast<double>(bound), static_cast<double>(kMaxPlanBytes)),
        {{"micro_batch_tokens", s.micro_batch_tokens}});
  MemoryPlan p;
  const int64_t base = base_parameters(cfg);
  int64_t trainable = 0;
  int64_t dora_rows = 0;  // DoRA: Σ out over the adapted projections of every layer
  if (s.mode == TrainMode::Full) {
    trainable = base;
  } else if (s.mode == TrainMode::Lora) {
    const bool router = router_targeted(cfg, s.lora);
    for (int64_t l = 0; l < cfg.num_layers; ++l) {
      if (router && cfg.is_moe_layer(l))  // the router's A [r, D] and B [E, r]
        trainable += s.lora.r * (cfg.hidden_size + cfg.num_experts);
      for (auto t : kAllLoraTargets) {
        if (!s.lora.targets(t)) continue;
        if (cfg.is_moe_layer(l) && expert_projection(t) >= 0) {  // every expert's A [r, in] and B [out, r]
          trainable += cfg.num_experts * s.lora.r * (cfg.hidden_size + cfg.moe_intermediate_size);
          if (s.lora.use_dora)  // and DoRA's magnitude [out]
            dora_rows += cfg.num_experts * (t == LoraTarget::Down ? cfg.hidden_size : cfg.moe_intermediate_size);
          continue;
        }
        // A fused module (Phi-3's qkv_proj, gate_up_proj) has one A: counted with its first member.
        const LoraFusedModule* fm = cfg.fused_projections() ? lora_fused_module_of(t) : nullptr;
        const bool shared_a = fm && fm->first != t;
        trainable += s.lora.r * ((shared_a ? 0 : lora_target_in(cfg, t)) + lora_target_out(cfg, t));
        if (s.lora.use_dora) dora_rows += lora_target_out(cfg, t);
      }
    }
    trainable += dora_rows;  // DoRA's magnitudes [out]
  }
  const size_t f = sizeof(float);
  p.trainable_parameters = trainable;
  if (s.mode == TrainMode::Full && s.matmul_dtype == DType::BF16) p.weights = gemm_copy_bytes(cfg);
  if (s.mode != TrainMode::Full)
    p.weights = s.weights_bytes > 0          ? s.weights_bytes
                : s.base_dtype == DType::F32 ? static_cast<size_t>(base) * f
                                             : held_weight_bytes(cfg, s.base_dtype);
  // Gemma's (1 + w) norms: the model's one vector of offsets (Model::norm_weight).
  if (cfg.norm_weight_offset != 0.0f) p.weights += static_cast<size_t>(std::max(cfg.hidden_size, cfg.head_dim)) * f;
  // DoRA: each adapted projection's ||W_j||² [out] beside the frozen weights (Model::attach_lora).
  p.weights += static_cast<size_t>(dora_rows) * f;
  // PiSSA: the initial A and B, kept on the host for the conversion at save (model/lora.h).
  if (s.mode == TrainMode::Lora && s.lora.pissa() && s.device == DeviceType::CPU)
    p.weights += static_cast<size_t>(trainable - dora_rows) * f;
  p.trainable = static_cast<size_t>(trainable) * f;
  p.gradients = p.trainable;
  const size_t shards = static_cast<size_t>(std::max(1, s.optimizer_shards));
  p.optimizer_state = s.optimizer ? 2 * ((static_cast<size_t>(trainable) + shards - 1) / shards) * f : 0;
  p.gemm_workspace = s.device == DeviceType::CUDA ? s.gemm_workspace_bytes : 0;
  const Dims dims = dims_of(cfg, s);
  const auto groups = replay_forward_backward(dims, &p.peak_phase);
  p.saved_activations = groups[kSaved];
  p.recompute_buffers = groups[kRecompute];
  p.cross_entropy_chunk = groups[kChunk];
  if (!dims.device.cuda)
    p.cross_entropy_value_bytes = static_cast<int64_t>(sizeof(float) + cpu_bf16_operand_bytes(dims.device.head));
  p.workspace = groups[kWork];
  return p;
}

int64_t max_micro_batch_tokens(const ModelConfig& cfg, const MemorySettings& settings, size_t limit_bytes,
                               int64_t max_tokens) {
  MemorySettings s = settings;
  auto fits = [&](int64_t T) {
    s.micro_batch_tokens = T;
    if (plan_bytes_bound(cfg, s) > kMaxPlanBytes) return false;  // far past any limit_bytes
    return plan_memory(cfg, s).total() <= limit_bytes;
  };
  if (max_tokens < 1 || !fits(1)) return 0;
  int64_t lo = 1, hi = max_tokens;  // fits(lo) holds
  if (fits(hi)) return hi;
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    (fits(mid) ? lo : hi) = mid;
  }
  return lo;
}

}  // namespace bp
