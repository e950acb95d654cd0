// One thread setting drives both OpenMP (our loops) and OpenBLAS (GEMMs). BLAS is never called
// inside an OpenMP parallel region.
#pragma once

namespace bp {

// n <= 0 means all cores.
void set_num_threads(int n);
int num_threads();
int hardware_threads();
// The BLAS library's name and its configured thread count (for `backprop info`).
const char* blas_name();
// The OpenBLAS kernel set in use ("SkylakeX", "Zen", "Haswell", "Prescott", ...).
const char* blas_core_name();
int blas_num_threads();

}  // namespace bp
