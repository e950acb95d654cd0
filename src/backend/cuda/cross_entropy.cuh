// CUDA fused linear + cross-entropy (contract: ops/cross_entropy.h; CPU sibling:
// backend/cpu/cross_entropy.cpp). x [T, D] and W [V, D] stored as T (f32 or bf16), labels [T]
// (−100 = ignored, else in [0, V): validated by the front-end), dx [T, D] as T, dW [V, D] f32.
// Tokens are walked in windows of `chunk` rows; a window with no label costs nothing. Per window:
//   1. logits[c, V] (f32) = x_w · Wᵀ                      GEMM (cuBLASLt), f32 accumulation
//   2. one block per row: max, Σ exp(l − max) (block reductions, f32), loss = lse − l[label];
//      grad row = grad_scale·(softmax − onehot) stored as T (zero for ignored rows)
//      softcap > 0 (Gemma 2's final_logit_softcapping): the row's logits l are c = softcap·tanh(l/softcap)
//      (recomputed from l in each pass) and the gradient row is multiplied by 1 − tanh²
//   3. dx_w = G · W (GEMM, beta 0),  dW += Gᵀ · x_w (GEMM, beta 1)
// Logits stay f32 (a softmax over ~150k classes in bf16 loses the small probabilities); the
// gradient G is stored as T because both backward GEMMs read it beside a T operand (cuBLASLt
// wants A and B of one type). Row losses are summed in row order in double on the device, as the
// CPU does on the host, and the total is copied back once per call (the only wait for the card). Workspace:
// cross_entropy_workspace_bytes() of device memory, and cuBLASLt's (gemm_workspace, handed to every GEMM).
// linear_cross_entropy_held: the same for a frozen head held quantized (or bf16/f16) with f32
// activations, W dequantized panel by panel inside both GEMMs (dequant.cuh).
#pragma once

#include <vector>

#include "backend/cuda/dequant.cuh"
#include "backend/cuda/gemm.cuh"

