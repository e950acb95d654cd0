// The CUDA thread model on the CPU, so the SAME kernel source (backend/cuda/*.cuh) runs in tests
// on machines without a GPU (DESIGN.md "CUDA kernels simulated on the CPU in tests").
//
// What it models:
// - a launch walks the grid block by block; the threads of a block run as fibers (glibc ucontext)
//   on one OS thread, so __syncthreads() really suspends a thread until every thread of its block
//   has arrived (a kernel whose result depends on the barrier fails here when the barrier is
//   missing); a barrier some threads never reach (divergent or exited) is reported as an error;
// - threadIdx/blockIdx/blockDim/gridDim are set by the scheduler before it resumes a fiber;
// - `__shared__` is a `static thread_local`: one copy per OS thread, and blocks run one after
//   another, so it is shared by exactly the threads of one block; dynamic shared memory
//   (BP_DYNAMIC_SHARED) is a per-block buffer, 128-byte aligned, filled with NaN bytes at each
//   block start;
// - tensor-core fragments (nvcuda::wmma, 16×16×16 bf16/f16): sim_wmma.h, warp-collective like the
//   shuffles;
// - warp shuffles and votes exchange values among the (up to) 32 fibers of a warp at a warp-wide
//   meeting point: every lane of the warp must take part (the full-mask form the kernels use);
// - atomics (plain read-modify-write: one OS thread runs the whole launch);
// - races: the order of threads and blocks is a choice (BP_SIM_SCHEDULE: forward, reverse,
//   shuffle), so a result that depends on it shows up as a test failure under one of them, and an
//   optional check (BP_SIM_CHECK_WRITES) reports two blocks writing one byte without an atomic;
// - the runtime calls the backend uses, with a memory budget (set_memory_budget) so that
//   cudaMalloc fails with cudaErrorMemoryAllocation exactly when a test wants it to, and a compute
//   capability (set_compute_capability, 8.0 by default) for what the backend sizes by it.
// Everything lives in namespace bp::sim; kernels compiled against it are placed in bp::sim too
// (cuda_compat.h's BP_CUDA_NS), so unqualified CUDA names resolve here and never clash with the
// real CUDA runtime that a CUDA build links into the same test binary.
#pragma once

#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#define __global__ inline  // the kernel text lives in headers included by several test files
#define __device__ inline
#define __host__
#define __forceinline__  // __device__ already makes it inline
#define __shared__ static thread_local
#define __launch_bounds__(...)
#define __grid_constant__  // a kernel parameter read in place: a plain const parameter here

namespace bp::sim {

struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
using uint3 = dim3;
constexpr int warpSize = 32;

extern thread_local dim3 threadIdx, blockIdx, blockDim, gridDim;

// ---- errors and streams (the subset of the runtime API the backend calls) ----
enum cudaError_t : int {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorLaunchFailure = 719,
  cudaErrorIllegalAddress = 700,
};
enum cudaFuncAttribute : int { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };
enum cudaMemcpyKind : int {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4
};
using cudaStream_t = struct SimStream*;
// The device attributes the backend reads (CUDA's values).
enum cudaDeviceAttr : int { cudaDevAttrComputeCapabilityMajor = 75, cudaDevAttrComputeCapabilityMinor = 76 };

cudaError_t cudaMalloc(void** ptr, size_t bytes);
cudaError_t cudaFree(void* ptr);
cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t s = nullptr);
cudaError_t cudaMemset(void* ptr, int value, size_t bytes);
cudaError_t cudaMemsetAsync(void* ptr, int value, size_t bytes, cudaStream_t s = nullptr);
cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes);
cudaError_t cudaGetLastError();
cudaError_t cudaPeekAtLastError();
cudaError_t cudaStreamCreate(cudaStream_t* s);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaDeviceSynchronize();
cudaError_t cudaSetDevice(int index);
cudaError_t cudaGetDevice(int* index);  // the one simulated card: 0
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attribute, int device);
const char* cudaGetErrorString(cudaError_t e);
const char* cudaGetErrorName(cudaError_t e);

