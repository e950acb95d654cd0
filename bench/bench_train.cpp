// End-to-end LoRA training speed (issue 6): tokens/s of full optimizer steps on SmolLM-135M- and
// Qwen2.5-0.5B-shaped models with random weights, model-FLOPs utilisation against raw OpenBLAS
// sgemm measured in the same run, and a per-op profile of where a step's time goes.
// scripts/bench_train.sh runs this next to the PyTorch oracle (tests/oracles/torch_train_bench.py)
// and prints the ratio.
//
// One step = zero_grads + Model::forward_backward (1 sequence of BP_BENCH_SEQ tokens, packed as
// one sample) + AdamW::step over every LoRA tensor. LoRA r=16, alpha=32, all-linear, dropout 0
// (the oracle has no dropout). Each benchmark does 1 untimed warm-up step, then BP_BENCH_STEPS
// timed steps (Google Benchmark iterations, wall time).
//
// Model FLOPs of one step: bp::lora_step_flops (train/train_benchmark.h, shared with bench_cuda,
// which states the count: frozen forward and dx, LoRA forward and backward, causal attention; the
// recomputed forward of checkpointing and the elementwise ops are not counted). MFU = model FLOPs /
// step time / sgemm rate, the rate of OpenBLAS on the layer's MLP shape T×D×F, measured right
// after the steps; where the engine runs bf16 GEMMs on oneDNN, also oneDNN's bf16 rate on that
// shape (counter bf16GF/s, 0 elsewhere), the peak of a bf16 base (issue 41).
//
// Environment: BP_BENCH_THREADS (default 2) sets OpenMP and OpenBLAS threads; BP_BENCH_STEPS (3);
// BP_BENCH_LORA_DROPOUT (percent, default 0: the oracle has none, nor has the training default);
// BP_BENCH_SEQ (512); BP_BENCH_SMOL_LAYERS (30); BP_BENCH_QWEN_LAYERS (8 of Qwen's 24: same layer
// shapes, full-size vocabulary head; the whole model is heavy on 2 cores).
// `--qlora` compares the frozen weights held at f32, q8_0 and q4_k in one process, steps interleaved
// (qlora_compare below); BP_BENCH_BASE_DTYPE sets the base of the other benchmarks.
// `--profile` prints the per-op table (checkpointing on; BP_BENCH_PROFILE_NO_CKPT=1 adds off)
// instead of running the benchmarks.
//
// Run: ./build/bench/bench_train --benchmark_counters_tabular=true
//      BP_BENCH_STEPS=3 ./build/bench/bench_train --qlora
//      ./build/bench/bench_train --profile
#include <benchmark/benchmark.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/gemm.h"
#include "backend/cpu/gemm_engine.h"
#include "bench_kernels.h"
#include "core/threads.h"
#include "model/held_weights.h"
#include "model/loader.h"
#include "model/lora.h"
#include "model/transformer.h"
#include "ops/attention.h"
#include "ops/embedding.h"
#include "ops/optim.h"
#include "ops/rms_norm.h"
#include "ops/rope.h"
#include "ops/swiglu.h"
#include "train/optimizer.h"
#include "train/train_benchmark.h"

namespace {

using bp::Tensor;
using Clock = std::chrono::steady_clock;

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : fallback;
}

constexpr int64_t kRank = 16;
constexpr float kAlpha = 32.0f;

using Shape = bp::BenchShape;
Shape smol_shape() {
  Shape s = bp::smollm135m_shape();
  s.layers = env_int("BP_BENCH_SMOL_LAYERS", 30);
  return s;
}
Shape qwen_shape() {
  Shape s = bp::qwen25_05b_shape();
  s.layers = env_int("BP_BENCH_QWEN_LAYERS", 8);
  return s;
}
bp::ModelConfig make_config(const Shape& s) {
  return bp::bench_config(s);
}