namespace bp::BP_CUDA_NS {

struct CrossEntropyResult {
  double loss_sum = 0.0;
  int64_t n_counted = 0;
};

// Workspace layout: logits [chunk, V] f32, their gradient [chunk, V] T, the row losses [chunk] f32,
// then (8-byte aligned) the call's loss total, one double.
template <class T>
size_t cross_entropy_loss_total_offset(int64_t chunk, int64_t V) {
  const size_t rows = static_cast<size_t>(chunk) * V * (sizeof(float) + sizeof(T)) + static_cast<size_t>(chunk) * 4;
  return (rows + sizeof(double) - 1) / sizeof(double) * sizeof(double);
}
template <class T>
size_t cross_entropy_workspace_bytes(int64_t chunk, int64_t V) {
  return cross_entropy_loss_total_offset<T>(chunk, V) + sizeof(double);
}

// *total += the window's row losses, one after another in double: the host's order and rounding
// (the CPU kernel's, and this kernel's before the sum moved to the device), with no copy back.
__global__ void add_row_losses_kernel(const float* row_loss, int64_t c, double* total) {
  double s = *total;
  for (int64_t r = 0; r < c; ++r) s += row_loss[r];
  *total = s;
}

template <class T>
constexpr gemm::DType gemm_type_of() {
  return sizeof(T) == 4 ? gemm::DType::F32 : gemm::DType::BF16;
}

template <class T>
__global__ void softmax_cross_entropy_kernel(const float* logits, const int32_t* labels, int64_t V, float grad_scale,
                                             T* grad, float* row_loss, float softcap) {
  __shared__ float scratch[32];
  const float* row = logits + blockIdx.x * V;
  const int32_t label = labels[blockIdx.x];
  T* grow = grad ? grad + blockIdx.x * V : nullptr;
  if (label < 0) {  // ignored token: no loss, zero gradient row (uniform per block: no divergence)
    if (grow)
      for (int64_t i = threadIdx.x; i < V; i += blockDim.x) grow[i] = store_from_f32<T>(0.0f);
    if (threadIdx.x == 0) row_loss[blockIdx.x] = 0.0f;
    return;
  }
  auto logit = [&](int64_t i) { return softcap > 0.0f ? softcap * tanhf(row[i] / softcap) : row[i]; };
  float mx = -INFINITY;
  for (int64_t i = threadIdx.x; i < V; i += blockDim.x) mx = fmaxf(mx, logit(i));
  mx = block_max(mx, scratch);
  float sum = 0.0f;
  for (int64_t i = threadIdx.x; i < V; i += blockDim.x) sum += expf(logit(i) - mx);
  sum = block_sum(sum, scratch);
  if (threadIdx.x == 0) row_loss[blockIdx.x] = mx + logf(sum) - logit(label);
  if (grow) {
    const float scale = grad_scale / sum;
    for (int64_t i = threadIdx.x; i < V; i += blockDim.x) {
      const float l = logit(i);
      float g = expf(l - mx) * scale - (i == label ? grad_scale : 0.0f);
      if (softcap > 0.0f) g *= 1.0f - (l / softcap) * (l / softcap);
      grow[i] = store_from_f32<T>(g);
    }
  }
}

// The window loop of both heads. logits_of(x_w, c, logits) writes the window's [c, V] f32 logits;
// dx_of(grad, c, dx_w) writes its [c, D] rows of dx = G·W (overwritten).
template <class T, class LogitsFn, class DxFn>
CrossEntropyResult cross_entropy_windows(const T* x, const int32_t* labels, const int32_t* labels_host,
                                         int64_t T_tokens, int64_t D, int64_t V, int64_t chunk, void* workspace,
                                         float grad_scale, T* dx, float* dW, gemm::Workspace gemm_workspace,
                                         cudaStream_t stream, float softcap, LogitsFn&& logits_of, DxFn&& dx_of) {
  CrossEntropyResult result;
  float* logits = static_cast<float*>(workspace);
  T* grad = reinterpret_cast<T*>(logits + chunk * V);
  float* row_loss = reinterpret_cast<float*>(grad + chunk * V);
  double* loss_total =
      reinterpret_cast<double*>(static_cast<char*>(workspace) + cross_entropy_loss_total_offset<T>(chunk, V));
  const bool make_grad = dx || dW;
  cudaMemsetAsync(loss_total, 0, sizeof(double), stream);
  for (int64_t t0 = 0; t0 < T_tokens; t0 += chunk) {
    const int64_t c = std::min(chunk, T_tokens - t0);
    int64_t counted = 0;
    for (int64_t t = t0; t < t0 + c; ++t) counted += labels_host[t] >= 0;
    if (counted == 0) {  // nothing to learn here: dx rows are zero, dW unchanged
      if (dx) cudaMemsetAsync(dx + t0 * D, 0, static_cast<size_t>(c * D) * sizeof(T), stream);
      continue;
    }
    logits_of(x + t0 * D, c, logits);
    BP_LAUNCH(static_cast<unsigned>(c), 256, 0, stream, softmax_cross_entropy_kernel<T>)
    (logits, labels + t0, V, grad_scale, make_grad ? grad : nullptr, row_loss, softcap);
    if (dx) dx_of(static_cast<const T*>(grad), c, dx + t0 * D);
    if (dW)
      gemm(gemm::linear_dW_gemm(c, D, V, gemm_type_of<T>()), x + t0 * D, grad, dW, gemm_workspace.ptr,
           gemm_workspace.bytes, stream);
    BP_LAUNCH(1, 1, 0, stream, add_row_losses_kernel)(row_loss, c, loss_total);
    result.n_counted += counted;
  }
  if (result.n_counted > 0) {  // the call's one wait for the card: its loss
    cudaMemcpyAsync(&result.loss_sum, loss_total, sizeof(double), cudaMemcpyDeviceToHost, stream);
    cudaStreamSynchronize(stream);
  }
  return result;
}

// labels_host: the same labels in host memory (windows are chosen on the host).
template <class T>
CrossEntropyResult linear_cross_entropy(const T* x, const T* W, const int32_t* labels, const int32_t* labels_host,
                                        int64_t T_tokens, int64_t D, int64_t V, int64_t chunk, void* workspace,
                                        float grad_scale, T* dx, float* dW, gemm::Workspace gemm_workspace,
                                        cudaStream_t stream = nullptr, float softcap = 0.0f) {
  constexpr auto tt = gemm_type_of<T>();
  const gemm::Workspace& ws = gemm_workspace;
  return cross_entropy_windows<T>(
      x, labels, labels_host, T_tokens, D, V, chunk, workspace, grad_scale, dx, dW, ws, stream, softcap,
      [&](const T* xw, int64_t c, float* logits) {
        gemm(gemm::linear_forward_gemm(c, D, V, tt, gemm::DType::F32), W, xw, logits, ws.ptr, ws.bytes, stream);
      },
      [&](const T* grad, int64_t c, T* dxw) {
        gemm(gemm::linear_dx_gemm(c, D, V, tt, tt), W, grad, dxw, ws.ptr, ws.bytes, stream);
      });
}

// A frozen head held in its stored type (bf16, f16, q8_0, q4_K, ...: dequant.cuh), f32 activations,
// no dW (held weights get no gradient, as on the CPU): both GEMMs walk W in panels of `panel_rows` rows, each
// dequantized into the workspace's tail, so no f32 copy of the whole [V, D] head ever exists. Workspace:
// cross_entropy_held_workspace_bytes().
BP_HOST_FN size_t cross_entropy_held_workspace_bytes(int64_t chunk, int64_t V, int64_t D, int64_t panel_rows) {
  return cross_entropy_workspace_bytes<float>(chunk, V) + static_cast<size_t>(panel_rows * D) * sizeof(float);
}
BP_HOST_FN CrossEntropyResult linear_cross_entropy_held(const float* x, DType w_type, const void* W,
                                                        const int32_t* labels, const int32_t* labels_host,
                                                        int64_t T_tokens, int64_t D, int64_t V, int64_t chunk,
                                                        int64_t panel_rows, void* workspace, float grad_scale,
                                                        float* dx, gemm::Workspace gemm_workspace,
                                                        cudaStream_t stream = nullptr, float softcap = 0.0f) {
  const gemm::Workspace& ws = gemm_workspace;
  float* panel =
      reinterpret_cast<float*>(static_cast<char*>(workspace) + cross_entropy_workspace_bytes<float>(chunk, V));
  auto for_each_panel = [&](auto&& fn) {
    for (int64_t v0 = 0; v0 < V; v0 += panel_rows) {
      const int64_t nb = std::min(panel_rows, V - v0);
      dequantize_rows<float>(w_type, W, D, v0, nb, panel, stream);
      fn(v0, nb);
    }
  };
  return cross_entropy_windows<float>(
      x, labels, labels_host, T_tokens, D, V, chunk, workspace, grad_scale, dx, nullptr, ws, stream, softcap,
      [&](const float* xw, int64_t c, float* logits) {  // logits[:, v0 .. v0 + nb) = x_w · panelᵀ
        for_each_panel([&](int64_t v0, int64_t nb) {
          gemm(gemm::row_major_gemm(false, true, c, nb, D, 1.0f, D, D, 0.0f, V), panel, xw, logits + v0, ws.ptr,
               ws.bytes, stream);
        });
      },
      [&](const float* grad, int64_t c, float* dxw) {  // dx_w = Σ_panels G[:, v0 .. v0 + nb) · panel
        for_each_panel([&](int64_t v0, int64_t nb) {
          gemm(gemm::row_major_gemm(false, false, c, D, nb, 1.0f, V, D, v0 == 0 ? 0.0f : 1.0f, D), panel, grad + v0,
               dxw, ws.ptr, ws.bytes, stream);
        });
      });
}

}  // namespace bp::BP_CUDA_NS
