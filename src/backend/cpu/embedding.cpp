// CPU embedding: a row gather forward and a scatter-add backward.
//
// The scatter-add must be race-free (two tokens with the same id write the same row) and
// deterministic (same sums in the same order on any thread count). Splitting work by token
// would need atomics or per-thread tables; instead each thread owns a block of columns of the
// whole table and applies all tokens to it in token order. With D >= 64·threads (every Llama
// model) all threads are busy; rows of dy are read once per column block, which stays cheap
// next to the rest of a step.
#include "backend/cpu/embedding.h"

#include <cstring>

namespace bp::cpu {

void embedding_forward(const int32_t* ids, const float* table, float* y, int64_t T, int64_t D) {
#pragma omp parallel for schedule(static) if (T * D >= (1 << 14))
  for (int64_t t = 0; t < T; ++t)
    std::memcpy(y + t * D, table + static_cast<int64_t>(ids[t]) * D, static_cast<size_t>(D) * sizeof(float));
}

void embedding_backward(const float* dy, const int32_t* ids, float* dtable, int64_t T, int64_t D) {
  constexpr int64_t kBlock = 64;  // columns per work item: one cache line... times four
  const int64_t blocks = (D + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (T * D >= (1 << 14))
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t j0 = blk * kBlock, j1 = j0 + kBlock < D ? j0 + kBlock : D;
    for (int64_t t = 0; t < T; ++t) {
      float* dst = dtable + static_cast<int64_t>(ids[t]) * D;
      const float* src = dy + t * D;
#pragma omp simd
      for (int64_t j = j0; j < j1; ++j) dst[j] += src[j];
    }
  }
}

}  // namespace bp::cpu
