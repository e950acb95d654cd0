// linear: forward and backward against a plain double-precision reference at odd sizes, the
// backward against finite differences of that reference, gradient semantics (= vs +=, frozen W),
// LoRA identities (B = 0), deterministic dropout and eval mode, and error messages. A LoRA input
// group (q/k/v, gate/up as one GEMM of x each) against its members alone, and its refusals.
#include "ops/linear.h"

#include <gtest/gtest.h>

#include "backend/cpu/gemm_engine.h"
#include "backend/cpu/linear.h"
#include "op_test_util.h"
#include "support/finite_diff.h"
#include "support/lora_group_check.h"
#include "support/test_util.h"

namespace bp {
namespace {

using test::all_close;
using test::random_tensor;
using test::to_double;

constexpr test::Tolerance kTolGrad{2e-4, 2e-4};  // f32 backward vs f64 finite differences

// Plain reference in double. W, A, B, b as flat row-major vectors; mask[i] = 1/(1-p) or 0
// (empty: no dropout). r = 0: no LoRA.
struct LinearRef {
  int64_t T, in, out, r;
  std::vector<double> x, W, b, A, B, mask;
  double scale = 1.0;

  std::vector<double> forward() const {
    std::vector<double> y(static_cast<size_t>(T * out), 0.0);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t o = 0; o < out; ++o) {
        double s = b.empty() ? 0.0 : b[o];
        for (int64_t i = 0; i < in; ++i) s += x[t * in + i] * W[o * in + i];
        y[t * out + o] = s;
      }
    if (r == 0) return y;
    for (int64_t t = 0; t < T; ++t) {
      std::vector<double> xa(static_cast<size_t>(r), 0.0);
      for (int64_t k = 0; k < r; ++k)
        for (int64_t i = 0; i < in; ++i) {
          const double xd = x[t * in + i] * (mask.empty() ? 1.0 : mask[t * in + i]);
          xa[k] += xd * A[k * in + i];
        }
      for (int64_t o = 0; o < out; ++o)
        for (int64_t k = 0; k < r; ++k) y[t * out + o] += scale * xa[k] * B[o * r + k];
    }
    return y;
  }
};

struct Case {
  int64_t T, in, out, r;
};

// Odd sizes (CONVENTIONS.md): 1, 31, 32, 33, 257 in every role.
const Case kCases[] = {{1, 31, 33, 1}, {31, 32, 1, 2}, {33, 257, 32, 8}, {257, 33, 31, 4}, {32, 1, 257, 1}};

std::vector<double> mask_for(int64_t n, float p, uint64_t seed) {
  std::vector<double> m(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) m[i] = cpu::dropout_keep(seed, static_cast<uint64_t>(i), p) ? 1.0 / (1.0 - p) : 0.0;
  return m;
}

struct LinearCase {
  Tensor x, W, b, A, B;
  LoraWeights lora;
  LinearRef ref;
};

LinearCase make_setup(const Case& c, bool bias, bool lora, float p, uint64_t seed) {
  LinearCase s;
  s.x = random_tensor({c.T, c.in}, seed + 1);
  s.W = random_tensor({c.out, c.in}, seed + 2);
  s.ref = {c.T, c.in, c.out, lora ? c.r : 0, to_double(s.x.to_vector()), to_double(s.W.to_vector()), {}, {}, {}, {}};
  if (bias) {
    s.b = random_tensor({c.out}, seed + 3);
    s.ref.b = to_double(s.b.to_vector());
  }
  if (lora) {
    s.A = random_tensor({c.r, c.in}, seed + 4);
    s.B = random_tensor({c.out, c.r}, seed + 5);
    s.lora.A = &s.A;
    s.lora.B = &s.B;
    s.lora.scale = 0.75f;
    s.lora.dropout = p;
    s.lora.dropout_seed = seed * 7919 + 13;
    s.ref.A = to_double(s.A.to_vector());
    s.ref.B = to_double(s.B.to_vector());
    s.ref.scale = 0.75;
    if (p > 0) s.ref.mask = mask_for(c.T * c.in, p, s.lora.dropout_seed);
  }
  return s;
}

TEST(Linear, ForwardMatchesReferenceAtOddSizes) {
  uint64_t seed = 100;
  for (const Case& c : kCases)
    for (int mode = 0; mode < 4; ++mode) {  // plain, bias, LoRA, bias + LoRA with dropout
      const bool bias = mode & 1, lora = mode >= 2;
      LinearCase s = make_setup(c, bias, lora, mode == 3 ? 0.25f : 0.0f, seed += 10);
      LinearSaved saved;
      Tensor y = linear_forward(s.x, s.W, bias ? &s.b : nullptr, lora ? &s.lora : nullptr, &saved);
      ASSERT_EQ(y.shape(), (Shape{c.T, c.out}));
      const std::vector<double> ref = s.ref.forward();
      EXPECT_TRUE(all_close(to_double(y.to_vector()), ref, {1e-5, 1e-5}))
          << "T=" << c.T << " in=" << c.in << " out=" << c.out << " mode " << mode;
      EXPECT_EQ(saved.xa.defined(), lora);  // xa only: the dropped input is regenerated backward
    }
}

// A residual the projection adds (ops/linear.h: the base GEMM's beta matrix; the model's o_proj
// and down_proj): y = residual + the reference's y in every form (plain, bias, LoRA, bias + LoRA
// with dropout; weights held in bf16 and q8_0; a LoRA group member), the residual unchanged. One
// of the wrong shape is refused.
TEST(Linear, ResidualIsAddedByEveryForm) {
  uint64_t seed = 700;
  for (const Case& c : kCases)
    for (int mode = 0; mode < 4; ++mode) {
      const bool bias = mode & 1, lora = mode >= 2;
      LinearCase s = make_setup(c, bias, lora, mode == 3 ? 0.25f : 0.0f, seed += 10);
      const Tensor res = random_tensor({c.T, c.out}, seed + 5);
      const std::vector<float> res_before = res.to_vector();
      const Tensor y =
          linear_forward(s.x, s.W, bias ? &s.b : nullptr, lora ? &s.lora : nullptr, nullptr, nullptr, &res);
      std::vector<double> ref = s.ref.forward();
      for (size_t i = 0; i < ref.size(); ++i) ref[i] += res_before[i];
      EXPECT_TRUE(all_close(to_double(y.to_vector()), ref, {1e-5, 1e-5}))
          << "T=" << c.T << " in=" << c.in << " out=" << c.out << " mode " << mode;
      EXPECT_EQ(res.to_vector(), res_before) << "the residual was written";
    }

  const int64_t T = 9, in = 64, out = 33, r = 3;
  const Tensor x = random_tensor({T, in}, 1), res = random_tensor({T, out}, 2);
  auto plus_res = [&](Tensor y) {
    const auto rv = res.to_vector();
    for (int64_t i = 0; i < T * out; ++i) y.data<float>()[i] += rv[static_cast<size_t>(i)];
    return y.to_vector();
  };
  for (DType type : {DType::BF16, DType::Q8_0}) {
    const Tensor W = random_tensor({out, in}, 3).to(type);
    EXPECT_TRUE(all_close(linear_forward(x, W, nullptr, nullptr, nullptr, nullptr, &res).to_vector(),
                          plus_res(linear_forward(x, W, nullptr, nullptr, nullptr)), test::kTolF32))
        << dtype_name(type);
  }
  const Tensor W = random_tensor({out, in}, 4), A = random_tensor({r, in}, 5), B = random_tensor({out, r}, 6);
  LoraWeights member{&A, &B, 0.5f, 0.0f, 0, true};
  const Tensor xa_all = lora_group_forward(x, A);
  member.group_xa = &xa_all;
  EXPECT_TRUE(all_close(linear_forward(x, W, nullptr, &member, nullptr, nullptr, &res).to_vector(),
                        plus_res(linear_forward(x, W, nullptr, &member, nullptr)), test::kTolF32))
      << "a LoRA group member";

  const Tensor wide = random_tensor({T, out + 1}, 7);
  test::expect_op_error([&] { linear_forward(x, W, nullptr, nullptr, nullptr, nullptr, &wide); },
                        ErrorCode::RUNTIME_INTERNAL, {"[linear]", "residual", "[9, 34]"});
}

// Analytic backward in double: dx = dy·W + dropout'(s·dy·B·A), dW = dyᵀx, db = Σdy,
// dB = s·dyᵀ·xa, dA = s·(dy·B)ᵀ·xd.
TEST(Linear, BackwardMatchesAnalyticReferenceAtOddSizes) {
  uint64_t seed = 500;
  for (const Case& c : kCases) {
    LinearCase s = make_setup(c, true, true, 0.2f, seed += 10);
    LinearSaved saved;
    linear_forward(s.x, s.W, &s.b, &s.lora, &saved);
    Tensor dy = random_tensor({c.T, c.out}, seed + 9);
    Tensor dx = Tensor::empty({c.T, c.in}), dW = Tensor::zeros({c.out, c.in}), db = Tensor::zeros({c.out});
    Tensor dA = Tensor::zeros({c.r, c.in}), dB = Tensor::zeros({c.out, c.r});
    linear_backward(dy, s.x, s.W, &s.lora, &saved, {&dx, &dW, &db, &dA, &dB});

    const auto& R = s.ref;
    const std::vector<double> g = to_double(dy.to_vector());
    std::vector<double> xd(R.x.size()), xa(static_cast<size_t>(c.T * c.r), 0.0), gB(xa.size(), 0.0);
    for (size_t i = 0; i < xd.size(); ++i) xd[i] = R.x[i] * R.mask[i];
    for (int64_t t = 0; t < c.T; ++t)
      for (int64_t k = 0; k < c.r; ++k) {
        for (int64_t i = 0; i < c.in; ++i) xa[t * c.r + k] += xd[t * c.in + i] * R.A[k * c.in + i];
        for (int64_t o = 0; o < c.out; ++o) gB[t * c.r + k] += R.scale * g[t * c.out + o] * R.B[o * c.r + k];
      }
    std::vector<double> rdx(R.x.size(), 0.0), rdW(R.W.size(), 0.0), rdb(static_cast<size_t>(c.out), 0.0);
    std::vector<double> rdA(R.A.size(), 0.0), rdB(R.B.size(), 0.0);
    for (int64_t t = 0; t < c.T; ++t) {
      for (int64_t i = 0; i < c.in; ++i) {
        double v = 0.0, l = 0.0;
        for (int64_t o = 0; o < c.out; ++o) v += g[t * c.out + o] * R.W[o * c.in + i];
        for (int64_t k = 0; k < c.r; ++k) l += gB[t * c.r + k] * R.A[k * c.in + i];
        rdx[t * c.in + i] = v + l * R.mask[t * c.in + i];
      }
      for (int64_t o = 0; o < c.out; ++o) {
        rdb[o] += g[t * c.out + o];
        for (int64_t i = 0; i < c.in; ++i) rdW[o * c.in + i] += g[t * c.out + o] * R.x[t * c.in + i];
        for (int64_t k = 0; k < c.r; ++k) rdB[o * c.r + k] += R.scale * g[t * c.out + o] * xa[t * c.r + k];
      }
      for (int64_t k = 0; k < c.r; ++k)
        for (int64_t i = 0; i < c.in; ++i) rdA[k * c.in + i] += gB[t * c.r + k] * xd[t * c.in + i];
    }
    const std::string where = "T=" + std::to_string(c.T) + " in=" + std::to_string(c.in);
    EXPECT_TRUE(all_close(to_double(dx.to_vector()), rdx, {1e-5, 1e-5})) << "dx " << where;
    EXPECT_TRUE(all_close(to_double(dW.to_vector()), rdW, {1e-5, 1e-5})) << "dW " << where;
    EXPECT_TRUE(all_close(to_double(db.to_vector()), rdb, {1e-5, 1e-5})) << "db " << where;
    EXPECT_TRUE(all_close(to_double(dA.to_vector()), rdA, {1e-5, 1e-5})) << "dA " << where;
    EXPECT_TRUE(all_close(to_double(dB.to_vector()), rdB, {1e-5, 1e-5})) << "dB " << where;
  }
}

// Every gradient against central differences (f64) of L = Σ dy ⊙ y_ref. The third setting puts
// exact zeros into x, where dropout's backward cannot read the mask off xd and must rehash.
TEST(Linear, BackwardMatchesFiniteDifferences) {
  for (int setting = 0; setting < 3; ++setting) {
    const float p = setting == 0 ? 0.0f : 0.4f;
    Case c{5, 7, 6, 3};
    LinearCase s = make_setup(c, true, true, p, 71 + setting);
    if (setting == 2) {
      float* x = s.x.data<float>();
      for (int64_t i = 0; i < s.x.numel(); i += 2) x[i] = 0.0f;
      s.ref.x = to_double(s.x.to_vector());
    }
    LinearSaved saved;
    linear_forward(s.x, s.W, &s.b, &s.lora, &saved);
    Tensor dy = random_tensor({c.T, c.out}, 99);
    Tensor dx = Tensor::empty({c.T, c.in}), dW = Tensor::zeros({c.out, c.in}), db = Tensor::zeros({c.out});
    Tensor dA = Tensor::zeros({c.r, c.in}), dB = Tensor::zeros({c.out, c.r});
    linear_backward(dy, s.x, s.W, &s.lora, &saved, {&dx, &dW, &db, &dA, &dB});

    LinearRef ref = s.ref;
    const std::vector<double> g = to_double(dy.to_vector());
    auto loss = [&] { return test::dot(g, ref.forward()); };
    SCOPED_TRACE("setting " + std::to_string(setting));
    EXPECT_TRUE(all_close(to_double(dx.to_vector()), test::numeric_gradient(&ref.x, loss), kTolGrad)) << "dx";
    EXPECT_TRUE(all_close(to_double(dW.to_vector()), test::numeric_gradient(&ref.W, loss), kTolGrad)) << "dW";
    EXPECT_TRUE(all_close(to_double(db.to_vector()), test::numeric_gradient(&ref.b, loss), kTolGrad)) << "db";
    EXPECT_TRUE(all_close(to_double(dA.to_vector()), test::numeric_gradient(&ref.A, loss), kTolGrad)) << "dA";
    EXPECT_TRUE(all_close(to_double(dB.to_vector()), test::numeric_gradient(&ref.B, loss), kTolGrad)) << "dB";
  }
}

TEST(Linear, ParameterGradientsAccumulateAndDxOverwrites) {
  Case c{9, 13, 11, 4};
  LinearCase s = make_setup(c, true, true, 0.3f, 7);
  LinearSaved saved;
  linear_forward(s.x, s.W, &s.b, &s.lora, &saved);
  Tensor dy = random_tensor({c.T, c.out}, 8);
  Tensor dx = Tensor::empty({c.T, c.in}), dW = Tensor::zeros({c.out, c.in}), db = Tensor::zeros({c.out});
  Tensor dA = Tensor::zeros({c.r, c.in}), dB = Tensor::zeros({c.out, c.r});
  LinearGrads grads{&dx, &dW, &db, &dA, &dB};
  linear_backward(dy, s.x, s.W, &s.lora, &saved, grads);
  const auto dx1 = dx.to_vector(), dW1 = dW.to_vector(), db1 = db.to_vector(), dA1 = dA.to_vector(),
             dB1 = dB.to_vector();
  dx.fill(123.0f);  // garbage: dx must be overwritten, not accumulated
  linear_backward(dy, s.x, s.W, &s.lora, &saved, grads);
  auto twice = [](std::vector<float> v) {
    for (float& f : v) f *= 2.0f;
    return v;
  };
  EXPECT_TRUE(all_close(dx.to_vector(), dx1, {0, 0}));
  EXPECT_TRUE(all_close(dW.to_vector(), twice(dW1), {1e-6, 1e-6}));
  EXPECT_TRUE(all_close(db.to_vector(), twice(db1), {1e-6, 1e-6}));
  EXPECT_TRUE(all_close(dA.to_vector(), twice(dA1), {1e-6, 1e-6}));
  EXPECT_TRUE(all_close(dB.to_vector(), twice(dB1), {1e-6, 1e-6}));
}

// accumulate_dx: dx += what dx = would write, through every path that writes dx: the f32 base
// GEMM (beta 1), a held base (held_gemm_xw's beta), the LoRA term with and without dropout, and an
// empty batch.
TEST(Linear, DxAccumulatesWhenAsked) {
  for (int setting = 0; setting < 5; ++setting) {
    SCOPED_TRACE("setting " + std::to_string(setting));
    const Case c{setting == 4 ? int64_t{0} : int64_t{17}, 29, 23, 3};
    const bool lora = setting == 1 || setting == 2;
    LinearCase s = make_setup(c, false, lora, setting == 2 ? 0.3f : 0.0f, 91 + setting);
    const Tensor W = setting == 3 ? s.W.to(DType::BF16) : s.W;
    const LoraWeights* lw = lora ? &s.lora : nullptr;
    LinearSaved saved;
    linear_forward(s.x, W, nullptr, lw, &saved);
    const Tensor dy = random_tensor({c.T, c.out}, 95);
    Tensor fresh = Tensor::empty({c.T, c.in});
    linear_backward(dy, s.x, W, lw, &saved, LinearGrads{&fresh});
    const Tensor prior = random_tensor({c.T, c.in}, 96);
    Tensor acc = prior.clone();
    LinearGrads grads{&acc};
    grads.accumulate_dx = true;
    linear_backward(dy, s.x, W, lw, &saved, grads);
    std::vector<float> want = prior.to_vector();
    const std::vector<float> f = fresh.to_vector();
    double moved = 0;
    for (size_t i = 0; i < want.size(); ++i) want[i] += f[i], moved += std::fabs(f[i]);
    EXPECT_TRUE(all_close(acc.to_vector(), want, {1e-5, 1e-6}));
    if (c.T > 0) {
      EXPECT_GT(moved, 1.0) << "the added dx is not trivial";
    }
  }
}

// Full fine-tuning with training.matmul_dtype bf16 (model/transformer.h): W is the bf16 GEMM copy of
// an f32 master. The products read the rounded weight; dW, the master's f32 gradient, is dyᵀ·x
// added to what it held (on the CPU in f32: it does not read W). Other held types (f16) still get none.
TEST(Linear, Bf16GemmCopyIsReadAndTheMasterGetsItsGradient) {
  const int64_t T = 17, in = 29, out = 23;
  const Tensor x = random_tensor({T, in}, 301), W = random_tensor({out, in}, 302), dy = random_tensor({T, out}, 303);
  const Tensor copy = W.to(DType::BF16), rounded = copy.to(DType::F32);
  const auto xv = x.to_vector(), wv = rounded.to_vector(), gv = dy.to_vector(), mv = W.to_vector();
  // The CPU's GEMMs against a bf16 weight round x and dy to bf16 too unless --cpu-gemm openblas
  // (backend/cpu/gemm_engine.h; tests/ops/held_bf16_gemm_test.cpp checks each path): y and dx read
  // the operands the path reads, dW the f32 ones.
  const bool bf16_inputs = cpu::cpu_gemm_choice().held_bf16 != cpu::HeldBf16Path::F32;
  auto operand = [&](const std::vector<float>& v) {
    std::vector<float> r = v;
    if (bf16_inputs)
      for (float& e : r) e = bf16_to_f32(f32_to_bf16(e));
    return r;
  };
  const auto xo = operand(xv), go = operand(gv);
  std::vector<double> y_ref(T * out), dx_ref(T * in), dW_ref(out * in);
  double moved = 0;  // the rounding changes the products: the test tells the copy from the master
  for (int64_t t = 0; t < T; ++t)
    for (int64_t o = 0; o < out; ++o) {
      double a = 0, m = 0;
      for (int64_t i = 0; i < in; ++i) a += xo[t * in + i] * wv[o * in + i], m += xo[t * in + i] * mv[o * in + i];
      y_ref[t * out + o] = a;
      moved = std::max(moved, std::fabs(a - m));
    }
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < in; ++i) {
      double a = 0;
      for (int64_t o = 0; o < out; ++o) a += go[t * out + o] * wv[o * in + i];
      dx_ref[t * in + i] = a;
    }
  const Tensor prior = random_tensor({out, in}, 304);
  const auto pv = prior.to_vector();
  for (int64_t o = 0; o < out; ++o)
    for (int64_t i = 0; i < in; ++i) {
      double a = pv[o * in + i];
      for (int64_t t = 0; t < T; ++t) a += gv[t * out + o] * xv[t * in + i];
      dW_ref[o * in + i] = a;
    }
  EXPECT_GT(moved, 1e-4) << "bf16 rounding must show in the product";
  const Tensor y = linear_forward(x, copy, nullptr, nullptr, nullptr);
  const auto yv = y.to_vector();
  EXPECT_TRUE(all_close(std::vector<double>(yv.begin(), yv.end()), y_ref, {1e-5, 1e-5}));
  Tensor dx = Tensor::empty({T, in}), dW = prior.clone();
  linear_backward(dy, x, copy, nullptr, nullptr, {&dx, &dW});
  const auto dxv = dx.to_vector(), dWv = dW.to_vector();
  EXPECT_TRUE(all_close(std::vector<double>(dxv.begin(), dxv.end()), dx_ref, {1e-5, 1e-5}));
  EXPECT_TRUE(all_close(std::vector<double>(dWv.begin(), dWv.end()), dW_ref, {1e-5, 1e-5}));
  Tensor dW_q = Tensor::zeros({out, in});
  EXPECT_THROW(linear_backward(dy, x, W.to(DType::F16), nullptr, nullptr, {&dx, &dW_q}), Error)
      << "a frozen f16 weight gets no gradient";
}

