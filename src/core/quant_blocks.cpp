// Single-block quantize / dequantize kernels for ggml's block formats (layouts in io/quantize.h).
// They live in core so that the CPU kernels reading frozen weights held quantized (backend/cpu/
// quant_gemm.cpp) and the GGUF reader/writer (io/) share one implementation.
//
// How scales are chosen, and the error bound that follows (|x − y| per element, before float
// rounding of the arithmetic itself, which adds a few ulps):
//   * Every f16 scale is rounded *up* in magnitude (f16_ceil) so the grid always covers the data.
//   * Q8_0: d = amax/127 → |err| <= d/2.
//   * Q4_0 / Q5_0: d = −m/8 (−m/16) with m the value of largest magnitude (llama.cpp's convention, so
//     m lands exactly on the most negative level −8 / −16) → |err| <= |d|/2, except values of the
//     opposite sign near −m, which clamp to level 7 (15): |err| <= |d|.
//   * Q5_1: m = f16(min), d = (max − m)/31 → |err| <= d/2 + |min − m|.
//   * Q4_K / Q5_K (levels L = 15 / 31): per sub-block j of 32, mn_j = max(0, −min x) and
//     dmin = max_j mn_j / 63; m_j = ceil(mn_j / dmin) so the offset dmin·m_j >= mn_j (at most dmin
//     more). span_j = max x + dmin·m_j; d = max_j span_j / (63·L); sc_j = ceil(span_j / (L·d)).
//     The step d·sc_j <= span_j/L + d, so |err| <= (span_j/L + d)/2.
//   * Q6_K: per sub-block j of 16, a_j = max|x|; d = max_j a_j / (31·127); sc_j = ceil(a_j / (31·d))
//     so levels −32..31 cover ±a_j: |err| <= (a_j/31 + d)/2.
#include "core/quant_blocks.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/dtype.h"

