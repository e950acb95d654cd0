// Op front-ends on CUDA tensors against the CPU backend on random inputs at odd sizes: every entry
// of the CUDA dispatch table. Run on the simulated device (tests/cuda/
// cuda_dispatch_test.cpp) and, where a GPU exists, on the real one through the real table
// (tests/cuda_device/dispatch_device_test.cpp). `tol` is the f32 tolerance of the device's results;
// GEMM outputs over hundreds of products get widen(tol).
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <optional>

#include "backend/cuda/device_workspace.h"
#include "ops/attention.h"
#include "ops/cross_entropy.h"
#include "ops/elementwise.h"
#include "ops/embedding.h"
#include "ops/linear.h"
#include "ops/moe.h"
#include "ops/optim.h"
#include "ops/rms_norm.h"
#include "ops/rope.h"
#include "ops/swiglu.h"
#include "support/test_util.h"

namespace bp::test::parity {

constexpr Device kGpu{DeviceType::CUDA, 0};

inline Tensor gpu(const Tensor& t) {
  return t.to(kGpu);
}

// Held weights split into panels of at most `values` values for the guard's life (the card's
// default, cuda_workspace::kDefaultHeldPanelValues, holds the small weights of a test whole), so
// the panel loops are exercised with weights a test can afford.
class ScopedHeldPanelValues {
 public:
  explicit ScopedHeldPanelValues(int64_t values) : previous_(cuda_workspace::exchange_held_panel_values(values)) {}
  ~ScopedHeldPanelValues() { cuda_workspace::exchange_held_panel_values(previous_); }
  ScopedHeldPanelValues(const ScopedHeldPanelValues&) = delete;
  ScopedHeldPanelValues& operator=(const ScopedHeldPanelValues&) = delete;

 private:
  int64_t previous_;
};
// The panel budget the tests below were written against: the CPU's tile (2^17 values).
inline constexpr int64_t kSmallPanelValues = int64_t{1} << 17;

inline void expect_same(const Tensor& got_gpu, const Tensor& ref_cpu, const std::string& what, Tolerance tol) {
  EXPECT_EQ(got_gpu.device(), kGpu) << what;
  EXPECT_TRUE(all_close(got_gpu.to_vector(), ref_cpu.to_vector(), tol)) << what;
}

// The code of the bp::Error f throws (nullopt when it throws none).
inline std::optional<ErrorCode> code_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.code();
  }
  return std::nullopt;
}

inline Tolerance widen(Tolerance tol) {
  return Tolerance{tol.atol * 10, tol.rtol * 10};
}

inline void elementwise(Tolerance tol) {
  for (int64_t T : {1, 33}) {
    for (int64_t N : {1, 31, 257}) {
      Tensor y = random_tensor({T, N}, 10 + T * N), x = random_tensor({T, N}, 11), b = random_tensor({N}, 12);
      Tensor yd = gpu(y), xd = gpu(x), bd = gpu(b), db = random_tensor({N}, 13), dbd = gpu(db);
      add_inplace(y, x), add_inplace(yd, xd);
      axpy_inplace(y, -0.7f, x), axpy_inplace(yd, -0.7f, xd);
      scale_inplace(y, 1.3f), scale_inplace(yd, 1.3f);
      add_bias_inplace(y, b), add_bias_inplace(yd, bd);
      bias_grad_accumulate(y, db), bias_grad_accumulate(yd, dbd);
      expect_same(yd, y, "y", tol);
      expect_same(dbd, db, "db", tol);
    }
  }
}

