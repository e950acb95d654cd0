// The real GEMM of the CUDA backend: a GemmDesc (gemm_desc.h) turned into cuBLASLt descriptors
// and one cublasLtMatmul call (compiled only in CUDA builds; the simulation executes the same
// description with the CPU reference, sim/gemm_sim.cpp).
//   operation: CUBLAS_COMPUTE_32F with f32 scale (alpha, beta): f32 accumulation for bf16 or f16
//              inputs (f16 on Turing, compute capability 7.5); alpha and beta from host memory, or
//              from device memory (CUBLASLT_POINTER_MODE_DEVICE, set in the plan's matmul
//              descriptor, so part of the plan's key) when the description points there;
//   layouts:   A, B, C column-major with the description's types, leading dimensions, and for a
//              batch, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT and _STRIDED_BATCH_OFFSET; D = C;
//   algorithm: the first heuristic result within the caller's workspace (from our allocator) and
//              the pointers' real alignment (gemm_alignments: panel pointers like `C + n0` may be
//              only 4- or 2-byte aligned; left unset, the heuristic assumes 256 and may pick a
//              kernel that faults with a misaligned address).
//   plans:     descriptors and algorithm are made once per distinct call (gemm_plan_cache.h: the
//              key is everything the heuristic sees; LRU-bounded, one cache per thread like the
//              handle) and reused: cublasLtMatmulAlgoGetHeuristic runs on a cache miss only. The
//              preference descriptor is made for the query alone.
// Failures become bp::Errors through cuda_errors.h (CUBLAS_STATUS_ALLOC_FAILED: OOM-adjacent).
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <utility>

#include "backend/cuda/cuda_errors.h"
#include "backend/cuda/gemm_desc.h"
#include "backend/cuda/gemm_plan_cache.h"

namespace bp::cuda {

namespace {

void check(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS)
    throw cuda_failure(what, cublasGetStatusName(status), cublasGetStatusString(status));
}

cudaDataType_t cuda_type(gemm::DType t) {
  return t == gemm::DType::F32 ? CUDA_R_32F : t == gemm::DType::BF16 ? CUDA_R_16BF : CUDA_R_16F;
}

cublasLtHandle_t lt_handle() {
  struct Handle {
    cublasLtHandle_t h = nullptr;
    ~Handle() {
      if (h) cublasLtDestroy(h);
    }
  };
  thread_local Handle handle;
  if (!handle.h) check(cublasLtCreate(&handle.h), "cublasLtCreate");
  return handle.h;
}

// The cached plan of one distinct call (gemm_plan_cache.h): its descriptors (destroyed with the
// plan: when it is evicted, or the thread ends) and the heuristic's algorithm, or none found.
struct LtPlan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool found = false;
  LtPlan() = default;
  LtPlan(const LtPlan&) = delete;
  LtPlan& operator=(const LtPlan&) = delete;
  ~LtPlan() {
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

struct LtPreference {  // only needed for the query
  cublasLtMatmulPreference_t pref = nullptr;
  ~LtPreference() {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
  }
};

void make_layout(cublasLtMatrixLayout_t* layout, gemm::DType type, int64_t rows, int64_t cols, int64_t ld,
                 int32_t batch, int64_t stride) {
  check(
      cublasLtMatrixLayoutCreate(layout, cuda_type(type), static_cast<uint64_t>(rows), static_cast<uint64_t>(cols), ld),
      "cublasLtMatrixLayoutCreate");
  if (batch > 1) {
    check(cublasLtMatrixLayoutSetAttribute(*layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch, sizeof(batch)),
          "cublasLtMatrixLayoutSetAttribute(BATCH_COUNT)");
    check(
        cublasLtMatrixLayoutSetAttribute(*layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride)),
        "cublasLtMatrixLayoutSetAttribute(STRIDED_BATCH_OFFSET)");
  }
}

// The descriptors of `d` and the heuristic's first algorithm within the workspace and alignments:
// what a cache miss costs (the only cublasLtMatmulAlgoGetHeuristic call of the backend).
void make_plan(LtPlan& plan, const gemm::GemmDesc& d, const gemm::GemmAlignments& al, size_t workspace_bytes) {
  check(cublasLtMatmulDescCreate(&plan.op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
  const cublasOperation_t ta = d.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, tb = d.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  check(cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)), "TRANSA");
  check(cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)), "TRANSB");
  if (d.alpha_beta_on_device) {  // alpha and beta in device memory (a scale the device computed)
    const cublasLtPointerMode_t mode = CUBLASLT_POINTER_MODE_DEVICE;
    check(cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_POINTER_MODE, &mode, sizeof(mode)),
          "POINTER_MODE");
  }
  make_layout(&plan.a, d.a_type, d.trans_a ? d.k : d.m, d.trans_a ? d.m : d.k, d.lda, d.batch, d.stride_a);
  make_layout(&plan.b, d.b_type, d.trans_b ? d.n : d.k, d.trans_b ? d.k : d.n, d.ldb, d.batch, d.stride_b);
  make_layout(&plan.c, d.c_type, d.m, d.n, d.ldc, d.batch, d.stride_c);
  LtPreference p;
  check(cublasLtMatmulPreferenceCreate(&p.pref), "cublasLtMatmulPreferenceCreate");
  const uint64_t ws = workspace_bytes;
  check(cublasLtMatmulPreferenceSetAttribute(p.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)),
        "MAX_WORKSPACE_BYTES");
  const std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t> alignments[] = {
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, al.a},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, al.b},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, al.c},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, al.d}};
  for (const auto& [attribute, bytes] : alignments)
    check(cublasLtMatmulPreferenceSetAttribute(p.pref, attribute, &bytes, sizeof(bytes)), "MIN_ALIGNMENT_BYTES");
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  check(
      cublasLtMatmulAlgoGetHeuristic(lt_handle(), plan.op, plan.a, plan.b, plan.c, plan.c, p.pref, 1, &result, &found),
      "cublasLtMatmulAlgoGetHeuristic");
  plan.found = found > 0;
  if (plan.found) plan.algo = result.algo;
}