TEST(Linear, FrozenWeightGetsNoGradientAndOthersAreUnchanged) {
  Case c{6, 10, 8, 2};
  LinearCase s = make_setup(c, false, true, 0.0f, 21);
  LinearSaved saved;
  linear_forward(s.x, s.W, nullptr, &s.lora, &saved);
  Tensor dy = random_tensor({c.T, c.out}, 22);
  Tensor dx_full = Tensor::empty({c.T, c.in}), dW = Tensor::zeros({c.out, c.in});
  Tensor dA_full = Tensor::zeros({c.r, c.in}), dB_full = Tensor::zeros({c.out, c.r});
  linear_backward(dy, s.x, s.W, &s.lora, &saved, {&dx_full, &dW, nullptr, &dA_full, &dB_full});
  // LoRA mode: W frozen, dW null.
  Tensor dx = Tensor::empty({c.T, c.in}), dA = Tensor::zeros({c.r, c.in}), dB = Tensor::zeros({c.out, c.r});
  linear_backward(dy, s.x, s.W, &s.lora, &saved, {&dx, nullptr, nullptr, &dA, &dB});
  EXPECT_TRUE(all_close(dx.to_vector(), dx_full.to_vector(), {0, 0}));
  EXPECT_TRUE(all_close(dA.to_vector(), dA_full.to_vector(), {0, 0}));
  EXPECT_TRUE(all_close(dB.to_vector(), dB_full.to_vector(), {0, 0}));
  // And the dW that was computed is non-trivial (so the null path really skipped work).
  double norm = 0;
  for (float v : dW.to_vector()) norm += std::fabs(v);
  EXPECT_GT(norm, 0.1);
}

