// RoPE: against an independent PyTorch oracle (tests/oracles/torch_rope.py, HF's code path incl.
// Llama-3 scaling, gradients by autograd), against a plain double reference at odd sizes,
// backward against finite differences, and the error paths.
#include "ops/rope.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numbers>

#include "op_test_util.h"
#include "support/finite_diff.h"
#include "support/test_util.h"

namespace bp {
namespace {

using test::all_close;
using test::random_tensor;
using test::to_double;

// Plain reference: angle as HF forms it (f32 product pos·inv_freq), everything else in double.
std::vector<double> ref_rope(const std::vector<double>& x, const std::vector<int32_t>& pos,
                             const std::vector<float>& inv_freq, int64_t H, int64_t D) {
  std::vector<double> y(x.size());
  const int64_t T = static_cast<int64_t>(pos.size()), half = D / 2;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < half; ++i) {
        const double angle = static_cast<float>(static_cast<float>(pos[t]) * inv_freq[i]);
        const double c = std::cos(angle), s = std::sin(angle);
        const int64_t lo = t * H * D + h * D + i, hi = lo + half;
        y[lo] = x[lo] * c - x[hi] * s;
        y[hi] = x[hi] * c + x[lo] * s;
      }
  return y;
}

// Packed-batch positions: samples of random lengths, positions restarting at 0 in each.
std::vector<int32_t> packed_positions(int64_t T, uint64_t seed, int32_t start = 0) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> p(static_cast<size_t>(T));
  int32_t cur = start;
  for (auto& v : p) {
    v = cur++;
    if (rng() % 11 == 0) cur = 0;
  }
  return p;
}

// One oracle case: config, sizes and inputs; the oracle answers inv_freq, y and dx (autograd).
struct OracleCase {
  RopeConfig cfg;
  int64_t T, H;
  std::vector<int32_t> pos;
  Tensor x, dy;
};

OracleCase make_case(const RopeConfig& cfg, int64_t T, int64_t H, uint64_t seed, int32_t start) {
  return {cfg,
          T,
          H,
          packed_positions(T, seed, start),
          random_tensor({T, H * cfg.head_dim}, seed + 1),
          random_tensor({T, H * cfg.head_dim}, seed + 2)};
}

// Runs all cases through tests/oracles/torch_rope.py in one interpreter; empty on failure (which
// is reported as a test failure, never a skip).
nlohmann::json run_oracle(const std::vector<OracleCase>& cases) {
  const std::string python = "/usr/bin/python3";
  if (!std::filesystem::exists(python)) {
    ADD_FAILURE() << "RoPE oracle needs " << python << " with PyTorch (Debian python3-torch); it is missing";
    return {};
  }
  nlohmann::json in = nlohmann::json::array();
  for (const OracleCase& c : cases) {
    nlohmann::json j = {{"head_dim", c.cfg.head_dim}, {"n_heads", c.H},       {"theta", c.cfg.theta},
                        {"positions", c.pos},         {"x", c.x.to_vector()}, {"dy", c.dy.to_vector()}};
    j["llama3"] = nullptr;
    if (c.cfg.llama3_scaling)
      j["llama3"] = {{"factor", c.cfg.factor},
                     {"low_freq_factor", c.cfg.low_freq_factor},
                     {"high_freq_factor", c.cfg.high_freq_factor},
                     {"original_max_position_embeddings", c.cfg.original_max_position}};
    in.push_back(j);
  }
  test::TempDir dir;
  const std::string in_path = dir.path + "/in.json", out_path = dir.path + "/out.json";
  std::ofstream(in_path) << in.dump();
  const std::string script = test::source_dir() + "/tests/oracles/torch_rope.py";
  std::string output;
  const int rc = test::run_command(python + " " + script + " " + in_path + " " + out_path, &output);
  if (rc != 0) {
    ADD_FAILURE() << "RoPE oracle failed (exit " << rc << "): " << output;
    return {};
  }
  return nlohmann::json::parse(std::ifstream(out_path));
}

