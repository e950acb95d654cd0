// The real CUDA build of elementwise.cuh (f32 only: its launchers are not templates).
#include "backend/cuda/elementwise.cuh"