TEST(Linear, LoraWithZeroBEqualsBase) {
  Case c{33, 31, 32, 8};
  LinearCase s = make_setup(c, true, true, 0.1f, 31);
  s.B.zero();  // PEFT init
  Tensor base = linear_forward(s.x, s.W, &s.b, nullptr, nullptr);
  Tensor y = linear_forward(s.x, s.W, &s.b, &s.lora, nullptr);
  EXPECT_TRUE(all_close(y.to_vector(), base.to_vector(), {0, 0}));
}

// A = identity (r = in): xa = dropout(x)·Aᵀ is the dropped input itself (one product by 1 per value).
TEST(Linear, DropoutMaskIsDeterministicPerSeedAndScalesKeptValues) {
  Case c{64, 96, 16, 96};
  LinearCase s = make_setup(c, false, true, 0.3f, 41);
  s.A.zero();
  for (int64_t j = 0; j < c.in; ++j) s.A.data<float>()[j * c.in + j] = 1.0f;
  LinearSaved a, b, other;
  Tensor ya = linear_forward(s.x, s.W, nullptr, &s.lora, &a);
  Tensor yb = linear_forward(s.x, s.W, nullptr, &s.lora, &b);
  EXPECT_TRUE(all_close(a.xa.to_vector(), b.xa.to_vector(), {0, 0}));
  EXPECT_TRUE(all_close(ya.to_vector(), yb.to_vector(), {0, 0}));
  s.lora.dropout_seed += 1;
  linear_forward(s.x, s.W, nullptr, &s.lora, &other);

  const auto x = s.x.to_vector(), xa = a.xa.to_vector(), xo = other.xa.to_vector();
  size_t dropped = 0, differ = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    if (xa[i] == 0.0f) {
      ++dropped;
    } else {
      ASSERT_FLOAT_EQ(xa[i], x[i] / 0.7f) << "kept values are scaled by 1/(1-p) at " << i;
    }
    if ((xa[i] == 0.0f) != (xo[i] == 0.0f)) ++differ;
  }
  const double frac = static_cast<double>(dropped) / static_cast<double>(x.size());
  EXPECT_NEAR(frac, 0.3, 0.03);  // 6144 draws: 5 sigma ≈ 0.03
  EXPECT_GT(differ, x.size() / 5) << "another seed must give another mask";
}

