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
#include "backend/cuda/sim/gemm_sim.h"

#include "backend/cuda/cuda_errors.h"
#include "backend/cuda/gemm.cuh"
#include "backend/cuda/sim/gemm_reference.h"
#include "core/error.h"

namespace bp::sim {

namespace {
GemmRecorder* active_recorder = nullptr;
thread_local gemm::GemmAlignments last_alignments;
thread_local GemmWorkspaceSeen last_workspace;
}  // namespace

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
          cudaStream_t) {
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
  last_alignments = gemm::gemm_alignments(desc, A, B, C);
  if (auto why = gemm::misaligned_reason(desc, last_alignments); !why.empty())
    throw cuda_failure("cublasLtMatmul", "CUBLAS_STATUS_NOT_SUPPORTED", "[gemm] " + why);
  gemm::gemm_reference(desc, A, B, C);
}

}  // namespace bp::sim
