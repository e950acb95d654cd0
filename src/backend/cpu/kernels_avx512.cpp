// The avx512 variant of the hand-vectorised CPU kernels (kernel_variants.h): 64-byte vectors.
// CMakeLists.txt sets this file's target flags.
#if defined(__x86_64__)
#define BP_KERNEL_NS avx512
#define BP_KERNEL_VEC_BYTES 64
#define BP_KERNEL_F16C 1
#include "backend/cpu/kernel_variants_impl.h"
#endif