// DoRA (ops/linear.h "DoRA"): forward with a bias and a residual, backward's dx, dA, dB and the
// magnitude's dm, over an f32 and a bf16-held W (the norm's GEMM reads W in its held type; on a
// card the held GEMMs round their activations (x, A, dy·m/n) to bf16: bf16's tolerance there).
// DoRA, without and with LoRA dropout (ops/linear.h "DoRA": xd·Wᵀ through the dropout kernels).
inline void linear_with_dora(Tolerance f32_tol) {
  const int64_t T = 33, in = 31, out = 17, r = 3;
  for (float p : {0.0f, 0.25f})
    for (DType held : {DType::F32, DType::BF16}) {
      const std::string at = std::string(held == DType::F32 ? " (f32 W" : " (bf16 W") + (p > 0 ? ", dropout)" : ")");
      const Tolerance tol = held == DType::F32 ? f32_tol : Tolerance{2e-3, 2e-3};  // widened: 2e-2
      Tensor x = random_tensor({T, in}, 40), W = random_tensor({out, in}, 41).to(held);
      Tensor bias = random_tensor({out}, 42), res = random_tensor({T, out}, 43), dy = random_tensor({T, out}, 44);
      Tensor A = random_tensor({r, in}, 45), B = random_tensor({out, r}, 46), m = random_tensor({out}, 47, 0.5f, 1.5f);
      Tensor nsq = random_tensor({out}, 48, 2.0f, 3.0f);  // any positive ||W_j||²: the formula, not its source
      Tensor xg = gpu(x), Wg = gpu(W), bg = gpu(bias), resg = gpu(res), dyg = gpu(dy), Ag = gpu(A), Bg = gpu(B);
      Tensor mg = gpu(m), nsqg = gpu(nsq);
      LoraWeights lc{&A, &B, 0.5f, p, 77, true}, lg{&Ag, &Bg, 0.5f, p, 77, true};
      lc.magnitude = &m, lc.weight_norm_sq = &nsq, lg.magnitude = &mg, lg.weight_norm_sq = &nsqg;
      LinearSaved sc, sg;
      const Tensor y = linear_forward(x, W, &bias, &lc, &sc, nullptr, &res);
      expect_same(linear_forward(xg, Wg, &bg, &lg, &sg, nullptr, &resg), y, "DoRA y" + at, widen(tol));
      expect_same(sg.dora_c, sc.dora_c, "DoRA m/n" + at, widen(tol));
      Tensor dx = Tensor::empty({T, in}), dA = random_tensor({r, in}, 49), dB = random_tensor({out, r}, 50);
      Tensor dm = random_tensor({out}, 51);
      Tensor dxg = Tensor::empty({T, in}, DType::F32, kGpu), dAg = gpu(dA), dBg = gpu(dB), dmg = gpu(dm);
      LinearGrads gc{&dx, nullptr, nullptr, &dA, &dB}, gg{&dxg, nullptr, nullptr, &dAg, &dBg};
      gc.dm = &dm, gg.dm = &dmg;
      linear_backward(dy, x, W, &lc, &sc, gc);
      linear_backward(dyg, xg, Wg, &lg, &sg, gg);
      expect_same(dxg, dx, "DoRA dx" + at, widen(tol));
      expect_same(dAg, dA, "DoRA dA" + at, widen(tol));
      expect_same(dBg, dB, "DoRA dB" + at, widen(tol));
      expect_same(dmg, dm, "DoRA dm" + at, widen(tol));
    }
}

