// linear forward/backward throughput next to raw sgemm on the same shapes, in the same run
// (CONVENTIONS.md "Performance method": the machine is noisy, so only ratios hold).
//
// Shapes: T tokens × in × out = 512×576×1536 (an MLP projection of a 576-wide model) and
// 512×576×49152 (a vocabulary-sized projection). LoRA rank 16, dropout 0.05 (training);
// BP_BENCH_LORA_DROPOUT=<percent> sets another (0: the default of lora.dropout, no mask).
// Counters are GFLOP/s, counting 2·M·N·K per GEMM including the LoRA products.
//
// lora_qkv: q/k/v's forward and backward with LoRA, each projection alone against a LoRA input
// group (one GEMM of x per product for the three), at SmolLM-135M's and Qwen2.5-0.5B's shapes;
// arg 5: dropout in percent (0, or 10: each member's own mask, the group's one dropout-kernel call
// per product against one per projection).
//
// residual_o: o_proj's forward with LoRA (r 16, no dropout) and the residual connection after it,
// arg 2 = 1 added by the GEMM (linear_forward's residual: the base GEMM's beta matrix, as the model
// does), 0 by an add_inplace after it (the model until the sixteenth session). Args 0-1: T, D.
//
// rope_qk: RoPE of q and k (arg 2 = 1: one call, ops/rope.h's two-tensor form, each token's angles
// computed once; 0: one call each), args 0, 1, 3: T, q heads, k heads, head_dim 64.
//
// held_xWt / held_dx: the same products with W held quantized (backend/cpu/quant_gemm.h: tiles
// dequantized inside the GEMM), arg 0 the held type (0 f32, 1 q8_0, 2 q5_0, 3 q4_K), at the
// projection shapes of SmolLM-135M and Qwen2.5-0.5B (q4_K only where rows are whole 256-blocks);
// compare each with the f32 row of the same shape, same run.
//
// held_bf16_xWt / held_bf16_dx: the same products against W held in bf16 through the CPU's GEMM
// engines (backend/cpu/gemm_engine.h, cpu::held_linear_forward / held_linear_backward), arg 0 the
// path: 0 f32-openblas (--cpu-gemm openblas: x f32, W widened), 1 bf16-openblas (x rounded to bf16
// and widened, f32 sgemm), 2 bf16-onednn (oneDNN's bf16 matmul; skipped without oneDNN), at the
// shapes of held_xWt; the f32 sgemm row of held_xWt is the baseline.
//
// Threads: BP_BENCH_THREADS=n (default: all cores) sets OpenMP and OpenBLAS threads. With one
// thread the rates use CPU time, which stays stable on a loaded shared machine; with more they
// use wall time (CPU time of the main thread would miss the BLAS worker threads).
//
// Run: BP_BENCH_THREADS=1 ./build/bench/bench_linear --benchmark_min_time=0.2
//      ./build/bench/bench_linear --benchmark_min_time=0.2 --benchmark_repetitions=3
#include <benchmark/benchmark.h>

#include <array>
#include <cstdlib>
#include <vector>

#include "backend/cpu/gemm.h"
#include "backend/cpu/gemm_engine.h"
#include "backend/cpu/linear.h"
#include "backend/cpu/quant_gemm.h"
#include "core/error.h"
#include "core/sysinfo.h"
#include "core/threads.h"
#include "ops/elementwise.h"
#include "ops/linear.h"
#include "ops/rope.h"

