// The simulation's GEMM: a GemmDesc executed by the plain column-major reference
// (gemm_reference.h), f32 accumulation like cuBLASLt's CUBLAS_COMPUTE_32F; recorded for tests
// while a GemmRecorder (gemm_sim.h) lives. It computes the pointers' alignment preferences as
// cublaslt_gemm.cpp does (gemm_alignments), keeps them for the tests (last_gemm_alignments), and
// refuses an operand aligned below its element size with CUBLAS_STATUS_NOT_SUPPORTED, as cuBLASLt
// does. The workspace is held to cuBLASLt's contract: `workspace_bytes` of device memory at
// `workspace` (none: 0 bytes); a range outside the simulated card's live allocations is what
// faults with an illegal address on a card (the algorithm writes its partial sums there), so it is
// refused as that sticky error (RUNTIME_GPU_KERNEL_FAULT). The last GEMM's workspace is kept for
// the tests (last_gemm_workspace). A description in device pointer mode (alpha_beta_on_device)
// has its alpha and beta read from the simulated card's memory when it runs, as cuBLASLt does, and
// is recorded with the values read.
// Plans: like cublaslt_gemm.cpp, a GEMM looks its plan up in the thread's GemmPlanCache
// (gemm_plan_cache.h) and on a miss asks the simulated cuBLASLt heuristic (simulated_heuristic:
// counted, gemm_heuristic_queries). The simulated algorithm remembers what it was chosen for and
// is refused (CUBLAS_STATUS_NOT_SUPPORTED) when run on another shape, or on pointers less aligned
// or a workspace smaller than it assumed: what a card does with a wrongly cached algorithm.
#include "backend/cuda/sim/gemm_sim.h"

#include <atomic>

#include "backend/cuda/cuda_errors.h"
#include "backend/cuda/gemm.cuh"
#include "backend/cuda/gemm_plan_cache.h"
#include "backend/cuda/sim/gemm_reference.h"
#include "core/error.h"

namespace bp::sim {

namespace {
GemmRecorder* active_recorder = nullptr;
thread_local gemm::GemmAlignments last_alignments;
thread_local GemmWorkspaceSeen last_workspace;
std::atomic<uint64_t> heuristic_queries{0};

// The simulated cuBLASLt algorithm: the call it was chosen for.
struct SimPlan {
  gemm::GemmDesc chosen_for;
  gemm::GemmAlignments alignments;
  size_t workspace_bytes = 0;
};
thread_local gemm::GemmPlanCache<SimPlan> plans;

// cublasLtMatmulAlgoGetHeuristic's stand-in: counts the query; the CPU reference runs any call.
void simulated_heuristic(SimPlan& plan, const gemm::GemmDesc& d, const gemm::GemmAlignments& al,
                         size_t workspace_bytes) {
  heuristic_queries.fetch_add(1);
  plan = {d, al, workspace_bytes};
}

// Why the card would refuse to run `plan`'s algorithm for this call ("" when it runs).
std::string plan_mismatch(const SimPlan& plan, const gemm::GemmDesc& d, const gemm::GemmAlignments& al,
                          size_t workspace_bytes) {
  const gemm::GemmDesc& c = plan.chosen_for;
  if (c.m != d.m || c.n != d.n || c.k != d.k || c.trans_a != d.trans_a || c.trans_b != d.trans_b ||
      c.a_type != d.a_type || c.b_type != d.b_type || c.c_type != d.c_type || c.batch != d.batch)
    return "the cached algorithm was chosen for another shape";
  if (al.a < plan.alignments.a || al.b < plan.alignments.b || al.c < plan.alignments.c || al.d < plan.alignments.d)
    return "the cached algorithm assumes more aligned pointers";
  if (workspace_bytes < plan.workspace_bytes) return "the cached algorithm assumes a larger workspace";
  return "";
}
}  // namespace

uint64_t gemm_heuristic_queries() {
  return heuristic_queries.load();
}

size_t gemm_plans_cached() {
  return plans.size();
}

void clear_gemm_plans() {
  plans.clear();
}

GemmRecorder::GemmRecorder() {
  if (active_recorder) throw Error(ErrorCode::RUNTIME_INTERNAL, "[sim] a GemmRecorder is already recording");
  active_recorder = this;
}
GemmRecorder::~GemmRecorder() {
  active_recorder = nullptr;
}

gemm::GemmAlignments last_gemm_alignments() {
  return last_alignments;
}

GemmWorkspaceSeen last_gemm_workspace() {
  return last_workspace;
}

void gemm(const gemm::GemmDesc& given, const void* A, const void* B, void* C, void* workspace, size_t workspace_bytes,
          cudaStream_t, const void* C_in) {
  if (auto why = gemm::invalid_reason(given); !why.empty())
    throw Error(ErrorCode::RUNTIME_INTERNAL, "[gemm] invalid description " + why);
  gemm::GemmDesc desc = given;
  if (desc.alpha_beta_on_device) {  // device pointer mode: read when the GEMM runs, from the card
    if (!memory_range_live(desc.alpha_beta_on_device, 2 * sizeof(float)))
      throw cuda_failure("cublasLtMatmul", cudaGetErrorName(cudaErrorIllegalAddress),
                         fmt::format("{} ([gemm] alpha and beta at {} are not inside one live allocation of the "
                                     "device)",
                                     cudaGetErrorString(cudaErrorIllegalAddress),
                                     static_cast<const void*>(desc.alpha_beta_on_device)));
    desc.alpha = desc.alpha_beta_on_device[0];
    desc.beta = desc.alpha_beta_on_device[1];
  }
  if (active_recorder) active_recorder->record(desc, workspace_bytes);
  last_workspace = {workspace, workspace_bytes};
  if (workspace_bytes > 0 && !memory_range_live(workspace, workspace_bytes))
    throw cuda_failure("cublasLtMatmul", cudaGetErrorName(cudaErrorIllegalAddress),
                       fmt::format("{} ([gemm] a workspace of {} bytes at {} is not inside one live allocation of the "
                                   "device)",
                                   cudaGetErrorString(cudaErrorIllegalAddress), workspace_bytes, workspace));
  last_alignments = gemm::gemm_alignments(desc, A, B, C, C_in);
  if (auto why = gemm::misaligned_reason(desc, last_alignments); !why.empty())
    throw cuda_failure("cublasLtMatmul", "CUBLAS_STATUS_NOT_SUPPORTED", "[gemm] " + why);
  if (desc.m == 0 || desc.n == 0) return;  // as cublaslt_gemm.cpp: no plan, nothing to do
  count_gemm_call();
  const SimPlan& plan =
      plans.find_or_make(gemm::gemm_plan_key(desc, last_alignments, workspace_bytes, 0),
                         [&](SimPlan& p) { simulated_heuristic(p, desc, last_alignments, workspace_bytes); });
  if (auto why = plan_mismatch(plan, desc, last_alignments, workspace_bytes); !why.empty())
    throw cuda_failure("cublasLtMatmul", "CUBLAS_STATUS_NOT_SUPPORTED", "[gemm] " + why);
  gemm::gemm_reference(desc, A, B, C, C_in);
}

}  // namespace bp::sim
