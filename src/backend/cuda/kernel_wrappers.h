// The CUDA backend's kernels behind the CPU kernels' signatures (backend/cpu/*.h), so the ops'
// dispatch table (ops/dispatch.h, kernels_from<KernelWrappers>) holds them beside the CPU ones.
// Written once, compiled twice (like cuda_compat.cuh): included with BP_WRAP_NS = cuda by
// cuda_kernel_wrappers.h over the real launchers (g++, CUDA runtime headers), and with
// BP_WRAP_NS = sim by sim/sim_kernel_wrappers.h over the simulated kernels (test_cuda). The
// includer declares the launchers and the runtime calls first; this file has no include guard.
//
// What the wrappers add to a launcher: f32 activations (the ops layer is f32 today), device
// workspace from the CUDA allocator (counted, and released on every path; cuBLASLt's workspace is
// the one block the allocator holds for every GEMM: gemm_workspace), a check of the launch
// (a failed launch throws through cuda_errors.h), and the few host values the CUDA launchers need:
// the labels on the host (cross-entropy windows: the uploader's host copy, core/host_mirror.h, or
// a copy back), rope's inv_freq table (host memory on every backend) passed in the launch's arguments. GEMMs against a
// frozen weight held narrower than f32 take 16-bit inputs with f32 accumulation and an f32 result (cuBLASLt's
// tensor-core path), in the card's narrow type (gemm::narrow_type): bf16 from compute capability 8.0 on, f16 on Turing
// (7.5). bf16 card: a bf16 weight is read as stored, f16 and the block types (q8_0, q4_K, ...: dequant.cuh) are
// dequantized to bf16 panel by panel (at most cuda_workspace::held_panel_values() values) into workspace. f16 card:
// every held type, bf16 included, is dequantized to f16 panels the same way (frozen weights stay in their stored type
// in memory: nothing to convert at upload, and one code path for every type). The f32 activation operand is rounded to
// the narrow type into workspace (ActivationOperand; a bf16 GEMM reads the bf16 copy its producer wrote instead, when
// the caller gives one: held_linear_forward, held_linear_backward), scaled by a power of two into f16's range on an f16
// card (the GEMM's alpha, read from device memory, undoes it: no wait for the card). GEMMs against f32 weights
// (trainable ones, LoRA's A/B, a model held in f32) stay f32 GEMMs without TF32; other held types are refused
// (RUNTIME_NOT_BUILT_WITH_CUDA, never a crash). Attention: the ops front-end (ops/attention.cpp) validates cu_seqlens
// on the host (the uploader's host copy, or a staged copy) and refuses mixed devices, so the pointer reaching the
// wrapper is already the device's copy; heads wider than kCudaAttentionMaxHeadDim are refused here. Kernels not written
// yet would be null entries, listed in kernel_gaps.h (none today).
#ifndef BP_WRAP_NS
#error "define BP_WRAP_NS (cuda or sim) and declare the launchers before including kernel_wrappers.h"
#endif

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backend/cpu/attention.h"
#include "backend/cpu/cross_entropy.h"
#include "backend/cpu/linear.h"
#include "backend/cpu/quant_gemm.h"
#include "backend/cpu/rope.h"
#include "backend/cuda/attention_limits.h"
#include "backend/cuda/caching_allocator.h"
#include "backend/cuda/cuda_device.h"
#include "backend/cuda/cuda_errors.h"
#include "backend/cuda/device_workspace.h"
#include "backend/cuda/gemm_desc.h"
#include "backend/cuda/kernel_gaps.h"
#include "core/allocator.h"
#include "core/dtype.h"
#include "core/host_mirror.h"

namespace bp::BP_WRAP_NS {

// Device memory from the CUDA allocator for one call, returned when the call ends.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes)
      : allocator_(allocator_for(Device{DeviceType::CUDA, 0})), bytes_(bytes), ptr_(allocator_.allocate(bytes)) {}
  ~DeviceBuffer() { allocator_.deallocate(ptr_, bytes_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  template <class T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }

 private:
  Allocator& allocator_;
  size_t bytes_;
  void* ptr_;
};

inline void check_cuda(cudaError_t status, const char* what) {
  if (status == cudaSuccess) return;
  const cudaError_t e = cudaGetLastError();
  const cudaError_t shown = e == cudaSuccess ? status : e;
  throw cuda_failure(what, cudaGetErrorName(shown), cudaGetErrorString(shown));
}
// A launch reports its configuration errors (and, in the simulation, injected faults) here.
inline void check_launch(const char* kernel) {
  check_cuda(cudaGetLastError(), kernel);
}

// Heads wider than the kernels' shared-memory tiles allow are refused with the numbers.
inline void check_attention_head_dim(const cpu::AttentionDims& dims, const char* kernel) {
  if (dims.head_dim >= 1 && dims.head_dim <= kCudaAttentionMaxHeadDim) return;
  throw Error(ErrorCode::RUNTIME_NOT_BUILT_WITH_CUDA,
              std::string("[") + kernel + "] the CUDA attention kernels take head_dim 1.." +
                  std::to_string(kCudaAttentionMaxHeadDim) + ", this model has head_dim " +
                  std::to_string(dims.head_dim) + "; train it with --device cpu");
}

[[noreturn]] inline void held_type_unavailable(const char* kernel, DType type) {
  const std::string what = std::string(kernel) + " (weights held as " + dtype_name(type) + ")";
  cuda_op_unavailable(what.c_str());
}

// Kernels still missing would be the null members inherited from KernelGaps.
struct KernelWrappers : cuda_gaps::KernelGaps {
  // ---- attention (attention.cuh): f32 storage; cu_seqlens is device memory (see above) ----
  static void attention_forward(const float* q, const float* k, const float* v, const int32_t* cu_seqlens,
                                const cpu::AttentionDims& dims, float* o, uint16_t* o_bf16, float* lse) {
    check_attention_head_dim(dims, "attention_forward");
    ::bp::BP_WRAP_NS::attention_forward<float>(q, k, v, cu_seqlens, dims, o, reinterpret_cast<bf16*>(o_bf16), lse,
                                               nullptr);
    check_launch("attention_forward");
  }
  static void attention_backward(const float* dout, const float* q, const float* k, const float* v, const float* o,
                                 const float* lse, const int32_t* cu_seqlens, const cpu::AttentionDims& dims,
                                 float* delta, float* dq, float* dk, float* dv, uint16_t* dv_bf16) {
    check_attention_head_dim(dims, "attention_backward");
    ::bp::BP_WRAP_NS::attention_backward<float>(dout, q, k, v, o, lse, cu_seqlens, dims, delta, dq, dk, dv,
                                                reinterpret_cast<bf16*>(dv_bf16), nullptr);
    check_launch("attention_backward");
  }
  // The CUDA kernels keep their tiles in shared memory: no global scratch beyond the front-end's
  // [Hq, T] delta (counted by the caller), whatever the sample length.
  static int64_t attention_forward_scratch_floats(int64_t /*max_len*/, const cpu::AttentionDims& /*dims*/,
                                                  int /*threads*/) {
    return 0;
  }
  static int64_t attention_backward_scratch_floats(int64_t /*max_len*/, const cpu::AttentionDims& /*dims*/,
                                                   int /*threads*/) {
    return 0;
  }

