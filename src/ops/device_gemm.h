// The GEMM description every cuBLASLt call is built from (backend/cuda/gemm_desc.h: layouts,
// transposes, types, batch), for train/: the benchmark (train/train_benchmark.h) measures a device's
// GEMM rate on the model's shapes through it. The ops layer is where train/ reaches the backends
// (DESIGN.md layers; tests/core/layer_order_test.cpp), so train/ includes this header, not the backend's.
#pragma once

#include "backend/cuda/gemm_desc.h"  // bp::gemm::GemmDesc, linear_forward_gemm, DType
