// Quantization tests. Three independent checks per type:
//  1. Layout: the test decodes blocks with its own per-element reading of ggml's layouts (written
//     from the spec, element by element, unlike the library's loops) and must agree with
//     dequantize_block_* on random bytes, and with the values the quantizer meant to store.
//  2. Error bounds derived here from the input alone (see quantize_blocks.cpp for the derivation).
//  3. Determinism across thread counts; bad row lengths are errors.
#include "io/quantize.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>

#include "core/dtype.h"
#include "core/error.h"
#include "support/test_util.h"

namespace bp {
namespace {

float h2f(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return f16_to_f32(h);
}

// ---- spec decoders: value of element i of one block -------------------------------------------
float spec_q8_0(const uint8_t* b, int i) {
  return h2f(b) * static_cast<int8_t>(b[2 + i]);
}
float spec_q4_0(const uint8_t* b, int i) {
  const int nib = i < 16 ? (b[2 + i] & 15) : (b[2 + i - 16] >> 4);
  return h2f(b) * (nib - 8);
}
int spec_q5_low(const uint8_t* qs, int i) {
  return i < 16 ? (qs[i] & 15) : (qs[i - 16] >> 4);
}
int spec_bit(const uint8_t* qh, int bit) {
  return (qh[bit / 8] >> (bit % 8)) & 1;
}  // little-endian bit string
float spec_q5_0(const uint8_t* b, int i) {
  return h2f(b) * ((spec_q5_low(b + 6, i) | (spec_bit(b + 2, i) << 4)) - 16);
}
float spec_q5_1(const uint8_t* b, int i) {
  return h2f(b) * (spec_q5_low(b + 8, i) | (spec_bit(b + 4, i) << 4)) + h2f(b + 2);
}
// 6-bit scale and min of sub-block j from the 12 packed bytes.
void spec_k4_scale(const uint8_t* s, int j, int* sc, int* m) {
  if (j < 4) {
    *sc = s[j] % 64;
    *m = s[4 + j] % 64;
  } else {
    *sc = s[4 + j] % 16 + 16 * (s[j - 4] / 64);
    *m = s[4 + j] / 16 + 16 * (s[j] / 64);
  }
}
float spec_q4_k(const uint8_t* b, int i) {
  const int sub = i / 32, l = i % 32;
  const uint8_t byte = b[16 + (i / 64) * 32 + l];
  const int q = sub % 2 == 0 ? byte % 16 : byte / 16;
  int sc, m;
  spec_k4_scale(b + 4, sub, &sc, &m);
  return h2f(b) * sc * q - h2f(b + 2) * m;
}
float spec_q5_k(const uint8_t* b, int i) {
  const int sub = i / 32, l = i % 32;
  const uint8_t byte = b[48 + (i / 64) * 32 + l];
  const int q = (sub % 2 == 0 ? byte % 16 : byte / 16) + 16 * ((b[16 + l] >> sub) & 1);
  int sc, m;
  spec_k4_scale(b + 4, sub, &sc, &m);
  return h2f(b) * sc * q - h2f(b + 2) * m;
}
float spec_q6_k(const uint8_t* b, int i) {
  const int half = i / 128, quarter = (i % 128) / 32, l = i % 32;
  const uint8_t* ql = b + half * 64;
  const int lo = quarter == 0   ? ql[l] % 16
                 : quarter == 1 ? ql[32 + l] % 16
                 : quarter == 2 ? ql[l] / 16
                                : ql[32 + l] / 16;
  const int hi = (b[128 + half * 32 + l] >> (2 * quarter)) & 3;
  const int sc = static_cast<int8_t>(b[192 + i / 16]);
  return h2f(b + 208) * sc * ((lo | (hi << 4)) - 32);
}

using SpecFn = std::function<float(const uint8_t*, int)>;
using BoundFn = std::function<std::vector<float>(const float*)>;

// An f16 scale rounded up: at most one f16 step above v (relative 2^-10, absolute 2^-24 for subnormals).
float f16up(float v) {
  return v * (1.0f + std::ldexp(1.0f, -10)) + std::ldexp(1.0f, -24);
}
float absmax(const float* x, int n) {
  float a = 0;
  for (int i = 0; i < n; ++i) a = std::max(a, std::fabs(x[i]));
  return a;
}
float slack(const float* x, int n) {
  return 2e-6f * absmax(x, n) + 1e-30f;
}

std::vector<float> bound_q8_0(const float* x) {
  return std::vector<float>(32, 0.5f * f16up(absmax(x, 32) / 127) + slack(x, 32));
}
std::vector<float> bound_sym(const float* x, float levels) {  // Q4_0 (8) / Q5_0 (16)
  float m = 0;
  for (int i = 0; i < 32; ++i)
    if (std::fabs(x[i]) > std::fabs(m)) m = x[i];
  const float d = f16up(std::fabs(m) / levels);
  std::vector<float> b(32);
  for (int i = 0; i < 32; ++i) b[i] = (x[i] * m < 0 ? d : 0.5f * d) + slack(x, 32);
  return b;
}
std::vector<float> bound_q5_1(const float* x) {
  const float lo = *std::min_element(x, x + 32), hi = *std::max_element(x, x + 32);
  const float em = std::fabs(lo) * std::ldexp(1.0f, -11) + std::ldexp(1.0f, -24);
  return std::vector<float>(32, 0.5f * f16up((hi - lo + em) / 31) + em + slack(x, 32));
}
std::vector<float> bound_k(const float* x, float levels) {  // Q4_K (15) / Q5_K (31)
  float mn[8], hi[8], mn_max = 0;
  for (int j = 0; j < 8; ++j) {
    mn[j] = std::max(0.0f, -*std::min_element(x + 32 * j, x + 32 * j + 32));
    hi[j] = *std::max_element(x + 32 * j, x + 32 * j + 32);
    mn_max = std::max(mn_max, mn[j]);
  }
  const float dmin = f16up(mn_max / 63);
  float span[8], span_max = 0;
  for (int j = 0; j < 8; ++j) {
    span[j] = std::max(0.0f, hi[j] + mn[j] + dmin);
    span_max = std::max(span_max, span[j]);
  }
  const float d = f16up(span_max / (63 * levels));
  std::vector<float> b(256);
  for (int i = 0; i < 256; ++i) b[i] = 0.5f * (span[i / 32] / levels + d) + slack(x, 256);
  return b;
}
std::vector<float> bound_q6_k(const float* x) {
  const float d = f16up(absmax(x, 256) / (31 * 127));
  std::vector<float> b(256);
  for (int i = 0; i < 256; ++i) b[i] = 0.5f * (absmax(x + 16 * (i / 16), 16) / 31 + d) + slack(x, 256);
  return b;
}

struct Case {
  GGMLType type;
  int block;
  size_t bytes;
  SpecFn spec;
  BoundFn bound;
  double max_rel_rmse;  // quality guard on Gaussian data (RMSE / RMS)
};

std::vector<Case> cases() {
  return {
      {GGMLType::Q8_0, 32, 34, spec_q8_0, bound_q8_0, 0.01},
      {GGMLType::Q4_0, 32, 18, spec_q4_0, [](const float* x) { return bound_sym(x, 8); }, 0.15},
      {GGMLType::Q5_0, 32, 22, spec_q5_0, [](const float* x) { return bound_sym(x, 16); }, 0.075},
      {GGMLType::Q5_1, 32, 24, spec_q5_1, bound_q5_1, 0.06},
      {GGMLType::Q4_K, 256, 144, spec_q4_k, [](const float* x) { return bound_k(x, 15); }, 0.12},
      {GGMLType::Q5_K, 256, 176, spec_q5_k, [](const float* x) { return bound_k(x, 31); }, 0.06},
      {GGMLType::Q6_K, 256, 210, spec_q6_k, bound_q6_k, 0.035},
  };
}

// Inputs that exercise every branch: Gaussian, all positive, all negative, constant, zeros,
// an outlier, tiny (f16 subnormal scales) and large values.
std::vector<std::vector<float>> inputs(int n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::vector<std::vector<float>> out;
  auto gen = [&](auto f) {
    std::vector<float> v(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) v[static_cast<size_t>(i)] = f(i);
    out.push_back(v);
  };
  gen([&](int) { return g(rng) * 0.02f; });
  gen([&](int) { return std::fabs(g(rng)) + 0.5f; });
  gen([&](int) { return -std::fabs(g(rng)) - 0.25f; });
  gen([&](int) { return 0.3f; });
  gen([&](int) { return 0.0f; });
  gen([&](int i) { return i == n / 3 ? 40.0f : g(rng) * 0.1f; });
  gen([&](int) { return g(rng) * 1e-6f; });
  gen([&](int) { return g(rng) * 300.0f; });
  return out;
}

TEST(Quantize, BlockSizesAreGgmls) {
  for (const auto& c : cases()) {
    EXPECT_EQ(ggml_type_info(c.type).block_size, c.block) << ggml_type_name(c.type);
    EXPECT_EQ(ggml_type_info(c.type).block_bytes, c.bytes) << ggml_type_name(c.type);
    EXPECT_EQ(ggml_row_bytes(c.type, 4 * c.block), 4 * c.bytes);
  }
  EXPECT_EQ(ggml_row_bytes(GGMLType::F16, 7), 14u);
  EXPECT_EQ(static_cast<uint32_t>(GGMLType::Q4_K), 12u);
  EXPECT_EQ(static_cast<uint32_t>(GGMLType::BF16), 30u);
  EXPECT_STREQ(ggml_type_name(GGMLType::Q6_K), "q6_K");
}

TEST(Quantize, DequantizeMatchesSpecOnRandomBytes) {
  std::mt19937 rng(7);
  for (const auto& c : cases()) {
    for (int trial = 0; trial < 20; ++trial) {
      std::vector<uint8_t> blk(c.bytes);
      for (auto& b : blk) b = static_cast<uint8_t>(rng());
      // Keep f16 fields finite: overwrite them with modest values.
      auto put = [&](size_t off, float v) {
        uint16_t h = f32_to_f16(v);
        std::memcpy(blk.data() + off, &h, 2);
      };
      const float d = 0.01f * static_cast<float>(1 + trial), m = -0.003f * static_cast<float>(trial);
      if (c.type == GGMLType::Q6_K) {
        put(208, d);
      } else {
        put(0, d);
        if (c.type == GGMLType::Q5_1 || c.type == GGMLType::Q4_K || c.type == GGMLType::Q5_K) put(2, m);
      }
      std::vector<float> y(static_cast<size_t>(c.block));
      dequantize_rows(c.type, blk.data(), y.data(), 1, c.block);
      for (int i = 0; i < c.block; ++i)
        ASSERT_FLOAT_EQ(y[static_cast<size_t>(i)], c.spec(blk.data(), i)) << ggml_type_name(c.type) << " element " << i;
    }
  }
}

TEST(Quantize, ErrorWithinDerivedBoundAndLayoutMatchesSpec) {
  for (const auto& c : cases()) {
    for (int nblocks : {1, 3}) {
      for (const auto& x : inputs(c.block * nblocks, 11 + static_cast<uint64_t>(nblocks))) {
        std::vector<uint8_t> q(ggml_row_bytes(c.type, c.block * nblocks));
        std::vector<float> y(x.size());
        quantize_rows(c.type, x.data(), q.data(), 1, c.block * nblocks);
        dequantize_rows(c.type, q.data(), y.data(), 1, c.block * nblocks);
        for (int b = 0; b < nblocks; ++b) {
          const float* xb = x.data() + b * c.block;
          const auto bound = c.bound(xb);
          for (int i = 0; i < c.block; ++i) {
            const size_t k = static_cast<size_t>(b * c.block + i);
            ASSERT_LE(std::fabs(y[k] - x[k]), bound[static_cast<size_t>(i)])
                << ggml_type_name(c.type) << " block " << b << " element " << i << " x=" << x[k] << " y=" << y[k];
            ASSERT_FLOAT_EQ(c.spec(q.data() + static_cast<size_t>(b) * c.bytes, i), y[k]);
          }
        }
      }
    }
  }
}

TEST(Quantize, QualityOnGaussianWeights) {
  const int n = 256 * 64;
  const auto x = test::random_vector(n, 3, -1.0f, 1.0f);
  for (const auto& c : cases()) {
    std::vector<uint8_t> q(ggml_row_bytes(c.type, n));
    std::vector<float> y(n);
    quantize_rows(c.type, x.data(), q.data(), 1, n);
    dequantize_rows(c.type, q.data(), y.data(), 1, n);
    double se = 0, ss = 0;
    for (int i = 0; i < n; ++i) {
      se += (y[i] - x[i]) * (y[i] - x[i]);
      ss += x[i] * x[i];
    }
    EXPECT_LE(std::sqrt(se / ss), c.max_rel_rmse) << ggml_type_name(c.type);
  }
}

TEST(Quantize, SameBytesForAnyThreadCount) {
  const int rows = 65, cols = 4096;  // above the size where quantize_rows goes parallel
  const auto x = test::random_vector(rows * cols, 5);
  for (const auto& c : cases()) {
    std::vector<uint8_t> a(rows * ggml_row_bytes(c.type, cols)), b(a.size());
    const int saved = omp_get_max_threads();
    omp_set_num_threads(1);
    quantize_rows(c.type, x.data(), a.data(), rows, cols);
    omp_set_num_threads(std::max(2, saved));
    quantize_rows(c.type, x.data(), b.data(), rows, cols);
    omp_set_num_threads(saved);
    EXPECT_EQ(a, b) << ggml_type_name(c.type);
  }
}

TEST(Quantize, FloatTypesRoundTrip) {
  auto x = test::random_vector(257, 9);
  // Rounding ties, subnormals, overflow and NaN go through the vector path (first 8s) and the tail.
  const float special[] = {1.0f + std::ldexp(1.0f, -11),
                           1.0f + 3 * std::ldexp(1.0f, -11),
                           std::ldexp(1.0f, -24),
                           std::ldexp(1.0f, -26),
                           70000.0f,
                           -65504.0f,
                           1e-7f,
                           -0.0f,
                           3.0e-5f,
                           65520.0f};
  for (size_t i = 0; i < 10; ++i) x[i] = x[250 - i] = special[i];
  std::vector<uint8_t> buf(257 * 4);
  std::vector<float> y(257);
  quantize_rows(GGMLType::F16, x.data(), buf.data(), 1, 257);
  dequantize_rows(GGMLType::F16, buf.data(), y.data(), 1, 257);
  for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(y[i], f16_to_f32(f32_to_f16(x[i])));
  quantize_rows(GGMLType::BF16, x.data(), buf.data(), 1, 257);
  dequantize_rows(GGMLType::BF16, buf.data(), y.data(), 1, 257);
  for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(y[i], bf16_to_f32(f32_to_bf16(x[i])));
  quantize_rows(GGMLType::F32, x.data(), buf.data(), 1, 257);
  dequantize_rows(GGMLType::F32, buf.data(), y.data(), 1, 257);
  EXPECT_EQ(y, x);
}

TEST(Quantize, RowLengthNotMultipleOfBlockIsAnError) {
  std::vector<float> x(300, 1.0f);
  std::vector<uint8_t> q(1024);
  try {
    quantize_rows(GGMLType::Q4_K, x.data(), q.data(), 1, 300);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::RUNTIME_GGUF_EXPORT_FAILED);
    EXPECT_NE(std::string(e.what()).find("300"), std::string::npos);
  }
  EXPECT_THROW(ggml_row_bytes(GGMLType::Q8_0, 33), Error);
}

}  // namespace
}  // namespace bp