// ---- test controls ----
// The simulated card's memory: cudaMalloc fails past `bytes_total` (counted in bytes requested).
void set_memory_budget(size_t bytes_total);
size_t memory_in_use();
// Successful cudaMalloc calls since the process started (a caching allocator in steady state makes none).
uint64_t cuda_malloc_calls();
// The caching allocator's block at ptr is handed out (in_use) or given back (DeviceMemoryApi::on_block
// of the simulated card): the write check watches the block holding an output, not its whole segment.
void note_allocator_block(void* ptr, size_t bytes, bool in_use);
// Whether [ptr, ptr + bytes) lies inside one live cudaMalloc allocation (what a kernel may touch).
bool memory_range_live(const void* ptr, size_t bytes);
// The simulated card's compute capability (cudaDeviceGetAttribute): 8.0 (an A100) unless set. The
// backend sizes cuBLASLt's workspace by it and picks its GEMM input type from the major
// (gemm::narrow_type): set_compute_capability(7, 5) makes the card a Turing T4.
void set_compute_capability(int major, int minor);
// The next launch (only) reports `e` (as a faulting kernel would: launch failure, illegal address).
void inject_launch_error(cudaError_t e);
// Launches since the process started (tests check a host wrapper really launched).
uint64_t launch_count();
// The runtime calls that cost a real card time outside its kernels, counted since the last reset.
// The host waits for the card (its launch queue drains) at every synchronous cudaMemcpy to the
// host and every explicit synchronisation (an asynchronous copy to the host is read only after
// one); host-to-device copies and cudaMalloc calls are counted too (a real cudaMalloc also
// stalls the launch pipeline). Tests hold a training step's waits to a small constant
// (tests/cuda/sync_count_cuda_test.cpp).
struct RuntimeCounts {
  uint64_t device_to_host_copies = 0;  // cudaMemcpy and cudaMemcpyAsync
  uint64_t synchronous_reads = 0;      // cudaMemcpy to the host: itself a wait
  uint64_t host_to_device_copies = 0;
  uint64_t synchronizations = 0;  // cudaStreamSynchronize and cudaDeviceSynchronize
  uint64_t mallocs = 0;           // successful cudaMalloc calls (cuda_malloc_calls)
  uint64_t kernel_launches = 0;   // our kernels (launch_grid), each a few µs of a real card's queue
  uint64_t gemms = 0;             // cuBLASLt matmuls (gemm_sim.cpp)
  uint64_t host_waits() const { return synchronous_reads + synchronizations; }
  RuntimeCounts operator-(const RuntimeCounts& before) const {
    return {device_to_host_copies - before.device_to_host_copies,
            synchronous_reads - before.synchronous_reads,
            host_to_device_copies - before.host_to_device_copies,
            synchronizations - before.synchronizations,
            mallocs - before.mallocs,
            kernel_launches - before.kernel_launches,
            gemms - before.gemms};
  }
};
// gemm_sim.cpp counts each simulated cuBLASLt matmul here (RuntimeCounts::gemms).
void count_gemm_call();
RuntimeCounts runtime_counts();
void reset_runtime_counts();

// The order the scheduler runs the threads of a block and the blocks of a grid in (sim_races.cpp
// explains what each finds). Every order is one a GPU could produce, so a kernel whose result
// changes with it has a race. Forward: thread order and block order. Reverse: both reversed.
// Shuffle: the blocks in a random order; in each block either rounds of a random permutation of
// the ready threads (some warps held back a round) or the warps one at a time in a random order;
// from `seed` and the number of launches since the schedule was set. Chosen once per process from BP_SIM_SCHEDULE
// (forward | reverse | shuffle | shuffle:SEED; unset: forward) at the first launch.
enum class Schedule { Forward, Reverse, Shuffle };
struct ScheduleChoice {
  Schedule order = Schedule::Forward;
  uint64_t seed = 0;  // Shuffle only
};
// "forward", "reverse", "shuffle" (seed 1), "shuffle:SEED"; std::invalid_argument otherwise.
ScheduleChoice parse_schedule(const char* text);
// The schedule launches use now (BP_SIM_SCHEDULE's until set_schedule replaced it).
ScheduleChoice current_schedule();
// Replaces the schedule for the launches that follow; returns the one it replaced (tests restore it).
ScheduleChoice set_schedule(ScheduleChoice choice);

// The cross-block write check (sim_races.cpp): while on, a launch
// watches the device allocations its kernel's non-const pointer arguments point into and throws
// std::runtime_error when two blocks change the same byte other than through an atomic (on a GPU
// the blocks run at once: the last writer wins, a non-atomic += loses updates). On from
// BP_SIM_CHECK_WRITES=1 at the first launch, or set_write_check; returns the setting it replaced.
bool set_write_check(bool on);
bool write_check_enabled();

// ---- intrinsics used inside kernels ----
void __syncthreads();
// Internal: lane index, the warp's exchange slots, and the warp-wide meeting point.
int sim_lane();
uint64_t* sim_warp_slots();
void sim_warp_meet();
void* sim_dynamic_shared();
void sim_record_error(cudaError_t e);
// Internal: an atomic touched [p, p + bytes) (the write check lets blocks share those bytes).
void sim_note_atomic(const void* p, size_t bytes);

