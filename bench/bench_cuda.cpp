// LoRA training speed on one NVIDIA GPU (issue 18): tokens/s of `--device cuda` training through
// bp::Trainer (the code path of `backprop train`) on the Qwen2.5-0.5B and Qwen2.5-1.5B shapes with
// random weights, sequence 2048, and model-FLOPs utilisation against the card's bf16 GEMM rate (f16 on a Turing card)
// measured in the same run through our cuBLASLt path (backend/cuda/cublaslt_gemm.cpp, descriptions
// of gemm_desc.h) on the model's own GEMM shapes. Built only with the CUDA backend.
//
// The measuring logic (shapes, FLOP count, timing, MFU, report) is bp::run_train_benchmark
// (train/train_benchmark.h), which tests run at a tiny shape on the CPU (test_train) and on the
// simulated card (test_cuda); this file only binds it to the real device.
// scripts/gpu_check.sh runs it next to transformers + PEFT and PyTorch eager
// (scripts/gpu_bench_compare.py) and prints the ratio and the targets.
//
// Environment: BP_BENCH_SHAPES (qwen2.5-0.5b,qwen2.5-1.5b)  BP_BENCH_SEQ (2048)
//   BP_BENCH_STEPS (5 timed, after 1 warm-up)  BP_BENCH_BASE_DTYPE (bf16: frozen weights; or f32)
//   BP_BENCH_LAYERS (the shape's own: 24 / 28)  BP_BENCH_MODE (lora; full: every weight trained, f32
//   masters, GEMMs on bf16 copies: BP_BENCH_MATMUL_DTYPE auto/bf16/f32)  BP_SOURCE_DIR (the repository, for
//   models/tiny-chat; default: the one it was built from; scripts/gpu_check.sh --prebuilt sets it)
// Run: ./build-gpu/bench/bench_cuda [--json FILE]   (FILE: one JSON line per shape, appended)
#include <cuda_runtime_api.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>

#include "backend/cuda/cuda_kernels.h"
#include "core/device_info.h"
#include "core/error.h"
#include "core/tensor.h"
#include "ops/device_compute.h"
#include "train/train_benchmark.h"

namespace {

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : fallback;
}
std::string env_str(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v && *v ? v : fallback;
}

// bp::cuda::gemm (cuBLASLt) on the default stream, with a workspace from our allocator of the size
// training's GEMMs get (the card's recommended one, ops::device_gemm_workspace_bytes), so the rate
// is the one the trainer's GEMMs can reach.
// Inputs in the card's 16-bit type (bf16; f16 on a Turing card), as training's frozen-weight GEMMs.
bp::GemmRunner cublaslt_runner(const bp::Tensor& workspace, int cc_major) {
  bp::GemmRunner r;
  r.device = bp::Device{bp::DeviceType::CUDA, 0};
  r.input_type = bp::gemm::narrow_type(cc_major);
  r.run = [&workspace](const bp::gemm::GemmDesc& d, const void* A, const void* B, void* C) {
    bp::cuda::gemm(d, A, B, C, workspace.kernel_raw(), workspace.nbytes(), nullptr);
  };
  r.sync = [] {
    const cudaError_t e = cudaDeviceSynchronize();
    if (e != cudaSuccess)
      throw bp::Error(bp::ErrorCode::RUNTIME_GPU_KERNEL_FAULT,
                      std::string("[bench] cudaDeviceSynchronize: ") + cudaGetErrorString(e));
  };
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  std::string json_path;
  for (int i = 1; i < argc; ++i)
    if (std::strcmp(argv[i], "--json") == 0 && i + 1 < argc) json_path = argv[++i];
  spdlog::set_level(spdlog::level::err);  // the trainer's notes (texts cut at the sequence length) are expected
  std::printf("device: %s\n", bp::cuda_device_description().c_str());
  const bp::CudaStatus cs = bp::cuda_status();
  if (cs.devices.empty()) {
    std::fprintf(stderr, "bench_cuda: no usable CUDA device (%s): nothing measured\n", cs.why_unavailable.c_str());
    return 2;
  }
  const std::string work =
      (std::filesystem::temp_directory_path() / ("bench_cuda." + std::to_string(getpid()))).string();
  std::ofstream json;
  if (!json_path.empty()) json.open(json_path, std::ios::app);
  try {
    const size_t workspace_bytes = bp::ops::device_gemm_workspace_bytes(bp::DeviceType::CUDA);
    const bp::Tensor workspace = bp::Tensor::empty({static_cast<int64_t>(workspace_bytes / 4)}, bp::DType::F32,
                                                   bp::Device{bp::DeviceType::CUDA, 0});
    std::stringstream shapes(env_str("BP_BENCH_SHAPES", "qwen2.5-0.5b,qwen2.5-1.5b"));
    for (std::string name; std::getline(shapes, name, ',');) {
      bp::TrainBenchSpec spec;
      spec.name = name;
      spec.config = bp::bench_config(bp::bench_shape(name), env_int("BP_BENCH_LAYERS", -1));
      spec.seq_len = env_int("BP_BENCH_SEQ", 2048);
      spec.steps = env_int("BP_BENCH_STEPS", 5);
      spec.base_dtype = env_str("BP_BENCH_BASE_DTYPE", "bf16");
      const std::string mode = env_str("BP_BENCH_MODE", "lora");
      if (mode != "lora" && mode != "full") throw std::runtime_error("BP_BENCH_MODE must be lora or full, not " + mode);
      spec.mode = mode == "full" ? bp::TrainMode::Full : bp::TrainMode::Lora;
      spec.matmul_dtype = env_str("BP_BENCH_MATMUL_DTYPE", "auto");
      spec.device = "cuda";
      spec.tokenizer_dir = env_str("BP_SOURCE_DIR", BP_SOURCE_DIR) + "/models/tiny-chat";
      spec.work_dir = work;
      const bp::TrainBenchResult r = bp::run_train_benchmark(spec, cublaslt_runner(workspace, cs.devices[0].cc_major));
      std::printf("%s", r.report().c_str());
      std::fflush(stdout);
      if (json.is_open()) json << r.to_json().dump() << "\n" << std::flush;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_cuda: %s\n", e.what());
    std::filesystem::remove_all(work);
    return 1;
  }
  std::filesystem::remove_all(work);
  return 0;
}