inline void linear_with_lora_dropout_and_bias(Tolerance tol) {
  const int64_t T = 33, in = 31, out = 17, r = 3;
  Tensor x = random_tensor({T, in}, 20), W = random_tensor({out, in}, 21), bias = random_tensor({out}, 22);
  Tensor A = random_tensor({r, in}, 23), B = random_tensor({out, r}, 24), dy = random_tensor({T, out}, 25);
  x.data<float>()[5] = 0.0f;  // an exact zero hides the dropout mask in xd: the rehash path
  Tensor xg = gpu(x), Wg = gpu(W), bg = gpu(bias), Ag = gpu(A), Bg = gpu(B), dyg = gpu(dy);
  LoraWeights lc{&A, &B, 0.5f, 0.25f, 99, true}, lg{&Ag, &Bg, 0.5f, 0.25f, 99, true};
  LinearSaved sc, sg;
  expect_same(linear_forward(xg, Wg, &bg, &lg, &sg), linear_forward(x, W, &bias, &lc, &sc), "y", tol);
  expect_same(sg.xa, sc.xa, "xa (through the dropout mask)", tol);
  // A residual the projection adds (ops/linear.h): the base GEMM's beta matrix, read, never written.
  const Tensor res = random_tensor({T, out}, 31), resg = gpu(res);
  for (float dropout : {0.25f, 0.0f}) {
    lc.dropout = lg.dropout = dropout;
    LinearSaved rc, rg;
    const Tensor y_res = linear_forward(x, W, &bias, &lc, &rc, nullptr, &res);
    expect_same(linear_forward(xg, Wg, &bg, &lg, &rg, nullptr, &resg), y_res, "y with a residual", tol);
    Tensor y_add = linear_forward(x, W, &bias, &lc, nullptr);
    add_inplace(y_add, res);
    EXPECT_TRUE(all_close(y_res.to_vector(), y_add.to_vector(), tol)) << "y + residual";
    EXPECT_EQ(resg.to_vector(), res.to_vector()) << "the residual was written";
  }
  expect_same(linear_forward(xg, Wg, nullptr, nullptr, nullptr, nullptr, &resg),
              linear_forward(x, W, nullptr, nullptr, nullptr, nullptr, &res), "y with a residual, no LoRA", tol);
  lc.dropout = lg.dropout = 0.25f;
  linear_forward(xg, Wg, &bg, &lg, &sg), linear_forward(x, W, &bias, &lc, &sc);
  Tensor dx = Tensor::empty({T, in}), dW = random_tensor({out, in}, 26), db = random_tensor({out}, 27);
  Tensor dA = random_tensor({r, in}, 28), dB = random_tensor({out, r}, 29);
  Tensor dxg = Tensor::empty({T, in}, DType::F32, kGpu), dWg = gpu(dW), dbg = gpu(db), dAg = gpu(dA), dBg = gpu(dB);
  linear_backward(dy, x, W, &lc, &sc, LinearGrads{&dx, &dW, &db, &dA, &dB});
  linear_backward(dyg, xg, Wg, &lg, &sg, LinearGrads{&dxg, &dWg, &dbg, &dAg, &dBg});
  expect_same(dxg, dx, "dx", tol);
  expect_same(dWg, dW, "dW", tol);
  expect_same(dbg, db, "db", tol);
  expect_same(dAg, dA, "dA", tol);
  expect_same(dBg, dB, "dB", tol);
  // dx accumulated (a second projection of the same input): the base GEMM's beta and the LoRA term.
  for (bool dropout : {true, false}) {
    lc.dropout = lg.dropout = dropout ? 0.25f : 0.0f;
    linear_forward(xg, Wg, &bg, &lg, &sg), linear_forward(x, W, &bias, &lc, &sc);
    LinearGrads acc{&dx}, acc_g{&dxg};
    acc.accumulate_dx = acc_g.accumulate_dx = true;
    linear_backward(dy, x, W, &lc, &sc, acc);
    linear_backward(dyg, xg, Wg, &lg, &sg, acc_g);
    expect_same(dxg, dx, dropout ? "dx accumulated (dropout)" : "dx accumulated", tol);
  }
  Tensor C = random_tensor({out, r}, 30), Cg = gpu(C);
  matmul_accumulate(C, 0.3f, dy.rows(0, out), B);
  matmul_accumulate(Cg, 0.3f, dyg.rows(0, out), Bg);
  expect_same(Cg, C, "matmul_accumulate", tol);
}

// The activation operand as a GEMM with bf16 inputs reads it: rounded to nearest even bf16.
inline Tensor bf16_rounded(const Tensor& t) {
  return t.to(DType::F32).to(DType::BF16).to(DType::F32);
}

