// Fused linear + cross-entropy on the CPU.
//
// Tokens are walked in windows of at most `chunk` rows. A window starts at the next token with a
// label (ignored tokens before it are skipped outright) and is trimmed after its last labelled
// token, so spans of −100 labels (prompts in SFT) cost no GEMM work. For each window:
//   1. logits[c, V] = x_w · Wᵀ                       (the only [c × V] buffer)
//   2. per row (OpenMP): max, lse = max + log Σ exp(l − max), loss = lse − l[label];
//      with gradients the row becomes grad_scale·(softmax − onehot) in place (zero if ignored)
//   3. dx_w = G · W  (beta 0)   and   dW += Gᵀ · x_w  (sgemm, beta 1)
// The two products against W are a held linear's (linear.h held_linear_forward / _backward): sgemm
// for an f32 W; for a W held in bf16 (a frozen tied embedding over a bf16 base, or full training's
// bf16 GEMM copy of the head) the engine's bf16 numerics (gemm_engine.h: x and G rounded to bf16,
// f32 accumulation, oneDNN where the CPU has bf16 dot products), as the CUDA head's bf16
// instantiation computes them; f16 and block types are widened to f32 tiles (quant_gemm.h).
// The per-row losses are summed in row order in double, so results do not depend on threads.
// Final logit soft-capping (Gemma 2, softcap > 0): step 2 first turns each row l into
// c = softcap·tanh(l/softcap) and keeps its tanh, then multiplies the gradient row by
// dc/dl = 1 − tanh² (the row's copy of the tanh: V floats per row, on the stack of its task). The
// tanh is the kernel variant's softcap (tanh_approx_t in vector lanes; std::tanh per logit was a
// third of a Gemma 2 step at a 49k vocabulary).
#include "backend/cpu/cross_entropy.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "backend/cpu/gemm.h"
#include "backend/cpu/kernel_variants.h"
#include "backend/cpu/linear.h"
#include "backend/cpu/quant_gemm.h"

namespace bp::cpu {

// One row of logits -> its loss, and (when make_grad) the gradient row in place. The row is a
// workspace either way: exp(l − max) is written into it (the vectorised kernels, kernel_variants.h).
static double softmax_row(const KernelTable& kern, float* row, int64_t V, int32_t label, float grad_scale,
                          bool make_grad) {
  if (label < 0) {  // ignored token inside a window: no loss, zero gradient row
    if (make_grad) std::memset(row, 0, static_cast<size_t>(V) * sizeof(float));
    return 0.0;
  }
  const double label_logit = row[label];
  const float mx = kern.row_max(row, V);
  const float sum = kern.exp_shifted_sum(row, V, mx);
  const double lse = static_cast<double>(mx) + std::log(static_cast<double>(sum));
  if (make_grad) {
    kern.scale(row, V, grad_scale / sum);
    row[label] -= grad_scale;
  }
  return lse - label_logit;
}

CrossEntropyWindow cross_entropy_window(const int32_t* labels, int64_t T, int64_t t, int64_t chunk) {
  int64_t begin = t;
  while (begin < T && labels[begin] < 0) ++begin;
  if (begin == T) return {T, T};
  int64_t end = std::min(begin + chunk, T);
  while (labels[end - 1] < 0) --end;
  return {begin, end};
}

int64_t cross_entropy_max_window(const int32_t* labels, int64_t T, int64_t chunk) {
  int64_t most = 0;
  for (int64_t t = 0; t < T;) {
    const CrossEntropyWindow w = cross_entropy_window(labels, T, t, chunk);
    most = std::max(most, w.end - w.begin);
    t = w.end;
  }
  return most;
}

CrossEntropyTotals linear_cross_entropy(const float* x, const HeldMatrix& Wm, const int32_t* labels, int64_t T,
                                        int64_t D, int64_t V, int64_t chunk, float* logits, float grad_scale, float* dx,
                                        float* dW, float softcap) {
  CrossEntropyTotals totals;
  const bool make_grad = dx != nullptr || dW != nullptr;
  std::vector<double> row_loss(static_cast<size_t>(std::min(chunk, T)));
  const KernelTable& kern = cpu_kernels();
  // f32 W goes straight to sgemm; a held W through the held linear's engine (see the top).
  const bool held = Wm.type != DType::F32;
  const float* W = held ? nullptr : static_cast<const float*>(Wm.data);
  int64_t t = 0;
  while (t < T) {
    // Skip ignored tokens (their dx rows are zero), then take a window of at most `chunk` rows
    // trimmed after its last labelled token.
    const CrossEntropyWindow win = cross_entropy_window(labels, T, t, chunk);
    const int64_t begin = win.begin, end = win.end;
    if (dx) std::memset(dx + t * D, 0, static_cast<size_t>((begin - t) * D) * sizeof(float));
    if (begin == T) break;
    const int64_t c = end - begin;
    const float* xw = x + begin * D;

    if (held)
      held_linear_forward(xw, nullptr, Wm, 0.0f, nullptr, logits, c);
    else
      sgemm(false, true, c, V, D, 1.0f, xw, D, W, D, 0.0f, logits, V);
#pragma omp parallel for schedule(static) if (c * V >= (int64_t{1} << 16))
    for (int64_t i = 0; i < c; ++i) {
      float* row = logits + i * V;
      std::vector<float> th;  // softcap: the row's tanh(l/softcap)
      if (softcap > 0.0f) {
        th.resize(static_cast<size_t>(V));
        kern.softcap(row, th.data(), V, softcap);
      }
      row_loss[static_cast<size_t>(i)] = softmax_row(kern, row, V, labels[begin + i], grad_scale, make_grad);
      if (make_grad && softcap > 0.0f)
        for (int64_t j = 0; j < V; ++j) row[j] *= 1.0f - th[static_cast<size_t>(j)] * th[static_cast<size_t>(j)];
    }
    for (int64_t i = 0; i < c; ++i) {
      totals.loss_sum += row_loss[static_cast<size_t>(i)];
      totals.n_counted += labels[begin + i] >= 0 ? 1 : 0;
    }
    if (dx && held) held_linear_backward(logits, nullptr, nullptr, nullptr, Wm, 0.0f, dx + begin * D, nullptr, c);
    if (dx && !held) sgemm(false, false, c, D, V, 1.0f, logits, V, W, D, 0.0f, dx + begin * D, D);
    // dW does not read W: the same product for an f32 head and a bf16 GEMM copy of one.
    if (dW) sgemm(true, false, V, D, c, 1.0f, logits, V, xw, D, 1.0f, dW, D);
    t = end;
  }
  return totals;
}

}  // namespace bp::cpu
