// The CUDA dispatch table (src/backend/cuda/kernel_wrappers.h, ops/dispatch.h) on the simulated
// device (sim_device.h): device tensors get their memory from the CUDA caching allocator, host
// code cannot read it except through explicit copies (the guard that makes a stray host read
// fail in the simulation as it would crash on a GPU), and every op front-end run on CUDA tensors
// gives the CPU backend's result on random inputs at odd sizes.
#include <gtest/gtest.h>

#include <functional>
#include <optional>

#include "ops/attention.h"
#include "ops/cross_entropy.h"
#include "ops/elementwise.h"
#include "ops/embedding.h"
#include "ops/linear.h"
#include "ops/op_table.h"
#include "ops/optim.h"
#include "ops/rms_norm.h"
#include "ops/rope.h"
#include "ops/swiglu.h"
#include "sim_device.h"
#include "support/test_util.h"

namespace bp::test {
namespace {

constexpr Device kGpu{DeviceType::CUDA, 0};

Tensor gpu(const Tensor& t) {
  return t.to(kGpu);
}

void expect_same(const Tensor& got_gpu, const Tensor& ref_cpu, const std::string& what, Tolerance tol = kTolF32) {
  EXPECT_EQ(got_gpu.device(), kGpu) << what;
  EXPECT_TRUE(all_close(got_gpu.to_vector(), ref_cpu.to_vector(), tol)) << what;
}

// The code of the bp::Error f throws (nullopt when it throws none).
std::optional<ErrorCode> code_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.code();
  }
  return std::nullopt;
}

TEST(CudaDispatch, HostAccessToDeviceMemoryThrows) {
  SimulatedCudaDevice card;
  Tensor t = Tensor::zeros({3, 5}, DType::F32, kGpu);
  const Tensor& ct = t;
  EXPECT_EQ(code_of([&] { (void)t.data<float>(); }), ErrorCode::RUNTIME_INTERNAL);
  EXPECT_EQ(code_of([&] { (void)ct.data<float>(); }), ErrorCode::RUNTIME_INTERNAL);
  EXPECT_EQ(code_of([&] { (void)t.raw(); }), ErrorCode::RUNTIME_INTERNAL);
  EXPECT_EQ(code_of([&] { (void)t.rows(1, 2).reshape({5}).data<float>(); }), ErrorCode::RUNTIME_INTERNAL);
  try {
    (void)t.data<float>();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("f32[3, 5] on CUDA device 0"), std::string::npos) << e.what();
  }
  // The same tensor copied to the host reads normally.
  EXPECT_EQ(t.to(Device{}).data<float>()[7], 0.0f);
}

TEST(CudaDispatch, DeviceTensorsUseTheCachingAllocatorAndExplicitCopies) {
  SimulatedCudaDevice card;
  const size_t before = card.allocator().stats().bytes_in_use;
  {
    Tensor host = random_tensor({7, 33}, 1);
    Tensor d = gpu(host);
    EXPECT_EQ(card.allocator().stats().bytes_in_use, before + 7 * 33 * 4);
    EXPECT_EQ(d.to_vector(), host.to_vector());
    Tensor c = d.clone();
    EXPECT_EQ(c.to(Device{}).to_vector(), host.to_vector());
    Tensor h = d.to(DType::BF16);  // converted on the host, back on the device
    EXPECT_EQ(h.device(), kGpu);
    EXPECT_EQ(h.to_vector(), host.to(DType::BF16).to_vector());
    Tensor f = Tensor::empty({7, 33}, DType::F32, kGpu);
    f.fill(2.5f);
    EXPECT_EQ(f.to_vector(), std::vector<float>(7 * 33, 2.5f));
    f.copy_from(h);  // bf16 device -> f32 device
    EXPECT_EQ(f.to_vector(), host.to(DType::BF16).to_vector());
    Tensor back = Tensor::zeros({7, 33});
    back.copy_from(d);  // device -> host
    EXPECT_EQ(back.to_vector(), host.to_vector());
    d.rows(2, 3).zero();  // a view zeroes only its rows
    auto v = d.to_vector();
    EXPECT_EQ(v[2 * 33 + 5], 0.0f);
    EXPECT_EQ(v[3 * 33 + 5], host.to_vector()[3 * 33 + 5]);
  }
  EXPECT_EQ(card.allocator().stats().bytes_in_use, before);  // everything returned
  EXPECT_GT(card.allocator().stats().bytes_cached, 0u);      // and kept in the cache
}