// Frozen weights held in `type` (bf16, f16 or a block type) on the device, read by the linear
// forward/backward, the embedding and the LM head against the CPU reading the same held bytes.
// The device's GEMMs against them take bf16 inputs with f32 accumulation (backend/cuda/
// kernel_wrappers.h): the activation operand (x forward, dy for dx) is rounded to bf16, and a
// weight held in another type than bf16 is dequantized to bf16 panels. The exact reference is the
// CPU's f32 product of both rounded operands (f32 sums in another order: widen(tol)); the CPU's
// product with the unrounded activation must differ from the device's by more than that, or the
// test could not tell a bf16 GEMM from an f32 one.
inline void held_weights(DType type, Tolerance tol) {
  SCOPED_TRACE(dtype_name(type));
  // 768 columns (whole q4_K blocks): a 128k-value panel holds 168 rows (170 rounded down to a
  // multiple of 8), so the 257-row weight takes two panels.
  const ScopedHeldPanelValues small_panels(kSmallPanelValues);
  const int64_t T = 9, in = 768, out = 257;
  Tensor x = random_tensor({T, in}, 40), W = random_tensor({out, in}, 41).to(type), dy = random_tensor({T, out}, 42);
  const Tensor W_bf16 = W.to(DType::F32).to(DType::BF16);  // what the device's GEMMs read
  Tensor xg = gpu(x), Wg = gpu(W), dyg = gpu(dy);
  const Tensor y = linear_forward(xg, Wg, nullptr, nullptr, nullptr);
  expect_same(y, linear_forward(bf16_rounded(x), W_bf16, nullptr, nullptr, nullptr), "y", widen(tol));
  EXPECT_FALSE(all_close(y.to_vector(), linear_forward(x, W, nullptr, nullptr, nullptr).to_vector(), widen(tol)))
      << "y: the activation was not rounded to bf16";
  // A residual the projection adds: each panel's GEMM reads its columns of it (out of place).
  const Tensor res = random_tensor({T, out}, 43), resg = gpu(res);
  expect_same(linear_forward(xg, Wg, nullptr, nullptr, nullptr, nullptr, &resg),
              linear_forward(bf16_rounded(x), W_bf16, nullptr, nullptr, nullptr, nullptr, &res), "y with a residual",
              widen(tol));
  EXPECT_EQ(resg.to_vector(), res.to_vector()) << "the residual was written";
  Tensor dx = Tensor::empty({T, in}), dx_f32 = Tensor::empty({T, in}), dxg = Tensor::empty({T, in}, DType::F32, kGpu);
  linear_backward(bf16_rounded(dy), x, W_bf16, nullptr, nullptr, LinearGrads{&dx});
  linear_backward(dy, x, W, nullptr, nullptr, LinearGrads{&dx_f32});
  linear_backward(dyg, xg, Wg, nullptr, nullptr, LinearGrads{&dxg});
  expect_same(dxg, dx, "dx", widen(tol));
  EXPECT_FALSE(all_close(dxg.to_vector(), dx_f32.to_vector(), widen(tol))) << "dx: dy was not rounded to bf16";
  LinearGrads acc{&dx}, acc_g{&dxg};  // accumulated: the first panel's beta is 1
  acc.accumulate_dx = acc_g.accumulate_dx = true;
  linear_backward(bf16_rounded(dy), x, W_bf16, nullptr, nullptr, acc);
  linear_backward(dyg, xg, Wg, nullptr, nullptr, acc_g);
  expect_same(dxg, dx, "dx accumulated", widen(tol));
  Tensor ids = Tensor::from_vector(std::vector<int32_t>{0, 256, 3, 3, 100}, {5});
  expect_same(embedding_forward(gpu(ids), Wg), embedding_forward(ids, W), "embedding of a held table", tol);
  expect_same(lm_head_logits(xg, Wg), lm_head_logits(bf16_rounded(x), W_bf16), "lm_head", widen(tol));
  // The held weight as a frozen (tied) head of the fused linear + cross-entropy: vocabulary 257.
  // A bf16 head runs bf16 GEMMs (the loss is the CPU's over the rounded x; dx carries the bf16
  // rounding of the logits' gradient and of dx itself, each at most 2⁻⁹ of a row of |G|·|W|, which
  // sums to at most 2·grad_scale·max|W| = 1 here: checked at twice their sum); other held heads are
  // dequantized into f32 panels.
  const bool bf16_head = type == DType::BF16;
  std::vector<int32_t> lab(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) lab[static_cast<size_t>(t)] = t == 4 ? kIgnoreLabel : static_cast<int32_t>(t * 29);
  const Tensor labels = Tensor::from_vector(lab, {T});
  Tensor cx = Tensor::empty({T, in}), cxg = Tensor::empty({T, in}, DType::F32, kGpu);
  const auto rc =
      linear_cross_entropy_forward_backward(bf16_head ? bf16_rounded(x) : x, W, labels, 0.5f, cx, nullptr, 4);
  const auto rg = linear_cross_entropy_forward_backward(xg, Wg, gpu(labels), 0.5f, cxg, nullptr, 4);
  EXPECT_EQ(rg.n_counted, rc.n_counted);
  EXPECT_NEAR(rg.loss_sum, rc.loss_sum, 1e-4 * std::abs(rc.loss_sum));
  expect_same(cxg, cx, "cross-entropy dx through a held head",
              bf16_head ? Tolerance{std::ldexp(1.0, -7), 0} : widen(tol));
}

