// The training benchmarks' measuring logic (train/train_benchmark.h): shapes, the FLOP count, the
// GEMM rate on a runner's device, a timed LoRA run through bp::Trainer, MFU and the report.
#include "train/train_benchmark.h"

#include <fmt/format.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <random>

#include "core/device_info.h"
#include "core/error.h"
#include "core/tensor.h"
#include "train/trainer.h"

namespace bp {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

BenchShape smollm135m_shape() {
  return {"smollm135m", Arch::Llama, 576, 1536, 30, 9, 3, 49152, false, 10000.0f, 1e-5f};
}
BenchShape qwen25_05b_shape() {
  return {"qwen2.5-0.5b", Arch::Qwen2, 896, 4864, 24, 14, 2, 151936, true, 1000000.0f, 1e-6f};
}
BenchShape qwen25_15b_shape() {  // Qwen/Qwen2.5-1.5B config.json
  return {"qwen2.5-1.5b", Arch::Qwen2, 1536, 8960, 28, 12, 2, 151936, true, 1000000.0f, 1e-6f};
}
BenchShape tiny_bench_shape() {  // stories260K's widths with a Llama head
  return {"tiny", Arch::Llama, 64, 172, 5, 8, 4, 512, false, 10000.0f, 1e-5f};
}

BenchShape bench_shape(const std::string& name) {
  for (const BenchShape& s : {qwen25_05b_shape(), qwen25_15b_shape(), smollm135m_shape(), tiny_bench_shape()})
    if (name == s.name) return s;
  throw Error(ErrorCode::CONFIG_INVALID_SETTING,
              fmt::format("[bench] unknown shape '{}' (qwen2.5-0.5b, qwen2.5-1.5b, smollm135m or tiny)", name));
}

ModelConfig bench_config(const BenchShape& s, int64_t layers) {
  ModelConfig c;
  c.arch = s.arch;
  c.architecture_name = s.arch == Arch::Qwen2 ? "Qwen2ForCausalLM" : "LlamaForCausalLM";
  c.model_type = s.arch == Arch::Qwen2 ? "qwen2" : "llama";
  c.vocab_size = s.vocab;
  c.hidden_size = s.hidden;
  c.intermediate_size = s.inter;
  c.num_layers = layers >= 0 ? layers : s.layers;
  c.num_heads = s.heads;
  c.num_kv_heads = s.kv_heads;
  c.head_dim = s.hidden / s.heads;
  c.max_position_embeddings = 4096;
  c.rms_norm_eps = s.eps;
  c.rope.head_dim = static_cast<int>(c.head_dim);
  c.rope.theta = s.theta;
  c.tie_word_embeddings = true;
  c.attention_bias = s.bias;
  return c;
}

StepFlops lora_step_flops(const ModelConfig& c, int64_t seq_len, int64_t rank) {
  const double D = static_cast<double>(c.hidden_size), F = static_cast<double>(c.intermediate_size);
  const double q = static_cast<double>(c.q_dim()), kv = static_cast<double>(c.kv_dim());
  const double L = static_cast<double>(c.num_layers), V = static_cast<double>(c.vocab_size);
  const double t = static_cast<double>(seq_len), r = static_cast<double>(rank);
  const double n_lin = D * (q + 2 * kv) + q * D + 3 * D * F;
  const double lora_in_out = (D + q) + (D + kv) * 2 + (q + D) + (D + F) * 2 + (F + D);
  StepFlops f;
  f.frozen_fwd = 2 * t * (L * n_lin + V * D);
  f.frozen_bwd = f.frozen_fwd;
  f.lora = 6 * t * r * lora_in_out * L;
  f.attention = 3 * 4 * t * t * q * L / 2;
  return f;
}

StepFlops full_step_flops(const ModelConfig& c, int64_t seq_len) {
  StepFlops f = lora_step_flops(c, seq_len, 0);
  f.frozen_bwd = 2 * f.frozen_fwd;  // dx and dW
  return f;
}

std::vector<GemmShape> model_gemm_shapes(const ModelConfig& c, int64_t T) {
  const int64_t D = c.hidden_size, F = c.intermediate_size, q = c.q_dim(), kv = c.kv_dim();
  return {{"q", T, D, q},    {"k", T, D, kv}, {"v", T, D, kv},   {"o", T, q, D},
          {"gate", T, D, F}, {"up", T, D, F}, {"down", T, F, D}, {"lm_head", T, D, c.vocab_size}};
}

namespace {

// bf16 random values in [-1, 1) on `device` (made on the host, converted, copied over): a block of
// 64K random values repeated, so the LM head's hundreds of millions of elements take no time.
Tensor random_operand(int64_t n, DType type, Device device, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> block(65536), v(static_cast<size_t>(n));
  for (float& x : block) x = u(rng);
  for (size_t i = 0; i < v.size(); ++i) v[i] = block[i % block.size()];
  Tensor t = Tensor::from_vector(v, {n}).to(type);
  return device.type == DeviceType::CPU ? t : t.to(device);
}

}  // namespace

GemmRate measure_gemm_rate(const std::vector<GemmShape>& shapes, const GemmRunner& runner, double min_seconds) {
  int64_t x_max = 1, w_max = 1, y_max = 1;
  double flops_per_round = 0;
  for (const GemmShape& s : shapes) {
    x_max = std::max(x_max, s.M * s.K);
    w_max = std::max(w_max, s.N * s.K);
    y_max = std::max(y_max, s.M * s.N);
    flops_per_round += 2.0 * static_cast<double>(s.M) * static_cast<double>(s.N) * static_cast<double>(s.K);
  }
  const DType type = runner.input_type == gemm::DType::F16 ? DType::F16 : DType::BF16;
  const Tensor x = random_operand(x_max, type, runner.device, 1), w = random_operand(w_max, type, runner.device, 2);
  const Tensor y = Tensor::empty({y_max}, type, runner.device);
  auto round = [&] {
    for (const GemmShape& s : shapes)  // y = x·Wᵀ as the model's linear forward describes it (A = W, B = x)
      runner.run(gemm::linear_forward_gemm(s.M, s.K, s.N, runner.input_type, runner.input_type), w.kernel_raw(),
                 x.kernel_raw(), y.kernel_raw());
    if (runner.sync) runner.sync();
  };
  round();  // warm-up: cuBLASLt's heuristics, first-touch
  GemmRate r;
  const auto t0 = Clock::now();
  do {
    round();
    ++r.rounds;
    r.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  } while (r.seconds < min_seconds);
  r.flops = flops_per_round * r.rounds;
  r.flops_per_s = r.seconds > 0 ? r.flops / r.seconds : 0.0;
  return r;
}

// ---- the training run -------------------------------------------------------------------------

namespace {

// Rows of random words, each longer than seq_len tokens under any tokenizer (at least one token
// per word), so every step trains on exactly one sequence cut at seq_len.
std::string write_dataset(const fs::path& dir, int64_t seq_len, int rows) {
  static const char* words[] = {"the",   "little", "dog",   "ran",    "home",   "after", "school", "and",
                                "found", "a",      "red",   "ball",   "under",  "tree",  "garden", "sun",
                                "was",   "warm",   "happy", "friend", "played", "with",  "cat",    "blue"};
  std::mt19937 rng(7);
  std::uniform_int_distribution<size_t> pick(0, std::size(words) - 1);
  const fs::path path = dir / "data.jsonl";
  std::ofstream f(path);
  for (int i = 0; i < rows; ++i) {
    std::string text;
    for (int64_t w = 0; w < seq_len + 16; ++w) text += std::string(w ? " " : "") + words[pick(rng)];
    f << nlohmann::json{{"text", text}}.dump() << "\n";
  }
  if (!f) throw Error(ErrorCode::RUNTIME_INTERNAL, "[bench] could not write " + path.string());
  return path.string();
}

TrainOptions bench_train_options(const TrainBenchSpec& spec, const fs::path& dir) {
  TrainOptions o;
  const fs::path config = dir / "config.json";
  std::ofstream(config) << spec.config.to_json().dump(2);
  o.init_from_config = config.string();  // random weights from the config (held as base_dtype)
  o.tokenizer_dir = spec.tokenizer_dir;
  o.data_path = write_dataset(dir, spec.seq_len, spec.warmup_steps + spec.steps);
  o.output_dir = (dir / "run").string();
  o.device = spec.device;
  o.base_dtype = spec.mode == TrainMode::Full ? "auto" : spec.base_dtype;
  o.mode = spec.mode;
  o.matmul_dtype = spec.mode == TrainMode::Full ? spec.matmul_dtype : "auto";
  o.lora.r = spec.rank;
  o.lora.alpha = spec.alpha;
  o.lora.dropout = 0.0f;
  o.lora.target_modules = {"all-linear"};
  o.steps = spec.warmup_steps + spec.steps;
  o.batch_size = 1;
  o.max_seq_length = spec.seq_len;
  o.holdout = 0.0;
  o.lr = 1e-4;
  o.lr_scheduler = LrScheduler::Constant;
  o.train_on_all = true;
  o.threads = spec.threads;
  o.quiet = true;
  return o;
}

}  // namespace

void finish_train_benchmark(TrainBenchResult& r, double timed_seconds, int64_t timed_tokens, int timed_steps) {
  r.steps = timed_steps;
  r.step_s = timed_steps > 0 ? timed_seconds / timed_steps : 0.0;
  r.tokens_per_step = timed_steps > 0 ? timed_tokens / timed_steps : 0;
  r.tokens_per_s = timed_seconds > 0 ? static_cast<double>(timed_tokens) / timed_seconds : 0.0;
  r.model_flops_per_s = r.step_s > 0 ? r.model_flops_per_step / r.step_s : 0.0;
  r.mfu = r.gemm_flops_per_s > 0 ? r.model_flops_per_s / r.gemm_flops_per_s : 0.0;
}

TrainBenchResult run_train_benchmark(const TrainBenchSpec& spec, const GemmRunner& runner) {
  if (spec.steps < 1 || spec.warmup_steps < 1 || spec.seq_len < 2)
    throw Error(ErrorCode::CONFIG_INVALID_SETTING,
                fmt::format("[bench] needs >= 1 warm-up and >= 1 timed step and seq_len >= 2 (got {}, {}, {})",
                            spec.warmup_steps, spec.steps, spec.seq_len));
  const fs::path dir = fs::path(spec.work_dir) / spec.name;
  fs::create_directories(dir);
  TrainBenchResult r;
  r.name = spec.name;
  r.device = spec.device;
  r.layers = spec.config.num_layers;
  r.seq_len = spec.seq_len;
  r.rank = spec.rank;
  r.alpha = spec.alpha;
  r.config = spec.config.to_json();
  // Timed: from the end of the last warm-up step to the end of the last step (the loss of every
  // step is read back, so the device has finished each step's forward/backward by its callback).
  Clock::time_point t_start{}, t_end{};
  int64_t timed_tokens = 0;
  int timed_steps = 0;
  bool all_full_length = true;
  TrainCallbacks cb;
  cb.on_step = [&](const StepRecord& rec, const TrainSummary&, int64_t) {
    const auto now = Clock::now();
    if (rec.step == spec.warmup_steps) t_start = now;
    if (rec.step <= spec.warmup_steps) return;
    t_end = now;
    timed_tokens += rec.tokens;
    ++timed_steps;
    all_full_length = all_full_length && rec.tokens == spec.seq_len;
  };
  Trainer trainer(bench_train_options(spec, dir), cb);
  const TrainSummary sum = trainer.run();
  if (!all_full_length || timed_steps != spec.steps)
    throw Error(ErrorCode::RUNTIME_INTERNAL,
                fmt::format("[bench] {} timed steps of {} tokens expected, got {} steps, {} tokens", spec.steps,
                            spec.seq_len, timed_steps, timed_tokens));
  r.base_dtype = sum.base_dtype;
  r.gradient_checkpointing = sum.gradient_checkpointing;
  r.final_loss = sum.final_loss;
  r.peak_memory_bytes = sum.peak_memory_bytes;
  r.mode = spec.mode == TrainMode::Full ? "full" : "lora";
  r.matmul_dtype = sum.matmul_dtype;
  r.model_flops_per_step = spec.mode == TrainMode::Full ? full_step_flops(spec.config, spec.seq_len).total()
                                                        : lora_step_flops(spec.config, spec.seq_len, spec.rank).total();
  r.gemm_input_type = gemm::dtype_name(runner.input_type);
  r.gemm_flops_per_s =
      measure_gemm_rate(model_gemm_shapes(spec.config, spec.seq_len), runner, spec.gemm_min_seconds).flops_per_s;
  finish_train_benchmark(r, std::chrono::duration<double>(t_end - t_start).count(), timed_tokens, timed_steps);
  return r;
}

nlohmann::json TrainBenchResult::to_json() const {
  return {{"impl", "backprop"},
          {"model", name},
          {"device", device},
          {"base_dtype", base_dtype},
          {"mode", mode},
          {"matmul_dtype", matmul_dtype},
          {"layers", layers},
          {"seq", seq_len},
          {"rank", rank},
          {"alpha", alpha},
          {"steps", steps},
          {"gradient_checkpointing", gradient_checkpointing},
          {"tokens_per_step", tokens_per_step},
          {"step_s", step_s},
          {"tokens_per_s", tokens_per_s},
          {"model_flops_per_step", model_flops_per_step},
          {"model_flops_per_s", model_flops_per_s},
          {"gemm_flops_per_s", gemm_flops_per_s},
          {"gemm_input_type", gemm_input_type},
          {"mfu", mfu},
          {"loss", final_loss},
          {"peak_memory_bytes", peak_memory_bytes},
          {"config", config}};
}

std::string TrainBenchResult::report() const {
  const std::string setup = mode == "full" ? fmt::format("full fine-tuning, {} GEMMs", matmul_dtype)
                                           : fmt::format("LoRA r{} all-linear, frozen {}", rank, base_dtype);
  return fmt::format(
      "{} ({} layers, seq {}, {}, checkpointing {}) on {}: {} timed steps\n"
      "  step {:.4f} s, {:.1f} tokens/s, model {:.3f} GFLOP/step = {:.2f} GFLOP/s\n"
      "  {} GEMM rate on the model's shapes {:.2f} GFLOP/s; MFU {:.1f}%; loss {:.4f}; peak memory {:.1f} MiB\n",
      name, layers, seq_len, setup, gradient_checkpointing ? "on" : "off", device, steps, step_s, tokens_per_s,
      model_flops_per_step / 1e9, model_flops_per_s / 1e9, gemm_input_type, gemm_flops_per_s / 1e9, 100.0 * mfu,
      final_loss, static_cast<double>(peak_memory_bytes) / (1 << 20));
}

std::string cuda_device_description() {
  const CudaStatus cs = cuda_status();
  auto version = [](int v) { return v ? fmt::format("{}.{}", v / 1000, (v % 1000) / 10) : std::string("none"); };
  if (!cs.compiled) return "no CUDA backend in this build";
  std::string s = fmt::format("driver {}, runtime {}", version(cs.driver_version), version(cs.runtime_version));
  if (cs.devices.empty()) return s + "; no usable device: " + cs.why_unavailable;
  const CudaDeviceInfo& d = cs.devices[0];
  return fmt::format("{}, compute capability {}.{}, {}, {:.1f} GiB", d.name, d.cc_major, d.cc_minor, s,
                     static_cast<double>(d.bytes_total) / (1 << 30));
}

}  // namespace bp
