// What the Trainer-on-the-simulated-card tests share (trainer_cuda_test.cpp: parity with the CPU,
// resume, quantized bases, device choice; trainer_cuda_memory_test.cpp: OOM recovery and the
// memory plan on the card): the tiny-chat run options, loss comparison with tolerances, and
// readers of what a run wrote.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <set>

#include "backend/cuda/device_workspace.h"
#include "backend/cuda/sim/cuda_sim.h"
#include "backend/cuda/sim/gemm_sim.h"
#include "core/device_info.h"
#include "export/gguf_export.h"
#include "hub/gguf_source.h"
#include "io/safetensors.h"
#include "model/held_weights.h"
#include "model/loader.h"
#include "model/merge.h"
#include "sim_device.h"
#include "support/shaped_config.h"
#include "support/test_util.h"
#include "train/trainer.h"

namespace bp::test::cuda_trainer {

constexpr Device kGpu{DeviceType::CUDA, 0};

// A model's config.json as a Qwen3ForCausalLM (q/k norms) of the same shape: a run started from it
// (TrainOptions::init_from_config) has random weights.
inline nlohmann::json config_as_qwen3(nlohmann::json cfg) {
  cfg["architectures"] = {"Qwen3ForCausalLM"};
  cfg["model_type"] = "qwen3";
  return cfg;
}

inline std::string write_dataset(const std::string& dir) {
  const std::string path = dir + "/data.jsonl";
  std::ofstream f(path);
  const char* names[] = {"Lily", "Tom", "Ben", "Sue", "Max", "Mia"};
  const char* things[] = {"a red ball", "a big dog", "a small cat", "a blue car"};
  for (int i = 0; i < 10; ++i)
    f << "{\"text\": \"" << names[i % 6] << " had " << things[i % 4] << ". " << names[(i + 1) % 6] << " liked it.\"}\n";
  return path;
}

inline TrainOptions tiny_chat_options(const std::string& dir, const std::string& device) {
  TrainOptions o;
  o.model_dir = source_dir() + "/models/tiny-chat";
  o.data_path = write_dataset(dir);
  o.output_dir = dir + "/run";
  o.device = device;
  o.steps = 3;
  o.batch_size = 4;
  o.micro_batch_size = 2;  // two micro-batches per step: gradient accumulation on the device
  o.lr = 5e-3;
  o.warmup_steps = 0;
  o.lr_scheduler = LrScheduler::Constant;
  o.max_seq_length = 32;
  o.holdout = 0.2;        // two held-out samples: the evaluations run on the device too
  o.max_grad_norm = 0.5;  // small enough that clipping scales the gradients
  o.lora.r = 4;
  o.lora.alpha = 8;
  o.lora.dropout = 0.1f;
  o.lora.target_modules = {"all-linear"};
  o.gradient_checkpointing = true;
  o.threads = 1;
  o.quiet = true;
  // Held as stored (f32): the f32 comparisons with the CPU hold element for element. --base-dtype
  // auto would hold it in bf16 on the card (CudaTrainer.AutoHoldsASafetensorsBaseInBf16OnTheCard).
  o.base_dtype = "f32";
  return o;
}

// Relative tolerances of the device's losses and gradient norms against the CPU's.
struct RunTolerance {
  double loss = 1e-5, grad_norm = 1e-4;  // f32 activations and weights: f32 sums in another order
};
// Frozen weights held narrower than f32 (bf16, f16, block types): the device's GEMMs against them
// take bf16 inputs (kernel_wrappers.h): the activation operand is rounded to bf16 and a weight not
// held as bf16 is dequantized to bf16; the CPU multiplies the dequantized weight and the activation
// in f32. u = 2⁻⁹ is bf16's unit roundoff: every product moves by at most 2u, the loss stays within
// u (measured: ≤ 5e-4 relative); the gradients pass through every rounded GEMM above them, forward
// and backward (16u per tensor in norm, tests/cuda/model_cuda_test.cpp) and, from step 2 on, weights
// updated from gradients that already differ: 16u for the global norm (measured: ≤ 1.4e-2 by step 3
// over a q8_0 base).
constexpr RunTolerance kBf16HeldRunTolerance{1.0 / 512, 16.0 / 512};
// The same on a Turing card (compute capability 7.5), whose GEMMs against them take f16 inputs
// (the activation scaled per tensor by a power of two): the same bounds in f16's u = 2⁻¹¹.
constexpr RunTolerance kF16HeldRunTolerance{1.0 / 2048, 16.0 / 2048};

inline void expect_losses_close(const TrainSummary& got, const TrainSummary& ref, RunTolerance tol = {}) {
  ASSERT_EQ(got.history.size(), ref.history.size());
  for (size_t i = 0; i < ref.history.size(); ++i) {
    EXPECT_EQ(got.history[i].sample_ids, ref.history[i].sample_ids) << "step " << i + 1;
    EXPECT_NEAR(got.history[i].loss, ref.history[i].loss, tol.loss * std::max(1.0, std::fabs(ref.history[i].loss)))
        << "step " << i + 1;
    EXPECT_EQ(got.history[i].skipped, ref.history[i].skipped) << "step " << i + 1;
    if (!ref.history[i].skipped) {  // a skipped step's norm is the non-finite one
      EXPECT_NEAR(got.history[i].grad_norm, ref.history[i].grad_norm, tol.grad_norm * ref.history[i].grad_norm)
          << "step " << i + 1;
    }
  }
}

// The trainer's "training on ..." event: the device and what it computes in.
inline TrainCallbacks capture_device_event(std::string* line) {
  TrainCallbacks cb;
  cb.on_event = [line](const std::string&, const std::string& message) {
    if (message.rfind("training on ", 0) == 0) *line = message;
  };
  return cb;
}

// The run's last "oom_recovery" record in metrics.jsonl ("" when none).
inline std::string last_oom_record(const std::string& output_dir) {
  std::ifstream metrics(output_dir + "/metrics.jsonl");
  std::string line, oom_line;
  while (std::getline(metrics, line))
    if (line.find("\"oom_recovery\"") != std::string::npos) oom_line = line;
  return oom_line;
}

inline std::vector<float> saved_tensor(const std::string& file, const std::string& name) {
  return SafetensorsReader::open_file(file).read(name).to_vector();
}

}  // namespace bp::test::cuda_trainer
