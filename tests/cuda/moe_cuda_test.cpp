// CUDA Mixture-of-Experts kernels (src/backend/cuda/moe.cuh) on the CPU simulation against the CPU
// kernels (backend/cpu/moe.cpp) at odd sizes (one token and one expert; more tokens than a block's
// threads; more experts than a block's threads), with ties in the router's probabilities, with and
// without renormalisation and the auxiliary gradient. Integers (expert choices, the sort's offsets,
// rows and slots) and copies must be exactly the CPU's; every output must be the same bits under
// the forward, reverse and shuffled schedules with the cross-block write check on (device memory
// from cudaMalloc, which the check watches).
#include <cstring>

#include "backend/cpu/moe.h"
#include "backend/cuda/moe.cuh"
#include "sim_test_util.h"

namespace bp::sim {
namespace {

// A device copy of `host` (cudaMalloc'd: the write check watches it), freed with the scope.
template <class T>
class Dev {
 public:
  explicit Dev(const std::vector<T>& host) : n_(host.size()) {
    void* p = nullptr;
    EXPECT_EQ(cudaMalloc(&p, std::max<size_t>(n_, 1) * sizeof(T)), cudaSuccess);
    ptr_ = static_cast<T*>(p);
    if (n_) cudaMemcpy(ptr_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice);
  }
  ~Dev() { cudaFree(ptr_); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  T* get() const { return ptr_; }
  std::vector<T> host() const {
    std::vector<T> v(n_);
    if (n_) cudaMemcpy(v.data(), ptr_, n_ * sizeof(T), cudaMemcpyDeviceToHost);
    return v;
  }

 private:
  size_t n_;
  T* ptr_ = nullptr;
};

struct Shape {
  int64_t T, E, k, D;
};

// Every output of the eight kernels, as one record compared between schedules.
struct Outputs {
  std::vector<int32_t> ids, offsets, row_token, slot_of;
  std::vector<float> weights, dlogits, xs, dx, out, dys, dweights, counts, prob_sum;
  bool operator==(const Outputs&) const = default;
};

struct Inputs {
  std::vector<float> logits, dweights, aux, x, dxs, ys, dout, out0, dx0, counts0, prob0;
};

Inputs make_inputs(const Shape& s) {
  const int64_t n = s.T * s.k;
  Inputs in;
  in.logits = test::random_floats(s.T * s.E, 1 + s.T, -3.0f, 3.0f);
  if (s.T > 2)  // a token whose experts tie: the lower indices first
    for (int64_t e = 0; e < s.E; ++e) in.logits[2 * s.E + e] = 0.25f;
  in.dweights = test::random_floats(n, 2 + s.T);
  in.aux = test::random_floats(s.E, 3 + s.E, 0.0f, 0.1f);
  in.x = test::random_floats(s.T * s.D, 4);
  in.dxs = test::random_floats(n * s.D, 5);
  in.ys = test::random_floats(n * s.D, 6);
  in.dout = test::random_floats(s.T * s.D, 7);
  in.out0 = test::random_floats(s.T * s.D, 8);
  in.dx0 = test::random_floats(s.T * s.D, 9);
  in.counts0 = std::vector<float>(s.E, 2.0f);
  in.prob0 = test::random_floats(s.E, 10, 0.0f, 1.0f);
  return in;
}

Outputs run_cpu(const Shape& s, const Inputs& in, bool renorm, bool aux) {
  const int64_t n = s.T * s.k;
  Outputs o;
  o.ids.resize(n), o.weights.resize(n), o.dlogits.resize(s.T * s.E);
  cpu::moe_route_forward(in.logits.data(), s.T, s.E, s.k, renorm, o.ids.data(), o.weights.data());
  cpu::moe_route_backward(in.logits.data(), o.ids.data(), in.dweights.data(), aux ? in.aux.data() : nullptr, s.T, s.E,
                          s.k, renorm, o.dlogits.data());
  o.offsets.resize(s.E + 1), o.row_token.resize(n), o.slot_of.resize(n);
  cpu::moe_sort(o.ids.data(), s.T, s.k, s.E, o.offsets.data(), o.row_token.data(), o.slot_of.data());
  o.xs.resize(n * s.D);
  cpu::moe_gather_forward(in.x.data(), o.row_token.data(), n, s.D, o.xs.data());
  o.dx = in.dx0;
  cpu::moe_gather_backward(in.dxs.data(), o.slot_of.data(), s.T, s.k, s.D, o.dx.data());
  o.out = in.out0;
  cpu::moe_scatter_forward(in.ys.data(), o.weights.data(), o.slot_of.data(), s.T, s.k, s.D, o.out.data());
  o.dys.resize(n * s.D), o.dweights.resize(n);
  cpu::moe_scatter_backward(in.dout.data(), in.ys.data(), o.weights.data(), o.slot_of.data(), s.T, s.k, s.D,
                            o.dys.data(), o.dweights.data());
  o.counts = in.counts0, o.prob_sum = in.prob0;
  cpu::moe_aux_accumulate(in.logits.data(), o.ids.data(), s.T, s.E, s.k, o.counts.data(), o.prob_sum.data());
  return o;
}

// The same chain on the simulated card; each kernel reads the previous one's device outputs.
Outputs run_cuda(const Shape& s, const Inputs& in, bool renorm, bool aux) {
  const int64_t n = s.T * s.k;
  const std::vector<float> nan_n(n, NAN), nan_nd(n * s.D, NAN);
  const std::vector<int32_t> junk_n(n, -7), junk_e(s.E + 1, -7);
  Dev<float> logits(in.logits), dweights(in.dweights), auxg(in.aux), x(in.x), dxs(in.dxs), ys(in.ys), dout(in.dout);
  Dev<int32_t> ids(junk_n), offsets(junk_e), row_token(junk_n), slot_of(junk_n);
  Dev<float> weights(nan_n), dlogits(std::vector<float>(s.T * s.E, NAN)), xs(nan_nd), dx(in.dx0), out(in.out0);
  Dev<float> dys(nan_nd), dw(nan_n), counts(in.counts0), prob(in.prob0), stats(std::vector<float>(2 * s.T, NAN));
  moe_route_forward(logits.get(), s.T, s.E, s.k, renorm, ids.get(), weights.get());
  moe_route_backward(logits.get(), ids.get(), dweights.get(), aux ? auxg.get() : nullptr, s.T, s.E, s.k, renorm,
                     dlogits.get());
  moe_sort(ids.get(), s.T, s.k, s.E, offsets.get(), row_token.get(), slot_of.get());
  moe_gather_forward(x.get(), row_token.get(), n, s.D, xs.get());
  moe_gather_backward(dxs.get(), slot_of.get(), s.T, s.k, s.D, dx.get());
  moe_scatter_forward(ys.get(), weights.get(), slot_of.get(), s.T, s.k, s.D, out.get());
  moe_scatter_backward(dout.get(), ys.get(), weights.get(), slot_of.get(), s.T, s.k, s.D, dys.get(), dw.get());
  moe_aux_accumulate(logits.get(), ids.get(), s.T, s.E, s.k, counts.get(), prob.get(), stats.get());
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  return {ids.host(), offsets.host(), row_token.host(), slot_of.host(), weights.host(), dlogits.host(), xs.host(),
          dx.host(),  out.host(),     dys.host(),       dw.host(),      counts.host(),  prob.host()};
}

void check(const Shape& s, bool renorm, bool aux) {
  const std::string at = " T=" + std::to_string(s.T) + " E=" + std::to_string(s.E) + " k=" + std::to_string(s.k) +
                         " D=" + std::to_string(s.D) + (renorm ? " renormalised" : "") + (aux ? " aux" : "");
  const Inputs in = make_inputs(s);
  const Outputs ref = run_cpu(s, in, renorm, aux);
  const ScheduleChoice saved = set_schedule({Schedule::Forward, 0});
  const bool saved_check = set_write_check(true);
  const Outputs got = run_cuda(s, in, renorm, aux);
  // Choices and the sort: exactly the CPU's (stable: by token, then choice, within an expert).
  EXPECT_EQ(got.ids, ref.ids) << at;
  EXPECT_EQ(got.offsets, ref.offsets) << at;
  EXPECT_EQ(got.row_token, ref.row_token) << at;
  EXPECT_EQ(got.slot_of, ref.slot_of) << at;
  EXPECT_EQ(got.xs, ref.xs) << at;  // a copy
  EXPECT_EQ(got.counts, ref.counts) << at;
  test::expect_close(got.weights, ref.weights, test::kF32Tol, "weights" + at);
  test::expect_close(got.dlogits, ref.dlogits, test::kF32Tol, "dlogits" + at);
  test::expect_close(got.dx, ref.dx, test::kF32Tol, "dx" + at);
  test::expect_close(got.out, ref.out, test::kF32Tol, "out" + at);
  test::expect_close(got.dys, ref.dys, test::kF32Tol, "dys" + at);
  test::expect_close(got.dweights, ref.dweights, {1e-5, 1e-4}, "dweights" + at);  // a block sum's order
  test::expect_close(got.prob_sum, ref.prob_sum, test::kF32Tol, "prob_sum" + at);
  // No races: the same bits under every order a GPU could run the threads and blocks in.
  for (ScheduleChoice other : {ScheduleChoice{Schedule::Reverse, 0}, ScheduleChoice{Schedule::Shuffle, 3},
                               ScheduleChoice{Schedule::Shuffle, 11}}) {
    set_schedule(other);
    EXPECT_TRUE(run_cuda(s, in, renorm, aux) == got) << "schedule " << static_cast<int>(other.order) << at;
  }
  set_schedule(saved);
  set_write_check(saved_check);
}

TEST(CudaMoe, EveryKernelMatchesTheCpuAndEverySchedule) {
  check({1, 1, 1, 1}, true, false);
  check({37, 7, 3, 33}, true, true);
  check({37, 7, 3, 33}, false, false);
  check({130, 5, 2, 17}, false, true);  // more tokens than a block's threads
  check({9, 129, 8, 65}, true, true);   // more experts than a block's threads; k = 8 as Qwen3-MoE
}

// An expert id out of range is counted by no expert: the offsets end short of T·k (what the
// front-end checks), and no row is written outside the arrays.
TEST(CudaMoe, SortCountsOnlyIdsInRange) {
  const std::vector<int32_t> ids{0, 3, 9, 1, -1, 2};
  Dev<int32_t> d_ids(ids), offsets(std::vector<int32_t>(5, -7)), rows(std::vector<int32_t>(6, -7)),
      slots(std::vector<int32_t>(6, -7));
  moe_sort(d_ids.get(), 3, 2, 4, offsets.get(), rows.get(), slots.get());
  EXPECT_EQ(offsets.host(), (std::vector<int32_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(slots.host(), (std::vector<int32_t>{0, 3, -7, 1, -7, 2}));
}

}  // namespace
}  // namespace bp::sim