void check_against_oracle(const OracleCase& c, const nlohmann::json& o) {
  SCOPED_TRACE("head_dim " + std::to_string(c.cfg.head_dim) + ", T " + std::to_string(c.T) +
               (c.cfg.llama3_scaling ? ", llama3" : ""));
  const std::vector<float> inv = rope_inv_freq(c.cfg);
  // Bit-identical frequencies: the angle pos·inv_freq is an f32 product, so any ulp here would
  // show up as ~1e-4 errors at large positions.
  EXPECT_TRUE(all_close(to_double(inv), o["inv_freq"].get<std::vector<double>>(), {0, 0})) << "inv_freq";
  Tensor pt = Tensor::from_vector(c.pos, {c.T});
  Tensor y = c.x.clone();
  rope_forward(y, pt, static_cast<int>(c.H), c.cfg);
  // Remaining differences: torch's f32 cos/sin (~1 ulp) and product rounding.
  EXPECT_TRUE(all_close(to_double(y.to_vector()), o["y"].get<std::vector<double>>(), {2e-6, 1e-6})) << "forward";
  Tensor dx = c.dy.clone();
  rope_backward(dx, pt, static_cast<int>(c.H), c.cfg);
  EXPECT_TRUE(all_close(to_double(dx.to_vector()), o["dx"].get<std::vector<double>>(), {2e-6, 1e-6})) << "backward";
}

TEST(Rope, MatchesTorchOracle) {
  std::vector<OracleCase> cases;
  RopeConfig cfg;
  cfg.head_dim = 32;
  cfg.theta = 10000.0f;
  cases.push_back(make_case(cfg, 33, 3, 1, 0));
  cfg.head_dim = 6;
  cases.push_back(make_case(cfg, 1, 1, 2, 7));

  // Llama 3.1's rope_scaling; head_dim 64 puts frequencies in all three bands (checked below).
  cfg.head_dim = 64;
  cfg.theta = 500000.0f;
  cfg.llama3_scaling = true;
  cfg.factor = 8.0f;
  cfg.low_freq_factor = 1.0f;
  cfg.high_freq_factor = 4.0f;
  cfg.original_max_position = 8192;
  int low = 0, mid = 0, high = 0;
  for (float f : rope_inv_freq(cfg)) {
    const double wavelen = 2 * std::numbers::pi / f;
    if (wavelen < 8192.0 / 4.0)
      ++high;
    else if (wavelen > 8192.0 * 8.0)  // scaled by 1/8: original wavelen > 8192
      ++low;
    else
      ++mid;
  }
  EXPECT_GT(low, 0);
  EXPECT_GT(mid, 0);
  EXPECT_GT(high, 0);
  // Positions beyond 8000 (long context) as well as small ones.
  cases.push_back(make_case(cfg, 257, 2, 3, 8000));
  // A second scaling setting with a short original context, so a small head_dim hits all bands.
  cfg.head_dim = 16;
  cfg.theta = 10000.0f;
  cfg.factor = 4.0f;
  cfg.low_freq_factor = 1.5f;
  cfg.high_freq_factor = 6.0f;
  cfg.original_max_position = 128;
  cases.push_back(make_case(cfg, 31, 5, 4, 100));

  const nlohmann::json out = run_oracle(cases);
  if (out.empty()) return;  // already a failure
  ASSERT_EQ(out.size(), cases.size());
  for (size_t i = 0; i < cases.size(); ++i) check_against_oracle(cases[i], out[i]);
}

TEST(Rope, ForwardMatchesPlainReferenceAtOddSizes) {
  uint64_t seed = 10;
  for (auto [T, H, D] :
       {std::tuple<int64_t, int64_t, int>{1, 1, 2}, {31, 3, 62}, {32, 1, 64}, {33, 2, 66}, {257, 1, 32}}) {
    RopeConfig cfg;
    cfg.head_dim = D;
    cfg.theta = 10000.0f;
    const auto pos = packed_positions(T, ++seed, 3);
    Tensor x = random_tensor({T, H * D}, ++seed);
    Tensor y = x.clone();
    rope_forward(y, Tensor::from_vector(pos, {T}), static_cast<int>(H), cfg);
    const auto ref = ref_rope(to_double(x.to_vector()), pos, rope_inv_freq(cfg), H, D);
    EXPECT_TRUE(all_close(to_double(y.to_vector()), ref, {1e-6, 1e-6})) << T << " " << H << " " << D;
  }
}