namespace bp {
namespace {

// Smallest f16 >= v (v >= 0, finite). Values past the f16 range saturate at 65504.
uint16_t f16_ceil(float v) {
  if (!(v > 0.0f)) return 0;
  if (v >= 65504.0f) return 0x7bff;
  uint16_t h = f32_to_f16(v);
  if (f16_to_f32(h) < v) ++h;  // positive halves are ordered like their bit patterns
  return h;
}

inline void store_f16(uint8_t* p, uint16_t h) {
  std::memcpy(p, &h, 2);
}
inline float load_f16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return f16_to_f32(h);
}
inline int round_clamp(float v, int lo, int hi) {
  int q = static_cast<int>(std::lrintf(v));
  return std::min(hi, std::max(lo, q));
}
// ceil that tolerates inputs slightly above an integer from float rounding by clamping afterwards.
inline int ceil_clamp(float v, int hi) {
  int q = static_cast<int>(std::ceil(v));
  return std::min(hi, std::max(0, q));
}

// The value of largest magnitude (keeps its sign).
float signed_absmax(const float* x, int n) {
  float m = 0.0f, a = 0.0f;
  for (int i = 0; i < n; ++i) {
    float ax = std::fabs(x[i]);
    if (ax > a) {
      a = ax;
      m = x[i];
    }
  }
  return m;
}

// Packs 6-bit scale/min pairs for 8 sub-blocks into ggml's 12-byte K-quant layout.
void pack_scales_k4(const int* sc, const int* mn, uint8_t* s) {
  std::memset(s, 0, 12);
  for (int j = 0; j < 8; ++j) {
    if (j < 4) {
      s[j] |= static_cast<uint8_t>(sc[j] & 63);
      s[j + 4] |= static_cast<uint8_t>(mn[j] & 63);
    } else {
      s[j + 4] |= static_cast<uint8_t>((sc[j] & 15) | ((mn[j] & 15) << 4));
      s[j - 4] |= static_cast<uint8_t>((sc[j] >> 4) << 6);
      s[j] |= static_cast<uint8_t>((mn[j] >> 4) << 6);
    }
  }
}
void unpack_scales_k4(const uint8_t* s, int j, int* sc, int* mn) {
  if (j < 4) {
    *sc = s[j] & 63;
    *mn = s[j + 4] & 63;
  } else {
    *sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
    *mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

// Shared part of Q4_K / Q5_K: picks d, dmin, per-sub-block scales and the level (0..levels) of each
// of the 256 values.
void choose_k_quants(const float* x, int levels, uint16_t* d_out, uint16_t* dmin_out, int* sc, int* mn, uint8_t* q) {
  float lo_neg[8], hi[8];
  float mn_max = 0.0f;
  for (int j = 0; j < 8; ++j) {
    float lo = x[j * 32], h = x[j * 32];
    for (int i = 1; i < 32; ++i) {
      lo = std::min(lo, x[j * 32 + i]);
      h = std::max(h, x[j * 32 + i]);
    }
    lo_neg[j] = std::max(0.0f, -lo);
    hi[j] = h;
    mn_max = std::max(mn_max, lo_neg[j]);
  }
  const uint16_t dmin_h = f16_ceil(mn_max / 63.0f);
  const float dmin = f16_to_f32(dmin_h);
  float span[8], span_max = 0.0f;
  for (int j = 0; j < 8; ++j) {
    mn[j] = dmin > 0.0f ? ceil_clamp(lo_neg[j] / dmin, 63) : 0;
    span[j] = std::max(0.0f, hi[j] + dmin * static_cast<float>(mn[j]));
    span_max = std::max(span_max, span[j]);
  }
  const uint16_t d_h = f16_ceil(span_max / (63.0f * static_cast<float>(levels)));
  const float d = f16_to_f32(d_h);
  for (int j = 0; j < 8; ++j) {
    sc[j] = d > 0.0f ? ceil_clamp(span[j] / (static_cast<float>(levels) * d), 63) : 0;
    const float step = d * static_cast<float>(sc[j]);
    const float off = dmin * static_cast<float>(mn[j]);
    const float inv = step > 0.0f ? 1.0f / step : 0.0f;
    for (int i = 0; i < 32; ++i)
      q[j * 32 + i] = static_cast<uint8_t>(round_clamp((x[j * 32 + i] + off) * inv, 0, levels));
  }
  *d_out = d_h;
  *dmin_out = dmin_h;
}

}  // namespace

// ---- Q8_0: f16 d; int8 qs[32] ------------------------------------------------------------------
void quantize_block_q8_0(const float* x, uint8_t* out) {
  float amax = 0.0f;
  for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[i]));
  const uint16_t dh = f16_ceil(amax / 127.0f);
  const float d = f16_to_f32(dh);
  const float inv = d > 0.0f ? 1.0f / d : 0.0f;
  store_f16(out, dh);
  for (int i = 0; i < 32; ++i)
    out[2 + i] = static_cast<uint8_t>(static_cast<int8_t>(round_clamp(x[i] * inv, -127, 127)));
}
void dequantize_block_q8_0(const uint8_t* in, float* y) {
  const float d = load_f16(in);
  for (int i = 0; i < 32; ++i) y[i] = d * static_cast<float>(static_cast<int8_t>(in[2 + i]));
}

// ---- Q4_0: f16 d; u8 qs[16]; y = d·(q − 8) --------------------------------------------------------
void quantize_block_q4_0(const float* x, uint8_t* out) {
  const float m = signed_absmax(x, 32);
  uint16_t dh = f16_ceil(std::fabs(m) / 8.0f);
  if (m > 0.0f) dh |= 0x8000;  // d = −m/8: m maps onto level 0 (value −8)
  const float d = f16_to_f32(dh);
  const float inv = d != 0.0f ? 1.0f / d : 0.0f;
  store_f16(out, dh);
  for (int j = 0; j < 16; ++j) {
    const int q0 = round_clamp(x[j] * inv + 8.0f, 0, 15);
    const int q1 = round_clamp(x[j + 16] * inv + 8.0f, 0, 15);
    out[2 + j] = static_cast<uint8_t>(q0 | (q1 << 4));
  }
}
void dequantize_block_q4_0(const uint8_t* in, float* y) {
  const float d = load_f16(in);
  for (int j = 0; j < 16; ++j) {
    y[j] = d * static_cast<float>((in[2 + j] & 15) - 8);
    y[j + 16] = d * static_cast<float>((in[2 + j] >> 4) - 8);
  }
}

