// One description per GEMM of the CUDA backend (cuBLASLt's model): every cublasLtMatmul call is
// built from a GemmDesc (cublaslt_gemm.cpp, real CUDA builds), and the tests execute the same
// description with a plain column-major CPU GEMM (gemm_reference) and compare it with the CPU
// backend's row-major sgemm. Plain C++: no CUDA header needed.
//
// Semantics, column-major as in cuBLAS: for each batch item b,
//   C_b[m×n] = alpha · op(A_b)[m×k] · op(B_b)[k×n] + beta · C_b
// (cuBLASLt's D = alpha·op(A)·op(B) + beta·C with D = C; a call may read beta's matrix from another
// array of the same layout, C_in: out of place, D = C and C = C_in in cuBLASLt's names.)
// where op(X) = Xᵀ when trans_x; A_b = A + b·stride_a (elements), likewise B and C; lda/ldb/ldc
// are the column strides of the stored matrices (stored A is m×k, or k×m when transposed).
// Inputs A and B are f32, bf16 or f16, C f32 (or a 16-bit type); products are accumulated in f32.
//
// The model's tensors are row-major. A row-major matrix R[r×c] with row stride ld is the
// column-major matrix Rᵀ[c×r] with column stride ld, so row-major Y = op(X)·op(W) is column-major
// Yᵀ = op(W)ᵀ·op(X)ᵀ: row_major_gemm() swaps the operands and the roles of M and N.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>

