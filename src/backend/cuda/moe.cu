// The real CUDA build of moe.cuh: its launchers are plain functions, defined here once.
#include "backend/cuda/moe.cuh"