int current_device() {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) cudaGetLastError();
  return device;
}

}  // namespace

void gemm(const gemm::GemmDesc& d, const void* A, const void* B, void* C, void* workspace, size_t workspace_bytes,
          cudaStream_t stream, const void* C_in) {
  if (auto why = gemm::invalid_reason(d); !why.empty())
    throw Error(ErrorCode::RUNTIME_INTERNAL, "[gemm] invalid description " + why);
  if (d.m == 0 || d.n == 0) return;
  const gemm::GemmAlignments al = gemm::gemm_alignments(d, A, B, C, C_in);
  if (auto why = gemm::misaligned_reason(d, al); !why.empty())
    throw cuda_failure("cublasLtMatmul", "CUBLAS_STATUS_NOT_SUPPORTED", "[gemm] " + why);
  thread_local gemm::GemmPlanCache<LtPlan> plans;  // per handle: lt_handle() is thread_local too
  const LtPlan& plan = plans.find_or_make(gemm::gemm_plan_key(d, al, workspace_bytes, current_device()),
                                          [&](LtPlan& p) { make_plan(p, d, al, workspace_bytes); });
  if (!plan.found)
    throw Error(ErrorCode::RUNTIME_INTERNAL,
                fmt::format("[gemm] cuBLASLt has no algorithm for m={} n={} k={} ({} x {} -> {}) within {} bytes of "
                            "workspace",
                            d.m, d.n, d.k, gemm::dtype_name(d.a_type), gemm::dtype_name(d.b_type),
                            gemm::dtype_name(d.c_type), workspace_bytes));
  const float* alpha = d.alpha_beta_on_device ? d.alpha_beta_on_device : &d.alpha;
  const float* beta = d.alpha_beta_on_device ? d.alpha_beta_on_device + 1 : &d.beta;
  // Out of place (C_in given): cuBLASLt's C is C_in and its D is C, one layout for both (its rule).
  check(cublasLtMatmul(lt_handle(), plan.op, alpha, A, plan.a, B, plan.b, beta, C_in ? C_in : C, plan.c, C, plan.c,
                       &plan.algo, workspace, workspace_bytes, stream),
        "cublasLtMatmul");
}

}  // namespace bp::cuda
