// The real CUDA build of lora_dropout.cuh (its launchers are not templates).
#include "backend/cuda/lora_dropout.cuh"