TEST(Rope, BackwardMatchesFiniteDifferencesAndInvertsForward) {
  RopeConfig cfg;
  cfg.head_dim = 8;
  const int64_t T = 5, H = 2;
  const auto pos = packed_positions(T, 5, 1);
  Tensor pt = Tensor::from_vector(pos, {T});
  Tensor dy = random_tensor({T, H * 8}, 6), x = random_tensor({T, H * 8}, 7);
  Tensor dx = dy.clone();
  rope_backward(dx, pt, H, cfg);
  std::vector<double> xd = to_double(x.to_vector());
  const std::vector<double> g = to_double(dy.to_vector());
  const auto inv = rope_inv_freq(cfg);
  auto loss = [&] { return test::dot(g, ref_rope(xd, pos, inv, H, 8)); };
  EXPECT_TRUE(all_close(to_double(dx.to_vector()), test::numeric_gradient(&xd, loss), {1e-6, 1e-5}));
  // The rotation is orthogonal: backward(forward(x)) = x.
  Tensor r = x.clone();
  rope_forward(r, pt, H, cfg);
  rope_backward(r, pt, H, cfg);
  EXPECT_TRUE(all_close(r.to_vector(), x.to_vector(), {1e-6, 1e-6}));
}

// The backward's bf16 copy (q_proj's / k_proj's dy on a card: ops/linear.h dy_bf16): each value
// the nearest-even rounding of the rotated dx, written while its row is in cache; dx unchanged by
// asking for it. Above the kernel's parallel threshold, with packed positions; a copy of the wrong
// shape or type is refused.
TEST(Rope, BackwardBf16CopyIsTheRoundedGradient) {
  RopeConfig cfg;
  cfg.head_dim = 34;
  const int64_t T = 301, H = 3;
  Tensor pt = Tensor::from_vector(packed_positions(T, 97, 2), {T});
  const Tensor dy = random_tensor({T, H * 34}, 8, -3.0f, 3.0f);
  Tensor dx = dy.clone(), dx_alone = dy.clone(), dx16;
  rope_backward(dx, pt, H, cfg, &dx16);
  rope_backward(dx_alone, pt, H, cfg);
  EXPECT_EQ(dx.to_vector(), dx_alone.to_vector());
  test::expect_bf16_copy_of(dx16, dx, "dx");
  Tensor wrong_shape = Tensor::empty({T, H * 34 - 1}, DType::BF16), wrong_type = Tensor::empty({T, H * 34});
  for (Tensor* wrong : {&wrong_shape, &wrong_type}) {
    Tensor again = dy.clone();
    test::expect_op_error([&] { rope_backward(again, pt, H, cfg, wrong); }, ErrorCode::RUNTIME_INTERNAL,
                          {"[rope]", "dx_bf16"});
    EXPECT_EQ(again.to_vector(), dy.to_vector()) << "nothing written before the refusal";
  }
}

