// CUDA embedding (contract: ops/embedding.h; CPU sibling: backend/cpu/embedding.cpp). ids [T]
// (range-checked by the front-end), table [V, D] and y [T, D] stored as T; dtable [V, D] f32.
//   forward:  y[t, :] = table[ids[t], :]            one block per token
//   backward: dtable[ids[t], :] += dy[t, :]          (+=)
// The backward is deterministic like the CPU's: one thread per column walks the tokens in order
// (no atomics, so repeated ids add up in the same order every run). Its parallelism is D threads,
// enough for hidden sizes in the hundreds and up; the embedding gradient is a small part of a step.
#pragma once

#include "backend/cuda/cuda_compat.cuh"

namespace bp::BP_CUDA_NS {

template <class T>
__global__ void embedding_forward_kernel(const int32_t* ids, const T* table, T* y, int64_t D) {
  const T* row = table + static_cast<int64_t>(ids[blockIdx.x]) * D;
  T* out = y + blockIdx.x * D;
  for (int64_t i = threadIdx.x; i < D; i += blockDim.x) out[i] = row[i];
}

template <class T>
__global__ void embedding_backward_kernel(const T* dy, const int32_t* ids, float* dtable, int64_t T_tokens, int64_t D) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= D) return;
  for (int64_t t = 0; t < T_tokens; ++t) dtable[static_cast<int64_t>(ids[t]) * D + i] += load_f32(dy[t * D + i]);
}

template <class T>
void embedding_forward(const int32_t* ids, const T* table, T* y, int64_t T_tokens, int64_t D,
                       cudaStream_t stream = nullptr) {
  if (T_tokens > 0 && D > 0)
    BP_LAUNCH(static_cast<unsigned>(T_tokens), 128, 0, stream, embedding_forward_kernel<T>)(ids, table, y, D);
}

template <class T>
void embedding_backward(const T* dy, const int32_t* ids, float* dtable, int64_t T_tokens, int64_t D,
                        cudaStream_t stream = nullptr) {
  if (T_tokens > 0 && D > 0)
    BP_LAUNCH(blocks_for(D, 128), 128, 0, stream, embedding_backward_kernel<T>)(dy, ids, dtable, T_tokens, D);
}

}  // namespace bp::BP_CUDA_NS
