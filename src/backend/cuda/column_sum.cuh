// Deterministic column sums over the rows of a [rows, N] operand: out[j] += Σ_t term(t, j), for the
// reductions of a backward over the tokens (a bias's gradient; RMSNorm's weight gradient).
//
// One thread per column walking every row in order gives N threads in all (896 for Qwen2.5-0.5B's
// norms, 128 for a k/v bias) doing rows-long dependent chains: a handful of SMs busy and a loop
// bound by memory latency. Here a block is kColumnSumCols columns × kColumnSumRowGroups thread rows:
// thread (g, c) sums rows g, g + R, g + 2R, ... of its column in order, then thread row 0 adds the R
// partials in order g = 0..R-1 and adds that to out[j]. The split of the rows and the order of every
// sum depend only on the shape, never on the schedule: each run gives the same bits (a different
// rounding from a row-by-row sum, within f32's). A warp is 32 consecutive columns of one row group, so
// its loads are coalesced. No atomics, no workspace.
#pragma once

#include "backend/cuda/cuda_compat.cuh"

namespace bp::BP_CUDA_NS {

constexpr int kColumnSumCols = 32, kColumnSumRowGroups = 16;

// Term: a device-callable object, float operator()(int64_t row, int64_t column). weight (may be
// null): out[j] += weight[j]·Σ instead (DoRA's magnitude gradient).
template <class Term>
__global__ void column_sum_kernel(Term term, float* out, int64_t rows, int64_t N, const float* weight) {
  __shared__ float partial[kColumnSumRowGroups][kColumnSumCols + 1];
  const int c = static_cast<int>(threadIdx.x), g = static_cast<int>(threadIdx.y);
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kColumnSumCols + c;
  float acc = 0.0f;
  if (j < N)
    for (int64_t t = g; t < rows; t += kColumnSumRowGroups) acc = __fadd_rn(acc, term(t, j));
  partial[g][c] = acc;
  __syncthreads();
  if (g == 0 && j < N) {
    float s = partial[0][c];
    for (int q = 1; q < kColumnSumRowGroups; ++q) s = __fadd_rn(s, partial[q][c]);
    out[j] = __fadd_rn(out[j], weight ? __fmul_rn(weight[j], s) : s);
  }
}

template <class Term>
void column_sum_accumulate(Term term, float* out, int64_t rows, int64_t N, cudaStream_t stream,
                           const float* weight = nullptr) {
  if (N <= 0) return;
  BP_LAUNCH(blocks_for(N, kColumnSumCols), dim3(kColumnSumCols, kColumnSumRowGroups), 0, stream,
            column_sum_kernel<Term>)
  (term, out, rows, N, weight);
}

}  // namespace bp::BP_CUDA_NS