// The FLOP model of the header comment (train/train_benchmark.h, shared with bench_cuda).
using bp::StepFlops;
StepFlops step_flops(const bp::ModelConfig& c, int64_t T) {
  return bp::lora_step_flops(c, T, kRank);
}

// GFLOP/s of wall time of `gemm` (2·M·N·K FLOPs a call) over >= min_s seconds, after one warm-up call.
template <class F>
double gemm_rate(int64_t M, int64_t K, int64_t N, double min_s, F&& gemm) {
  gemm();
  int calls = 0;
  const auto t0 = Clock::now();
  double s = 0;
  do {
    gemm();
    ++calls;
    s = std::chrono::duration<double>(Clock::now() - t0).count();
  } while (s < min_s);
  return 2.0 * M * N * K * calls / s / 1e9;
}

// Raw OpenBLAS rate on y[T×F] = x[T×D]·W[F×D]ᵀ, in GFLOP/s of wall time, over >= min_s seconds.
double sgemm_rate(int64_t M, int64_t K, int64_t N, double min_s) {
  std::vector<float> a(static_cast<size_t>(M * K), 0.01f), b(static_cast<size_t>(N * K), 0.02f),
      y(static_cast<size_t>(M * N));
  return gemm_rate(M, K, N, min_s,
                   [&] { bp::cpu::sgemm(false, true, M, N, K, 1.0f, a.data(), K, b.data(), K, 0.0f, y.data(), N); });
}

// oneDNN's bf16 matmul on the same product (the engine's path for weights held in bf16,
// backend/cpu/gemm_engine.h), or 0 where the engine does not run it (no oneDNN, a CPU without
// bf16 dot products, --cpu-gemm openblas): the peak a bf16 base's MFU is measured against.
double onednn_bf16_rate(int64_t M, int64_t K, int64_t N, double min_s) {
  if (bp::cpu::cpu_gemm_choice().held_bf16 != bp::cpu::HeldBf16Path::OneDnn) return 0.0;
  std::vector<uint16_t> a(static_cast<size_t>(M * K), 0x3c24), b(static_cast<size_t>(N * K), 0x3ca4);  // ~0.01, 0.02
  std::vector<float> y(static_cast<size_t>(M * N));
  return gemm_rate(M, K, N, min_s, [&] { bp::cpu::onednn_bf16_gemm_xwt(a.data(), b.data(), 0.0f, y.data(), M, N, K); });
}

// Process CPU seconds (all threads, user + system) and minor page faults so far.
struct Usage {
  double cpu_s;
  double minor_faults;
};
Usage usage_now() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  auto sec = [](const timeval& tv) { return static_cast<double>(tv.tv_sec) + 1e-6 * static_cast<double>(tv.tv_usec); };
  return {sec(ru.ru_utime) + sec(ru.ru_stime), static_cast<double>(ru.ru_minflt)};
}

bp::Batch make_batch(int64_t T, int64_t vocab) {
  std::mt19937 rng(1234);
  std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(vocab - 1));
  std::vector<int32_t> ids(static_cast<size_t>(T));
  for (auto& i : ids) i = tok(rng);
  return bp::Batch::causal_lm({ids});
}

struct Trainer {
  bp::ModelConfig cfg;
  bp::LoraAdapter adapter;
  bp::Model model;
  bp::AdamW adam;
  std::vector<bp::TrainableParam> params;
  bp::Batch batch;
  float grad_scale;
  bp::AdamWConfig opt{1e-4f, 0.9f, 0.999f, 1e-8f, 0.0f};

