// The simulation's GEMM: a GemmDesc executed by the plain column-major reference
// (gemm_reference.h), f32 accumulation like cuBLASLt's CUBLAS_COMPUTE_32F; recorded for tests
// while a GemmRecorder (gemm_sim.h) lives.
#include "backend/cuda/sim/gemm_sim.h"

#include "backend/cuda/gemm.cuh"
#include "backend/cuda/sim/gemm_reference.h"
#include "core/error.h"

namespace bp::sim {

namespace {
GemmRecorder* active_recorder = nullptr;
}  // namespace

GemmRecorder::GemmRecorder() {
  if (active_recorder) throw Error(ErrorCode::RUNTIME_INTERNAL, "[sim] a GemmRecorder is already recording");
  active_recorder = this;
}
GemmRecorder::~GemmRecorder() {
  active_recorder = nullptr;
}

void gemm(const gemm::GemmDesc& desc, const void* A, const void* B, void* C, void*, size_t, cudaStream_t) {
  if (auto why = gemm::invalid_reason(desc); !why.empty())
    throw Error(ErrorCode::RUNTIME_INTERNAL, "[gemm] invalid description " + why);
  if (active_recorder) active_recorder->record(desc);
  gemm::gemm_reference(desc, A, B, C);
}

}  // namespace bp::sim