// ---- Q5_0: f16 d; u8 qh[4]; u8 qs[16]; y = d·(q − 16) ----------------------------------------------
void quantize_block_q5_0(const float* x, uint8_t* out) {
  const float m = signed_absmax(x, 32);
  uint16_t dh = f16_ceil(std::fabs(m) / 16.0f);
  if (m > 0.0f) dh |= 0x8000;
  const float d = f16_to_f32(dh);
  const float inv = d != 0.0f ? 1.0f / d : 0.0f;
  store_f16(out, dh);
  uint32_t qh = 0;
  for (int j = 0; j < 16; ++j) {
    const int q0 = round_clamp(x[j] * inv + 16.0f, 0, 31);
    const int q1 = round_clamp(x[j + 16] * inv + 16.0f, 0, 31);
    out[6 + j] = static_cast<uint8_t>((q0 & 15) | ((q1 & 15) << 4));
    qh |= static_cast<uint32_t>(q0 >> 4) << j;
    qh |= static_cast<uint32_t>(q1 >> 4) << (j + 16);
  }
  std::memcpy(out + 2, &qh, 4);  // little-endian, as ggml stores it
}
void dequantize_block_q5_0(const uint8_t* in, float* y) {
  const float d = load_f16(in);
  uint32_t qh;
  std::memcpy(&qh, in + 2, 4);
  for (int j = 0; j < 16; ++j) {
    const int q0 = (in[6 + j] & 15) | static_cast<int>(((qh >> j) & 1) << 4);
    const int q1 = (in[6 + j] >> 4) | static_cast<int>(((qh >> (j + 16)) & 1) << 4);
    y[j] = d * static_cast<float>(q0 - 16);
    y[j + 16] = d * static_cast<float>(q1 - 16);
  }
}

// ---- Q5_1: f16 d; f16 m; u8 qh[4]; u8 qs[16]; y = d·q + m -------------------------------------------
void quantize_block_q5_1(const float* x, uint8_t* out) {
  float lo = x[0], hi = x[0];
  for (int i = 1; i < 32; ++i) {
    lo = std::min(lo, x[i]);
    hi = std::max(hi, x[i]);
  }
  const uint16_t mh = f32_to_f16(lo);
  const float m = f16_to_f32(mh);
  const uint16_t dh = f16_ceil(std::max(0.0f, hi - m) / 31.0f);
  const float d = f16_to_f32(dh);
  const float inv = d > 0.0f ? 1.0f / d : 0.0f;
  store_f16(out, dh);
  store_f16(out + 2, mh);
  uint32_t qh = 0;
  for (int j = 0; j < 16; ++j) {
    const int q0 = round_clamp((x[j] - m) * inv, 0, 31);
    const int q1 = round_clamp((x[j + 16] - m) * inv, 0, 31);
    out[8 + j] = static_cast<uint8_t>((q0 & 15) | ((q1 & 15) << 4));
    qh |= static_cast<uint32_t>(q0 >> 4) << j;
    qh |= static_cast<uint32_t>(q1 >> 4) << (j + 16);
  }
  std::memcpy(out + 4, &qh, 4);
}
void dequantize_block_q5_1(const uint8_t* in, float* y) {
  const float d = load_f16(in), m = load_f16(in + 2);
  uint32_t qh;
  std::memcpy(&qh, in + 4, 4);
  for (int j = 0; j < 16; ++j) {
    const int q0 = (in[8 + j] & 15) | static_cast<int>(((qh >> j) & 1) << 4);
    const int q1 = (in[8 + j] >> 4) | static_cast<int>(((qh >> (j + 16)) & 1) << 4);
    y[j] = d * static_cast<float>(q0) + m;
    y[j + 16] = d * static_cast<float>(q1) + m;
  }
}

// ---- Q4_K: f16 d; f16 dmin; u8 scales[12]; u8 qs[128] ------------------------------------------------
void quantize_block_q4_k(const float* x, uint8_t* out) {
  uint16_t dh, dminh;
  int sc[8], mn[8];
  uint8_t q[256];
  choose_k_quants(x, 15, &dh, &dminh, sc, mn, q);
  store_f16(out, dh);
  store_f16(out + 2, dminh);
  pack_scales_k4(sc, mn, out + 4);
  uint8_t* qs = out + 16;
  for (int c = 0; c < 4; ++c)  // chunk c: sub-blocks 2c (low nibbles) and 2c+1 (high nibbles)
    for (int l = 0; l < 32; ++l) qs[c * 32 + l] = static_cast<uint8_t>(q[c * 64 + l] | (q[c * 64 + 32 + l] << 4));
}
void dequantize_block_q4_k(const uint8_t* in, float* y) {
  const float d = load_f16(in), dmin = load_f16(in + 2);
  const uint8_t* qs = in + 16;
  for (int c = 0; c < 4; ++c) {
    int sc0, m0, sc1, m1;
    unpack_scales_k4(in + 4, 2 * c, &sc0, &m0);
    unpack_scales_k4(in + 4, 2 * c + 1, &sc1, &m1);
    const float d0 = d * static_cast<float>(sc0), o0 = dmin * static_cast<float>(m0);
    const float d1 = d * static_cast<float>(sc1), o1 = dmin * static_cast<float>(m1);
    for (int l = 0; l < 32; ++l) {
      y[c * 64 + l] = d0 * static_cast<float>(qs[c * 32 + l] & 15) - o0;
      y[c * 64 + 32 + l] = d1 * static_cast<float>(qs[c * 32 + l] >> 4) - o1;
    }
  }
}