TEST(Linear, EvalModeAppliesNoDropout) {
  Case c{17, 19, 23, 3};
  LinearCase s = make_setup(c, true, true, 0.5f, 51);
  s.lora.training = false;
  LinearSaved saved;
  Tensor y = linear_forward(s.x, s.W, &s.b, &s.lora, &saved);
  s.ref.mask.clear();
  EXPECT_TRUE(all_close(to_double(y.to_vector()), s.ref.forward(), {1e-5, 1e-5}));
  // Same output as dropout 0 in training mode, bit for bit.
  s.lora.training = true;
  s.lora.dropout = 0.0f;
  EXPECT_TRUE(all_close(y.to_vector(), linear_forward(s.x, s.W, &s.b, &s.lora, nullptr).to_vector(), {0, 0}));
}

TEST(Linear, ErrorsNameTheShapes) {
  Tensor x = random_tensor({4, 576}, 1), W = random_tensor({8, 512}, 2);
  test::expect_op_error([&] { linear_forward(x, W, nullptr, nullptr, nullptr); }, ErrorCode::RUNTIME_INTERNAL,
                        {"[linear]", "576", "512"});
  Tensor W2 = random_tensor({8, 576}, 3), A = random_tensor({2, 576}, 4), B = random_tensor({8, 2}, 5);
  LoraWeights lora{&A, &B, 1.0f, 1.0f, 0, true};
  test::expect_op_error([&] { linear_forward(x, W2, nullptr, &lora, nullptr); }, ErrorCode::INPUT_VALIDATION_FAILED,
                        {"[linear]", "dropout"});
  Tensor B_bad = random_tensor({8, 3}, 6);
  lora = {&A, &B_bad, 1.0f, 0.0f, 0, true};
  test::expect_op_error([&] { linear_forward(x, W2, nullptr, &lora, nullptr); }, ErrorCode::RUNTIME_INTERNAL,
                        {"lora B", "[8, 3]", "[8, 2]"});
  Tensor xi = Tensor::zeros({4, 576}, DType::BF16);
  test::expect_op_error([&] { linear_forward(xi, W2, nullptr, nullptr, nullptr); }, ErrorCode::RUNTIME_INTERNAL,
                        {"bf16"});
  // LoRA backward without the saved activations.
  lora = {&A, &B, 1.0f, 0.0f, 0, true};
  Tensor dy = random_tensor({4, 8}, 7), dx = Tensor::empty({4, 576});
  test::expect_op_error(
      [&] {
        linear_backward(dy, x, W2, &lora, nullptr, {&dx, nullptr, nullptr, nullptr, nullptr});
      },
      ErrorCode::RUNTIME_INTERNAL, {"xa"});
}

