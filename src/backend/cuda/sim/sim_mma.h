// PTX `mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32` on the CPU simulation (cuda_mma.cuh
// has the GPU side and the register layout). Unlike wmma (sim_wmma.h), the layout of the operands
// over the lanes is DOCUMENTED (PTX ISA, "Matrix fragments for mma.m16n8k16 with floating point
// type"), and kernels depend on it: each lane holds its own part, and this emulation gathers the 32
// lanes' registers, multiplies the 16×16 by 16×8 tile in f32 and scatters D back by that layout.
// So a kernel that puts an element in the wrong register gets a wrong product here too.
//
// Warp-collective like wmma: every lane of a full warp must make the call together (a call made by
// only some lanes is reported as a deadlock, lanes meeting at another warp call as an error).
// Rounding: bf16 products are exact in f32; each output element adds its 16 products in k order
// onto C (a GPU adds in an unspecified order: results agree within f32 rounding, not bit for bit).
#pragma once

#include <atomic>
#include <cstdint>
#include <cstring>

#include "backend/cuda/sim/sim_wmma.h"  // the warp meeting and the error reporting of warp calls

namespace bp::sim {

namespace mma_detail {
inline std::atomic<uint64_t> g_mma_calls{0};

// What one lane brings to the call: its registers, and where its D goes.
struct Registers {
  const uint32_t* a;
  const uint32_t* b;
  const float* c;
  float* d;
};

inline float bf16_half(uint32_t reg, int high) {
  return __bfloat162float(__nv_bfloat16{static_cast<uint16_t>(high ? reg >> 16 : reg & 0xffffu)});
}
}  // namespace mma_detail

// mma_m16n8k16_bf16 calls (counted once per warp) since the process started: tests check that a
// kernel really took its mma path.
inline uint64_t mma_m16n8k16_count() {
  return mma_detail::g_mma_calls.load();
}

inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 h) {
  return h.bits;
}

// D = A·B + C (d may alias c). Lane (groupID g = lane / 4, t = lane % 4) holds
//   A: a[0] = (g, 2t..2t+1), a[1] = (g+8, 2t..), a[2] = (g, 2t+8..), a[3] = (g+8, 2t+8..)
//   B: b[0] = (k 2t..2t+1, n g), b[1] = (k 2t+8..2t+9, n g)
//   C, D: c[0], c[1] = (g, 2t), (g, 2t+1); c[2], c[3] = (g+8, 2t), (g+8, 2t+1)
// with the lower-indexed element of each bf16 pair in the register's low 16 bits.
inline void mma_m16n8k16_bf16(float d[4], const uint32_t a[4], const uint32_t b[2], const float c[4]) {
  wmma_detail::WarpCall call{wmma_detail::call_key(6)};
  mma_detail::Registers mine{a, b, c, d};
  call.a = &mine;
  auto* calls = wmma_detail::meet_warp(call, "mma_m16n8k16_bf16");
  if (sim_lane() == 0) {
    float A[16][16], B[16][8], C[16][8];
    for (int lane = 0; lane < warpSize; ++lane) {
      const auto& r = *static_cast<const mma_detail::Registers*>(calls[lane]->a);
      const int g = lane / 4, t = lane % 4;
      for (int i = 0; i < 8; ++i)  // a_i: register i / 2, half i % 2
        A[g + (i / 2 % 2) * 8][2 * t + i % 2 + (i / 4) * 8] = mma_detail::bf16_half(r.a[i / 2], i % 2);
      for (int i = 0; i < 4; ++i) B[2 * t + i % 2 + (i / 2) * 8][g] = mma_detail::bf16_half(r.b[i / 2], i % 2);
      for (int i = 0; i < 4; ++i) C[g + (i / 2) * 8][2 * t + i % 2] = r.c[i];
    }
    float D[16][8];
    for (int m = 0; m < 16; ++m)
      for (int n = 0; n < 8; ++n) {
        float acc = C[m][n];
        for (int k = 0; k < 16; ++k) acc += A[m][k] * B[k][n];
        D[m][n] = acc;
      }
    for (int lane = 0; lane < warpSize; ++lane) {  // every C was read above: d may alias c
      const auto& r = *static_cast<const mma_detail::Registers*>(calls[lane]->a);
      const int g = lane / 4, t = lane % 4;
      for (int i = 0; i < 4; ++i) r.d[i] = D[g + (i / 2) * 8][2 * t + i % 2];
    }
    mma_detail::g_mma_calls.fetch_add(1);
  }
  sim_warp_meet();  // every lane's d is written
}

}  // namespace bp::sim