  // ---- GEMMs (gemm_desc.h: row-major calls become column-major descriptions, A = W, B = X) ----
  // Device 0's compute capability (the card training uses). A runtime that cannot say (no card: a
  // memory plan made without one) answers 8.0.
  static std::pair<int, int> compute_capability() {
    int major = 8, minor = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0) != cudaSuccess) {
      cudaGetLastError();
      return {8, 0};
    }
    return {major, minor};
  }
  // Every GEMM gets cuBLASLt's workspace (gemm_workspace below): this many bytes for this card.
  static size_t gemm_workspace_bytes() { return cuda_workspace::gemm_workspace_bytes(compute_capability().first); }
  // The 16-bit input type of the GEMMs against frozen weights: bf16 unless the compute capability
  // is below 8.0. A card older than the build's kernels (below 7.5, which cuda_status() already
  // reports unusable) is refused here too: DEP_GPU_NOT_AVAILABLE.
  static gemm::DType narrow_gemm_type() {
    const auto [major, minor] = compute_capability();
    if (const std::string why = unsupported_device_reason("CUDA device 0", major, minor); !why.empty())
      throw Error(ErrorCode::DEP_GPU_NOT_AVAILABLE, "[cuda] " + why);
    return gemm::narrow_type(major);
  }
  static bool frozen_gemms_in_f16() { return narrow_gemm_type() == gemm::DType::F16; }
  static void sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                    int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
    run_gemm(gemm::row_major_gemm(trans_a, trans_b, M, N, K, alpha, lda, ldb, beta, ldc), B, A, C);
  }
  // residual (may be null): the GEMM adds it (out of place, beta 1: cublaslt_gemm.cpp), no add launch.
  static void linear_base_forward(const float* x, const float* W, const float* bias, const float* residual, float* y,
                                  int64_t T, int64_t in, int64_t out) {
    gemm::GemmDesc d = gemm::linear_forward_gemm(T, in, out, gemm::DType::F32, gemm::DType::F32);
    if (residual) d.beta = 1.0f;
    run_gemm(d, W, x, y, residual);
    if (bias) add_bias_inplace(y, bias, T, out);
  }
  static void lora_forward(const float* xd, const float* A, const float* B, float scale, float* xa, float* y, int64_t T,
                           int64_t in, int64_t out, int64_t r) {
    sgemm(false, true, T, r, in, 1.0f, xd, in, A, in, 0.0f, xa, r);
    sgemm(false, true, T, out, r, scale, xa, r, B, r, 1.0f, y, out);
  }
  static void linear_dx(const float* dy, const float* W, float beta, float* dx, int64_t T, int64_t in, int64_t out) {
    if (out == 0) {
      if (beta == 0.0f)
        check_cuda(cudaMemset(dx, 0, static_cast<size_t>(T * in) * sizeof(float)), "cudaMemset(linear dx)");
      return;
    }
    run_gemm(gemm::linear_dx_gemm(T, in, out, gemm::DType::F32, gemm::DType::F32, beta), W, dy, dx);
  }
  static void linear_dW_accumulate(const float* dy, const float* x, float* dW, int64_t T, int64_t in, int64_t out) {
    if (T > 0) run_gemm(gemm::linear_dW_gemm(T, in, out, gemm::DType::F32), x, dy, dW);
  }
  // The backward of a held weight W [out, in]: dx = dy·W + dx_beta·dx (held_gemm_xw) and, for the
  // bf16 GEMM copy of a trained matrix (full fine-tuning, training.matmul_dtype bf16), dW += dyᵀ·x
  // into the master's f32 gradient (beta 1) with both operands rounded to nearest-even bf16: the two
  // GEMMs share dy's one bf16 copy, x's is made for dW (together
  // cuda_workspace::narrow_dW_operand_bytes), f32 accumulation. An f16 card has no bf16 tensor cores
  // and gets no GEMM copies from the trainer; called there anyway, dW is the f32 GEMM. dy_bf16 and
  // x_bf16 (may be null): dy's bf16 copy as its producer made it (SwiGLU's, RMSNorm's, RoPE's or the
  // attention backward), x's as the forward kept it (RMSNorm's, attention's or SwiGLU's output), read
  // instead of rounding dy or x.
  static void held_linear_backward(const float* dy, const uint16_t* dy_bf16, const float* x, const uint16_t* x_bf16,
                                   const cpu::HeldMatrix& W, float dx_beta, float* dx, float* dW, int64_t T) {
    const int64_t out = W.rows, in = W.cols;
    ActivationOperand g(dy, T * out, dy_bf16);
    if (dx) held_gemm_xw_over(g, W, dx_beta, dx, T);
    if (!dW || T == 0) return;
    if (narrow_gemm_type() != gemm::DType::BF16) return linear_dW_accumulate(dy, x, dW, T, in, out);
    ActivationOperand xs(x, T * in, x_bf16);
    const void* gb = g.as(gemm::DType::BF16);  // the copy dx's GEMM made (a bf16 weight on a bf16 card)
    run_gemm(gemm::linear_dW_gemm(T, in, out, gemm::DType::BF16), xs.as(gemm::DType::BF16), gb, dW);
  }
  // A held linear's forward: C[M, N] = X[M, K]·Wᵀ + beta·C_in, W [N, K] held (for_each_weight_panel:
  // an f32 GEMM for an f32 weight, 16-bit inputs with f32 accumulation and an f32 C for a weight
  // held narrower; alpha, read on the device, undoes the f16 operand's scale, and scales only the
  // product, so beta's C is untouched). X16 (may be null): X's bf16 copy as its producer made it
  // (RMSNorm, attention, SwiGLU), read where the GEMM takes bf16 instead of rounding X here. C_in
  // (may be null: C): the [M, N] matrix beta scales, read by each panel's GEMM out of place (a
  // residual the projection adds: no add launch).
  static void held_linear_forward(const float* X, const uint16_t* X16, const cpu::HeldMatrix& W, float beta,
                                  const float* C_in, float* C, int64_t M) {
    const int64_t N = W.rows, K = W.cols;
    ActivationOperand x(X, M * K, X16);
    for_each_weight_panel(W, "held_gemm_xwt", [&](int64_t n0, int64_t nb, const void* P, gemm::DType t) {
      const void* xt = x.as(t);  // before x.scaled(): the f16 copy's scale exists once it is made
      run_gemm(x.scaled(gemm::row_major_gemm(false, true, M, nb, K, 1.0f, K, K, beta, N, t, gemm::DType::F32)), P, xt,
               C + n0, C_in ? C_in + n0 : nullptr);
    });
  }
  // held_linear_forward with no copy: X rounded here where the GEMM takes 16 bits.
  static void held_gemm_xwt(const float* X, const cpu::HeldMatrix& W, float beta, float* C, int64_t M) {
    held_linear_forward(X, nullptr, W, beta, nullptr, C, M);
  }
  // C[M, K] = X[M, N]·W + beta·C, W [N, K] held: C = beta·C + Σ_panels X[:, panel]·W[panel, :].
  static void held_gemm_xw(const float* X, const cpu::HeldMatrix& W, float beta, float* C, int64_t M) {
    ActivationOperand x(X, M * W.rows);
    held_gemm_xw_over(x, W, beta, C, M);
  }
  // max |w| over W's dequantized values: one reduction on the card (dequant.cuh held_abs_max_bits:
  // no panel, no f32 copy) and one 4-byte copy back; made once per frozen weight (ops/held_range.h).
  static float held_abs_max(const cpu::HeldMatrix& W) {
    if (!::bp::BP_WRAP_NS::dequantize_supported(W.type)) held_type_unavailable("held_abs_max", W.type);
    DeviceBuffer bits(sizeof(int));
    check_cuda(cudaMemset(bits.as<int>(), 0, sizeof(int)), "cudaMemset(held_abs_max)");
    ::bp::BP_WRAP_NS::held_abs_max_bits(W.type, W.data, W.rows, W.cols, bits.as<int>(), nullptr);
    check_launch("held_abs_max");
    int host_bits = 0;
    check_cuda(cudaMemcpy(&host_bits, bits.as<int>(), sizeof(int), cudaMemcpyDeviceToHost), "cudaMemcpy(held_abs_max)");
    float m;
    memcpy(&m, &host_bits, sizeof(float));
    return m;
  }
  static void embedding_forward_held(const int32_t* ids, const cpu::HeldMatrix& table, float* y, int64_t T) {
    const int64_t D = table.cols;
    if (table.type == DType::F32) return embedding_forward(ids, static_cast<const float*>(table.data), y, T, D);
    // The tokens' rows dequantized straight into y (dequant.cuh): no f32 copy of the whole table.
    if (!::bp::BP_WRAP_NS::dequantize_gather_rows<float>(table.type, table.data, D, ids, T, y, nullptr))
      held_type_unavailable("embedding_forward_held", table.type);
    check_launch("embedding_forward_held");
  }

  // ---- fused linear + cross-entropy (f32 activations; logits f32 in any case) ----
  // An f32 head: f32 GEMMs. A bf16 head (tied embeddings held as bf16) on a bf16 card: bf16 GEMMs
  // (bf16_head_cross_entropy below), never a widened f32 copy of the [V, D] head. Another held head
  // (f16 or a block type; and a bf16 one on an f16 card, where the logits' gradient, as small as
  // 1/V times the loss scale, would meet f16's underflow) is dequantized panel by panel into f32 inside the kernel's
  // f32 GEMMs (linear_cross_entropy_held): held_panel_values() floats of panel, never the whole [V, D] head in f32.
  // dW: an f32 head, or a bf16 one on a bf16 card (the bf16 GEMM copy of a trainable head,
  // training.matmul_dtype); the f32-panel path of other held heads has none (frozen heads; the
  // trainer makes no bf16 copies for an f16 card).
  static cpu::CrossEntropyTotals linear_cross_entropy(const float* x, const cpu::HeldMatrix& W, const int32_t* labels,
                                                      int64_t T, int64_t D, int64_t V, int64_t chunk,
                                                      float* /*logits_chunk: the workspace below holds them*/,
                                                      float grad_scale, float* dx, float* dW, float softcap) {
    if (!::bp::BP_WRAP_NS::dequantize_supported(W.type)) held_type_unavailable("linear_cross_entropy", W.type);
    if (T == 0) return {};
    // The windows are chosen on the host: from the labels' host copy when the uploader kept one
    // (core/host_mirror.h: the model's batch), else from a copy back (a wait for the card).
    std::vector<int32_t> labels_copy;
    const auto* labels_host =
        static_cast<const int32_t*>(host_mirror(labels, static_cast<size_t>(T) * sizeof(int32_t)));
    if (!labels_host) {
      labels_copy.resize(static_cast<size_t>(T));
      check_cuda(cudaMemcpy(labels_copy.data(), labels, labels_copy.size() * sizeof(int32_t), cudaMemcpyDeviceToHost),
                 "cudaMemcpy(labels)");
      labels_host = labels_copy.data();
    }
    const int64_t c = std::min(chunk, T);
    if (W.type != DType::F32 && !cuda_workspace::read_as_stored(W.type, narrow_gemm_type() == gemm::DType::F16)) {
      if (dW)
        throw Error(ErrorCode::RUNTIME_INTERNAL,
                    std::string("[linear_cross_entropy] dW asked for a head held as ") + dtype_name(W.type) +
                        " on a card whose GEMMs take f16: only f32 heads and bf16 ones on a bf16 card get a gradient");
      const int64_t panel_rows = cuda_workspace::held_panel_rows(V, D);
      DeviceBuffer workspace(cross_entropy_held_workspace_bytes(c, V, D, panel_rows));
      const auto r = ::bp::BP_WRAP_NS::linear_cross_entropy_held(x, W.type, W.data, labels, labels_host, T, D, V, c,
                                                                 panel_rows, workspace.as<void>(), grad_scale, dx,
                                                                 gemm_workspace(), nullptr, softcap);
      check_launch("linear_cross_entropy (held head)");
      return {r.loss_sum, r.n_counted};
    }
    if (W.type == DType::BF16)
      return bf16_head_cross_entropy(x, W, labels, labels_host, T, D, V, c, grad_scale, dx, dW, softcap);
    DeviceBuffer workspace(cross_entropy_workspace_bytes<float>(c, V));
    const auto r = ::bp::BP_WRAP_NS::linear_cross_entropy<float>(
        x, static_cast<const float*>(W.data), labels, labels_host, T, D, V, c, workspace.as<void>(), grad_scale, dx, dW,
        gemm_workspace(), nullptr, softcap);
    check_launch("linear_cross_entropy");
    return {r.loss_sum, r.n_counted};
  }

  // ---- elementwise ----
  static void add_inplace(float* y, const float* x, int64_t n) {
    ::bp::BP_WRAP_NS::add_inplace(y, x, n, nullptr);
    check_launch("add_inplace");
  }
  static void axpy_inplace(float* y, float a, const float* x, int64_t n) {
    ::bp::BP_WRAP_NS::axpy_inplace(y, a, x, n, nullptr);
    check_launch("axpy_inplace");
  }
  static void scale_inplace(float* y, float a, int64_t n) {
    ::bp::BP_WRAP_NS::scale_inplace(y, a, n, nullptr);
    check_launch("scale_inplace");
  }
  static void add_bias_inplace(float* y, const float* b, int64_t T, int64_t N) {
    ::bp::BP_WRAP_NS::add_bias_inplace(y, b, T, N, nullptr);
    check_launch("add_bias_inplace");
  }
  // A trainable matrix's bf16 GEMM copy from its f32 master (the same rounding as the activations':
  // convert_f32_to_bf16, nearest even).
  static void round_to_bf16(const float* src, uint16_t* dst, int64_t n) {
    ::bp::BP_WRAP_NS::convert_f32_to_bf16(src, reinterpret_cast<bf16*>(dst), n, nullptr);
    check_launch("round_to_bf16");
  }
  static void bias_grad_accumulate(const float* dy, float* db, int64_t T, int64_t N) {
    ::bp::BP_WRAP_NS::bias_grad_accumulate(dy, db, T, N, nullptr);
    check_launch("bias_grad_accumulate");
  }
  static void column_scale_add(float* y, const float* c, const float* z, int64_t T, int64_t N) {
    ::bp::BP_WRAP_NS::column_scale_add(y, c, z, T, N, nullptr);
    check_launch("column_scale_add");
  }
  static void column_dot_accumulate(const float* a, const float* b, const float* w, float* acc, int64_t T, int64_t N) {
    ::bp::BP_WRAP_NS::column_dot_accumulate(a, b, w, acc, T, N, nullptr);
    check_launch("column_dot_accumulate");
  }
  static void dora_column_scale(const float* m, const float* nsq, float* c, float* inv_n, int64_t N) {
    ::bp::BP_WRAP_NS::dora_column_scale(m, nsq, c, inv_n, N, nullptr);
    check_launch("dora_column_scale");
  }
  // LoRA dropout (lora_dropout.cuh): the mask regenerated where x is read, no dropped copy of x,
  // so no scratch from the front-end. dA's reduction over the tokens, split into slices when its
  // grid is small (lora_dropout_split.h), takes its per-slice partials from the CUDA allocator for
  // the call (cuda_workspace::lora_dropout_dA_bytes; none for one slice).
  static int64_t lora_dropout_scratch_floats(int64_t /*T*/, int64_t /*in*/, bool /*backward*/) { return 0; }
  static void lora_dropout_xa(const float* x, const float* A, float p, const cpu::LoraDropoutMember* members,
                              int n_members, float* /*scratch*/, float* xa, int64_t T, int64_t in) {
    ::bp::BP_WRAP_NS::lora_dropout_xa(x, A, xa, T, in, members, n_members, p, nullptr);
    check_launch("lora_dropout_xa");
  }
  static void lora_dropout_backward(const float* dxa, const float* x, const float* A, float p,
                                    const cpu::LoraDropoutMember* members, int n_members, float* /*scratch*/, float* dA,
                                    float* dx, int64_t T, int64_t in) {
    if (dA) {
      const size_t bytes = cuda_workspace::lora_dropout_dA_bytes(T, in, cpu::lora_dropout_rank(members, n_members));
      std::unique_ptr<DeviceBuffer> partials;
      if (bytes) partials = std::make_unique<DeviceBuffer>(bytes);
      ::bp::BP_WRAP_NS::lora_dropout_dA_accumulate(dxa, x, dA, T, in, members, n_members, p,
                                                   partials ? partials->as<float>() : nullptr, nullptr);
      check_launch("lora_dropout_dA_accumulate");
    }
    if (dx) {
      ::bp::BP_WRAP_NS::lora_dropout_dx_accumulate(dxa, A, dx, T, in, members, n_members, p, nullptr);
      check_launch("lora_dropout_dx_accumulate");
    }
  }

  // ---- Mixture-of-Experts (moe.cuh) ----
  static void moe_route_forward(const float* logits, int64_t T, int64_t E, int64_t k, bool renormalize,
                                int32_t* expert_ids, float* weights) {
    ::bp::BP_WRAP_NS::moe_route_forward(logits, T, E, k, renormalize, expert_ids, weights, nullptr);
    check_launch("moe_route_forward");
  }
  static void moe_route_backward(const float* logits, const int32_t* expert_ids, const float* dweights,
                                 const float* aux_grad, int64_t T, int64_t E, int64_t k, bool renormalize,
                                 float* dlogits) {
    ::bp::BP_WRAP_NS::moe_route_backward(logits, expert_ids, dweights, aux_grad, T, E, k, renormalize, dlogits,
                                         nullptr);
    check_launch("moe_route_backward");
  }
  static void moe_sort(const int32_t* expert_ids, int64_t T, int64_t k, int64_t E, int32_t* offsets, int32_t* row_token,
                       int32_t* slot_of) {
    ::bp::BP_WRAP_NS::moe_sort(expert_ids, T, k, E, offsets, row_token, slot_of, nullptr);
    check_launch("moe_sort");
  }
  static void moe_gather_forward(const float* x, const int32_t* row_token, int64_t rows, int64_t D, float* xs) {
    ::bp::BP_WRAP_NS::moe_gather_forward(x, row_token, rows, D, xs, nullptr);
    check_launch("moe_gather_forward");
  }
  static void moe_gather_backward(const float* dxs, const int32_t* slot_of, int64_t T, int64_t k, int64_t D,
                                  float* dx) {
    ::bp::BP_WRAP_NS::moe_gather_backward(dxs, slot_of, T, k, D, dx, nullptr);
    check_launch("moe_gather_backward");
  }
  static void moe_scatter_forward(const float* ys, const float* weights, const int32_t* slot_of, int64_t T, int64_t k,
                                  int64_t D, float* out) {
    ::bp::BP_WRAP_NS::moe_scatter_forward(ys, weights, slot_of, T, k, D, out, nullptr);
    check_launch("moe_scatter_forward");
  }
  static void moe_scatter_backward(const float* dout, const float* ys, const float* weights, const int32_t* slot_of,
                                   int64_t T, int64_t k, int64_t D, float* dys, float* dweights) {
    ::bp::BP_WRAP_NS::moe_scatter_backward(dout, ys, weights, slot_of, T, k, D, dys, dweights, nullptr);
    check_launch("moe_scatter_backward");
  }
  // The rows' softmax statistics (2·T floats) in workspace for the call.
  static void moe_aux_accumulate(const float* logits, const int32_t* expert_ids, int64_t T, int64_t E, int64_t k,
                                 float* counts, float* prob_sum) {
    DeviceBuffer stats(cuda_workspace::moe_aux_accumulate_bytes(T));
    ::bp::BP_WRAP_NS::moe_aux_accumulate(logits, expert_ids, T, E, k, counts, prob_sum, stats.as<float>(), nullptr);
    check_launch("moe_aux_accumulate");
  }

  // ---- embedding ----
  static void embedding_forward(const int32_t* ids, const float* table, float* y, int64_t T, int64_t D) {
    ::bp::BP_WRAP_NS::embedding_forward<float>(ids, table, y, T, D, nullptr);
    check_launch("embedding_forward");
  }
  static void embedding_backward(const float* dy, const int32_t* ids, float* dtable, int64_t T, int64_t D) {
    ::bp::BP_WRAP_NS::embedding_backward<float>(dy, ids, dtable, T, D, nullptr);
    check_launch("embedding_backward");
  }

  // ---- optimizer ----
  static void adamw_step_all(float* const* params, const float* const* grads, float* const* ms, float* const* vs,
                             uint16_t* const* copies, const int64_t* ns, int64_t count, float lr, float beta1,
                             float beta2, float eps, float weight_decay, int64_t step) {
    ::bp::BP_WRAP_NS::adamw_step_all(params, grads, ms, vs, reinterpret_cast<bf16* const*>(copies), ns, count, lr,
                                     beta1, beta2, eps, weight_decay, step, nullptr);
    check_launch("adamw_step_all");
  }
  static void scale_all(float* const* ys, const int64_t* ns, int64_t count, float a) {
    ::bp::BP_WRAP_NS::scale_all(ys, ns, count, a, nullptr);
    check_launch("scale_all");
  }
  static double sum_squares_total(const float* const* xs, const int64_t* ns, int64_t count) {
    if (count <= 0) return 0.0;
    const int64_t max_n = *std::max_element(ns, ns + count);
    DeviceBuffer scratch(sum_squares_total_scratch_bytes(max_n, count));
    const double s = ::bp::BP_WRAP_NS::sum_squares_total<float>(xs, ns, count, scratch.as<void>(), nullptr);
    check_launch("sum_squares_total");
    return s;
  }
  static bool all_finite_f32(const float* x, int64_t n) {
    if (n <= 0) return true;
    DeviceBuffer scratch(optim_scratch_bytes(n));
    const bool ok = ::bp::BP_WRAP_NS::all_finite<float>(x, n, scratch.as<void>(), nullptr);
    check_launch("all_finite_f32");
    return ok;
  }
  static bool all_finite_16(const uint16_t* x, int64_t n, bool is_bf16) {
    if (!is_bf16) held_type_unavailable("all_finite_16", DType::F16);
    if (n <= 0) return true;
    DeviceBuffer scratch(optim_scratch_bytes(n));
    const bool ok =
        ::bp::BP_WRAP_NS::all_finite<bf16>(reinterpret_cast<const bf16*>(x), n, scratch.as<void>(), nullptr);
    check_launch("all_finite_16");
    return ok;
  }

  // ---- normalisation, rotary embedding, activation ----
  static void rms_norm_forward(const float* x, const float* w, float eps, float* y, uint16_t* y_bf16, float* rstd,
                               int64_t N, int64_t D) {
    ::bp::BP_WRAP_NS::rms_norm_forward<float>(x, w, eps, y, reinterpret_cast<bf16*>(y_bf16), rstd, N, D, nullptr);
    check_launch("rms_norm_forward");
  }
  static void rms_norm_backward(const float* dy, const float* x, const float* w, const float* rstd, float* dx,
                                uint16_t* dx_bf16, float* dw, int64_t N, int64_t D, bool accumulate) {
    ::bp::BP_WRAP_NS::rms_norm_backward<float>(dy, x, w, rstd, dx, reinterpret_cast<bf16*>(dx_bf16), dw, N, D,
                                               accumulate, nullptr);
    check_launch("rms_norm_backward");
  }
  // inv_freq is host memory (the front-end's head_dim/2 table), handed to the kernel by value in
  // its launch arguments (rope.cuh RopeFreqs): no copy, no device buffer. Heads wider than the
  // attention kernels take (which bound RopeFreqs) are refused like there. a and b (q and k): one launch.
  static void rope_apply(cpu::RopeTarget a, cpu::RopeTarget b, const int32_t* positions, const float* inv_freq,
                         int64_t T, int64_t head_dim, int64_t rot_dim, float attn_scale, bool inverse) {
    if (T == 0) return;
    if (head_dim > kCudaRopeMaxHeadDim)
      throw Error(ErrorCode::RUNTIME_NOT_BUILT_WITH_CUDA,
                  "[rope_apply] the CUDA rotary kernel takes head_dim up to " + std::to_string(kCudaRopeMaxHeadDim) +
                      ", this model has head_dim " + std::to_string(head_dim) + "; train it with --device cpu");
    ::bp::BP_WRAP_NS::rope_apply<float>(a.x, a.n_heads, reinterpret_cast<bf16*>(a.x_bf16), a.bias, b.x, b.n_heads,
                                        reinterpret_cast<bf16*>(b.x_bf16), b.bias, positions, inv_freq, T, head_dim,
                                        rot_dim, attn_scale, inverse, nullptr);
    check_launch("rope_apply");
  }
  static void swiglu_forward(const float* gate, const float* up, float* h, uint16_t* h_bf16, int64_t n) {
    ::bp::BP_WRAP_NS::swiglu_forward<float>(gate, up, h, reinterpret_cast<bf16*>(h_bf16), n, nullptr);
    check_launch("swiglu_forward");
  }
  static void swiglu_backward(const float* dh, const float* gate, const float* up, float* dgate, float* dup,
                              uint16_t* dgate_bf16, uint16_t* dup_bf16, int64_t n) {
    ::bp::BP_WRAP_NS::swiglu_backward<float>(dh, gate, up, dgate, dup, reinterpret_cast<bf16*>(dgate_bf16),
                                             reinterpret_cast<bf16*>(dup_bf16), n, nullptr);
    check_launch("swiglu_backward");
  }
  static void geglu_forward(const float* gate, const float* up, float* h, uint16_t* h_bf16, int64_t n) {
    ::bp::BP_WRAP_NS::geglu_forward<float>(gate, up, h, reinterpret_cast<bf16*>(h_bf16), n, nullptr);
    check_launch("geglu_forward");
  }
  static void geglu_backward(const float* dh, const float* gate, const float* up, float* dgate, float* dup,
                             uint16_t* dgate_bf16, uint16_t* dup_bf16, int64_t n) {
    ::bp::BP_WRAP_NS::geglu_backward<float>(dh, gate, up, dgate, dup, reinterpret_cast<bf16*>(dgate_bf16),
                                            reinterpret_cast<bf16*>(dup_bf16), n, nullptr);
    check_launch("geglu_backward");
  }

 private:
  // The fused LM head + loss over a head held in bf16, as every GEMM against a frozen bf16 weight:
  // bf16 inputs, f32 accumulation. x is rounded to bf16 into workspace and the kernel's bf16
  // instantiation runs: logits f32, the logits' gradient bf16 (the backward GEMMs' other input),
  // dx out of an f32 accumulation rounded to bf16 and widened into the f32 dx (one more rounding,
  // as the kernel keeps dx in its input type). Workspace: device_workspace.h cross_entropy_bytes.
  static cpu::CrossEntropyTotals bf16_head_cross_entropy(const float* x, const cpu::HeldMatrix& W,
                                                         const int32_t* labels, const int32_t* labels_host, int64_t T,
                                                         int64_t D, int64_t V, int64_t c, float grad_scale, float* dx,
                                                         float* dW, float softcap) {
    ActivationOperand rounded(x, T * D);
    const bf16* xb = static_cast<const bf16*>(rounded.as(gemm::DType::BF16));
    std::unique_ptr<DeviceBuffer> dx_bf16;
    if (dx) dx_bf16 = std::make_unique<DeviceBuffer>(static_cast<size_t>(T * D) * sizeof(bf16));
    DeviceBuffer workspace(cross_entropy_workspace_bytes<bf16>(c, V));
    const auto r = ::bp::BP_WRAP_NS::linear_cross_entropy<bf16>(
        xb, static_cast<const bf16*>(W.data), labels, labels_host, T, D, V, c, workspace.as<void>(), grad_scale,
        dx ? dx_bf16->as<bf16>() : nullptr, dW, gemm_workspace(), nullptr, softcap);
    check_launch("linear_cross_entropy (bf16 head)");
    if (dx) {
      ::bp::BP_WRAP_NS::convert_bf16_to_f32(dx_bf16->as<bf16>(), dx, T * D, nullptr);
      check_launch("linear_cross_entropy (widen dx)");
    }
    return {r.loss_sum, r.n_counted};
  }
  // cuBLASLt's workspace: the block the device's allocator holds for it (caching_allocator.h
  // gemm_workspace: allocated at the first GEMM, kept, counted; none when it cannot be had), sized
  // as NVIDIA recommends for the card (device_workspace.h gemm_workspace_bytes).
  static gemm::Workspace gemm_workspace() {
    auto* caching = dynamic_cast<CachingDeviceAllocator*>(&allocator_for(Device{DeviceType::CUDA, 0}));
    if (!caching) throw Error(ErrorCode::RUNTIME_INTERNAL, "[gemm] the CUDA allocator is not the caching allocator");
    const auto held = caching->gemm_workspace(gemm_workspace_bytes());
    return {held.ptr, held.bytes};
  }
  // C_in (may be null): beta's matrix when it is not C (gemm.cuh).
  static void run_gemm(const gemm::GemmDesc& desc, const void* A, const void* B, void* C, const void* C_in = nullptr) {
    const gemm::Workspace ws = gemm_workspace();
    ::bp::BP_WRAP_NS::gemm(desc, A, B, C, ws.ptr, ws.bytes, nullptr, C_in);
    check_launch("gemm");
  }
  // The activation operand of a GEMM against a held weight, in the type the weight's panels are
  // read in: the f32 tensor itself for an f32 GEMM; for a 16-bit GEMM, a copy rounded (nearest
  // even) into workspace from the CUDA allocator (counted: cuda_workspace::held_gemm_operand_bytes;
  // made once per call on first use, returned when the call ends). An f16 copy is x·2^s with max|x|
  // scaled into [2^13, 2^14) (convert_f32_to_f16_scaled; exact, a power of two): f16 tops out at
  // 65504 and loses gradients below 2^-24, where activations reach 1e5 and a backward's dy 1e-9.
  // The GEMM's alpha = 2^-s (read from device memory: scaled()) gives the f32 result back its scale: per-tensor
  // scaling, so no global loss scale and no skipped steps. `given` (may be null): x's bf16 copy as
  // x's producer made it (the same rounding), which a bf16 GEMM reads instead: no copy, no
  // workspace; an f32 or f16 GEMM still reads or converts x.
  class ActivationOperand {
   public:
    ActivationOperand(const float* x, int64_t n, const uint16_t* given = nullptr) : x_(x), n_(n), given_(given) {}
    // Element `offset` of the operand as `type` (f32, bf16 or f16) device memory.
    const void* as(gemm::DType type, int64_t offset = 0) {
      if (type == gemm::DType::F32) return x_ + offset;
      if (type == gemm::DType::BF16 && given_) return given_ + offset;
      if (!rounded_ && n_ > 0) {
        rounded_ = std::make_unique<DeviceBuffer>(cuda_workspace::narrow_operand_bytes(type == gemm::DType::F16, n_));
        if (type == gemm::DType::BF16) {
          ::bp::BP_WRAP_NS::convert_f32_to_bf16(x_, rounded_->as<bf16>(), n_, nullptr);
        } else {
          scale_ = reinterpret_cast<gemm::F16OperandScale*>(rounded_->as<char>() +
                                                            cuda_workspace::f16_scale_scratch_offset(n_));
          ::bp::BP_WRAP_NS::convert_f32_to_f16_scaled(x_, rounded_->as<f16>(), n_, scale_, nullptr);
        }
        check_launch(type == gemm::DType::BF16 ? "GEMM activation to bf16" : "GEMM activation to f16");
      }
      return rounded_ ? static_cast<const void*>(rounded_->as<char>() + offset * 2) : nullptr;
    }
    // The GEMM `d` (alpha 1) over this operand: unchanged, or for an f16 copy (once as(F16) made
    // it) reading its (alpha = 2^-s, beta) from the copy's scale in device memory (device pointer
    // mode): the host never learns s. Such a GEMM's beta is 0 or 1 (what the wrappers use).
    gemm::GemmDesc scaled(gemm::GemmDesc d) const {
      if (!scale_) return d;
      d.alpha_beta_on_device = gemm::f16_alpha_beta_on_device(scale_, d.beta);
      if (!d.alpha_beta_on_device)
        throw Error(ErrorCode::RUNTIME_INTERNAL,
                    "[gemm] a GEMM over a scaled f16 operand takes beta 0 or 1, not " + std::to_string(d.beta));
      return d;
    }

   private:
    const float* x_;
    int64_t n_;
    const uint16_t* given_;
    gemm::F16OperandScale* scale_ = nullptr;  // device memory, inside rounded_
    std::unique_ptr<DeviceBuffer> rounded_;
  };
  // fn(row0, n_rows, rows in device memory, their GEMM type) over a held weight [rows, cols]:
  //   f32:  once, the weight itself, an f32 GEMM (the CPU's arithmetic: f32 weights are trainable
  //         ones or a model stored in f32, and LoRA's A/B, whose GEMMs are rank-r and cheap);
  //   bf16 on a bf16 card: once, the weight itself as stored: no widened copy;
  //   any other held type (dequant.cuh): per panel of at most held_panel_values() values (at least
  //   one row), each dequantized to the card's narrow type (bf16, or f16 on a Turing card) into
  //   one reused workspace buffer, fn called per panel with that type. Others are refused.
  //   Frozen weights are not scaled into f16 (trained LLM weights lie far inside its range); a weight
  //   the ops layer found outside it (W.f32_panels: some |w| >= 65520, which f16 rounds to Inf;
  //   ops/held_range.h) is dequantized to f32 panels instead and its GEMMs are f32: exact, slower.
  template <class Fn>
  static void for_each_weight_panel(const cpu::HeldMatrix& W, const char* kernel, Fn&& fn) {
    if (W.type == DType::F32) return fn(int64_t{0}, W.rows, W.data, gemm::DType::F32);
    const gemm::DType narrow = W.f32_panels ? gemm::DType::F32 : narrow_gemm_type();
    if (!W.f32_panels && cuda_workspace::read_as_stored(W.type, narrow == gemm::DType::F16))
      return fn(int64_t{0}, W.rows, W.data, gemm::DType::BF16);
    if (!::bp::BP_WRAP_NS::dequantize_supported(W.type)) held_type_unavailable(kernel, W.type);
    const int64_t rows = cuda_workspace::held_panel_rows(W.rows, W.cols);
    DeviceBuffer panel(static_cast<size_t>(rows * W.cols) * gemm::dtype_bytes(narrow));
    for (int64_t n0 = 0; n0 < W.rows; n0 += rows) {
      const int64_t nb = std::min(rows, W.rows - n0);
      if (narrow == gemm::DType::BF16)
        ::bp::BP_WRAP_NS::dequantize_rows<bf16>(W.type, W.data, W.cols, n0, nb, panel.as<bf16>(), nullptr);
      else if (narrow == gemm::DType::F16)
        ::bp::BP_WRAP_NS::dequantize_rows<f16>(W.type, W.data, W.cols, n0, nb, panel.as<f16>(), nullptr);
      else
        ::bp::BP_WRAP_NS::dequantize_rows<float>(W.type, W.data, W.cols, n0, nb, panel.as<float>(), nullptr);
      check_launch("held weight dequantize");
      fn(n0, nb, static_cast<const void*>(panel.as<char>()), narrow);
    }
  }
  // held_gemm_xw over an operand the caller keeps (held_linear_backward: dW reads dy's copy too).
  static void held_gemm_xw_over(ActivationOperand& x, const cpu::HeldMatrix& W, float beta, float* C, int64_t M) {
    const int64_t N = W.rows, K = W.cols;
    for_each_weight_panel(W, "held_gemm_xw", [&](int64_t n0, int64_t nb, const void* P, gemm::DType t) {
      const void* xt = x.as(t, n0);
      run_gemm(x.scaled(gemm::row_major_gemm(false, false, M, K, nb, 1.0f, N, K, n0 == 0 ? beta : 1.0f, K, t,
                                             gemm::DType::F32)),
               P, xt, C);
    });
  }
};

}  // namespace bp::BP_WRAP_NS
