// A GemmDesc (backend/cuda/gemm_desc.h) executed on the CPU by the definition: three loops over
// column-major storage, products accumulated in f32 in k order. The oracle that ties the
// descriptions the CUDA backend hands to cuBLASLt to the CPU backend's row-major results. 16-bit
// operands are read as the tensor cores read them: each bf16 or f16 value exactly (every one is an
// f32), so the only rounding is the one that made them; a 16-bit C is stored rounded to nearest
// even (core's f32_to_bf16 / f32_to_f16).
#pragma once

#include <cstring>
#include <vector>

#include "backend/cuda/gemm_desc.h"
#include "core/dtype.h"

namespace bp::gemm {

inline float load_element(const void* p, DType t, int64_t i) {
  if (t == DType::F32) return static_cast<const float*>(p)[i];
  if (t == DType::F16) return f16_to_f32(static_cast<const uint16_t*>(p)[i]);
  uint32_t u = static_cast<uint32_t>(static_cast<const uint16_t*>(p)[i]) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline void store_element(void* p, DType t, int64_t i, float v) {
  if (t == DType::F32) {
    static_cast<float*>(p)[i] = v;
    return;
  }
  if (t == DType::F16) {
    static_cast<uint16_t*>(p)[i] = f32_to_f16(v);
    return;
  }
  uint32_t u;
  std::memcpy(&u, &v, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u)
    u = (u | 0x400000u);  // NaN stays NaN
  else
    u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
  static_cast<uint16_t*>(p)[i] = static_cast<uint16_t>(u >> 16);
}

// op(A) is widened to f32 once per batch entry (row i contiguous) and op(B)'s column j once per
// column, so the inner product reads two contiguous arrays; every sum still runs over p in
// ascending order with the same f32 values, so the results are those of the plain triple loop.
// C_in (may be null: C): the matrix beta scales, of C's layout; C is written.
inline void gemm_reference(const GemmDesc& d, const void* A, const void* B, void* C, const void* C_in = nullptr) {
  const void* prior_of = C_in ? C_in : C;
  std::vector<float> a_rows(static_cast<size_t>(d.m * d.k)), b_col(static_cast<size_t>(d.k));
  for (int32_t b = 0; b < d.batch; ++b) {
    for (int64_t i = 0; i < d.m; ++i)
      for (int64_t p = 0; p < d.k; ++p) {
        const int64_t ia = b * d.stride_a + (d.trans_a ? i * d.lda + p : p * d.lda + i);  // op(A)[i,p]
        a_rows[static_cast<size_t>(i * d.k + p)] = load_element(A, d.a_type, ia);
      }
    for (int64_t j = 0; j < d.n; ++j) {
      for (int64_t p = 0; p < d.k; ++p) {
        const int64_t ib = b * d.stride_b + (d.trans_b ? p * d.ldb + j : j * d.ldb + p);  // op(B)[p,j]
        b_col[static_cast<size_t>(p)] = load_element(B, d.b_type, ib);
      }
      for (int64_t i = 0; i < d.m; ++i) {
        const float* ar = a_rows.data() + i * d.k;
        float acc = 0.0f;
        for (int64_t p = 0; p < d.k; ++p) acc += ar[p] * b_col[static_cast<size_t>(p)];
        const int64_t ic = b * d.stride_c + j * d.ldc + i;
        const float prior = d.beta != 0.0f ? d.beta * load_element(prior_of, d.c_type, ic) : 0.0f;
        store_element(C, d.c_type, ic, d.alpha * acc + prior);
      }
    }
  }
}

}  // namespace bp::gemm
