// The generic variant of the hand-vectorised CPU kernels (kernel_variants.h): 16-byte vectors.
// Compiled with the build's baseline flags: SSE on x86-64-v2, NEON on ARM64.
#define BP_KERNEL_NS generic
#define BP_KERNEL_VEC_BYTES 16
#include "backend/cpu/kernel_variants_impl.h"
