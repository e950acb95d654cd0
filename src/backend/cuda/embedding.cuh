// CUDA embedding (contract: ops/embedding.h; CPU sibling: backend/cpu/embedding.cpp). ids [T]
// (range-checked by the front-end), table [V, D] and y [T, D] stored as T; dtable [V, D] f32.
//   forward:  y[t, :] = table[ids[t], :]            one block per token
//   backward: dtable[ids[t], :] += dy[t, :]          (+=)
// The backward is deterministic like the CPU's, bit for bit: each (id, column) of dtable has one
// thread, which walks the tokens in order and adds the rows of its id (no atomics, so repeated ids
// add up in the CPU's order every run). A thread owns one column and the ids with id % kEmbeddingIdParts
// equal to its part: ceil(D/32)·kEmbeddingIdParts warps, each reading every id (a broadcast load) and
// updating only its ids' rows, instead of D threads each making T dependent read-add-writes. A warp
// is 32 consecutive columns of one part, so its branch is uniform and its accesses coalesced.
#pragma once

#include "backend/cuda/cuda_compat.cuh"

namespace bp::BP_CUDA_NS {

template <class T>
__global__ void embedding_forward_kernel(const int32_t* ids, const T* table, T* y, int64_t D) {
  const T* row = table + static_cast<int64_t>(ids[blockIdx.x]) * D;
  T* out = y + blockIdx.x * D;
  for (int64_t i = threadIdx.x; i < D; i += blockDim.x) out[i] = row[i];
}

constexpr int kEmbeddingIdParts = 64, kEmbeddingPartsPerBlock = 8;

template <class T>
__global__ void embedding_backward_kernel(const T* dy, const int32_t* ids, float* dtable, int64_t T_tokens, int64_t D) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int part = static_cast<int>(blockIdx.y * blockDim.y + threadIdx.y);
  if (i >= D) return;
  for (int64_t t = 0; t < T_tokens; ++t) {
    const int32_t id = ids[t];  // >= 0: range-checked by the front-end
    if (id % kEmbeddingIdParts == part) dtable[static_cast<int64_t>(id) * D + i] += load_f32(dy[t * D + i]);
  }
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
    BP_LAUNCH(dim3(blocks_for(D, 32), kEmbeddingIdParts / kEmbeddingPartsPerBlock), dim3(32, kEmbeddingPartsPerBlock),
              0, stream, embedding_backward_kernel<T>)
  (dy, ids, dtable, T_tokens, D);
}

}  // namespace bp::BP_CUDA_NS