  Trainer(const bp::ModelConfig& c, bool ckpt, int64_t T, const char* base_dtype = std::getenv("BP_BENCH_BASE_DTYPE"))
      : cfg(c), adapter(make_adapter(c)), model(held_base(bp::init_random_weights(c, 42), base_dtype), options(ckpt)) {
    model.attach_lora(adapter);
    params = model.trainable_parameters();
    adam.init(params);
    batch = make_batch(T, c.vocab_size);
    grad_scale = 1.0f / static_cast<float>(batch.num_label_tokens());
  }
  // BP_BENCH_BASE_DTYPE (f32 | bf16 | q8_0 | q4_k): how the frozen weights are held (QLoRA).
  static bp::ModelWeights held_base(bp::ModelWeights w, const char* v) {
    const auto base = bp::parse_base_dtype(v && *v ? v : "f32");
    if (base && *base != bp::DType::F32) bp::hold_weights(w, *base);
    return w;
  }
  static bp::LoraAdapter make_adapter(const bp::ModelConfig& c) {
    bp::LoraConfig lc;
    lc.r = kRank;
    lc.alpha = kAlpha;
    lc.target_modules = {"all-linear"};
    lc.dropout = static_cast<float>(env_int("BP_BENCH_LORA_DROPOUT", 0)) / 100.0f;
    return bp::init_lora(c, lc, 7);
  }
  static bp::ModelOptions options(bool ckpt) {
    bp::ModelOptions o;
    o.mode = bp::TrainMode::Lora;
    o.gradient_checkpointing = ckpt;
    return o;
  }
  float step(uint64_t seed) {
    model.zero_grads();
    auto res = model.forward_backward(batch, grad_scale, seed);
    adam.step(params, opt);
    return static_cast<float>(res.loss_sum);
  }
};

void BM_train(benchmark::State& state, Shape shape, bool ckpt) {
  const int64_t T = env_int("BP_BENCH_SEQ", 512);
  const bp::ModelConfig cfg = make_config(shape);
  Trainer tr(cfg, ckpt, T);
  uint64_t seed = 1;
  tr.step(seed++);  // warm-up: first-touch page faults, BLAS thread start-up
  float loss = 0;
  const Usage u0 = usage_now();
  for (auto _ : state) loss = tr.step(seed++);
  const Usage u1 = usage_now();
  const double n = static_cast<double>(state.iterations());
  const StepFlops f = step_flops(cfg, T);
  const double gemm = sgemm_rate(T, cfg.hidden_size, cfg.intermediate_size, 1.0);
  state.counters["bf16GF/s"] = onednn_bf16_rate(T, cfg.hidden_size, cfg.intermediate_size, 1.0);
  state.counters["tok/s"] = benchmark::Counter(static_cast<double>(T), benchmark::Counter::kIsIterationInvariantRate);
  state.counters["modelGF/s"] = benchmark::Counter(f.total() / 1e9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["model_GF"] = f.total() / 1e9;
  state.counters["sgemmGF/s"] = gemm;
  state.counters["cpu_s/step"] = (u1.cpu_s - u0.cpu_s) / n;  // vs wall step time: threads busy (or spinning)
  state.counters["faults/step"] = (u1.minor_faults - u0.minor_faults) / n;
  state.counters["layers"] = static_cast<double>(cfg.num_layers);
  state.counters["loss"] = loss / static_cast<float>(tr.batch.num_label_tokens());
  const char* base = std::getenv("BP_BENCH_BASE_DTYPE");
  state.SetLabel(std::string(shape.name) + (ckpt ? " ckpt" : " no-ckpt") + " base " + (base && *base ? base : "f32") +
                 " (MFU = modelGF/s / sgemmGF/s; over a bf16 base also / bf16GF/s)");
}

void BM_sgemm(benchmark::State& state) {
  const int64_t M = state.range(0), K = state.range(1), N = state.range(2);
  std::vector<float> a(static_cast<size_t>(M * K), 0.01f), b(static_cast<size_t>(N * K), 0.02f),
      y(static_cast<size_t>(M * N));
  for (auto _ : state) {
    bp::cpu::sgemm(false, true, M, N, K, 1.0f, a.data(), K, b.data(), K, 0.0f, y.data(), N);
    benchmark::DoNotOptimize(y.data());
  }
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * M * N * K / 1e9, benchmark::Counter::kIsIterationInvariantRate);
}

