// The avx2 variant of the hand-vectorised CPU kernels (kernel_variants.h): 32-byte vectors.
// CMakeLists.txt sets this file's target flags.
#if defined(__x86_64__)
#define BP_KERNEL_NS avx2
#define BP_KERNEL_VEC_BYTES 32
#define BP_KERNEL_F16C 1
#include "backend/cpu/kernel_variants_impl.h"
#endif