// q and k of one attention in one call (one kernel launch; the model's form): each the same bits as
// a call of its own, forward and backward with both bf16 copies, grouped heads (3 q, 1 k), above
// the kernel's parallel threshold. A k that does not fit (rows, width) or a wrong copy is refused
// before anything is written.
TEST(Rope, QAndKInOneCallMatchEachAlone) {
  RopeConfig cfg;
  cfg.head_dim = 34;
  const int64_t T = 301, Hq = 3, Hk = 1;
  Tensor pt = Tensor::from_vector(packed_positions(T, 41, 2), {T});
  const Tensor q0 = random_tensor({T, Hq * 34}, 11), k0 = random_tensor({T, Hk * 34}, 12);
  Tensor q = q0.clone(), k = k0.clone(), q_alone = q0.clone(), k_alone = k0.clone();
  rope_forward(q, k, pt, Hq, Hk, cfg);
  rope_forward(q_alone, pt, Hq, cfg);
  rope_forward(k_alone, pt, Hk, cfg);
  EXPECT_EQ(q.to_vector(), q_alone.to_vector());
  EXPECT_EQ(k.to_vector(), k_alone.to_vector());
  EXPECT_NE(q.to_vector(), q0.to_vector());

  Tensor dq16, dk16, dq16_alone, dk16_alone;
  rope_backward(q, k, pt, Hq, Hk, cfg, &dq16, &dk16);
  rope_backward(q_alone, pt, Hq, cfg, &dq16_alone);
  rope_backward(k_alone, pt, Hk, cfg, &dk16_alone);
  EXPECT_EQ(q.to_vector(), q_alone.to_vector());
  EXPECT_EQ(k.to_vector(), k_alone.to_vector());
  test::expect_bf16_copy_of(dq16, q, "dq");
  test::expect_bf16_copy_of(dk16, k, "dk");
  EXPECT_TRUE(all_close(q.to_vector(), q0.to_vector(), {1e-5, 1e-5})) << "backward(forward(q)) = q";

  Tensor short_k = random_tensor({T - 1, Hk * 34}, 13), wide_k = random_tensor({T, 2 * 34}, 14);
  for (Tensor* bad : {&short_k, &wide_k}) {
    Tensor q1 = q0.clone(), bad1 = bad->clone();
    test::expect_op_error([&] { rope_forward(q1, bad1, pt, Hq, Hk, cfg); }, ErrorCode::RUNTIME_INTERNAL,
                          {"[rope]", "k has"});
    EXPECT_EQ(q1.to_vector(), q0.to_vector()) << "nothing written before the refusal";
    EXPECT_EQ(bad1.to_vector(), bad->to_vector());
  }
  // q_proj's and k_proj's biases in the same call: (q + b_q) and (k + b_k) rotated, as a bias add
  // and a one-tensor call do; biases of another width are refused.
  const Tensor bq = random_tensor({Hq * 34}, 15), bk = random_tensor({Hk * 34}, 16);
  Tensor qb = q0.clone(), kb = k0.clone(), qb_ref = q0.clone(), kb_ref = k0.clone();
  rope_forward(qb, kb, pt, Hq, Hk, cfg, &bq, &bk);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t j = 0; j < Hq * 34; ++j) qb_ref.data<float>()[t * Hq * 34 + j] += bq.data<float>()[j];
    for (int64_t j = 0; j < Hk * 34; ++j) kb_ref.data<float>()[t * Hk * 34 + j] += bk.data<float>()[j];
  }
  rope_forward(qb_ref, pt, Hq, cfg);
  rope_forward(kb_ref, pt, Hk, cfg);
  EXPECT_EQ(qb.to_vector(), qb_ref.to_vector()) << "q + bias, rotated";
  EXPECT_EQ(kb.to_vector(), kb_ref.to_vector()) << "k + bias, rotated";
  Tensor q2 = q0.clone(), k2 = k0.clone();
  test::expect_op_error([&] { rope_forward(q2, k2, pt, Hq, Hk, cfg, &bq, &bq); }, ErrorCode::RUNTIME_INTERNAL,
                        {"[rope]", "k_bias"});
  EXPECT_EQ(q2.to_vector(), q0.to_vector()) << "nothing written before the refusal";

  Tensor q1 = q0.clone(), k1 = k0.clone(), dq16_ok, wrong = Tensor::empty({T, Hk * 34});
  test::expect_op_error([&] { rope_backward(q1, k1, pt, Hq, Hk, cfg, &dq16_ok, &wrong); }, ErrorCode::RUNTIME_INTERNAL,
                        {"[rope]", "dk_bf16"});
  EXPECT_EQ(q1.to_vector(), q0.to_vector());
  EXPECT_EQ(k1.to_vector(), k0.to_vector());
}

TEST(Rope, Errors) {
  RopeConfig cfg;
  cfg.head_dim = 8;
  Tensor x = random_tensor({2, 16}, 1);
  test::expect_op_error(
      [&] {
        rope_forward(x, Tensor::from_vector(std::vector<int32_t>{0, -3}, {2}), 2, cfg);
      },
      ErrorCode::INPUT_VALIDATION_FAILED, {"[rope]", "-3", "token 1"});
  test::expect_op_error(
      [&] {
        rope_forward(x, Tensor::from_vector(std::vector<int32_t>{0, 1}, {2}), 3, cfg);
      },
      ErrorCode::RUNTIME_INTERNAL, {"[rope]", "16", "3 heads"});
  cfg.head_dim = 7;
  test::expect_op_error([&] { rope_inv_freq(cfg); }, ErrorCode::INPUT_VALIDATION_FAILED, {"head_dim", "7"});
}

}  // namespace
}  // namespace bp
