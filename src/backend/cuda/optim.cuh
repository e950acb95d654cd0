// CUDA optimizer kernels (contract: ops/optim.h; CPU sibling: backend/cpu/optim.cpp). All f32:
// trainable weights keep f32 masters and AdamW keeps m and v in f32 (the issue's choice; bf16
// state loses small updates).
//   adamw_step_all: PyTorch's order, the same float operations as the CPU kernel
//                 (kernel_variants_impl.h adamw), host-side constants computed as optim.cpp does,
//                 over a list of tensors in one launch per kTensorsPerLaunch of them, writing a
//                 tensor's bf16 GEMM copy (full fine-tuning, training.matmul_dtype bf16) in the same
//                 pass when it has one;
//   scale_all:    y *= a over a list of tensors (gradient clipping), the same way;
//   sum_squares:  Σ x² in double, deterministic: each block sums a fixed slice into a partial
//                 (threads stride, then a fixed shuffle/shared-memory tree), and one block adds
//                 the partials in order; the result is copied to the host;
//   sum_squares_total: the same over a list of tensors, their sums added in order on the device:
//                 one copy back for the global gradient norm however many tensors it covers, and
//                 two launches per kTensorsPerLaunch tensors;
//   all_finite:   any thread that sees a non-finite value sets a flag (atomicOr); the host reads it.
// Device scratch (partials, flag) is the caller's: optim_scratch_bytes(n) of device memory.
#pragma once

#include <cmath>

#include "backend/cuda/cuda_compat.cuh"