// ---- QLoRA: f32 vs q8_0 vs q4_k in one process -----------------------------------------------------
// The same LoRA step (checkpointing on, the training default) with the frozen weights held at
// f32, q8_0 and q4_k, the three models built side by side and their steps interleaved
// (f32, q8_0, q4_k, f32, ...) so that the shared machine's load drifts over all three alike.
// Prints per base type the median wall time of a step, the mean CPU time (both threads), tok/s
// and both as a ratio to f32 (issue 17's target: tok/s at q8_0 and q4_k >= 85% of f32).
void qlora_compare(const Shape& shape, int steps) {
  const int64_t T = env_int("BP_BENCH_SEQ", 512);
  const bp::ModelConfig cfg = make_config(shape);
  const char* names[] = {"f32", "q8_0", "q4_k"};
  std::vector<std::unique_ptr<Trainer>> trainers;
  for (const char* n : names) trainers.push_back(std::make_unique<Trainer>(cfg, true, T, n));
  std::vector<std::vector<double>> wall(3), cpu(3);
  for (int round = 0; round <= steps; ++round) {  // round 0: warm-up, not counted
    for (size_t i = 0; i < trainers.size(); ++i) {
      const Usage u0 = usage_now();
      const auto t0 = Clock::now();
      trainers[i]->step(static_cast<uint64_t>(round + 1));
      const double w = std::chrono::duration<double>(Clock::now() - t0).count();
      if (round > 0) wall[i].push_back(w), cpu[i].push_back(usage_now().cpu_s - u0.cpu_s);
    }
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
  };
  auto mean = [](const std::vector<double>& v) {
    double s = 0;
    for (double x : v) s += x;
    return s / static_cast<double>(v.size());
  };
  std::printf("\n== QLoRA %s, %lld layers, T=%lld, checkpointing, %d threads, %d steps each (interleaved) ==\n",
              shape.name, static_cast<long long>(cfg.num_layers), static_cast<long long>(T), bp::num_threads(), steps);
  std::printf("%-6s %10s %10s %9s %14s %14s %8s\n", "base", "wall s", "cpu s", "tok/s", "tok/s vs f32",
              "cpu/step vs f32", "weights");
  const double wall_f32 = median(wall[0]), cpu_f32 = mean(cpu[0]);
  for (size_t i = 0; i < trainers.size(); ++i) {
    const double w = median(wall[i]), c = mean(cpu[i]);
    std::printf("%-6s %10.3f %10.3f %9.1f %13.1f%% %13.1f%% %7.1fM\n", names[i], w, c, static_cast<double>(T) / w,
                100.0 * wall_f32 / w, 100.0 * cpu_f32 / c,
                static_cast<double>(bp::resident_weight_bytes(trainers[i]->model.weights())) / (1 << 20));
  }
  std::fflush(stdout);
}

// ---- per-op profile -----------------------------------------------------------------------------
// Runs one decoder layer's op sequence (the same calls, in the same order, as Model::forward_layer
// and Model::backward_layer with LoRA on every projection) at the model's shapes with a scoped
// timer around each op, plus the LM head, AdamW and a measured full step, and prints per step:
// time per op type = measured layer time × L (× 2 for forward with checkpointing), and the rest of
// the measured step (allocation, bookkeeping) as "unaccounted".

std::map<std::string, double>* g_times = nullptr;
struct ScopedTimer {
  const char* name;
  Clock::time_point t0 = Clock::now();
  explicit ScopedTimer(const char* n) : name(n) {}
  ~ScopedTimer() { (*g_times)[name] += std::chrono::duration<double>(Clock::now() - t0).count(); }
};
#define TIMED(name, expr)     \
  [&]() -> decltype(auto) {   \
    ScopedTimer timer_(name); \
    return expr;              \
  }()

struct LayerRun {
  const bp::ModelConfig& c;
  const bp::LayerWeights& w;
  bp::LoraLayer& lora;
  const bp::Batch& b;
  std::array<bp::LinearSaved, bp::kNumLinearRoles> saved;
  std::array<bp::LoraGradPair, bp::kNumLinearRoles> grads;
  Tensor x, xn, rstd1, q, k, v, lse, attn, h, hn, rstd2, gate, up, m;

