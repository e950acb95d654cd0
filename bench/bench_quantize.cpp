// Quantization and GGUF write throughput. MB/s are of f32 input (4 bytes per weight).
//   ./build/bench/bench_quantize --benchmark_min_time=0.2
// BM_quantize/<type>: quantize_rows over a 1024 x 4096 matrix (OpenMP, all threads).
// BM_dequantize/<type>: the reverse.
// BM_gguf_write_f16 vs BM_raw_write: a 1024 x 8192 f32 tensor written as an f16 GGUF (convert +
// write + fsync + rename) against writing the same number of bytes with write(2) + fsync: the
// ratio says how close f16 export runs to disk speed.
#include <benchmark/benchmark.h>
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <random>
#include <vector>

#include "core/tensor.h"
#include "io/gguf_writer.h"
#include "io/quantize.h"

namespace {

using bp::GGMLType;

std::vector<float> weights(size_t n) {
  std::mt19937 rng(1);
  std::normal_distribution<float> g(0.0f, 0.02f);
  std::vector<float> v(n);
  for (auto& x : v) x = g(rng);
  return v;
}

constexpr int64_t kRows = 1024, kCols = 4096;

void BM_quantize(benchmark::State& st, GGMLType t) {
  const auto x = weights(static_cast<size_t>(kRows * kCols));
  std::vector<uint8_t> q(bp::ggml_row_bytes(t, kCols) * kRows);
  for (auto _ : st) {
    bp::quantize_rows(t, x.data(), q.data(), kRows, kCols);
    benchmark::DoNotOptimize(q.data());
  }
  st.SetBytesProcessed(st.iterations() * kRows * kCols * 4);
}

void BM_dequantize(benchmark::State& st, GGMLType t) {
  const auto x = weights(static_cast<size_t>(kRows * kCols));
  std::vector<uint8_t> q(bp::ggml_row_bytes(t, kCols) * kRows);
  bp::quantize_rows(t, x.data(), q.data(), kRows, kCols);
  std::vector<float> y(x.size());
  for (auto _ : st) {
    bp::dequantize_rows(t, q.data(), y.data(), kRows, kCols);
    benchmark::DoNotOptimize(y.data());
  }
  st.SetBytesProcessed(st.iterations() * kRows * kCols * 4);
}

#define BP_TYPES(X) X(F16) X(BF16) X(Q8_0) X(Q4_0) X(Q5_0) X(Q5_1) X(Q4_K) X(Q5_K) X(Q6_K)
#define BP_REGISTER(T)                                           \
  BENCHMARK_CAPTURE(BM_quantize, T, GGMLType::T)->UseRealTime(); \
  BENCHMARK_CAPTURE(BM_dequantize, T, GGMLType::T)->UseRealTime();
BP_TYPES(BP_REGISTER)

std::string bench_dir() {
  auto d = std::filesystem::temp_directory_path() / "bp_bench_quantize";
  std::filesystem::create_directories(d);
  return d.string();
}

void BM_gguf_write_f16(benchmark::State& st) {
  const int64_t rows = 1024, cols = 8192;
  auto t = bp::Tensor::from_vector(weights(static_cast<size_t>(rows * cols)), bp::Shape{rows, cols});
  const std::string path = bench_dir() + "/w.gguf";
  for (auto _ : st) {
    bp::GGUFWriter w;
    w.add_tensor(bp::gguf_tensor_from("w", t, GGMLType::F16));
    w.write(path);
  }
  std::filesystem::remove(path);
  st.SetBytesProcessed(st.iterations() * rows * cols * 2);  // bytes written
}
BENCHMARK(BM_gguf_write_f16)->UseRealTime()->Unit(benchmark::kMillisecond);

void BM_raw_write(benchmark::State& st) {
  const size_t bytes = 1024 * 8192 * 2;
  std::vector<char> buf(bytes, 1);
  const std::string path = bench_dir() + "/raw.bin";
  for (auto _ : st) {
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    for (size_t off = 0; off < bytes; off += 8u << 20)
      if (::write(fd, buf.data() + off, std::min<size_t>(8u << 20, bytes - off)) < 0) st.SkipWithError("write failed");
    ::fsync(fd);
    ::close(fd);
  }
  std::filesystem::remove(path);
  st.SetBytesProcessed(st.iterations() * static_cast<int64_t>(bytes));
}
BENCHMARK(BM_raw_write)->UseRealTime()->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