namespace bp::BP_CUDA_NS {

constexpr int kReduceThreads = 256;
constexpr int kReduceMaxBlocks = 1024;

BP_HOST_FN int reduce_blocks(int64_t n) {
  return static_cast<int>(
      std::max<int64_t>(1, std::min<int64_t>((n + kReduceThreads - 1) / kReduceThreads, kReduceMaxBlocks)));
}
// Device bytes sum_squares / all_finite need as scratch for n values.
BP_HOST_FN size_t optim_scratch_bytes(int64_t n) {
  return sizeof(double) * (reduce_blocks(n) + 1) + sizeof(unsigned);
}

// ---- lists of tensors: a few launches per list, not one per tensor ----
// A LoRA of Qwen2.5-0.5B trains 336 tensors; one launch each for the norm's sum, the clipping scale
// and AdamW made ~1,350 launches a step, each a few µs of a card's queue. The list kernels take up to
// kTensorsPerLaunch tensors per launch: their pointers and sizes travel in the kernel's arguments
// (__grid_constant__: about 2.5 KiB, under the 4 KiB every CUDA version accepts), so nothing is
// uploaded and nothing waits. Tensor t of a group owns blocks [block_start[t], block_start[t + 1])
// and strides over its values with them, exactly as a launch of its own would.
constexpr int kTensorsPerLaunch = 48;
struct TensorGroup {
  void* ptr[5][kTensorsPerLaunch];  // up to 5 arrays per tensor (AdamW: param, grad, m, v, bf16 copy)
  int64_t n[kTensorsPerLaunch];
  int block_start[kTensorsPerLaunch + 1];
  int count;
};
static_assert(sizeof(TensorGroup) <= 4096, "a TensorGroup travels in a kernel's arguments: 4 KiB at most");

// The tensor of the group that owns this block, and the block's first index and stride in it.
struct GroupSlot {
  int t;
  int64_t first, stride;
};
__device__ __forceinline__ GroupSlot group_slot(const TensorGroup& g) {
  int t = 0;
  while (t + 1 < g.count && static_cast<int>(blockIdx.x) >= g.block_start[t + 1]) ++t;
  return {t, static_cast<int64_t>(static_cast<int>(blockIdx.x) - g.block_start[t]) * blockDim.x + threadIdx.x,
          static_cast<int64_t>(g.block_start[t + 1] - g.block_start[t]) * blockDim.x};
}

// Calls launch(group, first tensor, blocks) for consecutive groups of at most kTensorsPerLaunch
// tensors, tensor i taking blocks_of(ns[i]) blocks (none when empty); fill(group, slot, i) sets the
// slot's pointers.
template <class BlocksOf, class Fill, class Launch>
void for_each_tensor_group(const int64_t* ns, int64_t count, BlocksOf blocks_of, Fill fill, Launch launch) {
  for (int64_t first = 0; first < count; first += kTensorsPerLaunch) {
    TensorGroup g{};
    g.count = static_cast<int>(std::min<int64_t>(kTensorsPerLaunch, count - first));
    for (int s = 0; s < g.count; ++s) {
      g.n[s] = ns[first + s];
      g.block_start[s + 1] = g.block_start[s] + (g.n[s] > 0 ? blocks_of(g.n[s]) : 0);
      fill(g, s, first + s);
    }
    if (g.block_start[g.count] > 0) launch(g, first, g.block_start[g.count]);
  }
}

__global__ void adamw_kernel(const __grid_constant__ TensorGroup g, float decay, float beta1, float beta2,
                             float one_minus_b1, float one_minus_b2, float step_size, float bc2_sqrt, float eps) {
  const GroupSlot at = group_slot(g);
  float* param = static_cast<float*>(g.ptr[0][at.t]);
  const float* grad = static_cast<const float*>(g.ptr[1][at.t]);
  float* m = static_cast<float*>(g.ptr[2][at.t]);
  float* v = static_cast<float*>(g.ptr[3][at.t]);
  bf16* copy = static_cast<bf16*>(g.ptr[4][at.t]);  // null: no GEMM copy
  for (int64_t i = at.first; i < g.n[at.t]; i += at.stride) {
    const float gi = grad[i];
    float p = __fmul_rn(param[i], decay);
    // __fmul_rn/__fadd_rn: no FMA contraction, so the rounding is the CPU kernel's.
    const float mi = __fadd_rn(__fmul_rn(m[i], beta1), __fmul_rn(one_minus_b1, gi));
    const float vi = __fadd_rn(__fmul_rn(v[i], beta2), __fmul_rn(one_minus_b2, __fmul_rn(gi, gi)));
    const float denom = __fadd_rn(sqrtf(vi) / bc2_sqrt, eps);
    p = __fsub_rn(p, __fmul_rn(step_size, mi / denom));
    m[i] = mi;
    v[i] = vi;
    param[i] = p;
    if (copy) copy[i] = __float2bfloat16(p);  // convert_f32_to_bf16's rounding (nearest even)
  }
}

// AdamW on each of `count` tensors (params[i], grads[i], ms[i], vs[i]: ns[i] device values; the
// pointer arrays are host memory): one launch per kTensorsPerLaunch tensors. copies (null, or null
// entries: none) are the parameters' bf16 GEMM copies, written from the updated values in the
// same pass.
BP_HOST_FN void adamw_step_all(float* const* params, const float* const* grads, float* const* ms, float* const* vs,
                               bf16* const* copies, const int64_t* ns, int64_t count, float lr, float beta1,
                               float beta2, float eps, float weight_decay, int64_t step,
                               cudaStream_t stream = nullptr) {
  const double lr_d = lr, b1 = beta1, b2 = beta2;
  const float decay = static_cast<float>(1.0 - lr_d * static_cast<double>(weight_decay));
  const double bc1 = 1.0 - std::pow(b1, static_cast<double>(step));
  const double bc2 = 1.0 - std::pow(b2, static_cast<double>(step));
  for_each_tensor_group(
      ns, count, [](int64_t n) { return static_cast<int>(elementwise_blocks(n)); },
      [&](TensorGroup& g, int s, int64_t i) {
        g.ptr[0][s] = params[i];
        g.ptr[1][s] = const_cast<float*>(grads[i]);  // read only by the kernel
        g.ptr[2][s] = ms[i];
        g.ptr[3][s] = vs[i];
        g.ptr[4][s] = copies ? copies[i] : nullptr;
      },
      [&](const TensorGroup& g, int64_t, int blocks) {
        BP_LAUNCH(static_cast<unsigned>(blocks), 256, 0, stream, adamw_kernel)
        (g, decay, beta1, beta2, static_cast<float>(1.0 - b1), static_cast<float>(1.0 - b2),
         static_cast<float>(lr_d / bc1), static_cast<float>(std::sqrt(bc2)), eps);
      });
}

// One tensor's AdamW update (adamw_step_all of a list of one).
BP_HOST_FN void adamw_step(float* param, const float* grad, float* m, float* v, int64_t n, float lr, float beta1,
                           float beta2, float eps, float weight_decay, int64_t step, cudaStream_t stream = nullptr) {
  adamw_step_all(&param, &grad, &m, &v, nullptr, &n, 1, lr, beta1, beta2, eps, weight_decay, step, stream);
}

__global__ void scale_list_kernel(const __grid_constant__ TensorGroup g, float a) {
  const GroupSlot at = group_slot(g);
  float* y = static_cast<float*>(g.ptr[0][at.t]);
  for (int64_t i = at.first; i < g.n[at.t]; i += at.stride) y[i] = __fmul_rn(y[i], a);
}

// ys[i] *= a for each of `count` tensors (ns[i] device values; `ys` is host memory).
BP_HOST_FN void scale_all(float* const* ys, const int64_t* ns, int64_t count, float a, cudaStream_t stream = nullptr) {
  for_each_tensor_group(
      ns, count, [](int64_t n) { return static_cast<int>(elementwise_blocks(n)); },
      [&](TensorGroup& g, int s, int64_t i) { g.ptr[0][s] = ys[i]; },
      [&](const TensorGroup& g, int64_t, int blocks) {
        BP_LAUNCH(static_cast<unsigned>(blocks), 256, 0, stream, scale_list_kernel)(g, a);
      });
}

__device__ __forceinline__ double warp_sum_f64(double v) {
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// Σ x[i]² over i = first, first + stride, ... < n, summed over the block (thread 0's value): each
// thread strides, then a fixed shuffle / shared-memory tree.
template <class T>
__device__ double block_sum_squares(const T* x, int64_t first, int64_t stride, int64_t n) {
  __shared__ double scratch[32];
  double s = 0.0;
  for (int64_t i = first; i < n; i += stride) {
    const double v = load_f32(x[i]);
    s += v * v;
  }
  s = warp_sum_f64(s);
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = s;
  __syncthreads();
  double t = 0.0;
  if (threadIdx.x < 32) {
    t = threadIdx.x < blockDim.x / 32 ? scratch[threadIdx.x] : 0.0;
    t = warp_sum_f64(t);
  }
  return t;
}

// Block b sums elements b, b + B, b + 2B, ... of each thread's stride into partial[b].
template <class T>
__global__ void sum_squares_kernel(const T* x, int64_t n, double* partial) {
  const double s = block_sum_squares(x, blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x,
                                     static_cast<int64_t>(gridDim.x) * blockDim.x, n);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

// The same for each tensor of a group, with the blocks its own launch would have: partial[b] for
// block b of the group.
template <class T>
__global__ void sum_squares_list_kernel(const __grid_constant__ TensorGroup g, double* partial) {
  const GroupSlot at = group_slot(g);
  const double s = block_sum_squares(static_cast<const T*>(g.ptr[0][at.t]), at.first, at.stride, g.n[at.t]);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

// *total = Σ values in order, in double, by one thread (a reduction's partials, or one sum per tensor).
__global__ void sum_partials_kernel(const double* partial, int64_t n_partial, double* total) {
  double s = 0.0;
  for (int64_t i = 0; i < n_partial; ++i) s += partial[i];
  *total = s;
}

// per_tensor[t] = Σ of tensor t's partials in order (sum_partials_kernel's sum), for each tensor of a group.
__global__ void sum_group_partials_kernel(const __grid_constant__ TensorGroup g, const double* partial,
                                          double* per_tensor) {
  for (int t = 0; t < g.count; ++t) {
    double s = 0.0;
    for (int b = g.block_start[t]; b < g.block_start[t + 1]; ++b) s += partial[b];
    per_tensor[t] = s;
  }
}

// `scratch` is device memory of optim_scratch_bytes(n). Returns Σ x² (synchronises the stream).
template <class T>
double sum_squares(const T* x, int64_t n, void* scratch, cudaStream_t stream = nullptr) {
  if (n <= 0) return 0.0;
  const int blocks = reduce_blocks(n);
  double* partial = static_cast<double*>(scratch);
  BP_LAUNCH(static_cast<unsigned>(blocks), kReduceThreads, 0, stream, sum_squares_kernel<T>)(x, n, partial);
  BP_LAUNCH(1, 1, 0, stream, sum_partials_kernel)(partial, blocks, partial + blocks);
  double total = 0.0;
  cudaMemcpyAsync(&total, partial + blocks, sizeof(double), cudaMemcpyDeviceToHost, stream);
  cudaStreamSynchronize(stream);
  return total;
}

// Device scratch sum_squares_total needs: the partials of one group of tensors (at most
// kTensorsPerLaunch of at most reduce_blocks(max_n) blocks each), one sum per tensor and the total.
BP_HOST_FN size_t sum_squares_total_scratch_bytes(int64_t max_n, int64_t count) {
  const int64_t group = std::min<int64_t>(count, kTensorsPerLaunch);
  return sizeof(double) * (static_cast<size_t>(group * reduce_blocks(max_n)) + static_cast<size_t>(count) + 1);
}

// Σ over `count` tensors (xs[i]: ns[i] device values) of Σ x²: each tensor reduced with the blocks
// sum_squares would give it and its partials added in order, then the tensors' sums added in order in
// double by one thread (what a host loop adding sum_squares results does, bit for bit). Two launches
// per kTensorsPerLaunch tensors and one for the total; one copy back, one synchronisation. `xs` and
// `ns` are host arrays; `scratch`: sum_squares_total_scratch_bytes(max ns, count).
template <class T>
double sum_squares_total(const T* const* xs, const int64_t* ns, int64_t count, void* scratch,
                         cudaStream_t stream = nullptr) {
  if (count <= 0) return 0.0;
  double* partial = static_cast<double*>(scratch);
  int64_t max_n = 0;
  for (int64_t i = 0; i < count; ++i) max_n = std::max(max_n, ns[i]);
  double* per_tensor = partial + std::min<int64_t>(count, kTensorsPerLaunch) * reduce_blocks(max_n);
  double* total = per_tensor + count;
  cudaMemsetAsync(per_tensor, 0, static_cast<size_t>(count) * sizeof(double), stream);  // empty tensors: 0
  // A group's partials reuse the area of the group before: the launches run in stream order.
  for_each_tensor_group(
      ns, count, [](int64_t n) { return reduce_blocks(n); },
      [&](TensorGroup& g, int s, int64_t i) { g.ptr[0][s] = const_cast<T*>(xs[i]); },
      [&](const TensorGroup& g, int64_t first, int blocks) {
        BP_LAUNCH(static_cast<unsigned>(blocks), kReduceThreads, 0, stream, sum_squares_list_kernel<T>)(g, partial);
        BP_LAUNCH(1, 1, 0, stream, sum_group_partials_kernel)(g, partial, per_tensor + first);
      });
  BP_LAUNCH(1, 1, 0, stream, sum_partials_kernel)(per_tensor, count, total);
  double host_total = 0.0;
  cudaMemcpyAsync(&host_total, total, sizeof(double), cudaMemcpyDeviceToHost, stream);
  cudaStreamSynchronize(stream);
  return host_total;
}

__device__ __forceinline__ bool is_finite_value(float v) {
  return isfinite(v);
}
__device__ __forceinline__ bool is_finite_value(bf16 v) {
  return isfinite(__bfloat162float(v));
}

template <class T>
__global__ void all_finite_kernel(const T* x, int64_t n, unsigned* flag) {
  bool bad = false;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    bad |= !is_finite_value(x[i]);
  if (__any_sync(0xffffffffu, bad) && threadIdx.x % 32 == 0) atomicOr(flag, 1u);
}

// True when no value of x is Inf or NaN (synchronises the stream).
template <class T>
bool all_finite(const T* x, int64_t n, void* scratch, cudaStream_t stream = nullptr) {
  if (n <= 0) return true;
  unsigned* flag = reinterpret_cast<unsigned*>(static_cast<char*>(scratch) + optim_scratch_bytes(n) - sizeof(unsigned));
  cudaMemsetAsync(flag, 0, sizeof(unsigned), stream);
  BP_LAUNCH(static_cast<unsigned>(reduce_blocks(n)), kReduceThreads, 0, stream, all_finite_kernel<T>)(x, n, flag);
  unsigned host_flag = 1;
  cudaMemcpyAsync(&host_flag, flag, sizeof(unsigned), cudaMemcpyDeviceToHost, stream);
  cudaStreamSynchronize(stream);
  return host_flag == 0;
}

}  // namespace bp::BP_CUDA_NS