// Every held type load_model can produce for a LoRA base.
inline constexpr DType kHeldTypes[] = {DType::BF16, DType::F16,  DType::Q8_0, DType::Q4_0, DType::Q5_0,
                                       DType::Q5_1, DType::Q4_K, DType::Q5_K, DType::Q6_K};

inline void norm_rope_swiglu_embedding(Tolerance tol) {
  const int64_t T = 33, heads = 3, d = 8, D = heads * d, V = 31;
  Tensor x = random_tensor({T, D}, 50), w = random_tensor({D}, 51, 0.8f, 1.2f), dy = random_tensor({T, D}, 52);
  Tensor xg = gpu(x), wg = gpu(w), dyg = gpu(dy);
  Tensor rstd, rstdg;
  expect_same(rms_norm_forward(xg, wg, 1e-5f, &rstdg), rms_norm_forward(x, w, 1e-5f, &rstd), "rms_norm y", tol);
  Tensor dx = Tensor::empty({T, D}), dw = random_tensor({D}, 53), dxg = Tensor::empty({T, D}, DType::F32, kGpu),
         dwg = gpu(dw);
  rms_norm_backward(dy, x, w, rstd, dx, &dw);
  rms_norm_backward(dyg, xg, wg, rstdg, dxg, &dwg);
  expect_same(dxg, dx, "rms_norm dx", tol);
  expect_same(dwg, dw, "rms_norm dw", tol);
  rms_norm_backward(dy, x, w, rstd, dx, nullptr, /*accumulate_dx=*/true);
  rms_norm_backward(dyg, xg, wg, rstdg, dxg, nullptr, /*accumulate_dx=*/true);
  expect_same(dxg, dx, "rms_norm dx accumulated", tol);

  std::vector<int32_t> pos(T);
  for (int64_t t = 0; t < T; ++t) pos[static_cast<size_t>(t)] = static_cast<int32_t>(t % 13);
  Tensor p = Tensor::from_vector(pos, {T}), pg = gpu(p);
  RopeConfig rc;
  rc.head_dim = static_cast<int>(d);
  rc.theta = 10000.0f;
  rope_forward(x, p, heads, rc), rope_forward(xg, pg, heads, rc);
  expect_same(xg, x, "rope forward", tol);
  rope_backward(dy, p, heads, rc), rope_backward(dyg, pg, heads, rc);
  expect_same(dyg, dy, "rope backward", tol);
  Tensor k = random_tensor({T, D}, 55), kg = gpu(k);  // q and k in one launch
  rope_forward(x, k, p, heads, heads, rc), rope_forward(xg, kg, pg, heads, heads, rc);
  expect_same(xg, x, "rope forward q of q+k", tol);
  expect_same(kg, k, "rope forward k of q+k", tol);
  const Tensor bq = random_tensor({D}, 56), bk = random_tensor({D}, 57), bqg = gpu(bq), bkg = gpu(bk);
  rope_forward(x, k, p, heads, heads, rc, &bq, &bk), rope_forward(xg, kg, pg, heads, heads, rc, &bqg, &bkg);
  expect_same(xg, x, "rope forward q + bias", tol);
  expect_same(kg, k, "rope forward k + bias", tol);
  rope_backward(dy, k, p, heads, heads, rc), rope_backward(dyg, kg, pg, heads, heads, rc);
  expect_same(dyg, dy, "rope backward dq of dq+dk", tol);
  expect_same(kg, k, "rope backward dk of dq+dk", tol);

  Tensor up = random_tensor({T, D}, 54), upg = gpu(up);
  expect_same(swiglu_forward(xg, upg), swiglu_forward(x, up), "swiglu h", tol);
  Tensor dg = Tensor::empty({T, D}), du = Tensor::empty({T, D});
  Tensor dgg = Tensor::empty({T, D}, DType::F32, kGpu), dug = Tensor::empty({T, D}, DType::F32, kGpu);
  swiglu_backward(dy, x, up, dg, du), swiglu_backward(dyg, xg, upg, dgg, dug);
  expect_same(dgg, dg, "swiglu dgate", tol);
  expect_same(dug, du, "swiglu dup", tol);

  Tensor table = random_tensor({V, D}, 55), ids = Tensor::from_vector(std::vector<int32_t>{0, 30, 7, 7, 1}, {5});
  Tensor tg = gpu(table), idsg = gpu(ids);
  expect_same(embedding_forward(idsg, tg), embedding_forward(ids, table), "embedding y", tol);
  Tensor dyt = random_tensor({5, D}, 56), dt = random_tensor({V, D}, 57), dtg = gpu(dt);
  embedding_backward(dyt, ids, dt), embedding_backward(gpu(dyt), idsg, dtg);
  expect_same(dtg, dt, "embedding dtable", tol);
  // Token ids are validated on the host through a copy, never a host read of device memory.
  Tensor bad = gpu(Tensor::from_vector(std::vector<int32_t>{0, 31}, {2}));
  EXPECT_EQ(code_of([&] { embedding_forward(bad, tg); }), ErrorCode::INPUT_VALIDATION_FAILED);
}