namespace bp::gemm {

enum class DType { F32, BF16, F16 };

inline const char* dtype_name(DType t) {
  return t == DType::F32 ? "f32" : t == DType::BF16 ? "bf16" : "f16";
}
inline size_t dtype_bytes(DType t) {
  return t == DType::F32 ? 4 : 2;
}

// The 16-bit input type of the GEMMs against frozen weights on a card of compute capability
// cc_major.x: bf16 from Ampere (8.0) on; f16 on Turing (7.5), whose tensor cores have no bf16 (the
// operands then need range care: kernel_wrappers.h ActivationOperand).
inline DType narrow_type(int cc_major) {
  return cc_major >= 8 ? DType::BF16 : DType::F16;
}

struct GemmDesc {
  bool trans_a = false, trans_b = false;
  int64_t m = 0, n = 0, k = 0;
  int64_t lda = 0, ldb = 0, ldc = 0;
  int64_t stride_a = 0, stride_b = 0, stride_c = 0;
  int32_t batch = 1;
  DType a_type = DType::F32, b_type = DType::F32, c_type = DType::F32;
  float alpha = 1.0f, beta = 0.0f;
  // When set: alpha and beta are read from DEVICE memory, {alpha, beta} here, when the GEMM runs
  // (cuBLASLt's CUBLASLT_POINTER_MODE_DEVICE), and the two fields above are not used: a scale the
  // device computed (F16OperandScale) reaches the GEMM without the host reading it.
  const float* alpha_beta_on_device = nullptr;
};

// The scale of an f16 activation operand, made on the device (elementwise.cuh
// convert_f32_to_f16_scaled) and read there by the GEMMs over it in device pointer mode: the
// operand is x·2^s, and alpha = 2^-s gives the product back its scale. Plain floats, 4-byte aligned.
struct F16OperandScale {
  int32_t abs_max_bits = 0;                 // max|x| as f32 bits (the reduction's result)
  float scale = 1.0f;                       // 2^s
  float alpha_beta_overwrite[2] = {1, 0};   // {2^-s, 0}: a GEMM that overwrites C
  float alpha_beta_accumulate[2] = {1, 1};  // {2^-s, 1}: a GEMM that adds to C
};
// The device address of the (alpha, beta) pair for a GEMM with `beta` (0 or 1) over the operand
// whose scale lives at `scale` (device memory: only the address is computed); nullptr for another beta.
inline const float* f16_alpha_beta_on_device(const F16OperandScale* scale, float beta) {
  const size_t at = beta == 0.0f   ? offsetof(F16OperandScale, alpha_beta_overwrite)
                    : beta == 1.0f ? offsetof(F16OperandScale, alpha_beta_accumulate)
                                   : 0;
  return at ? reinterpret_cast<const float*>(reinterpret_cast<const char*>(scale) + at) : nullptr;
}

// cuBLASLt's workspace for a GEMM (cublasLtMatmul's `workspace`, `workspaceSizeInBytes`): device
// memory the chosen algorithm may use; {nullptr, 0} restricts cuBLASLt to algorithms that need none.
// The wrappers hand every GEMM the device's held one (kernel_wrappers.h gemm_workspace).
struct Workspace {
  void* ptr = nullptr;
  size_t bytes = 0;
};

// Row-major Y[M×N] = alpha·op(X)[M×K]·op(W)[K×N] + beta·Y, the CPU backend's sgemm arguments
// (ldx, ldw, ldy: row strides of the stored matrices), as a column-major description with
// A = W and B = X.
inline GemmDesc row_major_gemm(bool trans_x, bool trans_w, int64_t M, int64_t N, int64_t K, float alpha, int64_t ldx,
                               int64_t ldw, float beta, int64_t ldy, DType in_type = DType::F32,
                               DType out_type = DType::F32) {
  GemmDesc d;
  d.trans_a = trans_w;
  d.trans_b = trans_x;
  d.m = N;
  d.n = M;
  d.k = K;
  d.lda = ldw;
  d.ldb = ldx;
  d.ldc = ldy;
  d.a_type = d.b_type = in_type;
  d.c_type = out_type;
  d.alpha = alpha;
  d.beta = beta;
  return d;
}

// The three GEMMs of a linear layer y[T,out] = x[T,in]·W[out,in]ᵀ (every projection of the model:
// q/k/v/o, gate/up/down, the LM head chunk), contiguous row-major tensors.
inline GemmDesc linear_forward_gemm(int64_t T, int64_t in, int64_t out, DType in_type, DType out_type) {
  return row_major_gemm(false, true, T, out, in, 1.0f, in, in, 0.0f, out, in_type, out_type);
}
// dx[T,in] = dy[T,out]·W[out,in] + beta·dx   (beta 1: a layer's input feeding several projections
// sums their dx in place)
inline GemmDesc linear_dx_gemm(int64_t T, int64_t in, int64_t out, DType in_type, DType out_type, float beta = 0.0f) {
  return row_major_gemm(false, false, T, in, out, 1.0f, out, in, beta, in, in_type, out_type);
}
// dW[out,in] += dy[T,out]ᵀ·x[T,in]   (beta 1: gradients accumulate into the f32 master gradient)
inline GemmDesc linear_dW_gemm(int64_t T, int64_t in, int64_t out, DType in_type) {
  return row_major_gemm(true, false, out, in, T, 1.0f, out, in, 1.0f, in, in_type, DType::F32);
}

// Why the description cannot be a valid cuBLASLt call (a leading dimension shorter than the stored
// rows, a negative size), or "" when it can. Callers throw RUNTIME_INTERNAL with it: a bug in the
// caller, caught before cuBLASLt reports CUBLAS_STATUS_INVALID_VALUE without saying which argument.
// (No core/error.h here: nvcc-compiled sources include this header, and they are C++17.)
inline std::string invalid_reason(const GemmDesc& d) {
  const int64_t a_rows = d.trans_a ? d.k : d.m, b_rows = d.trans_b ? d.n : d.k;
  const std::string at = "m=" + std::to_string(d.m) + " n=" + std::to_string(d.n) + " k=" + std::to_string(d.k) +
                         " lda=" + std::to_string(d.lda) + " ldb=" + std::to_string(d.ldb) +
                         " ldc=" + std::to_string(d.ldc) + " batch=" + std::to_string(d.batch) + ": ";
  if (d.m < 0 || d.n < 0 || d.k < 0 || d.batch < 1) return at + "negative size or batch < 1";
  if (d.lda < std::max<int64_t>(1, a_rows)) return at + "lda shorter than the stored rows of A";
  if (d.ldb < std::max<int64_t>(1, b_rows)) return at + "ldb shorter than the stored rows of B";
  if (d.ldc < std::max<int64_t>(1, d.m)) return at + "ldc shorter than the rows of C";
  return "";
}

// The alignment cuBLASLt may assume of a pointer (CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_*_BYTES): the
// largest power of two dividing the address, capped at 256 (cuBLASLt's default assumption, which
// is wrong for the panel pointers `C + n0` of the chunked GEMMs: 4 or 2 bytes past an allocation).
inline uint32_t pointer_alignment(const void* p) {
  const uintptr_t address = reinterpret_cast<uintptr_t>(p);
  const uintptr_t lowest_bit = address & (~address + 1);  // 0 for a null pointer
  return lowest_bit == 0 || lowest_bit >= 256 ? 256u : static_cast<uint32_t>(lowest_bit);
}

// The four MIN_ALIGNMENT preferences of one call: c of the matrix beta reads (C_in, or C when null),
// d of the one written (C). With a batch, every item starts `stride` elements after the previous
// one, so the stride in bytes bounds the alignment too.
struct GemmAlignments {
  uint32_t a = 256, b = 256, c = 256, d = 256;
};
inline GemmAlignments gemm_alignments(const GemmDesc& d, const void* A, const void* B, const void* C,
                                      const void* C_in = nullptr) {
  auto aligned = [&](const void* p, int64_t stride, DType t) {
    uint32_t bytes = pointer_alignment(p);
    if (d.batch > 1) {
      const auto stride_bytes = static_cast<uintptr_t>(stride) * dtype_bytes(t);
      bytes = std::min(bytes, pointer_alignment(reinterpret_cast<const void*>(stride_bytes)));
    }
    return bytes;
  };
  GemmAlignments r;
  r.a = aligned(A, d.stride_a, d.a_type);
  r.b = aligned(B, d.stride_b, d.b_type);
  r.d = aligned(C, d.stride_c, d.c_type);
  r.c = C_in ? aligned(C_in, d.stride_c, d.c_type) : r.d;
  return r;
}

// Why cuBLASLt refuses these pointers (CUBLAS_STATUS_NOT_SUPPORTED: an operand not aligned to its
// element size), or "" when it accepts them.
inline std::string misaligned_reason(const GemmDesc& d, const GemmAlignments& al) {
  auto check = [](const char* name, uint32_t bytes, DType t) -> std::string {
    if (bytes >= dtype_bytes(t)) return "";
    return std::string(name) + " is " + std::to_string(bytes) + "-byte aligned, below its " + dtype_name(t) +
           " element size of " + std::to_string(dtype_bytes(t)) + " bytes";
  };
  for (auto why :
       {check("A", al.a, d.a_type), check("B", al.b, d.b_type), check("C", al.c, d.c_type), check("D", al.d, d.c_type)})
    if (!why.empty()) return why;
  return "";
}

}  // namespace bp::gemm
