// nvcuda::wmma (CUDA's warp-level tensor-core fragments, <mma.h>) on the CPU simulation, so that a
// kernel using tensor cores runs in the tests like every other kernel (cuda_sim.h). The subset:
//   fragment<matrix_a | matrix_b, 16, 16, 16, __nv_bfloat16 | __half, row_major | col_major>,
//   fragment<accumulator, 16, 16, 16, float>, fill_fragment, load_matrix_sync (mem_row_major /
//   mem_col_major for accumulators), store_matrix_sync, mma_sync, num_elements and x[].
//
// Element-to-lane mapping: CUDA leaves it unspecified (each lane holds a part of the tile, e.g. 8
// elements). Here every lane holds the WHOLE 16×16 tile in x[] (num_elements = 256, row-major:
// x[row·16 + col], for matrix_b x[k·16 + n]). So only what CUDA defines carries over: element-wise
// operations applied alike to every element (scaling, fill, a conversion); code that reads a
// particular x[i] as a particular (row, column) works here and not on a GPU. mma_sync checks that
// every lane holds the same tiles (what uniform element-wise code leaves) and reports otherwise.
//
// Warp-collective, as on a GPU: every lane of the warp must call the same function with the same
// pointer, leading dimension and layout. Each call meets the warp like the shuffles do (cuda_sim.h):
// a call made by only some lanes of a warp (others exited or wait at __syncthreads) is reported as a
// deadlock, lanes meeting at different calls or with different arguments as an error. The warp
// must be full (32 lanes). Pointers must be 32-byte aligned and ldm a multiple of 16 bytes (8
// 16-bit elements, 4 floats): CUDA's requirements, a misaligned address fault on a GPU.
//
// Rounding: the inputs are what the fragment type holds (bf16 or f16: their products are exact in
// f32), every product and sum is f32; each output element sums its 16 products in k order onto the
// accumulator. A GPU's tensor cores add in an unspecified order (and may keep fewer bits between
// partial sums), so results agree within f32 rounding, not bit for bit.
// One lane of the warp computes the product for all (the others wait at the warp meeting): the
// simulated cost of an mma is one 16×16×16 product, not 32.
#pragma once

#include <atomic>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "backend/cuda/sim/cuda_sim.h"

namespace bp::sim {

namespace wmma_detail {
inline std::atomic<uint64_t> g_mma_calls{0};
}  // namespace wmma_detail

// mma_sync calls (counted once per warp) since the process started: tests check that a kernel
// really took its tensor-core path.
inline uint64_t wmma_mma_count() {
  return wmma_detail::g_mma_calls.load();
}

namespace nvcuda::wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

template <class Use, int M, int N, int K, class T, class Layout = void>
class fragment {
  static_assert(M == 16 && N == 16 && K == 16, "the simulation has the m16n16k16 shape only");
  static_assert(std::is_same_v<Use, accumulator>
                    ? std::is_same_v<T, float> && std::is_void_v<Layout>
                    : (std::is_same_v<T, __nv_bfloat16> || std::is_same_v<T, __half>)&&!std::is_void_v<Layout>,
                "simulated fragments: bf16/f16 matrix_a/matrix_b with a layout, float accumulators");

 public:
  using element_type = T;
  using storage_element_type = T;
  enum { num_elements = 256 };
  T x[num_elements];
};

}  // namespace nvcuda::wmma

namespace wmma_detail {

using namespace nvcuda::wmma;

// What one lane brings to a warp-collective call: the call's identity (function and warp-uniform
// arguments) and, for mma_sync, its fragments.
struct WarpCall {
  uint64_t key;
  const void* a = nullptr;
  const void* b = nullptr;
  const void* c = nullptr;
  void* d = nullptr;
};

inline uint64_t call_key(int op, const void* p = nullptr, unsigned ldm = 0, int layout = 0) {
  uint64_t h = reinterpret_cast<uintptr_t>(p);
  for (uint64_t v : {uint64_t(op), uint64_t(ldm), uint64_t(layout)}) h = (h ^ v) * 0x100000001b3ull + 0x9e3779b9ull;
  return h;
}

[[noreturn]] inline void fail(const char* op, const std::string& why) {
  throw std::runtime_error(std::string("[cuda-sim] wmma::") + op + ": " + why);
}

// Meets the warp with `call` published in the warp's exchange slots and checks that every lane
// made the same call. The lanes' calls stay readable until the caller's closing sim_warp_meet().
inline WarpCall* const* meet_warp(WarpCall& call, const char* op) {
  const int threads = static_cast<int>(blockDim.x * blockDim.y * blockDim.z);
  const int flat = static_cast<int>(threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z));
  if (flat / warpSize * warpSize + warpSize > threads)
    fail(op, "the warp has " + std::to_string(threads % warpSize) + " lanes; wmma needs all 32");
  uint64_t* slots = sim_warp_slots();
  slots[sim_lane()] = reinterpret_cast<uintptr_t>(&call);
  sim_warp_meet();
  auto* calls = reinterpret_cast<WarpCall* const*>(slots);
  for (int lane = 1; sim_lane() == 0 && lane < warpSize; ++lane)  // lane 0 checks: a mismatch involves it
    if (calls[lane]->key != call.key)
      fail(op, "lane " + std::to_string(lane) + " of the warp made another call or passed another pointer, ldm " +
                   "or layout (every lane of a warp must make the same wmma call together)");
  return calls;
}

