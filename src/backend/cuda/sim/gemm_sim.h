// What the simulated cuBLASLt was asked to do: while a GemmRecorder lives, every GemmDesc the
// simulation's gemm() executes (sim/gemm_sim.cpp) is kept, so tests can check the types, shapes,
// transposes and workspace the CUDA backend's wrappers hand to cuBLASLt (the real build makes the same
// descriptions: kernel_wrappers.h is compiled for both). One recorder at a time. A description in
// device pointer mode is recorded with the alpha and beta it read from the device (and its pointer).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "backend/cuda/gemm_desc.h"

namespace bp::sim {

class GemmRecorder {
 public:
  GemmRecorder();
  ~GemmRecorder();
  GemmRecorder(const GemmRecorder&) = delete;
  GemmRecorder& operator=(const GemmRecorder&) = delete;
  const std::vector<gemm::GemmDesc>& descs() const { return descs_; }
  // The workspace bytes each GEMM was given, in the same order.
  const std::vector<size_t>& workspace_bytes() const { return workspace_bytes_; }
  void record(const gemm::GemmDesc& d, size_t workspace_bytes) {
    descs_.push_back(d);
    workspace_bytes_.push_back(workspace_bytes);
  }

 private:
  std::vector<gemm::GemmDesc> descs_;
  std::vector<size_t> workspace_bytes_;
};

// The MIN_ALIGNMENT preferences (gemm_desc.h) the last simulated GEMM of this thread computed:
// the values cublaslt_gemm.cpp hands cuBLASLt for the same pointers.
gemm::GemmAlignments last_gemm_alignments();

// The workspace the last simulated GEMM of this thread was given (cuBLASLt's `workspace`,
// `workspaceSizeInBytes`): tests check the wrappers hand every GEMM a real one.
struct GemmWorkspaceSeen {
  const void* ptr = nullptr;
  size_t bytes = 0;
};
GemmWorkspaceSeen last_gemm_workspace();

// Queries of the simulated cublasLtMatmulAlgoGetHeuristic since the process started (gemm_sim.cpp:
// one per GEMM plan cache miss, gemm_plan_cache.h), and the plans this thread's cache holds;
// clear_gemm_plans() empties it (a test then sees every distinct call ask once).
uint64_t gemm_heuristic_queries();
size_t gemm_plans_cached();
void clear_gemm_plans();

}  // namespace bp::sim
