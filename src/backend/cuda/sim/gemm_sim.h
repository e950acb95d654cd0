// What the simulated cuBLASLt was asked to do: while a GemmRecorder lives, every GemmDesc the
// simulation's gemm() executes (sim/gemm_sim.cpp) is kept, so tests can check the types, shapes
// and transposes the CUDA backend's wrappers hand to cuBLASLt (the real build makes the same
// descriptions: kernel_wrappers.h is compiled for both). One recorder at a time.
#pragma once

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
  void record(const gemm::GemmDesc& d) { descs_.push_back(d); }

 private:
  std::vector<gemm::GemmDesc> descs_;
};

// The MIN_ALIGNMENT preferences (gemm_desc.h) the last simulated GEMM of this thread computed:
// the values cublaslt_gemm.cpp hands cuBLASLt for the same pointers.
gemm::GemmAlignments last_gemm_alignments();

}  // namespace bp::sim
