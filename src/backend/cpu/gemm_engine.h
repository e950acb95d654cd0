// The GEMM engines of the CPU backend (issue 41) and the one place that decides which runs a
// product (DESIGN.md "GEMM engines": nothing above backend/cpu knows which one ran).
//
// Engines: OpenBLAS (cblas_sgemm, every f32 GEMM: gemm.h) and, where the build links it
// (BACKPROP_ONEDNN), oneDNN's matmul for the bf16 products. What is decided here is how the GEMMs
// against a frozen weight held in bf16 (held_linear_forward / held_linear_backward's dx,
// backend/cpu/linear.h; the LM head's logits and dx in cross_entropy.cpp when it is held in bf16)
// run, from runtime.cpu_gemm and the CPU's features:
//
//   HeldBf16Path::OneDnn     bf16 numerics through oneDNN's bf16 matmul: x (or dy) rounded to bf16
//                            (nearest even, core/dtype.h f32_to_bf16), the weight read as stored,
//                            f32 accumulation, f32 output (the CUDA backend's numerics,
//                            docs/architecture.md "CUDA numerics").
//   HeldBf16Path::Bf16Sgemm  the same numerics through OpenBLAS: x rounded to bf16 and widened
//                            back to f32, the weight widened to f32 tile by tile (quant_gemm.h),
//                            f32 sgemm. bf16·bf16 products are exact in f32 (8+8 significant bits),
//                            so the two paths differ only in the order of the f32 sums.
//   HeldBf16Path::F32        x kept f32, the weight widened to f32 (the behaviour before oneDNN).
//
// runtime.cpu_gemm:
//   auto      OneDnn where the CPU has bf16 dot products (AVX512_BF16 or AMX-BF16, CPUID) and the
//             build has oneDNN, else Bf16Sgemm. A documented measured rule, not a per-call timing:
//             on an AMD EPYC Zen 5 (avx512_bf16) oneDNN 2.6's bf16 matmul ran at 486 GFLOP/s on one
//             core and 984 on two, against 225-233 for OpenBLAS's f32 sgemm (issue 41), and
//             bench/bench_linear.cpp measures it for the model shapes (docs/benchmarks.md). A choice
//             that followed a timing would make the bits of a run depend on the machine's load.
//   openblas  F32 (bit for bit the results before this engine existed).
//   onednn    OneDnn; a build without oneDNN throws DEP_CPU_GEMM_UNAVAILABLE, and so does a CPU on
//             which oneDNN cannot make a bf16 matmul (it needs AVX-512 at least).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace bp {
struct CpuIsa;  // core/sysinfo.h
}

namespace bp::cpu {

enum class HeldBf16Path { F32, Bf16Sgemm, OneDnn };
const char* held_bf16_path_name(HeldBf16Path p);  // "f32-openblas", "bf16-openblas", "bf16-onednn"

struct GemmEngineChoice {
  std::string setting = "auto";  // runtime.cpu_gemm as selected
  HeldBf16Path held_bf16 = HeldBf16Path::Bf16Sgemm;
  std::string reason;  // why (the CPU's features, or the setting)
};

// Whether this build links oneDNN, and its version ("" without).
bool onednn_built();
std::string onednn_version();
// The CPU has bf16 dot products oneDNN's matmul uses (AVX512_BF16 or AMX-BF16).
bool cpu_has_bf16_dot(const CpuIsa& isa);

// The choice in use (decided from "auto" at the first call unless select_cpu_gemm ran).
GemmEngineChoice cpu_gemm_choice();
// auto | openblas | onednn: see above. Unknown names throw CONFIG_INVALID_SETTING.
void select_cpu_gemm(std::string_view name);
// The same decision for a given CPU and build (tests: a CPU without bf16 dot products, a build
// without oneDNN).
void select_cpu_gemm(std::string_view name, const CpuIsa& isa, bool have_onednn);

// What the CPU's GEMMs compute in and which engine runs them, worded once for `backprop info` and
// the training start event (as backend/cuda/compute_precision.h does for CUDA): the GEMMs against
// weights held in bf16 only when `frozen_bf16` (some frozen weight is held in bf16), then every other.
std::string describe_cpu_gemms(bool frozen_bf16);

// The bf16 products, on operands already rounded to bf16 (W as held, row-major [N, K]):
//   bf16_gemm_xwt  C[M, N] = Xb[M, K]·Wᵀ + beta·C
//   bf16_gemm_xw   C[M, K] = Xb[M, N]·W  + beta·C   (beta 0: C is not read)
// through oneDNN's matmul (primitives made once per shape and beta, cached; thread-safe).
// Throws DEP_CPU_GEMM_UNAVAILABLE without oneDNN or where it cannot make the primitive.
void onednn_bf16_gemm_xwt(const uint16_t* Xb, const uint16_t* W, float beta, float* C, int64_t M, int64_t N, int64_t K);
void onednn_bf16_gemm_xw(const uint16_t* Xb, const uint16_t* W, float beta, float* C, int64_t M, int64_t N, int64_t K);
// Primitives made so far (tests: a second call of a shape makes none), those held now (at most
// kOnednnCachedPrimitives: the oldest goes first, since packed micro-batches bring a new token count
// M at almost every step; making one again is a JIT: 0.3 ms at [1..276]x32x16), and the implementation oneDNN
// picked for the last one made ("brg:avx512_core_bf16", ...; "" before any).
inline constexpr int64_t kOnednnCachedPrimitives = 256;
int64_t onednn_primitives_made();
int64_t onednn_cached_primitives();
std::string onednn_last_impl();

}  // namespace bp::cpu
