// The simulation of PTX mma.m16n8k16 bf16 (src/backend/cuda/cuda_mma.cuh, sim/sim_mma.h): random
// bf16 matrices put into the lanes' registers by the PTX ISA's documented layout (written out
// again here, register by register) and multiplied against a plain f64 GEMM; C's layout reused as
// the next product's A operand (what the FlashAttention-2 kernel does with P); the call counter;
// and the misuses a GPU punishes (a call by some lanes of a warp hangs it, a partial warp).
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "backend/cuda/cuda_mma.cuh"

namespace bp::sim {
namespace {

// D[16×N] = A[16×K]·B[K×N] + C, A row-major (lda = K), B [K][N] row-major, C and D [16][N]; warp w
// of the block computes columns 8w..8w+7, summing its K / 16 steps into one accumulator.
__global__ void mma_gemm_kernel(const bf16* A, const bf16* B, const float* C, float* D, int N, int K) {
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4, n0 = threadIdx.x / 32 * 8;
  float acc[4] = {C[g * N + n0 + 2 * t], C[g * N + n0 + 2 * t + 1], C[(g + 8) * N + n0 + 2 * t],
                  C[(g + 8) * N + n0 + 2 * t + 1]};
  for (int k0 = 0; k0 < K; k0 += 16) {
    const bf16* a = A + k0;
    const uint32_t ra[4] = {pack_bf16x2(a[g * K + 2 * t], a[g * K + 2 * t + 1]),
                            pack_bf16x2(a[(g + 8) * K + 2 * t], a[(g + 8) * K + 2 * t + 1]),
                            pack_bf16x2(a[g * K + 2 * t + 8], a[g * K + 2 * t + 9]),
                            pack_bf16x2(a[(g + 8) * K + 2 * t + 8], a[(g + 8) * K + 2 * t + 9])};
    const bf16* b = B + k0 * N + n0 + g;  // column g of the warp's 8
    const uint32_t rb[2] = {pack_bf16x2(b[2 * t * N], b[(2 * t + 1) * N]),
                            pack_bf16x2(b[(2 * t + 8) * N], b[(2 * t + 9) * N])};
    mma_m16n8k16_bf16(acc, ra, rb, acc);  // d aliases c
  }
  D[g * N + n0 + 2 * t] = acc[0];
  D[g * N + n0 + 2 * t + 1] = acc[1];
  D[(g + 8) * N + n0 + 2 * t] = acc[2];
  D[(g + 8) * N + n0 + 2 * t + 1] = acc[3];
}

// E[16×8] = bf16(A·B1)·B2: the two 16×8 accumulators of A·B1 (B1 [16][16]) become the A operand of
// the second product (B2 [16][8]) without leaving the registers. One warp.
__global__ void chained_mma_kernel(const bf16* A, const bf16* B1, const bf16* B2, float* E) {
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const uint32_t ra[4] = {load_bf16x2(A + g * 16 + 2 * t), load_bf16x2(A + (g + 8) * 16 + 2 * t),
                          load_bf16x2(A + g * 16 + 2 * t + 8), load_bf16x2(A + (g + 8) * 16 + 2 * t + 8)};
  float s[2][4];
  for (int nt = 0; nt < 2; ++nt) {
    const bf16* b = B1 + nt * 8 + g;
    const uint32_t rb[2] = {pack_bf16x2(b[2 * t * 16], b[(2 * t + 1) * 16]),
                            pack_bf16x2(b[(2 * t + 8) * 16], b[(2 * t + 9) * 16])};
    const float zero[4] = {0, 0, 0, 0};
    mma_m16n8k16_bf16(s[nt], ra, rb, zero);
  }
  const uint32_t rp[4] = {pack_bf16x2(s[0][0], s[0][1]), pack_bf16x2(s[0][2], s[0][3]), pack_bf16x2(s[1][0], s[1][1]),
                          pack_bf16x2(s[1][2], s[1][3])};
  const bf16* b = B2 + g;
  const uint32_t rb[2] = {pack_bf16x2(b[2 * t * 8], b[(2 * t + 1) * 8]),
                          pack_bf16x2(b[(2 * t + 8) * 8], b[(2 * t + 9) * 8])};
  float e[4] = {0, 0, 0, 0};
  mma_m16n8k16_bf16(e, rp, rb, e);
  E[g * 8 + 2 * t] = e[0];
  E[g * 8 + 2 * t + 1] = e[1];
  E[(g + 8) * 8 + 2 * t] = e[2];
  E[(g + 8) * 8 + 2 * t + 1] = e[3];
}

std::vector<bf16> random_bf16(size_t n, uint32_t seed, std::vector<double>& exact) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<bf16> out(n);
  exact.resize(n);
  for (size_t i = 0; i < n; ++i) {
    out[i] = __float2bfloat16(dist(rng));
    exact[i] = __bfloat162float(out[i]);
  }
  return out;
}

TEST(SimMma, GemmThroughTheDocumentedLayoutMatchesAPlainGemm) {
  const int N = 16, K = 48;
  std::vector<double> a, b, c;
  const auto A = random_bf16(16 * K, 1, a), B = random_bf16(size_t(K) * N, 2, b);
  random_bf16(16 * N, 3, c);
  const std::vector<float> C(c.begin(), c.end());
  std::vector<float> D(16 * N, NAN);
  const uint64_t before = mma_m16n8k16_count();
  BP_LAUNCH(1, 64, 0, nullptr, mma_gemm_kernel)(A.data(), B.data(), C.data(), D.data(), N, K);
  EXPECT_EQ(mma_m16n8k16_count() - before, 2u * K / 16);  // 2 warps, once per warp and k step
  for (int m = 0; m < 16; ++m)
    for (int n = 0; n < N; ++n) {
      double ref = c[m * N + n];
      for (int k = 0; k < K; ++k) ref += a[m * K + k] * b[k * N + n];
      EXPECT_NEAR(D[m * N + n], ref, 1e-5) << "(" << m << "," << n << ")";
    }
}

TEST(SimMma, AccumulatorLayoutIsTheNextProductsAOperand) {
  std::vector<double> a, b1, b2;
  const auto A = random_bf16(256, 4, a), B1 = random_bf16(256, 5, b1), B2 = random_bf16(128, 6, b2);
  std::vector<float> E(128, NAN);
  BP_LAUNCH(1, 32, 0, nullptr, chained_mma_kernel)(A.data(), B1.data(), B2.data(), E.data());
  for (int m = 0; m < 16; ++m)
    for (int n = 0; n < 8; ++n) {
      double ref = 0;
      for (int j = 0; j < 16; ++j) {
        float s = 0;  // f32 as the mma sums, then rounded to bf16 as the kernel packs it
        for (int k = 0; k < 16; ++k) s += float(a[m * 16 + k] * b1[k * 16 + j]);
        ref += double(__bfloat162float(__float2bfloat16(s))) * b2[j * 8 + n];
      }
      EXPECT_NEAR(E[m * 8 + n], ref, 1e-3 + 1e-2 * std::abs(ref)) << "(" << m << "," << n << ")";
    }
}

__global__ void some_lanes_mma_kernel(int calling_lanes) {
  uint32_t a[4] = {0, 0, 0, 0}, b[2] = {0, 0};
  float c[4] = {0, 0, 0, 0};
  if (static_cast<int>(threadIdx.x % 32) < calling_lanes) mma_m16n8k16_bf16(c, a, b, c);
}

// What a launch of `threads` threads, the first `calling_lanes` of each warp calling, reports.
std::string error_of_launch(unsigned threads, int calling_lanes) {
  try {
    BP_LAUNCH(1, threads, 0, nullptr, some_lanes_mma_kernel)(calling_lanes);
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(SimMma, MisusesAreReported) {
  EXPECT_NE(error_of_launch(64, 16).find("deadlocks"), std::string::npos);
  EXPECT_NE(error_of_launch(48, 32).find("needs all 32"), std::string::npos);
  EXPECT_EQ(error_of_launch(64, 32), "(no error)");
}

}  // namespace
}  // namespace bp::sim