TEST(CudaDispatch, EveryKernelButAttentionIsInTheTable) {
  SimulatedCudaDevice card;
  const ops::Kernels& k = ops::kernels(DeviceType::CUDA);
  int total = 0;
#define BP_KERNEL(op, name) ++total;
#include "ops/kernels.inc"
#undef BP_KERNEL
  EXPECT_EQ(k.count, total - 4);
  EXPECT_EQ(k.attention_forward.fn, nullptr);  // branch cudaattn
  EXPECT_NE(k.rms_norm_forward.fn, nullptr);
  // The docs' CUDA column (kernel_gaps.h) says exactly which entries the table holds.
  int i = 0;
  const auto rows = ops::kernel_support_table();
#define BP_KERNEL(op, name) EXPECT_EQ(rows[static_cast<size_t>(i++)].cuda, k.name.fn != nullptr) << #name;
#include "ops/kernels.inc"
#undef BP_KERNEL
  // The attention op on CUDA tensors is refused with the catalog's code, never a crash.
  Tensor q = Tensor::zeros({4, 8}, DType::F32, kGpu), kv = Tensor::zeros({4, 8}, DType::F32, kGpu);
  Tensor cu = gpu(Tensor::from_vector(std::vector<int32_t>{0, 4}, {2}));
  EXPECT_EQ(code_of([&] {
              attention_forward(q, kv, kv, cu, AttentionShape{1, 1, 8}, nullptr);
            }),
            ErrorCode::RUNTIME_NOT_BUILT_WITH_CUDA);
}

TEST(CudaDispatch, MixedDevicesAreRefused) {
  SimulatedCudaDevice card;
  Tensor y = gpu(random_tensor({5, 3}, 2));
  Tensor x = random_tensor({5, 3}, 3);
  EXPECT_EQ(code_of([&] { add_inplace(y, x); }), ErrorCode::RUNTIME_INTERNAL);
}

TEST(CudaDispatch, ElementwiseMatchesCpu) {
  SimulatedCudaDevice card;
  for (int64_t T : {1, 33}) {
    for (int64_t N : {1, 31, 257}) {
      Tensor y = random_tensor({T, N}, 10 + T * N), x = random_tensor({T, N}, 11), b = random_tensor({N}, 12);
      Tensor yd = gpu(y), xd = gpu(x), bd = gpu(b), db = random_tensor({N}, 13), dbd = gpu(db);
      add_inplace(y, x), add_inplace(yd, xd);
      axpy_inplace(y, -0.7f, x), axpy_inplace(yd, -0.7f, xd);
      scale_inplace(y, 1.3f), scale_inplace(yd, 1.3f);
      add_bias_inplace(y, b), add_bias_inplace(yd, bd);
      bias_grad_accumulate(y, db), bias_grad_accumulate(yd, dbd);
      expect_same(yd, y, "y");
      expect_same(dbd, db, "db");
    }
  }
}