inline void cross_entropy_and_optimizer(Tolerance tol) {
  const int64_t T = 33, D = 16, V = 37;
  Tensor x = random_tensor({T, D}, 60), W = random_tensor({V, D}, 61);
  std::vector<int32_t> lab(T);
  for (int64_t t = 0; t < T; ++t) lab[static_cast<size_t>(t)] = t % 5 == 0 ? -100 : static_cast<int32_t>((t * 7) % V);
  Tensor labels = Tensor::from_vector(lab, {T});
  Tensor dx = Tensor::empty({T, D}), dW = random_tensor({V, D}, 62);
  Tensor xg = gpu(x), Wg = gpu(W), lg = gpu(labels), dxg = Tensor::empty({T, D}, DType::F32, kGpu), dWg = gpu(dW);
  const auto rc = linear_cross_entropy_forward_backward(x, W, labels, 0.1f, dx, &dW, 8);
  const auto rg = linear_cross_entropy_forward_backward(xg, Wg, lg, 0.1f, dxg, &dWg, 8);
  EXPECT_EQ(rg.n_counted, rc.n_counted);
  EXPECT_NEAR(rg.loss_sum, rc.loss_sum, 1e-4 * std::abs(rc.loss_sum));
  expect_same(dxg, dx, "cross-entropy dx", tol);
  expect_same(dWg, dW, "cross-entropy dW", tol);

  Tensor p = random_tensor({V, D}, 63), m = random_tensor({V, D}, 64, 0, 0.1f), v = random_tensor({V, D}, 65, 0, 0.1f);
  Tensor pg = gpu(p), mg = gpu(m), vg = gpu(v);
  AdamWConfig cfg;
  cfg.lr = 1e-2f;
  cfg.weight_decay = 0.1f;
  adamw_step(p, dW, m, v, cfg, 3), adamw_step(pg, dWg, mg, vg, cfg, 3);
  expect_same(pg, p, "adamw param", tol);
  expect_same(vg, v, "adamw v", tol);
  EXPECT_NEAR(global_grad_norm({&dxg, &dWg}), global_grad_norm({&dx, &dW}), 1e-6 * global_grad_norm({&dx, &dW}));
  std::vector<Tensor*> gc{&dx, &dW}, gg{&dxg, &dWg};
  clip_grad_norm(gc, 0.01), clip_grad_norm(gg, 0.01);
  expect_same(dWg, dW, "clipped dW", tol);
  EXPECT_TRUE(all_finite(dWg));
  Tensor nan = Tensor::zeros({3, 3});
  nan.data<float>()[4] = std::nanf("");
  EXPECT_FALSE(all_finite(gpu(nan)));
  EXPECT_FALSE(all_finite(gpu(nan.to(DType::BF16))));
  EXPECT_TRUE(all_finite(gpu(Tensor::zeros({3, 3}, DType::BF16))));
}

