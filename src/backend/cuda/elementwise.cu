// The real CUDA build of elementwise.cuh (its launchers are not templates).
#include "backend/cuda/elementwise.cuh"