template <class T>
inline T sim_exchange(T v, int src_lane) {
  static_assert(sizeof(T) <= 8, "shuffle of a type wider than 8 bytes");
  uint64_t* slots = sim_warp_slots();
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  slots[sim_lane()] = bits;
  sim_warp_meet();  // every lane has written
  uint64_t got = slots[src_lane];
  sim_warp_meet();  // every lane has read: the slots may be reused
  T r;
  std::memcpy(&r, &got, sizeof(T));
  return r;
}
template <class T>
inline T __shfl_sync(unsigned, T v, int src, int width = warpSize) {
  int lane = sim_lane();
  return sim_exchange(v, (lane / width) * width + ((src % width) + width) % width);
}
template <class T>
inline T __shfl_xor_sync(unsigned, T v, int lane_mask, int width = warpSize) {
  int lane = sim_lane();
  int src = lane ^ lane_mask;
  if (src / width != lane / width) src = lane;  // outside the segment: own value (CUDA's rule)
  return sim_exchange(v, src);
}
template <class T>
inline T __shfl_down_sync(unsigned, T v, unsigned delta, int width = warpSize) {
  int lane = sim_lane();
  int src = lane + static_cast<int>(delta);
  if (src / width != lane / width || src >= warpSize) src = lane;
  return sim_exchange(v, src);
}
template <class T>
inline T __shfl_up_sync(unsigned, T v, unsigned delta, int width = warpSize) {
  int lane = sim_lane();
  int src = lane - static_cast<int>(delta);
  if (src < 0 || src / width != lane / width) src = lane;
  return sim_exchange(v, src);
}
unsigned __ballot_sync(unsigned mask, int predicate);
inline int __all_sync(unsigned mask, int p) {
  return __ballot_sync(mask, p) == __ballot_sync(mask, 1);
}
inline int __any_sync(unsigned mask, int p) {
  return __ballot_sync(mask, p) != 0u;
}
inline void __syncwarp(unsigned = 0xffffffffu) {
  sim_warp_meet();
}
// One OS thread runs a whole launch, every block to its end before the next: memory is always
// consistent, so the fence orders nothing more.
inline void __threadfence() {}

template <class T>
inline T atomicAdd(T* p, T v) {
  sim_note_atomic(p, sizeof(T));
  return std::atomic_ref<T>(*p).fetch_add(v);
}
inline int atomicMax(int* p, int v) {
  sim_note_atomic(p, sizeof(int));
  int old = *p;
  if (v > old) *p = v;
  return old;
}
inline unsigned atomicOr(unsigned* p, unsigned v) {
  sim_note_atomic(p, sizeof(unsigned));
  return std::atomic_ref<unsigned>(*p).fetch_or(v);
}
inline int atomicCAS(int* p, int compare, int v) {
  sim_note_atomic(p, sizeof(int));
  std::atomic_ref<int>(*p).compare_exchange_strong(compare, v);
  return compare;
}

inline float rsqrtf(float x) {
  return 1.0f / std::sqrt(x);
}
inline float __expf(float x) {
  return std::exp(x);
}
inline float __logf(float x) {
  return std::log(x);
}
inline float __fdividef(float a, float b) {
  return a / b;
}
// Round-to-nearest f32 arithmetic that nvcc never contracts into an FMA (host code here never does
// either: -std=c++20 implies -ffp-contract=off).
inline float __fmul_rn(float a, float b) {
  return a * b;
}
inline float __fadd_rn(float a, float b) {
  return a + b;
}
inline float __fsub_rn(float a, float b) {
  return a - b;
}
inline float __fdiv_rn(float a, float b) {
  return a / b;
}
inline float __fsqrt_rn(float a) {
  return std::sqrt(a);
}
inline bool isfinite(float v) {
  return std::isfinite(v);
}