  LayerRun(const bp::ModelConfig& cfg, const bp::LayerWeights& lw, bp::LoraLayer& ll, const bp::Batch& batch)
      : c(cfg), w(lw), lora(ll), b(batch) {
    for (int r = 0; r < bp::kNumLinearRoles; ++r) {
      grads[static_cast<size_t>(r)].dA = Tensor::zeros(ll.A[static_cast<size_t>(r)].shape());
      grads[static_cast<size_t>(r)].dB = Tensor::zeros(ll.B[static_cast<size_t>(r)].shape());
    }
  }
  bp::LoraWeights lw(int r) {
    return {&lora.A[static_cast<size_t>(r)], &lora.B[static_cast<size_t>(r)], kAlpha / kRank, 0.0f, 0, true};
  }
  // residual (may be null): added by the projection's GEMM, as the model's o_proj and down_proj do.
  Tensor lin(int r, const Tensor& in, const Tensor& W, const Tensor* bias, const Tensor* residual = nullptr) {
    auto l = lw(r);
    return TIMED("linear+lora fwd",
                 bp::linear_forward(in, W, bias, &l, &saved[static_cast<size_t>(r)], nullptr, residual));
  }
  void lin_back(int r, const Tensor& dy, const Tensor& in, const Tensor& W, Tensor& dx, bool add_dx = false) {
    auto l = lw(r);
    bp::LinearGrads g;
    g.dx = &dx;
    g.accumulate_dx = add_dx;
    g.dA = &grads[static_cast<size_t>(r)].dA;
    g.dB = &grads[static_cast<size_t>(r)].dB;
    TIMED("linear+lora bwd", bp::linear_backward(dy, in, W, &l, &saved[static_cast<size_t>(r)], g));
  }
  const Tensor* opt(const Tensor& t) { return t.defined() ? &t : nullptr; }

  Tensor forward(const Tensor& xin) {
    const int Hq = static_cast<int>(c.num_heads), Hkv = static_cast<int>(c.num_kv_heads);
    x = xin;
    xn = TIMED("rms_norm fwd", bp::rms_norm_forward(x, w.input_norm, c.rms_norm_eps, &rstd1));
    q = lin(0, xn, w.q, opt(w.q_bias));
    k = lin(1, xn, w.k, opt(w.k_bias));
    v = lin(2, xn, w.v, opt(w.v_bias));
    TIMED("rope fwd", bp::rope_forward(q, k, b.positions, Hq, Hkv, c.rope));
    bp::AttentionShape shape{Hq, Hkv, static_cast<int>(c.head_dim)};
    attn = TIMED("attention fwd", bp::attention_forward(q, k, v, b.cu_seqlens, shape, &lse));
    h = lin(3, attn, w.o, nullptr, &x);
    hn = TIMED("rms_norm fwd", bp::rms_norm_forward(h, w.post_norm, c.rms_norm_eps, &rstd2));
    gate = lin(4, hn, w.gate, nullptr);
    up = lin(5, hn, w.up, nullptr);
    m = TIMED("swiglu fwd", bp::swiglu_forward(gate, up));
    return lin(6, m, w.down, nullptr, &h);
  }