// The group's one GEMM of x per product gives each member's y, dA, dB and the shared dx of the
// members alone (which the tests above hold to double references).
TEST(Linear, LoraGroupMatchesEachProjectionAlone) {
  test::expect_lora_groups_match_projections_alone(Device{});
}

// A group member handed its own dA (the group's dA is lora_group_backward's: it would be left
// unwritten) and columns past the group's xa are refused, as are a group A and dxa that do not fit
// x, and a group dropout whose members do not make up the group's A (or too many of them, or p out
// of [0, 1)).
TEST(Linear, LoraGroupRefusesWhatItCannotCompute) {
  const int64_t T = 5, in = 7, r = 2;
  Tensor x = random_tensor({T, in}, 1), W = random_tensor({3, in}, 2), A_all = random_tensor({2 * r, in}, 3);
  Tensor A = A_all.rows(0, r), B = random_tensor({3, r}, 4);
  Tensor xa = lora_group_forward(x, A_all);
  LoraWeights l{&A, &B, 1.0f, 0.0f, 7, true};
  l.group_xa = &xa;
  l.group_col = 2 * r - 1;
  test::expect_op_error([&] { linear_forward(x, W, nullptr, &l, nullptr); }, ErrorCode::RUNTIME_INTERNAL,
                        {"group xa", "[5, 4]", "[3, 5)"});
  l.group_col = r;
  LinearSaved saved;
  (void)linear_forward(x, W, nullptr, &l, &saved);
  EXPECT_EQ(saved.col, r);
  Tensor dy = random_tensor({T, 3}, 5), dx = Tensor::empty({T, in}), dxa = Tensor::empty({T, 2 * r});
  Tensor dA = Tensor::zeros({r, in}), dB = Tensor::zeros({3, r});
  l.group_xa = nullptr;
  l.group_dxa = &dxa;
  test::expect_op_error(
      [&] {
        linear_backward(dy, x, W, &l, &saved, {&dx, nullptr, nullptr, &dA, &dB});
      },
      ErrorCode::RUNTIME_INTERNAL, {"group member", "dA"});
  const LoraGroupDropout short_rows{0.1f, {{r, 1}, {r - 1, 2}}};
  test::expect_op_error([&] { (void)lora_group_forward(x, A_all, &short_rows); }, ErrorCode::RUNTIME_INTERNAL,
                        {"[linear]", "members have 3 rows", "A has 4"});
  const LoraGroupDropout four{0.1f, {{1, 1}, {1, 2}, {1, 3}, {1, 4}}};
  test::expect_op_error([&] { lora_group_backward(x, A_all, dxa, nullptr, &dx, &four); }, ErrorCode::RUNTIME_INTERNAL,
                        {"[linear]", "4 members", "1 to 3"});
  const LoraGroupDropout empty_member{0.1f, {{2 * r, 1}, {0, 2}}};
  test::expect_op_error([&] { (void)lora_group_forward(x, A_all, &empty_member); }, ErrorCode::RUNTIME_INTERNAL,
                        {"[linear]", "0 rows"});
  const LoraGroupDropout certain{1.0f, {{r, 1}, {r, 2}}};
  test::expect_op_error([&] { (void)lora_group_forward(x, A_all, &certain); }, ErrorCode::INPUT_VALIDATION_FAILED,
                        {"[linear]", "dropout", "[0, 1)"});
  Tensor narrow = random_tensor({2 * r, in + 1}, 6);
  test::expect_op_error([&] { (void)lora_group_forward(x, narrow); }, ErrorCode::RUNTIME_INTERNAL,
                        {"[linear]", "7 columns", "[4, 8]"});
  Tensor dxa_bad = Tensor::empty({T, 2 * r + 1});
  test::expect_op_error([&] { lora_group_backward(x, A_all, dxa_bad, nullptr, &dx); }, ErrorCode::RUNTIME_INTERNAL,
                        {"group dxa", "[5, 5]", "[5, 4]"});
}

}  // namespace
}  // namespace bp