TEST(CudaDispatch, LinearWithLoraDropoutAndBiasMatchesCpu) {
  SimulatedCudaDevice card;
  const int64_t T = 33, in = 31, out = 17, r = 3;
  Tensor x = random_tensor({T, in}, 20), W = random_tensor({out, in}, 21), bias = random_tensor({out}, 22);
  Tensor A = random_tensor({r, in}, 23), B = random_tensor({out, r}, 24), dy = random_tensor({T, out}, 25);
  x.data<float>()[5] = 0.0f;  // an exact zero hides the dropout mask in xd: the rehash path
  Tensor xg = gpu(x), Wg = gpu(W), bg = gpu(bias), Ag = gpu(A), Bg = gpu(B), dyg = gpu(dy);
  LoraWeights lc{&A, &B, 0.5f, 0.25f, 99, true}, lg{&Ag, &Bg, 0.5f, 0.25f, 99, true};
  LinearSaved sc, sg;
  expect_same(linear_forward(xg, Wg, &bg, &lg, &sg), linear_forward(x, W, &bias, &lc, &sc), "y");
  expect_same(sg.xd, sc.xd, "xd (dropout mask)");
  Tensor dx = Tensor::empty({T, in}), dW = random_tensor({out, in}, 26), db = random_tensor({out}, 27);
  Tensor dA = random_tensor({r, in}, 28), dB = random_tensor({out, r}, 29);
  Tensor dxg = Tensor::empty({T, in}, DType::F32, kGpu), dWg = gpu(dW), dbg = gpu(db), dAg = gpu(dA), dBg = gpu(dB);
  linear_backward(dy, x, W, &lc, &sc, LinearGrads{&dx, &dW, &db, &dA, &dB});
  linear_backward(dyg, xg, Wg, &lg, &sg, LinearGrads{&dxg, &dWg, &dbg, &dAg, &dBg});
  expect_same(dxg, dx, "dx");
  expect_same(dWg, dW, "dW");
  expect_same(dbg, db, "db");
  expect_same(dAg, dA, "dA");
  expect_same(dBg, dB, "dB");
  Tensor C = random_tensor({out, r}, 30), Cg = gpu(C);
  matmul_accumulate(C, 0.3f, dy.rows(0, out), B);
  matmul_accumulate(Cg, 0.3f, dyg.rows(0, out), Bg);
  expect_same(Cg, C, "matmul_accumulate");
}

TEST(CudaDispatch, HeldBf16WeightsMatchCpu) {
  SimulatedCudaDevice card;
  // 700 columns: a 64k-float panel holds 93 rows, so the 257-row weight takes several panels.
  const int64_t T = 9, in = 700, out = 257;
  Tensor x = random_tensor({T, in}, 40), W = random_tensor({out, in}, 41).to(DType::BF16),
         dy = random_tensor({T, out}, 42);
  Tensor xg = gpu(x), Wg = gpu(W), dyg = gpu(dy);
  expect_same(linear_forward(xg, Wg, nullptr, nullptr, nullptr), linear_forward(x, W, nullptr, nullptr, nullptr), "y",
              Tolerance{1e-4, 1e-4});
  Tensor dx = Tensor::empty({T, in}), dxg = Tensor::empty({T, in}, DType::F32, kGpu);
  linear_backward(dy, x, W, nullptr, nullptr, LinearGrads{&dx});
  linear_backward(dyg, xg, Wg, nullptr, nullptr, LinearGrads{&dxg});
  expect_same(dxg, dx, "dx", Tolerance{1e-4, 1e-4});
  Tensor ids = Tensor::from_vector(std::vector<int32_t>{0, 256, 3, 3, 100}, {5});
  expect_same(embedding_forward(gpu(ids), Wg), embedding_forward(ids, W), "embedding of a held table");
  expect_same(lm_head_logits(xg, Wg), lm_head_logits(x, W), "lm_head", Tolerance{1e-4, 1e-4});
  // A type the CUDA backend has no kernel for is refused, not read.
  Tensor Wq = gpu(random_tensor({out, in}, 43).to(DType::F16));
  EXPECT_EQ(code_of([&] { linear_forward(xg, Wq, nullptr, nullptr, nullptr); }),
            ErrorCode::RUNTIME_NOT_BUILT_WITH_CUDA);
}