inline void check_operand(const char* op, const void* p, unsigned ldm, size_t element_bytes) {
  if (reinterpret_cast<uintptr_t>(p) % 32 != 0) fail(op, "the pointer is not 32-byte aligned");
  if (ldm * element_bytes % 16 != 0 || ldm < 16)
    fail(op, "ldm " + std::to_string(ldm) + " is not a multiple of 16 bytes of at least 16 elements");
}

template <class T>
float to_f32(T v) {
  if constexpr (std::is_same_v<T, float>)
    return v;
  else if constexpr (std::is_same_v<T, __half>)
    return __half2float(v);
  else
    return __bfloat162float(v);
}

template <class Use, class T, class Layout>
void load(fragment<Use, 16, 16, 16, T, Layout>& f, const T* p, unsigned ldm, bool row_major_memory, int op) {
  const char* name = "load_matrix_sync";
  WarpCall call{call_key(op, p, ldm, row_major_memory)};
  meet_warp(call, name);
  sim_warp_meet();
  check_operand(name, p, ldm, sizeof(T));
  for (int r = 0; r < 16; ++r) {
    if (row_major_memory)  // a row of the tile is 16 consecutive elements
      std::memcpy(&f.x[r * 16], p + static_cast<size_t>(r) * ldm, 16 * sizeof(T));
    else
      for (int c = 0; c < 16; ++c) f.x[r * 16 + c] = p[static_cast<size_t>(c) * ldm + r];
  }
}

}  // namespace wmma_detail

namespace nvcuda::wmma {

template <class Use, class T, class Layout>
void fill_fragment(fragment<Use, 16, 16, 16, T, Layout>& f, const T& value) {
  wmma_detail::WarpCall call{wmma_detail::call_key(1)};
  wmma_detail::meet_warp(call, "fill_fragment");
  sim_warp_meet();
  for (auto& e : f.x) e = value;
}

// matrix_a: element (m, k) at p[m·ldm + k] (row_major) or p[k·ldm + m] (col_major); matrix_b:
// element (k, n) at p[k·ldm + n] (row_major) or p[n·ldm + k] (col_major).
template <class Use, class T, class Layout>
void load_matrix_sync(fragment<Use, 16, 16, 16, T, Layout>& f, const T* p, unsigned ldm) {
  static_assert(!std::is_same_v<Use, accumulator>, "an accumulator load names its memory layout");
  wmma_detail::load(f, p, ldm, std::is_same_v<Layout, row_major>, 2);
}
inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, float>& f, const float* p, unsigned ldm,
                             layout_t layout) {
  wmma_detail::load(f, p, ldm, layout == mem_row_major, 3);
}

inline void store_matrix_sync(float* p, const fragment<accumulator, 16, 16, 16, float>& f, unsigned ldm,
                              layout_t layout) {
  const char* name = "store_matrix_sync";
  wmma_detail::WarpCall call{wmma_detail::call_key(4, p, ldm, layout)};
  wmma_detail::meet_warp(call, name);
  sim_warp_meet();
  wmma_detail::check_operand(name, p, ldm, sizeof(float));
  for (int r = 0; r < 16; ++r)
    for (int c = 0; c < 16; ++c) (layout == mem_row_major ? p[r * ldm + c] : p[c * ldm + r]) = f.x[r * 16 + c];
}

// d = a·b + c (d may be c). Lane 0 computes the tile once, from its own fragments after checking
// that every lane holds the same ones, and writes it into every lane's d.
template <class T, class LayoutA, class LayoutB>
void mma_sync(fragment<accumulator, 16, 16, 16, float>& d, const fragment<matrix_a, 16, 16, 16, T, LayoutA>& a,
              const fragment<matrix_b, 16, 16, 16, T, LayoutB>& b, const fragment<accumulator, 16, 16, 16, float>& c) {
  const char* name = "mma_sync";
  wmma_detail::WarpCall call{wmma_detail::call_key(5), &a, &b, &c, &d};
  auto* calls = wmma_detail::meet_warp(call, name);
  if (sim_lane() == 0) {
    for (int lane = 1; lane < warpSize; ++lane)
      if (std::memcmp(calls[lane]->a, &a, sizeof a) != 0 || std::memcmp(calls[lane]->b, &b, sizeof b) != 0 ||
          std::memcmp(calls[lane]->c, &c, sizeof c) != 0)
        wmma_detail::fail(name, "lane " + std::to_string(lane) +
                                    " holds other fragment values than lane 0 (lane-dependent element-wise code "
                                    "has no defined meaning: the element-to-lane mapping is unspecified)");
    float out[256];
    for (int m = 0; m < 16; ++m)
      for (int n = 0; n < 16; ++n) {
        float acc = c.x[m * 16 + n];
        for (int k = 0; k < 16; ++k) acc += wmma_detail::to_f32(a.x[m * 16 + k]) * wmma_detail::to_f32(b.x[k * 16 + n]);
        out[m * 16 + n] = acc;
      }
    for (int lane = 0; lane < warpSize; ++lane) std::memcpy(calls[lane]->d, out, sizeof out);
    wmma_detail::g_mma_calls.fetch_add(1);
  }
  sim_warp_meet();  // every lane's d is written
}

}  // namespace nvcuda::wmma

}  // namespace bp::sim
