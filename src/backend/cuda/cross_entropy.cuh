// CUDA fused linear + cross-entropy (contract: ops/cross_entropy.h; CPU sibling:
// backend/cpu/cross_entropy.cpp). x [T, D] and W [V, D] stored as T (f32 or bf16), labels [T]
// (−100 = ignored, else in [0, V): validated by the front-end), dx [T, D] as T, dW [V, D] f32.
// Tokens are walked in windows of `chunk` rows; a window with no label costs nothing. Per window:
//   1. logits[c, V] (f32) = x_w · Wᵀ                      GEMM (cuBLASLt), f32 accumulation
//   2. one block per row: max, Σ exp(l − max) (block reductions, f32), loss = lse − l[label];
//      grad row = grad_scale·(softmax − onehot) stored as T (zero for ignored rows)
//   3. dx_w = G · W (GEMM, beta 0),  dW += Gᵀ · x_w (GEMM, beta 1)
// Logits stay f32 (a softmax over ~150k classes in bf16 loses the small probabilities); the
// gradient G is stored as T because both backward GEMMs read it beside a T operand (cuBLASLt
// wants A and B of one type). Row losses are copied to the host and summed in row order in
// double, as the CPU does. Workspace: cross_entropy_workspace_bytes() of device memory.
#pragma once

#include <vector>

#include "backend/cuda/gemm.cuh"

namespace bp::BP_CUDA_NS {

struct CrossEntropyResult {
  double loss_sum = 0.0;
  int64_t n_counted = 0;
};

template <class T>
size_t cross_entropy_workspace_bytes(int64_t chunk, int64_t V) {
  return static_cast<size_t>(chunk) * V * (sizeof(float) + sizeof(T)) + static_cast<size_t>(chunk) * sizeof(float);
}

template <class T>
constexpr gemm::DType gemm_type_of() {
  return sizeof(T) == 4 ? gemm::DType::F32 : gemm::DType::BF16;
}

template <class T>
__global__ void softmax_cross_entropy_kernel(const float* logits, const int32_t* labels, int64_t V, float grad_scale,
                                             T* grad, float* row_loss) {
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
  float mx = -INFINITY;
  for (int64_t i = threadIdx.x; i < V; i += blockDim.x) mx = fmaxf(mx, row[i]);
  mx = block_max(mx, scratch);
  float sum = 0.0f;
  for (int64_t i = threadIdx.x; i < V; i += blockDim.x) sum += expf(row[i] - mx);
  sum = block_sum(sum, scratch);
  if (threadIdx.x == 0) row_loss[blockIdx.x] = mx + logf(sum) - row[label];
  if (grow) {
    const float scale = grad_scale / sum;
    for (int64_t i = threadIdx.x; i < V; i += blockDim.x)
      grow[i] = store_from_f32<T>(expf(row[i] - mx) * scale - (i == label ? grad_scale : 0.0f));
  }
}

// labels_host: the same labels in host memory (windows are chosen on the host).
template <class T>
CrossEntropyResult linear_cross_entropy(const T* x, const T* W, const int32_t* labels, const int32_t* labels_host,
                                        int64_t T_tokens, int64_t D, int64_t V, int64_t chunk, void* workspace,
                                        float grad_scale, T* dx, float* dW, cudaStream_t stream = nullptr) {
  CrossEntropyResult result;
  float* logits = static_cast<float*>(workspace);
  T* grad = reinterpret_cast<T*>(logits + chunk * V);
  float* row_loss = reinterpret_cast<float*>(grad + chunk * V);
  const bool make_grad = dx || dW;
  std::vector<float> losses(static_cast<size_t>(chunk));
  for (int64_t t0 = 0; t0 < T_tokens; t0 += chunk) {
    const int64_t c = std::min(chunk, T_tokens - t0);
    int64_t counted = 0;
    for (int64_t t = t0; t < t0 + c; ++t) counted += labels_host[t] >= 0;
    if (counted == 0) {  // nothing to learn here: dx rows are zero, dW unchanged
      if (dx) cudaMemsetAsync(dx + t0 * D, 0, static_cast<size_t>(c * D) * sizeof(T), stream);
      continue;
    }
    constexpr auto tt = gemm_type_of<T>();
    gemm(gemm::linear_forward_gemm(c, D, V, tt, gemm::DType::F32), W, x + t0 * D, logits, nullptr, 0, stream);
    BP_LAUNCH(static_cast<unsigned>(c), 256, 0, stream, softmax_cross_entropy_kernel<T>)
    (logits, labels + t0, V, grad_scale, make_grad ? grad : nullptr, row_loss);
    if (dx) gemm(gemm::linear_dx_gemm(c, D, V, tt, tt), W, grad, dx + t0 * D, nullptr, 0, stream);
    if (dW) gemm(gemm::linear_dW_gemm(c, D, V, tt), x + t0 * D, grad, dW, nullptr, 0, stream);
    cudaMemcpyAsync(losses.data(), row_loss, static_cast<size_t>(c) * sizeof(float), cudaMemcpyDeviceToHost, stream);
    cudaStreamSynchronize(stream);
    for (int64_t r = 0; r < c; ++r) result.loss_sum += losses[static_cast<size_t>(r)];
    result.n_counted += counted;
  }
  return result;
}

}  // namespace bp::BP_CUDA_NS