namespace {

using bp::Tensor;
constexpr int64_t kRank = 16;

Tensor filled(bp::Shape s, float v) {
  Tensor t = Tensor::empty(s);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = v * static_cast<float>((i * 7919) % 1000 - 500) / 500.0f;
  return t;
}

void set_gflops(benchmark::State& state, double flops) {
  state.counters["GFLOP/s"] = benchmark::Counter(flops / 1e9, benchmark::Counter::kIsIterationInvariantRate);
}

struct Problem {
  int64_t T, in, out;
  Tensor x, W, A, B, dy;
  bp::LoraWeights lora;
  explicit Problem(const benchmark::State& s) : T(s.range(0)), in(s.range(1)), out(s.range(2)) {
    x = filled({T, in}, 1.0f);
    W = filled({out, in}, 0.05f);
    A = filled({kRank, in}, 0.05f);
    B = filled({out, kRank}, 0.05f);
    dy = filled({T, out}, 0.01f);
    const char* pct = std::getenv("BP_BENCH_LORA_DROPOUT");
    lora = {&A, &B, 2.0f, pct ? static_cast<float>(std::atof(pct) / 100.0) : 0.05f, 1234, true};
  }
  double base_flops() const { return 2.0 * T * in * out; }
  double lora_fwd_flops() const { return 2.0 * T * kRank * (in + out); }
};

// Raw sgemm y = x·Wᵀ: the forward's floor.
void BM_sgemm_xWt(benchmark::State& state) {
  Problem p(state);
  Tensor y = Tensor::empty({p.T, p.out});
  for (auto _ : state) {
    bp::cpu::sgemm(false, true, p.T, p.out, p.in, 1.0f, p.x.data<float>(), p.in, p.W.data<float>(), p.in, 0.0f,
                   y.data<float>(), p.out);
    benchmark::DoNotOptimize(y.data<float>());
  }
  set_gflops(state, p.base_flops());
}

// Raw sgemm dx = dy·W and dW += dyᵀ·x: the backward's floor.
void BM_sgemm_dx(benchmark::State& state) {
  Problem p(state);
  Tensor dx = Tensor::empty({p.T, p.in});
  for (auto _ : state) {
    bp::cpu::sgemm(false, false, p.T, p.in, p.out, 1.0f, p.dy.data<float>(), p.out, p.W.data<float>(), p.in, 0.0f,
                   dx.data<float>(), p.in);
    benchmark::DoNotOptimize(dx.data<float>());
  }
  set_gflops(state, p.base_flops());
}

void BM_sgemm_dW(benchmark::State& state) {
  Problem p(state);
  Tensor dW = Tensor::zeros({p.out, p.in});
  for (auto _ : state) {
    bp::cpu::sgemm(true, false, p.out, p.in, p.T, 1.0f, p.dy.data<float>(), p.out, p.x.data<float>(), p.in, 1.0f,
                   dW.data<float>(), p.in);
    benchmark::DoNotOptimize(dW.data<float>());
  }
  set_gflops(state, p.base_flops());
}

void BM_linear_forward_lora(benchmark::State& state) {
  Problem p(state);
  for (auto _ : state) {
    bp::LinearSaved saved;
    Tensor y = bp::linear_forward(p.x, p.W, nullptr, &p.lora, &saved);
    benchmark::DoNotOptimize(y.raw());
  }
  set_gflops(state, p.base_flops() + p.lora_fwd_flops());
}

// LoRA training backward: dx (base + LoRA path, through the dropout mask if any), dA, dB; W frozen.
void BM_linear_backward_lora(benchmark::State& state) {
  Problem p(state);
  bp::LinearSaved saved;
  bp::linear_forward(p.x, p.W, nullptr, &p.lora, &saved);
  Tensor dx = Tensor::empty({p.T, p.in}), dA = Tensor::zeros({kRank, p.in}), dB = Tensor::zeros({p.out, kRank});
  for (auto _ : state) {
    bp::linear_backward(p.dy, p.x, p.W, &p.lora, &saved, {&dx, nullptr, nullptr, &dA, &dB});
    benchmark::DoNotOptimize(dx.raw());
  }
  // dx base + dB + dxa + dA + dxd
  set_gflops(state, p.base_flops() + 2.0 * p.lora_fwd_flops());
}

// q/k/v of one layer with LoRA (r 16, f32 W), forward and backward through the op API: arg 4 = 1
// as a LoRA input group (ops/linear.h lora_group_forward / lora_group_backward: x's products one
// GEMM each for the three, or with dropout one call of the dropout kernels), 0 each projection
// alone. Args 0-3: T, in (= D), q's out, k's and v's out; 5: dropout in percent. Compare the two
// rows of a shape and dropout from the same run.
void BM_lora_qkv(benchmark::State& state) {
  const int64_t T = state.range(0), D = state.range(1), qd = state.range(2), kvd = state.range(3);
  const bool grouped = state.range(4) != 0;
  const float p = static_cast<float>(state.range(5)) / 100.0f;
  bp::LoraGroupDropout dropout{p, {}};
  const int64_t outs[3] = {qd, kvd, kvd};
  Tensor x = filled({T, D}, 1.0f), A_all = filled({3 * kRank, D}, 0.05f), dA_all = Tensor::zeros({3 * kRank, D});
  Tensor dx = Tensor::empty({T, D});
  std::array<Tensor, 3> W, A, B, dy, dA, dB;
  std::array<bp::LoraWeights, 3> lora;
  for (int i = 0; i < 3; ++i) {
    W[i] = filled({outs[i], D}, 0.05f);
    A[i] = A_all.rows(i * kRank, (i + 1) * kRank);
    dA[i] = dA_all.rows(i * kRank, (i + 1) * kRank);
    B[i] = filled({outs[i], kRank}, 0.05f);
    dy[i] = filled({T, outs[i]}, 0.01f);
    dB[i] = Tensor::zeros({outs[i], kRank});
    lora[i] = {&A[i], &B[i], 2.0f, p, static_cast<uint64_t>(100 + i), true};
    dropout.members.push_back({kRank, static_cast<uint64_t>(100 + i)});
  }
  double flops = 0;
  for (int64_t out : outs) flops += 2.0 * (2.0 * T * D * out) + 3.0 * (2.0 * T * kRank * (D + out));
  for (auto _ : state) {
    std::array<bp::LinearSaved, 3> saved;
    Tensor xa_all = grouped ? bp::lora_group_forward(x, A_all, &dropout) : Tensor();
    for (int i = 0; i < 3; ++i) {
      bp::LoraWeights l = lora[i];
      if (grouped) l.group_xa = &xa_all, l.group_col = i * kRank;
      Tensor y = bp::linear_forward(x, W[i], nullptr, &l, &saved[i]);
      benchmark::DoNotOptimize(y.raw());
    }
    Tensor dxa_all = grouped ? Tensor::empty({T, 3 * kRank}) : Tensor();
    for (int i = 0; i < 3; ++i) {
      bp::LoraWeights l = lora[i];
      if (grouped) l.group_dxa = &dxa_all, l.group_col = i * kRank;
      bp::linear_backward(dy[i], x, W[i], &l, &saved[i],
                          {&dx, nullptr, nullptr, grouped ? nullptr : &dA[i], &dB[i], i > 0});
    }
    if (grouped) bp::lora_group_backward(x, A_all, dxa_all, &dA_all, &dx, &dropout);
    benchmark::DoNotOptimize(dx.raw());
  }
  set_gflops(state, flops);
}

void BM_residual_o(benchmark::State& state) {
  const int64_t T = state.range(0), D = state.range(1);
  const bool in_gemm = state.range(2) != 0;
  const Tensor x = filled({T, D}, 1.0f), res = filled({T, D}, 0.5f), W = filled({D, D}, 0.05f);
  const Tensor A = filled({kRank, D}, 0.05f), B = filled({D, kRank}, 0.05f);
  const bp::LoraWeights lora{&A, &B, 2.0f, 0.0f, 0, true};
  for (auto _ : state) {
    Tensor y = in_gemm ? bp::linear_forward(x, W, nullptr, &lora, nullptr, nullptr, &res)
                       : bp::linear_forward(x, W, nullptr, &lora, nullptr);
    if (!in_gemm) bp::add_inplace(y, res);
    benchmark::DoNotOptimize(y.raw());
  }
  set_gflops(state, 2.0 * T * D * D + 2.0 * (2.0 * T * kRank * D));
}

void BM_rope_qk(benchmark::State& state) {
  const int64_t T = state.range(0), Hq = state.range(1), Hk = state.range(3), d = 64;
  const bool one_call = state.range(2) != 0;
  Tensor q = filled({T, Hq * d}, 0.5f), k = filled({T, Hk * d}, 0.25f);
  std::vector<int32_t> pos(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) pos[static_cast<size_t>(t)] = static_cast<int32_t>(t % 256);  // packed
  const Tensor positions = Tensor::from_vector(pos, {T});
  bp::RopeConfig cfg;
  cfg.head_dim = static_cast<int>(d);
  for (auto _ : state) {
    if (one_call) {
      bp::rope_forward(q, k, positions, static_cast<int>(Hq), static_cast<int>(Hk), cfg);
    } else {
      bp::rope_forward(q, positions, static_cast<int>(Hq), cfg);
      bp::rope_forward(k, positions, static_cast<int>(Hk), cfg);
    }
    benchmark::DoNotOptimize(q.raw());
  }
  state.counters["tokens/s"] =
      benchmark::Counter(static_cast<double>(T), benchmark::Counter::kIsIterationInvariantRate);
}

void BM_linear_forward_full(benchmark::State& state) {
  Problem p(state);
  for (auto _ : state) {
    Tensor y = bp::linear_forward(p.x, p.W, nullptr, nullptr, nullptr);
    benchmark::DoNotOptimize(y.raw());
  }
  set_gflops(state, p.base_flops());
}

// Full fine-tuning backward: dx and dW.
void BM_linear_backward_full(benchmark::State& state) {
  Problem p(state);
  Tensor dx = Tensor::empty({p.T, p.in}), dW = Tensor::zeros({p.out, p.in});
  for (auto _ : state) {
    bp::linear_backward(p.dy, p.x, p.W, nullptr, nullptr, {&dx, &dW, nullptr, nullptr, nullptr});
    benchmark::DoNotOptimize(dx.raw());
  }
  set_gflops(state, 2.0 * p.base_flops());
}

// ---- held (quantized) W ----
bp::DType held_type(int64_t code) {
  switch (code) {
    case 1: return bp::DType::Q8_0;
    case 2: return bp::DType::Q5_0;
    case 3: return bp::DType::Q4_K;
    default: return bp::DType::F32;
  }
}

struct HeldProblem {
  int64_t T, in, out;
  Tensor x, W, dy;
  bp::cpu::HeldMatrix held;
  explicit HeldProblem(const benchmark::State& s) : T(s.range(1)), in(s.range(2)), out(s.range(3)) {
    x = filled({T, in}, 1.0f);
    W = filled({out, in}, 0.05f).to(held_type(s.range(0)));
    dy = filled({T, out}, 0.01f);
    held = {W.raw(), W.dtype(), out, in};
  }
};

void BM_held_xWt(benchmark::State& state) {
  HeldProblem p(state);
  Tensor y = Tensor::empty({p.T, p.out});
  for (auto _ : state) {
    if (p.held.type == bp::DType::F32)
      bp::cpu::sgemm(false, true, p.T, p.out, p.in, 1.0f, p.x.data<float>(), p.in, p.W.data<float>(), p.in, 0.0f,
                     y.data<float>(), p.out);
    else
      bp::cpu::held_gemm_xwt(p.x.data<float>(), p.held, 0.0f, y.data<float>(), p.T);
    benchmark::DoNotOptimize(y.raw());
  }
  set_gflops(state, 2.0 * p.T * p.in * p.out);
  state.SetLabel(bp::dtype_name(p.held.type));
}

void BM_held_dx(benchmark::State& state) {
  HeldProblem p(state);
  Tensor dx = Tensor::empty({p.T, p.in});
  for (auto _ : state) {
    if (p.held.type == bp::DType::F32)
      bp::cpu::sgemm(false, false, p.T, p.in, p.out, 1.0f, p.dy.data<float>(), p.out, p.W.data<float>(), p.in, 0.0f,
                     dx.data<float>(), p.in);
    else
      bp::cpu::held_gemm_xw(p.dy.data<float>(), p.held, 0.0f, dx.data<float>(), p.T);
    benchmark::DoNotOptimize(dx.raw());
  }
  set_gflops(state, 2.0 * p.T * p.in * p.out);
  state.SetLabel(bp::dtype_name(p.held.type));
}

// Forces a GEMM path for a benchmark (false: not available in this build or on this CPU).
bool force_path(int64_t code) {
  try {
    if (code == 0) bp::cpu::select_cpu_gemm("openblas");
    if (code == 1) {
      bp::CpuIsa isa = bp::cpu_isa();
      isa.avx512_bf16 = isa.amx_bf16 = false;  // auto without bf16 dot products
      bp::cpu::select_cpu_gemm("auto", isa, bp::cpu::onednn_built());
    }
    if (code == 2) bp::cpu::select_cpu_gemm("onednn");
    return true;
  } catch (const bp::Error&) {
    return false;
  }
}

struct HeldBf16Problem {
  int64_t T, in, out;
  Tensor x, W, dy;
  bp::cpu::HeldMatrix held;
  explicit HeldBf16Problem(const benchmark::State& s) : T(s.range(1)), in(s.range(2)), out(s.range(3)) {
    x = filled({T, in}, 1.0f);
    W = filled({out, in}, 0.05f).to(bp::DType::BF16);
    dy = filled({T, out}, 0.01f);
    held = {W.raw(), W.dtype(), out, in};
  }
};

void BM_held_bf16_xWt(benchmark::State& state) {
  if (!force_path(state.range(0))) return state.SkipWithError("path not available here");
  HeldBf16Problem p(state);
  Tensor y = Tensor::empty({p.T, p.out});
  for (auto _ : state) {
    bp::cpu::held_linear_forward(p.x.data<float>(), nullptr, p.held, 0.0f, nullptr, y.data<float>(), p.T);
    benchmark::DoNotOptimize(y.raw());
  }
  set_gflops(state, 2.0 * p.T * p.in * p.out);
  state.SetLabel(bp::cpu::held_bf16_path_name(bp::cpu::cpu_gemm_choice().held_bf16));
  bp::cpu::select_cpu_gemm("auto");
}

void BM_held_bf16_dx(benchmark::State& state) {
  if (!force_path(state.range(0))) return state.SkipWithError("path not available here");
  HeldBf16Problem p(state);
  Tensor dx = Tensor::empty({p.T, p.in});
  for (auto _ : state) {
    bp::cpu::held_linear_backward(p.dy.data<float>(), nullptr, nullptr, nullptr, p.held, 0.0f, dx.data<float>(),
                                  nullptr, p.T);
    benchmark::DoNotOptimize(dx.raw());
  }
  set_gflops(state, 2.0 * p.T * p.in * p.out);
  state.SetLabel(bp::cpu::held_bf16_path_name(bp::cpu::cpu_gemm_choice().held_bf16));
  bp::cpu::select_cpu_gemm("auto");
}

int bench_threads() {
  const char* env = std::getenv("BP_BENCH_THREADS");
  return env ? std::atoi(env) : 0;  // 0: all cores
}

void shapes(benchmark::internal::Benchmark* b) {
  b->Args({512, 576, 1536})->Args({512, 576, 49152})->Unit(benchmark::kMillisecond);
  if (bench_threads() != 1) b->UseRealTime();
}

void held_shapes(benchmark::internal::Benchmark* b) {
  // {T, in, out}: SmolLM q/o, gate/up, down; Qwen q/o, gate/up, down.
  for (auto [T, in, out] : {std::array<int64_t, 3>{512, 576, 576},
                            {512, 576, 1536},
                            {512, 1536, 576},
                            {512, 896, 896},
                            {512, 896, 4864},
                            {512, 4864, 896}})
    for (int64_t type : {0, 1, 2, 3})
      if (type != 3 || in % 256 == 0) b->Args({type, T, in, out});
  b->Unit(benchmark::kMillisecond);
  if (bench_threads() != 1) b->UseRealTime();
}

void held_bf16_shapes(benchmark::internal::Benchmark* b) {
  for (auto [T, in, out] : {std::array<int64_t, 3>{512, 576, 576},
                            {512, 576, 1536},
                            {512, 1536, 576},
                            {512, 896, 896},
                            {512, 896, 4864},
                            {512, 4864, 896}})
    for (int64_t path : {0, 1, 2}) b->Args({path, T, in, out});
  b->Unit(benchmark::kMillisecond);
  if (bench_threads() != 1) b->UseRealTime();
}

void qkv_shapes(benchmark::internal::Benchmark* b) {
  // {T, D, q out, k/v out}: SmolLM-135M, Qwen2.5-0.5B; each alone (0) and grouped (1); no dropout
  // and 10%.
  for (int64_t dropout : {0, 10})
    for (auto [T, D, qd, kvd] : {std::array<int64_t, 4>{512, 576, 576, 192}, {512, 896, 896, 128}})
      for (int64_t grouped : {0, 1}) b->Args({T, D, qd, kvd, grouped, dropout});
  b->Unit(benchmark::kMillisecond);
  if (bench_threads() != 1) b->UseRealTime();
}

void residual_shapes(benchmark::internal::Benchmark* b) {
  // {T, D}: SmolLM-135M, Qwen2.5-0.5B; added after (0) and by the GEMM (1).
  for (auto [T, D] : {std::array<int64_t, 2>{512, 576}, {512, 896}})
    for (int64_t in_gemm : {0, 1}) b->Args({T, D, in_gemm});
  b->Unit(benchmark::kMillisecond);
  if (bench_threads() != 1) b->UseRealTime();
}

void rope_shapes(benchmark::internal::Benchmark* b) {
  // {T, q heads, one call, k heads}: SmolLM-135M (9 over 3), Qwen2.5-0.5B (14 over 2).
  for (auto [Hq, Hk] : {std::array<int64_t, 2>{9, 3}, {14, 2}})
    for (int64_t one_call : {0, 1}) b->Args({2048, Hq, one_call, Hk});
  b->Unit(benchmark::kMillisecond);
  if (bench_threads() != 1) b->UseRealTime();
}

BENCHMARK(BM_residual_o)->Apply(residual_shapes);
BENCHMARK(BM_rope_qk)->Apply(rope_shapes);
BENCHMARK(BM_lora_qkv)->Apply(qkv_shapes);
BENCHMARK(BM_held_xWt)->Apply(held_shapes);
BENCHMARK(BM_held_dx)->Apply(held_shapes);
BENCHMARK(BM_held_bf16_xWt)->Apply(held_bf16_shapes);
BENCHMARK(BM_held_bf16_dx)->Apply(held_bf16_shapes);
BENCHMARK(BM_sgemm_xWt)->Apply(shapes);
BENCHMARK(BM_linear_forward_full)->Apply(shapes);
BENCHMARK(BM_linear_forward_lora)->Apply(shapes);
BENCHMARK(BM_sgemm_dx)->Apply(shapes);
BENCHMARK(BM_sgemm_dW)->Apply(shapes);
BENCHMARK(BM_linear_backward_lora)->Apply(shapes);
BENCHMARK(BM_linear_backward_full)->Apply(shapes);

}  // namespace

int main(int argc, char** argv) {
  bp::set_num_threads(bench_threads());
  benchmark::AddCustomContext("threads", std::to_string(bp::num_threads()));
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