  Tensor backward(Tensor dout) {  // consumed, as Model::backward_layer does: dout's buffer becomes dh
    const int64_t T = dout.dim(0), D = c.hidden_size, F = c.intermediate_size;
    const int Hq = static_cast<int>(c.num_heads), Hkv = static_cast<int>(c.num_kv_heads);
    Tensor dm = Tensor::empty({T, F});
    lin_back(6, dout, m, w.down, dm);
    Tensor dgate = Tensor::empty({T, F}), dup = Tensor::empty({T, F});
    TIMED("swiglu bwd", bp::swiglu_backward(dm, gate, up, dgate, dup));
    Tensor dhn = Tensor::empty({T, D});
    lin_back(4, dgate, hn, w.gate, dhn);
    lin_back(5, dup, hn, w.up, dhn, true);
    Tensor dh = std::move(dout);
    TIMED("rms_norm bwd", bp::rms_norm_backward(dhn, h, w.post_norm, rstd2, dh, nullptr, true));
    Tensor dattn = Tensor::empty({T, c.q_dim()});
    lin_back(3, dh, attn, w.o, dattn);
    Tensor dq = Tensor::empty({T, c.q_dim()}), dk = Tensor::empty({T, c.kv_dim()}), dv = Tensor::empty({T, c.kv_dim()});
    bp::AttentionShape shape{Hq, Hkv, static_cast<int>(c.head_dim)};
    TIMED("attention bwd", bp::attention_backward(dattn, q, k, v, attn, lse, b.cu_seqlens, shape, dq, dk, dv));
    TIMED("rope bwd", bp::rope_backward(dq, dk, b.positions, Hq, Hkv, c.rope));
    Tensor dxn = Tensor::empty({T, D});
    lin_back(0, dq, xn, w.q, dxn);
    lin_back(1, dk, xn, w.k, dxn, true);
    lin_back(2, dv, xn, w.v, dxn, true);
    TIMED("rms_norm bwd", bp::rms_norm_backward(dxn, x, w.input_norm, rstd1, dh, nullptr, true));
    return dh;
  }
};