TEST(CudaDispatch, NormRopeSwigluEmbeddingMatchCpu) {
  SimulatedCudaDevice card;
  const int64_t T = 33, heads = 3, d = 8, D = heads * d, V = 31;
  Tensor x = random_tensor({T, D}, 50), w = random_tensor({D}, 51, 0.8f, 1.2f), dy = random_tensor({T, D}, 52);
  Tensor xg = gpu(x), wg = gpu(w), dyg = gpu(dy);
  Tensor rstd, rstdg;
  expect_same(rms_norm_forward(xg, wg, 1e-5f, &rstdg), rms_norm_forward(x, w, 1e-5f, &rstd), "rms_norm y");
  Tensor dx = Tensor::empty({T, D}), dw = random_tensor({D}, 53), dxg = Tensor::empty({T, D}, DType::F32, kGpu),
         dwg = gpu(dw);
  rms_norm_backward(dy, x, w, rstd, dx, &dw);
  rms_norm_backward(dyg, xg, wg, rstdg, dxg, &dwg);
  expect_same(dxg, dx, "rms_norm dx");
  expect_same(dwg, dw, "rms_norm dw");

  std::vector<int32_t> pos(T);
  for (int64_t t = 0; t < T; ++t) pos[static_cast<size_t>(t)] = static_cast<int32_t>(t % 13);
  Tensor p = Tensor::from_vector(pos, {T}), pg = gpu(p);
  RopeConfig rc{static_cast<int>(d), 10000.0f};
  rope_forward(x, p, heads, rc), rope_forward(xg, pg, heads, rc);
  expect_same(xg, x, "rope forward");
  rope_backward(dy, p, heads, rc), rope_backward(dyg, pg, heads, rc);
  expect_same(dyg, dy, "rope backward");

  Tensor up = random_tensor({T, D}, 54), upg = gpu(up);
  expect_same(swiglu_forward(xg, upg), swiglu_forward(x, up), "swiglu h");
  Tensor dg = Tensor::empty({T, D}), du = Tensor::empty({T, D});
  Tensor dgg = Tensor::empty({T, D}, DType::F32, kGpu), dug = Tensor::empty({T, D}, DType::F32, kGpu);
  swiglu_backward(dy, x, up, dg, du), swiglu_backward(dyg, xg, upg, dgg, dug);
  expect_same(dgg, dg, "swiglu dgate");
  expect_same(dug, du, "swiglu dup");

  Tensor table = random_tensor({V, D}, 55), ids = Tensor::from_vector(std::vector<int32_t>{0, 30, 7, 7, 1}, {5});
  Tensor tg = gpu(table), idsg = gpu(ids);
  expect_same(embedding_forward(idsg, tg), embedding_forward(ids, table), "embedding y");
  Tensor dyt = random_tensor({5, D}, 56), dt = random_tensor({V, D}, 57), dtg = gpu(dt);
  embedding_backward(dyt, ids, dt), embedding_backward(gpu(dyt), idsg, dtg);
  expect_same(dtg, dt, "embedding dtable");
  // Token ids are validated on the host through a copy, never a host read of device memory.
  Tensor bad = gpu(Tensor::from_vector(std::vector<int32_t>{0, 31}, {2}));
  EXPECT_EQ(code_of([&] { embedding_forward(bad, tg); }), ErrorCode::INPUT_VALIDATION_FAILED);
}

TEST(CudaDispatch, CrossEntropyAndOptimizerMatchCpu) {
  SimulatedCudaDevice card;
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
  expect_same(dxg, dx, "cross-entropy dx");
  expect_same(dWg, dW, "cross-entropy dW");

  Tensor p = random_tensor({V, D}, 63), m = random_tensor({V, D}, 64, 0, 0.1f), v = random_tensor({V, D}, 65, 0, 0.1f);
  Tensor pg = gpu(p), mg = gpu(m), vg = gpu(v);
  AdamWConfig cfg;
  cfg.lr = 1e-2f;
  cfg.weight_decay = 0.1f;
  adamw_step(p, dW, m, v, cfg, 3), adamw_step(pg, dWg, mg, vg, cfg, 3);
  expect_same(pg, p, "adamw param");
  expect_same(vg, v, "adamw v");
  EXPECT_NEAR(global_grad_norm({&dxg, &dWg}), global_grad_norm({&dx, &dW}), 1e-6 * global_grad_norm({&dx, &dW}));
  std::vector<Tensor*> gc{&dx, &dW}, gg{&dxg, &dWg};
  clip_grad_norm(gc, 0.01), clip_grad_norm(gg, 0.01);
  expect_same(dWg, dW, "clipped dW");
  EXPECT_TRUE(all_finite(dWg));
  Tensor nan = Tensor::zeros({3, 3});
  nan.data<float>()[4] = std::nanf("");
  EXPECT_FALSE(all_finite(gpu(nan)));
  EXPECT_FALSE(all_finite(gpu(nan.to(DType::BF16))));
  EXPECT_TRUE(all_finite(gpu(Tensor::zeros({3, 3}, DType::BF16))));
}

}  // namespace
}  // namespace bp::test
