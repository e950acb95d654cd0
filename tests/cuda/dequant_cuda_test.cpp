// CUDA dequantization of held weights (src/backend/cuda/dequant.cuh) on the CPU simulation against
// the CPU reference dequantizers (core/quant_blocks.h): every held type, rows [row0, row0 + n) at
// odd offsets and counts and gathered rows, f32 output bit for bit and bf16 output as the
// round-to-nearest-even of the CPU's f32 value. The inputs mix block magnitudes (tiny ones give
// subnormal f16 scales, zero blocks give zero scales, negative ones flip q4_0/q5_0's sign).
#include <cstring>

#include "backend/cuda/dequant.cuh"
#include "backend/cuda/sim/sim_kernel_wrappers.h"
#include "core/quant_blocks.h"
#include "sim_test_util.h"

namespace bp::sim {
namespace {

constexpr DType kTypes[] = {DType::F32,  DType::BF16, DType::F16,  DType::Q8_0, DType::Q4_0,
                            DType::Q5_0, DType::Q5_1, DType::Q4_K, DType::Q5_K, DType::Q6_K};

// A held matrix [rows, cols] of `type` quantized from random rows of varied magnitude, and its
// dequantization by the CPU reference.
struct Held {
  std::vector<uint8_t> bytes;
  std::vector<float> reference;
};
Held make_held(DType type, int64_t rows, int64_t cols) {
  std::vector<float> x = test::random_floats(static_cast<size_t>(rows * cols), 7 + static_cast<uint32_t>(type));
  const float magnitude[] = {1.0f, 3e-4f, 40.0f, 0.0f, -0.2f, 1e-3f, 7.0f};
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) x[static_cast<size_t>(r * cols + c)] *= magnitude[r % 7];
  x[5] = 1.5f;  // one block dominated by a positive value: q4_0/q5_0 store a negative scale
  Held h;
  h.bytes.resize(dtype_bytes(type, rows * cols));
  quantize_span(type, x.data(), h.bytes.data(), rows * cols);
  h.reference.resize(x.size());
  dequantize_span(type, h.bytes.data(), h.reference.data(), rows * cols);
  return h;
}

uint32_t bits_of(float v) {
  uint32_t u;
  std::memcpy(&u, &v, 4);
  return u;
}

// dst[r, :] must be row rows_of[r] of the reference: f32 bit for bit, bf16 its rounding.
template <class Out>
void expect_rows(const std::vector<Out>& got, const Held& h, const std::vector<int64_t>& rows_of, int64_t cols,
                 const std::string& what) {
  int bad = 0;
  for (size_t r = 0; r < rows_of.size(); ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const float ref = h.reference[static_cast<size_t>(rows_of[r] * cols + c)];
      const Out g = got[r * static_cast<size_t>(cols) + static_cast<size_t>(c)];
      bool same;
      if constexpr (std::is_same_v<Out, float>)
        same = bits_of(g) == bits_of(ref);
      else
        same = g.bits == f32_to_bf16(ref);
      if (!same && ++bad <= 3)
        ADD_FAILURE() << what << " row " << rows_of[r] << " col " << c << ": got " << test::back(std::vector<Out>{g})[0]
                      << ", reference " << ref;
    }
  EXPECT_EQ(bad, 0) << what;
}

template <class Out>
void check_type(DType type) {
  // Rows of two blocks (or 96 values for the element types) at an odd row count.
  const int64_t cols = dtype_block_size(type) == 256 ? 512 : dtype_block_size(type) == 32 ? 96 : 37;
  const int64_t rows = 13;
  const Held h = make_held(type, rows, cols);
  for (auto [row0, n] : {std::pair<int64_t, int64_t>{0, rows}, {3, 7}, {12, 1}, {5, 0}}) {
    const std::string what = std::string(dtype_name(type)) + (std::is_same_v<Out, float> ? " -> f32" : " -> bf16") +
                             " rows " + std::to_string(row0) + "+" + std::to_string(n);
    std::vector<Out> got(static_cast<size_t>(n * cols) + 1);
    got.back() = test::as<Out>({-123.0f})[0];  // a sentinel past the rows: nothing writes beyond n rows
    const uint64_t launches = launch_count();
    ASSERT_TRUE(dequantize_rows<Out>(type, h.bytes.data(), cols, row0, n, got.data()));
    ASSERT_EQ(cudaGetLastError(), cudaSuccess);
    EXPECT_EQ(launch_count(), launches + (n > 0 ? 1 : 0)) << what;
    EXPECT_EQ(test::back(std::vector<Out>{got.back()})[0], -123.0f) << what;
    got.pop_back();
    std::vector<int64_t> rows_of;
    for (int64_t r = row0; r < row0 + n; ++r) rows_of.push_back(r);
    expect_rows(got, h, rows_of, cols, what);
  }
  const std::vector<int32_t> ids = {12, 0, 5, 5, 7};
  std::vector<Out> gathered(ids.size() * static_cast<size_t>(cols));
  ASSERT_TRUE(dequantize_gather_rows<Out>(type, h.bytes.data(), cols, ids.data(), static_cast<int64_t>(ids.size()),
                                          gathered.data()));
  expect_rows(gathered, h, {12, 0, 5, 5, 7}, cols, std::string(dtype_name(type)) + " gathered");
}

TEST(CudaDequant, EveryHeldTypeMatchesTheCpuReferenceBitForBitInF32) {
  for (DType t : kTypes) check_type<float>(t);
}

TEST(CudaDequant, Bf16OutputIsTheRoundedCpuValue) {
  for (DType t : kTypes) check_type<bf16>(t);
}

// The test inputs reach the paths that matter: subnormal and negative f16 scales, zero blocks.
TEST(CudaDequant, InputsCoverSubnormalNegativeAndZeroScales) {
  const Held h = make_held(DType::Q8_0, 7, 96);
  bool subnormal = false, zero = false;
  for (int64_t b = 0; b < 7 * 3; ++b) {
    const uint16_t d = static_cast<uint16_t>(h.bytes[b * 34] | (h.bytes[b * 34 + 1] << 8));
    subnormal = subnormal || ((d & 0x7c00) == 0 && (d & 0x3ff) != 0);
    zero = zero || d == 0;
  }
  EXPECT_TRUE(subnormal);
  EXPECT_TRUE(zero);
  const Held q4 = make_held(DType::Q4_0, 7, 96);
  EXPECT_TRUE(q4.bytes[1] & 0x80) << "the first q4_0 block's scale is negative";
}

// A type without a device dequantizer launches nothing and says so; the wrappers turn that into
// RUNTIME_NOT_BUILT_WITH_CUDA rather than reading the bytes.
TEST(CudaDequant, TypesWithoutAKernelAreRefused) {
  std::vector<int32_t> data(64, 1);
  std::vector<float> out(64, -1.0f);
  const uint64_t launches = launch_count();
  EXPECT_FALSE(dequantize_supported(DType::I32));
  EXPECT_FALSE(dequantize_rows<float>(DType::I32, data.data(), 8, 0, 8, out.data()));
  EXPECT_EQ(launch_count(), launches);
  EXPECT_EQ(out[0], -1.0f);
  const cpu::HeldMatrix W{data.data(), DType::I32, 8, 8};
  std::vector<float> x(8, 1.0f), c(64);
  try {
    KernelWrappers::held_gemm_xwt(x.data(), W, 0.0f, c.data(), 1);
    FAIL() << "an i32 weight was read";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::RUNTIME_NOT_BUILT_WITH_CUDA) << e.what();
    EXPECT_NE(std::string(e.what()).find("i32"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace bp::sim