// bf16 as the CUDA type: a 16-bit pattern; conversions round to nearest even like __float2bfloat16.
struct __nv_bfloat16 {
  uint16_t bits;
};
inline float __bfloat162float(__nv_bfloat16 h) {
  uint32_t u = static_cast<uint32_t>(h.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline __nv_bfloat16 __float2bfloat16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return {static_cast<uint16_t>((u >> 16) | 0x40u)};  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return {static_cast<uint16_t>(u >> 16)};
}

// f16 (IEEE half) as the CUDA type: __float2half rounds to nearest even, overflows to inf past
// 65504 (from 65520 on) and keeps subnormals down to 2^-24, as cuda_fp16.h does.
struct __half {
  uint16_t bits;
};
inline float __half2float(__half h) {
  const uint32_t sign = static_cast<uint32_t>(h.bits & 0x8000u) << 16, exp = (h.bits >> 10) & 31u,
                 mant = h.bits & 1023u;
  float f;
  if (exp == 0) {
    f = static_cast<float>(mant) * 5.9604644775390625e-8f;  // mant·2^-24, exact
    return sign ? -f : f;
  }
  const uint32_t u = exp == 31 ? sign | 0x7f800000u | (mant << 13) : sign | ((exp + 112u) << 23) | (mant << 13);
  std::memcpy(&f, &u, 4);
  return f;
}
inline __half __float2half(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const auto sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  u &= 0x7fffffffu;
  if (u > 0x7f800000u) return {static_cast<uint16_t>(sign | 0x7e00u)};   // NaN stays (quiet) NaN
  if (u >= 0x477ff000u) return {static_cast<uint16_t>(sign | 0x7c00u)};  // 65520 and up round to inf
  if (u >= 0x38800000u) {                                                // 2^-14 and up: a normal half
    const uint32_t r = u + 0xfffu + ((u >> 13) & 1u);                    // nearest even at bit 13
    return {static_cast<uint16_t>(sign | ((r - 0x38000000u) >> 13))};
  }
  float a;
  std::memcpy(&a, &u, 4);  // a subnormal half (or zero, or 2^-14): |f|·2^24 to the nearest even integer
  return {static_cast<uint16_t>(sign | static_cast<uint16_t>(std::nearbyint(a * 16777216.0f)))};
}

// ---- launches ----
// The simulated card's limits (CUDA's for every architecture this build targets): block x, y <=
// 1024, z <= 64, at most 1024 threads; grid x < 2^31, y, z <= 65535; dynamic shared memory up to
// 48 KiB, or up to what cudaFuncSetAttribute(kernel, MaxDynamicSharedMemorySize) allowed for that
// kernel, itself at most 99 KiB (sm_86/sm_89's opt-in limit, the smallest of the targets).
constexpr size_t kSimDefaultDynamicSharedBytes = 48 * 1024;
constexpr size_t kSimMaxOptInDynamicSharedBytes = 99 * 1024;

// Records the opt-in for the kernel at `kernel` (cudaErrorInvalidValue past the card's limit).
cudaError_t sim_set_max_dynamic_shared(const void* kernel, int bytes);
template <class... KArgs>
cudaError_t cudaFuncSetAttribute(void (*kernel)(KArgs...), cudaFuncAttribute attribute, int value) {
  if (attribute != cudaFuncAttributeMaxDynamicSharedMemorySize) return cudaErrorInvalidValue;
  return sim_set_max_dynamic_shared(reinterpret_cast<const void*>(kernel), value);
}

// Runs `body` once per thread of every block of the grid; rethrows what a thread threw. A launch
// configuration the hardware refuses (a block past the limits above, an empty or too large grid)
// is not run and sets cudaErrorInvalidConfiguration, like <<<>>> does; more dynamic shared memory
// than `kernel` may use sets cudaErrorInvalidValue. `kernel` identifies the kernel's opt-in
// (nullptr: none, 48 KiB). `outputs`: what the kernel may write, for the write check.
void launch_grid(dim3 grid, dim3 block, size_t dynamic_shared_bytes, const std::function<void()>& body,
                 const void* kernel = nullptr, const std::vector<void*>& outputs = {});

// The arguments a kernel may write through: its pointers to non-const.
template <class... KArgs>
std::vector<void*> writable_pointers(const std::tuple<KArgs...>& args) {
  std::vector<void*> out;
  auto note = [&out](const auto& a) {
    using A = std::decay_t<decltype(a)>;
    if constexpr (std::is_pointer_v<A> && !std::is_const_v<std::remove_pointer_t<A>>)
      out.push_back(const_cast<void*>(static_cast<const void*>(a)));
  };
  std::apply([&](const auto&... a) { (note(a), ...); }, args);
  return out;
}

template <class... KArgs>
struct Launch {
  dim3 grid, block;
  size_t shared_bytes;
  void (*kernel)(KArgs...);
  template <class... Args>
  void operator()(Args&&... args) const {
    std::tuple<KArgs...> bound(static_cast<KArgs>(std::forward<Args>(args))...);
    auto k = kernel;
    launch_grid(
        grid, block, shared_bytes, [&] { std::apply(k, bound); }, reinterpret_cast<const void*>(k),
        write_check_enabled() ? writable_pointers(bound) : std::vector<void*>{});
  }
};
template <class... KArgs>
Launch<KArgs...> make_launch(dim3 grid, dim3 block, size_t shared_bytes, cudaStream_t, void (*kernel)(KArgs...)) {
  return Launch<KArgs...>{grid, block, shared_bytes, kernel};
}

}  // namespace bp::sim