// Causal GQA attention over packed samples (odd lengths, a one-token sample, head_dim 12 and 40,
// 6 query heads over 2 or 3 KV heads), forward and backward through the op front-end: the
// cu_seqlens tensor lives on the device (validated on the host through a staged copy).
inline void attention(Tolerance tol) {
  struct Case {
    std::vector<int32_t> cu;
    AttentionShape shape;
  };
  for (const Case& c : {Case{{0, 1, 18, 47}, AttentionShape{6, 2, 12}}, Case{{0, 37, 38}, AttentionShape{6, 3, 40}}}) {
    const int64_t T = c.cu.back(), q_cols = int64_t{c.shape.n_heads} * c.shape.head_dim;
    const int64_t kv_cols = int64_t{c.shape.n_kv_heads} * c.shape.head_dim;
    Tensor q = random_tensor({T, q_cols}, 60 + T), k = random_tensor({T, kv_cols}, 61),
           v = random_tensor({T, kv_cols}, 62);
    Tensor dout = random_tensor({T, q_cols}, 63);
    Tensor cu = Tensor::from_vector(c.cu, {static_cast<int64_t>(c.cu.size())});
    Tensor lse_c, lse_g;
    Tensor o = attention_forward(q, k, v, cu, c.shape, &lse_c);
    Tensor og = attention_forward(gpu(q), gpu(k), gpu(v), gpu(cu), c.shape, &lse_g);
    expect_same(og, o, "attention o", tol);
    expect_same(lse_g, lse_c, "attention lse", tol);
    Tensor dq = Tensor::empty(q.shape()), dk = Tensor::empty(k.shape()), dv = Tensor::empty(v.shape());
    Tensor dqg = Tensor::empty(q.shape(), DType::F32, kGpu), dkg = Tensor::empty(k.shape(), DType::F32, kGpu);
    Tensor dvg = Tensor::empty(v.shape(), DType::F32, kGpu);
    attention_backward(dout, q, k, v, o, lse_c, cu, c.shape, dq, dk, dv);
    attention_backward(gpu(dout), gpu(q), gpu(k), gpu(v), og, lse_g, gpu(cu), c.shape, dqg, dkg, dvg);
    expect_same(dqg, dq, "attention dq", widen(tol));
    expect_same(dkg, dk, "attention dk", widen(tol));
    expect_same(dvg, dv, "attention dv", widen(tol));
  }
}

