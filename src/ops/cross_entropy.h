// Fused linear + cross-entropy: loss over logits = x·Wᵀ without ever holding [T × V] logits.
//
// x [T, D], W [V, D] (the LM head, or the tied embedding), labels i32 [T] with −100 = ignore.
// Tokens are processed in chunks of `chunk_tokens` rows: logits for one chunk [chunk, V] exist
// at a time (fewer rows when labels are −100: see linear_cross_entropy_workspace_rows). loss_sum = Σ over counted
// tokens of (logsumexp(logits) − logit[label]). Labels outside [0, V) other than −100 throw INPUT_VALIDATION_FAILED.
//
// Gradients are produced in the same pass (the chunk's logits are turned into softmax − onehot
// in place, then dx and dW are two GEMMs), so backward costs no recomputed logits:
//   dx  (=)  = grad_scale · (softmax − onehot)·W
//   dW  (+=) = grad_scale · (softmax − onehot)ᵀ·x     (only when dW is given: trainable head, W
//                                                      f32 or its bf16 GEMM copy, dW f32)
// grad_scale is normally 1 / (label tokens in the whole optimizer step), so micro-batches add
// up to the gradient of the step's mean loss.
// softcap > 0 (Gemma 2's final_logit_softcapping): the loss is over softcap·tanh(logits/softcap),
// and the gradients through it (times 1 − tanh²); still no [T × V] logits (CPU and CUDA kernels).
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace bp {

// The label of a token that takes no loss (PyTorch's ignore_index): the one constant every layer uses.
inline constexpr int32_t kIgnoreLabel = -100;

struct CrossEntropyResult {
  double loss_sum = 0.0;  // summed over counted tokens
  int64_t n_counted = 0;  // labels != −100
  double mean() const { return n_counted ? loss_sum / static_cast<double>(n_counted) : 0.0; }
};

constexpr int64_t kDefaultCrossEntropyChunk = 256;

// Loss only (evaluation).
CrossEntropyResult linear_cross_entropy_forward(const Tensor& x, const Tensor& W, const Tensor& labels,
                                                int64_t chunk_tokens = kDefaultCrossEntropyChunk, float softcap = 0.0f);
// Loss and gradients in one pass. dx must be [T, D] (overwritten); dW may be null.
CrossEntropyResult linear_cross_entropy_forward_backward(const Tensor& x, const Tensor& W, const Tensor& labels,
                                                         float grad_scale, Tensor& dx, Tensor* dW,
                                                         int64_t chunk_tokens = kDefaultCrossEntropyChunk,
                                                         float softcap = 0.0f);
// Bytes of workspace the op allocates (the logits chunk) when every token has a label: the most
// it can need, min(chunk, tokens)·V floats.
size_t linear_cross_entropy_workspace_bytes(int64_t tokens, int64_t vocab, int64_t chunk_tokens);
// Rows (of V floats) of the workspace the op really allocates for these labels (i32 [tokens]):
// logits exist only for windows of at most chunk_tokens rows from a labelled token to the last
// labelled one within them, so spans of −100 (SFT prompts) cost no rows. 0 when no label counts.
int64_t linear_cross_entropy_workspace_rows(const int32_t* labels, int64_t tokens, int64_t chunk_tokens);

// Full logits for inference/tests (x·Wᵀ), [T, V]; softcap > 0: softcap·tanh(x·Wᵀ/softcap).
Tensor lm_head_logits(const Tensor& x, const Tensor& W, float softcap = 0.0f);

}  // namespace bp