// ---- Q5_K: f16 d; f16 dmin; u8 scales[12]; u8 qh[32]; u8 qs[128] --------------------------------------
void quantize_block_q5_k(const float* x, uint8_t* out) {
  uint16_t dh, dminh;
  int sc[8], mn[8];
  uint8_t q[256];
  choose_k_quants(x, 31, &dh, &dminh, sc, mn, q);
  store_f16(out, dh);
  store_f16(out + 2, dminh);
  pack_scales_k4(sc, mn, out + 4);
  uint8_t* qh = out + 16;
  uint8_t* qs = out + 48;
  std::memset(qh, 0, 32);
  for (int c = 0; c < 4; ++c) {
    for (int l = 0; l < 32; ++l) {
      const int a = q[c * 64 + l], b = q[c * 64 + 32 + l];
      qs[c * 32 + l] = static_cast<uint8_t>((a & 15) | ((b & 15) << 4));
      qh[l] |= static_cast<uint8_t>(((a >> 4) << (2 * c)) | ((b >> 4) << (2 * c + 1)));
    }
  }
}
void dequantize_block_q5_k(const uint8_t* in, float* y) {
  const float d = load_f16(in), dmin = load_f16(in + 2);
  const uint8_t* qh = in + 16;
  const uint8_t* qs = in + 48;
  for (int c = 0; c < 4; ++c) {
    int sc0, m0, sc1, m1;
    unpack_scales_k4(in + 4, 2 * c, &sc0, &m0);
    unpack_scales_k4(in + 4, 2 * c + 1, &sc1, &m1);
    const float d0 = d * static_cast<float>(sc0), o0 = dmin * static_cast<float>(m0);
    const float d1 = d * static_cast<float>(sc1), o1 = dmin * static_cast<float>(m1);
    for (int l = 0; l < 32; ++l) {
      const int a = (qs[c * 32 + l] & 15) | (((qh[l] >> (2 * c)) & 1) << 4);
      const int b = (qs[c * 32 + l] >> 4) | (((qh[l] >> (2 * c + 1)) & 1) << 4);
      y[c * 64 + l] = d0 * static_cast<float>(a) - o0;
      y[c * 64 + 32 + l] = d1 * static_cast<float>(b) - o1;
    }
  }
}