// Mixture-of-Experts (ops/moe.h): routing forward/backward with the auxiliary gradient, the sort
// (offsets, rows, slots and the host's copy of the offsets), gather/scatter and their backwards, and
// the load-balancing statistics, over the front-ends on device tensors against the CPU. The expert
// choices and the sort are integers: exactly the CPU's.
inline void moe(Tolerance tol) {
  auto ints = [](const Tensor& t) {
    const Tensor h = t.to(Device{DeviceType::CPU, 0});
    return std::vector<int32_t>(h.data<int32_t>(), h.data<int32_t>() + h.numel());
  };
  struct Case {
    int64_t T, E, k, D;
    bool renorm;
  };
  for (const Case& c : {Case{1, 1, 1, 3, true}, Case{37, 7, 3, 33, false}, Case{131, 129, 8, 17, true}}) {
    const std::string at = " T=" + std::to_string(c.T) + " E=" + std::to_string(c.E);
    Tensor logits = random_tensor({c.T, c.E}, 70 + c.T, -3.0f, 3.0f), x = random_tensor({c.T, c.D}, 71);
    Tensor dw = random_tensor({c.T, c.k}, 72), aux = random_tensor({c.E}, 73, 0.0f, 0.1f);
    const MoeRouting r = moe_route_forward(logits, c.k, c.renorm);
    const MoeRouting rg = moe_route_forward(gpu(logits), c.k, c.renorm);
    EXPECT_EQ(ints(rg.expert_ids), ints(r.expert_ids)) << "expert ids" << at;
    expect_same(rg.weights, r.weights, "router weights" + at, tol);
    Tensor dl = Tensor::empty({c.T, c.E}), dlg = Tensor::empty({c.T, c.E}, DType::F32, kGpu);
    Tensor auxg = gpu(aux), dwg = gpu(dw);
    moe_route_backward(logits, r.expert_ids, dw, &aux, c.renorm, dl);
    moe_route_backward(gpu(logits), rg.expert_ids, dwg, &auxg, c.renorm, dlg);
    expect_same(dlg, dl, "router dlogits" + at, tol);
    const MoeDispatch d = moe_sort(r.expert_ids, c.E), dg = moe_sort(rg.expert_ids, c.E);
    EXPECT_EQ(dg.host_offsets, d.host_offsets) << at;
    EXPECT_EQ(ints(dg.offsets), d.host_offsets) << at;
    EXPECT_EQ(ints(dg.row_token), ints(d.row_token)) << at;
    EXPECT_EQ(ints(dg.slot_of), ints(d.slot_of)) << at;
    const Tensor xs = moe_gather_forward(x, d), xsg = moe_gather_forward(gpu(x), dg);
    expect_same(xsg, xs, "gathered rows" + at, Tolerance{0, 0});
    Tensor dx = random_tensor({c.T, c.D}, 74), dxg = gpu(dx), ys = random_tensor({c.T * c.k, c.D}, 75);
    moe_gather_backward(ys, d, dx), moe_gather_backward(gpu(ys), dg, dxg);
    expect_same(dxg, dx, "gather dx" + at, tol);
    Tensor out = random_tensor({c.T, c.D}, 76), outg = gpu(out);
    moe_scatter_forward(ys, r.weights, d, out), moe_scatter_forward(gpu(ys), rg.weights, dg, outg);
    expect_same(outg, out, "scatter out" + at, tol);
    Tensor dys = Tensor::empty({c.T * c.k, c.D}), dysg = Tensor::empty({c.T * c.k, c.D}, DType::F32, kGpu);
    Tensor dwt = Tensor::empty({c.T, c.k}), dwtg = Tensor::empty({c.T, c.k}, DType::F32, kGpu);
    moe_scatter_backward(x, ys, r.weights, d, dys, dwt);
    moe_scatter_backward(gpu(x), gpu(ys), rg.weights, dg, dysg, dwtg);
    expect_same(dysg, dys, "scatter dys" + at, tol);
    expect_same(dwtg, dwt, "scatter dweights" + at, widen(tol));
    Tensor counts = Tensor::zeros({c.E}), probs = Tensor::zeros({c.E});
    Tensor countsg = gpu(counts), probsg = gpu(probs);
    moe_aux_accumulate(logits, r.expert_ids, counts, probs);
    moe_aux_accumulate(gpu(logits), rg.expert_ids, countsg, probsg);
    expect_same(countsg, counts, "aux counts" + at, Tolerance{0, 0});
    expect_same(probsg, probs, "aux prob_sum" + at, widen(tol));
  }
  // An expert id out of range on the device: the sort's offsets say so (RUNTIME_INTERNAL).
  Tensor bad = gpu(Tensor::from_vector(std::vector<int32_t>{0, 1, 4, 2}, {2, 2}));
  EXPECT_EQ(code_of([&] { moe_sort(bad, 4); }), ErrorCode::RUNTIME_INTERNAL);
}

}  // namespace bp::test::parity
