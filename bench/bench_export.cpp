// f16 GGUF export of a moderately sized model against the floor it should reach (issue 7: "f16
// export runs near disk speed").
//   ./build/bench/bench_export --benchmark_min_time=1
// Model: SmolLM-135M's shape (hidden 576, intermediate 1536, 30 layers, 9/3 heads, vocab 49152,
// tied), random weights from init_random_weights: 134.5 M parameters, a 269 MB f16 file.
//   BM_export_f16_gguf   add_model_to_gguf + GGUFWriter::write (convert, q/k permute, write, fsync,
//                        rename, directory fsync): the tensor part of `backprop export --format gguf`.
//   BM_raw_write_fsync   the same number of bytes written with write(2) in 4 MiB pieces to a fresh
//                        file, then fsync: the disk floor.
//   BM_convert_only      every tensor converted to f16 into memory, nothing written: the CPU floor.
// Near disk speed means export ≈ max(raw, convert), not raw + convert.
#include <benchmark/benchmark.h>
#include <fcntl.h>
#include <unistd.h>

#include <filesystem>
#include <vector>

#include "export/gguf_export.h"
#include "io/gguf_writer.h"
#include "model/loader.h"

namespace {

const bp::ModelWeights& model() {
  static const bp::ModelWeights w = [] {
    nlohmann::json j = {{"architectures", {"LlamaForCausalLM"}},
                        {"vocab_size", 49152},
                        {"hidden_size", 576},
                        {"intermediate_size", 1536},
                        {"num_hidden_layers", 30},
                        {"num_attention_heads", 9},
                        {"num_key_value_heads", 3},
                        {"max_position_embeddings", 2048},
                        {"tie_word_embeddings", true}};
    return bp::init_random_weights(bp::ModelConfig::from_json(j, "smollm-135m-shape"), 1);
  }();
  return w;
}

std::string bench_path(const char* name) {
  auto d = std::filesystem::temp_directory_path() / "bp_bench_export";
  std::filesystem::create_directories(d);
  return (d / name).string();
}

uint64_t file_bytes() {
  bp::GGUFWriter w;
  bp::add_model_to_gguf(w, model(), bp::GGUFQuant::F16, "bench");
  return w.expected_file_bytes();
}

void BM_export_f16_gguf(benchmark::State& st) {
  const auto& m = model();
  const std::string path = bench_path("model-f16.gguf");
  for (auto _ : st) {
    bp::GGUFWriter w;
    bp::add_model_to_gguf(w, m, bp::GGUFQuant::F16, "bench");
    w.write(path);
    st.PauseTiming();
    std::filesystem::remove(path);  // every iteration writes a fresh file, like a real export
    st.ResumeTiming();
  }
  st.SetBytesProcessed(st.iterations() * static_cast<int64_t>(file_bytes()));
}
BENCHMARK(BM_export_f16_gguf)->UseRealTime()->Unit(benchmark::kMillisecond);

void BM_raw_write_fsync(benchmark::State& st) {
  const size_t bytes = file_bytes(), piece = 4u << 20;
  std::vector<char> buf(piece, 1);
  const std::string path = bench_path("raw.bin");
  for (auto _ : st) {
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    for (size_t off = 0; off < bytes; off += piece)
      if (::write(fd, buf.data(), std::min(piece, bytes - off)) < 0) st.SkipWithError("write failed");
    ::fsync(fd);
    ::close(fd);
    st.PauseTiming();
    std::filesystem::remove(path);
    st.ResumeTiming();
  }
  st.SetBytesProcessed(st.iterations() * static_cast<int64_t>(bytes));
}
BENCHMARK(BM_raw_write_fsync)->UseRealTime()->Unit(benchmark::kMillisecond);

void BM_convert_only(benchmark::State& st) {
  bp::GGUFWriter w;
  bp::add_model_to_gguf(w, model(), bp::GGUFQuant::F16, "bench");
  std::vector<uint8_t> buf;
  for (auto _ : st) {
    for (const auto& t : w.tensors()) {
      const int64_t rows = t.num_rows();
      const int64_t step = std::max<int64_t>(1, static_cast<int64_t>((4u << 20) / t.row_bytes()));
      for (int64_t r = 0; r < rows; r += step) {
        const int64_t r1 = std::min(rows, r + step);
        buf.resize(static_cast<size_t>(r1 - r) * t.row_bytes());
        t.produce(buf.data(), r, r1);
      }
    }
    benchmark::DoNotOptimize(buf.data());
  }
  st.SetBytesProcessed(st.iterations() * static_cast<int64_t>(file_bytes()));
}
BENCHMARK(BM_convert_only)->UseRealTime()->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