// ---- Q6_K: u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d; y = d·sc·(q − 32) -------------------------------
void quantize_block_q6_k(const float* x, uint8_t* out) {
  float a[16], a_max = 0.0f;
  for (int j = 0; j < 16; ++j) {
    a[j] = 0.0f;
    for (int i = 0; i < 16; ++i) a[j] = std::max(a[j], std::fabs(x[j * 16 + i]));
    a_max = std::max(a_max, a[j]);
  }
  const uint16_t dh = f16_ceil(a_max / (31.0f * 127.0f));
  const float d = f16_to_f32(dh);
  uint8_t q[256];
  int8_t* scales = reinterpret_cast<int8_t*>(out + 192);
  for (int j = 0; j < 16; ++j) {
    const int sc = d > 0.0f ? ceil_clamp(a[j] / (31.0f * d), 127) : 0;
    scales[j] = static_cast<int8_t>(sc);
    const float step = d * static_cast<float>(sc);
    const float inv = step > 0.0f ? 1.0f / step : 0.0f;
    for (int i = 0; i < 16; ++i) q[j * 16 + i] = static_cast<uint8_t>(round_clamp(x[j * 16 + i] * inv, -32, 31) + 32);
  }
  store_f16(out + 208, dh);
  uint8_t* ql = out;
  uint8_t* qh = out + 128;
  for (int h = 0; h < 2; ++h) {  // two halves of 128 elements: 64 bytes of ql and 32 of qh each
    const uint8_t* qq = q + h * 128;
    for (int l = 0; l < 32; ++l) {
      ql[h * 64 + l] = static_cast<uint8_t>((qq[l] & 15) | ((qq[l + 64] & 15) << 4));
      ql[h * 64 + l + 32] = static_cast<uint8_t>((qq[l + 32] & 15) | ((qq[l + 96] & 15) << 4));
      qh[h * 32 + l] = static_cast<uint8_t>((qq[l] >> 4) | ((qq[l + 32] >> 4) << 2) | ((qq[l + 64] >> 4) << 4) |
                                            ((qq[l + 96] >> 4) << 6));
    }
  }
}
void dequantize_block_q6_k(const uint8_t* in, float* y) {
  const float d = load_f16(in + 208);
  const uint8_t* ql = in;
  const uint8_t* qh = in + 128;
  const int8_t* sc = reinterpret_cast<const int8_t*>(in + 192);
  for (int h = 0; h < 2; ++h) {
    for (int l = 0; l < 32; ++l) {
      const int is = h * 8 + l / 16;
      const int q1 = ((ql[h * 64 + l] & 15) | (((qh[h * 32 + l] >> 0) & 3) << 4)) - 32;
      const int q2 = ((ql[h * 64 + l + 32] & 15) | (((qh[h * 32 + l] >> 2) & 3) << 4)) - 32;
      const int q3 = ((ql[h * 64 + l] >> 4) | (((qh[h * 32 + l] >> 4) & 3) << 4)) - 32;
      const int q4 = ((ql[h * 64 + l + 32] >> 4) | (((qh[h * 32 + l] >> 6) & 3) << 4)) - 32;
      y[h * 128 + l] = d * static_cast<float>(sc[is]) * static_cast<float>(q1);
      y[h * 128 + l + 32] = d * static_cast<float>(sc[is + 2]) * static_cast<float>(q2);
      y[h * 128 + l + 64] = d * static_cast<float>(sc[is + 4]) * static_cast<float>(q3);
      y[h * 128 + l + 96] = d * static_cast<float>(sc[is + 6]) * static_cast<float>(q4);
    }
  }
}

QuantizeBlockFn quantize_block_fn(DType t) {
  switch (t) {
    case DType::Q8_0: return quantize_block_q8_0;
    case DType::Q4_0: return quantize_block_q4_0;
    case DType::Q5_0: return quantize_block_q5_0;
    case DType::Q5_1: return quantize_block_q5_1;
    case DType::Q4_K: return quantize_block_q4_k;
    case DType::Q5_K: return quantize_block_q5_k;
    case DType::Q6_K: return quantize_block_q6_k;
    default: return nullptr;
  }
}

DequantizeBlockFn dequantize_block_fn(DType t) {
  switch (t) {
    case DType::Q8_0: return dequantize_block_q8_0;
    case DType::Q4_0: return dequantize_block_q4_0;
    case DType::Q5_0: return dequantize_block_q5_0;
    case DType::Q5_1: return dequantize_block_q5_1;
    case DType::Q4_K: return dequantize_block_q4_k;
    case DType::Q5_K: return dequantize_block_q5_k;
    case DType::Q6_K: return dequantize_block_q6_k;
    default: return nullptr;
  }
}

void dequantize_span(DType t, const void* src, float* dst, int64_t n) {
  const DequantizeBlockFn f = dequantize_block_fn(t);
  if (!f) return convert(src, t, dst, DType::F32, static_cast<size_t>(n));
  const int64_t bs = dtype_block_size(t);
  const auto bb = static_cast<int64_t>(dtype_block_bytes(t));
  const auto* in = static_cast<const uint8_t*>(src);
  (void)dtype_bytes(t, n);  // checks whole blocks
  for (int64_t b = 0; b < n / bs; ++b) f(in + b * bb, dst + b * bs);
}

void quantize_span(DType t, const float* src, void* dst, int64_t n) {
  const QuantizeBlockFn f = quantize_block_fn(t);
  if (!f) return convert(src, DType::F32, dst, t, static_cast<size_t>(n));
  const int64_t bs = dtype_block_size(t);
  const auto bb = static_cast<int64_t>(dtype_block_bytes(t));
  auto* out = static_cast<uint8_t*>(dst);
  (void)dtype_bytes(t, n);
  for (int64_t b = 0; b < n / bs; ++b) f(src + b * bs, out + b * bb);
}

}  // namespace bp