void profile(const Shape& shape, bool ckpt, int reps) {
  const int64_t T = env_int("BP_BENCH_SEQ", 512);
  const bp::ModelConfig cfg = make_config(shape);
  Trainer tr(cfg, ckpt, T);
  const double L = static_cast<double>(cfg.num_layers);
  tr.step(1);  // warm-up
  // Measured full steps.
  const auto t0 = Clock::now();
  const Usage u0 = usage_now();
  for (int i = 0; i < reps; ++i) tr.step(2 + static_cast<uint64_t>(i));
  const Usage u1 = usage_now();
  const double step_s = std::chrono::duration<double>(Clock::now() - t0).count() / reps;

  std::map<std::string, double> layer_fwd, layer_bwd, once;
  const auto& w = tr.model.weights();
  const bp::Batch& b = tr.batch;
  Tensor x = bp::embedding_forward(b.tokens, w.embed);
  for (int i = 0; i < reps; ++i) {
    LayerRun run(cfg, w.layers[0], tr.adapter.layers[0], b);
    g_times = &layer_fwd;
    Tensor out = run.forward(x);
    g_times = &layer_bwd;
    run.backward(std::move(out));
  }
  {
    g_times = &once;
    for (int i = 0; i < reps; ++i) {
      Tensor xe = TIMED("embedding fwd", bp::embedding_forward(b.tokens, w.embed));
      Tensor rstd, dxf = Tensor::empty({T, cfg.hidden_size});
      Tensor xf = TIMED("rms_norm fwd", bp::rms_norm_forward(xe, w.final_norm, cfg.rms_norm_eps, &rstd));
      TIMED("lm head + cross-entropy fwd+bwd",
            bp::linear_cross_entropy_forward_backward(xf, w.output_weight(), b.labels, tr.grad_scale, dxf, nullptr));
      TIMED("zero_grads", tr.model.zero_grads());
      TIMED("adamw", tr.adam.step(tr.params, tr.opt));
    }
  }
  std::map<std::string, double> per_step;
  const double fwd_times = ckpt ? 2.0 : 1.0;
  for (auto& [k, v] : layer_fwd) per_step[k] += v / reps * L * fwd_times;
  for (auto& [k, v] : layer_bwd) per_step[k] += v / reps * L;
  for (auto& [k, v] : once) per_step[k] += v / reps;
  double sum = 0;
  for (auto& [k, v] : per_step) sum += v;
  const double gemm = sgemm_rate(T, cfg.hidden_size, cfg.intermediate_size, 1.0);
  const StepFlops f = step_flops(cfg, T);
  std::printf("\n== profile %s, %lld layers, T=%lld, %s, %d threads ==\n", shape.name,
              static_cast<long long>(cfg.num_layers), static_cast<long long>(T),
              ckpt ? "checkpointing (forward counted twice)" : "no checkpointing", bp::num_threads());
  std::printf(
      "measured step %.3f s = %.0f tok/s; model %.1f GFLOP/step = %.1f GFLOP/s; sgemm %lldx%lldx%lld %.1f "
      "GFLOP/s; MFU %.1f%%\n",
      step_s, static_cast<double>(T) / step_s, f.total() / 1e9, f.total() / 1e9 / step_s, static_cast<long long>(T),
      static_cast<long long>(cfg.hidden_size), static_cast<long long>(cfg.intermediate_size), gemm,
      100.0 * f.total() / 1e9 / step_s / gemm);
  std::printf("  process CPU %.3f s/step (%.2f cores busy or spinning), %.0f minor page faults/step\n",
              (u1.cpu_s - u0.cpu_s) / reps, (u1.cpu_s - u0.cpu_s) / reps / step_s,
              (u1.minor_faults - u0.minor_faults) / reps);
  std::printf("  frozen fwd %.1f + frozen bwd(dx) %.1f + LoRA %.1f + attention %.1f GFLOP\n", f.frozen_fwd / 1e9,
              f.frozen_bwd / 1e9, f.lora / 1e9, f.attention / 1e9);
  std::printf("%-34s %10s %8s\n", "op (per step)", "seconds", "% step");
  for (auto& [k, v] : per_step) std::printf("%-34s %10.3f %7.1f%%\n", k.c_str(), v, 100.0 * v / step_s);
  std::printf("%-34s %10.3f %7.1f%%\n", "sum of ops", sum, 100.0 * sum / step_s);
  std::printf("%-34s %10.3f %7.1f%%\n", "unaccounted (step - ops)", step_s - sum, 100.0 * (step_s - sum) / step_s);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  bp::set_num_threads(env_int("BP_BENCH_THREADS", 2));
  bp::bench::select_kernels_from_environment();
  const int steps = env_int("BP_BENCH_STEPS", 3);
  bool do_profile = false, do_qlora = false;
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i) {
    if (std::strcmp(argv[i], "--profile") == 0)
      do_profile = true;
    else if (std::strcmp(argv[i], "--qlora") == 0)
      do_qlora = true;
    else
      args.push_back(argv[i]);
  }
  if (do_qlora) {
    for (const Shape& s : {smol_shape(), qwen_shape()}) qlora_compare(s, steps);
    return 0;
  }
  if (do_profile) {
    // The default training configuration (checkpointing on); BP_BENCH_PROFILE_NO_CKPT=1 adds the other.
    for (bool ckpt : {true, false}) {
      if (!ckpt && env_int("BP_BENCH_PROFILE_NO_CKPT", 0) == 0) continue;
      profile(smol_shape(), ckpt, steps);
      profile(qwen_shape(), ckpt, steps);
    }
    return 0;
  }
  int n = static_cast<int>(args.size());
  for (const Shape& s : {smol_shape(), qwen_shape()})
    for (bool ckpt : {true, false})
      benchmark::RegisterBenchmark((std::string("train/") + s.name + (ckpt ? "/ckpt" : "/no_ckpt")).c_str(), BM_train,
                                   s, ckpt)
          ->Iterations(steps)
          ->UseRealTime()
          ->Unit(benchmark::kSecond);
  for (auto [M, K, N] : {std::array<int64_t, 3>{512, 576, 1536}, {512, 896, 4864}})
    benchmark::RegisterBenchmark("sgemm_xWt", BM_sgemm)->Args({M, K, N})->UseRealTime()->MinTime(0.5);
  benchmark::Initialize(&n, args.data());
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
