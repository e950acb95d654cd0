// The Collective (core/collective.h): the launcher's environment, the single process, the MPI
// plugin's absence as a catalog error, and the deterministic all-reduce over real MPI.
//
// The MPI case runs this test binary again under `mpirun --oversubscribe -np N` with
// BP_COLLECTIVE_WORKER set: the same test then runs the checks in every rank, each comparing what
// the collective computed with a plain reference made from every rank's inputs (each rank can
// regenerate them from their seeds). The parent test checks that every rank passed. Only an absent
// mpirun skips it.
#include "core/collective.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"
#include "support/test_util.h"

namespace bp {

namespace {

// Sets environment variables for one test and restores them after.
struct EnvScope {
  std::vector<std::pair<std::string, std::string>> saved;
  std::vector<std::string> unset_after;
  void set(const std::string& k, const char* v) {
    if (const char* old = std::getenv(k.c_str()))
      saved.emplace_back(k, old);
    else
      unset_after.push_back(k);
    if (v)
      setenv(k.c_str(), v, 1);
    else
      unsetenv(k.c_str());
  }
  ~EnvScope() {
    for (auto& [k, v] : saved) setenv(k.c_str(), v.c_str(), 1);
    for (auto& k : unset_after) unsetenv(k.c_str());
  }
};

const char* const kLaunchVars[] = {"OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "PMI_SIZE",    "PMI_RANK",
                                   "SLURM_STEP_ID",        "SLURM_STEP_NUM_TASKS", "SLURM_PROCID"};

std::string mpirun_or_empty() {
  return find_mpirun();
}

std::string mpi_plugin() {
#ifdef BP_MPI_PLUGIN
  return BP_MPI_PLUGIN;
#else
  return "";
#endif
}

// Rank r's input of a given size: seeded by (rank, size), values of mixed sign and magnitude so
// that the order of the additions shows in the low bits.
std::vector<float> rank_input(int rank, size_t n) {
  std::vector<float> v = test::random_vector(n, 1000 + 17 * static_cast<uint64_t>(rank) + n, -1.0f, 1.0f);
  for (size_t i = 0; i < n; ++i)
    v[i] *= std::ldexp(1.0f, static_cast<int>((i * 7 + static_cast<size_t>(rank) * 3) % 23) - 11);
  return v;
}

// The plain reference: the ranks' values added in rank order, one element at a time.
std::vector<float> rank_order_sum(int world, size_t n) {
  std::vector<float> s = rank_input(0, n);
  for (int r = 1; r < world; ++r) {
    const std::vector<float> x = rank_input(r, n);
    for (size_t i = 0; i < n; ++i) s[i] += x[i];
  }
  return s;
}

bool bits_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

// Runs Collective.DeterministicAllReduceUnderMpirun's checks in `np` ranks; returns mpirun's exit code and the output.
int run_workers(int np, std::string* out) {
  const std::string cmd =
      "BP_COLLECTIVE_WORKER=1 BP_COLLECTIVE_PLUGIN=" + mpi_plugin() +
      // Under the sanitizer build LeakSanitizer leaves Open MPI's own allocations alone
      // (tests/support/lsan_openmpi.supp says why).
      " LSAN_OPTIONS=suppressions=" + test::source_dir() +
      "/tests/support/lsan_openmpi.supp:print_suppressions=0:fast_unwind_on_malloc=0 " + mpirun_or_empty() +
      " --allow-run-as-root --oversubscribe --timeout 300 --mca oob_tcp_if_include lo --mca btl_tcp_if_include "
      "lo -x BP_COLLECTIVE_WORKER -x BP_COLLECTIVE_PLUGIN -x OMP_NUM_THREADS=1 -np " +
      std::to_string(np) + " " + std::string(BP_BINARY_DIR) +
      "/tests/test_core --gtest_color=no --gtest_filter=Collective.DeterministicAllReduceUnderMpirun 2>&1";
  return test::run_command(cmd, out);
}

size_t count(const std::string& hay, const std::string& needle) {
  size_t n = 0;
  for (size_t at = hay.find(needle); at != std::string::npos; at = hay.find(needle, at + 1)) ++n;
  return n;
}

}  // namespace

TEST(Collective, LaunchEnvironmentNamesTheLauncher) {
  EnvScope env;
  for (const char* k : kLaunchVars) env.set(k, nullptr);
  EXPECT_EQ(launch_from_environment().world, 1);
  EXPECT_EQ(launch_from_environment().launcher, "");
  env.set("SLURM_STEP_NUM_TASKS", "4");  // inside an allocation but not a step srun started: one process
  EXPECT_EQ(launch_from_environment().world, 1);
  env.set("SLURM_STEP_ID", "0");
  env.set("SLURM_PROCID", "3");
  EXPECT_EQ(launch_from_environment().launcher, "srun");
  EXPECT_EQ(launch_from_environment().world, 4);
  EXPECT_EQ(launch_from_environment().rank, 3);
  env.set("PMI_SIZE", "2");
  env.set("PMI_RANK", "1");
  EXPECT_EQ(launch_from_environment().launcher, "pmi");
  EXPECT_EQ(launch_from_environment().world, 2);
  env.set("OMPI_COMM_WORLD_SIZE", "8");
  env.set("OMPI_COMM_WORLD_RANK", "5");
  EXPECT_EQ(launch_from_environment().launcher, "mpirun");
  EXPECT_EQ(launch_from_environment().world, 8);
  EXPECT_EQ(launch_from_environment().rank, 5);
}

TEST(Collective, SingleProcessLeavesEverythingAsItIs) {
  auto c = make_single_collective();
  EXPECT_EQ(c->world(), 1);
  EXPECT_EQ(c->rank(), 0);
  std::vector<float> v = rank_input(0, 33);
  const std::vector<float> before = v;
  c->all_reduce_sum(v.data(), v.size());
  EXPECT_TRUE(bits_equal(v, before));
  EXPECT_EQ(c->all_gather(int64_t{7}), std::vector<int64_t>{7});
  EXPECT_EQ(c->sum_in_rank_order(2.5), 2.5);
  EXPECT_TRUE(c->any(true));
  EXPECT_FALSE(c->any(false));
  EXPECT_EQ(c->broadcast("abc", 0), "abc");
  c->barrier(1.0);
}

TEST(Collective, MissingPluginIsACatalogError) {
  try {
    load_mpi_collective("/nonexistent/libbp_collective_mpi.so");
    FAIL() << "a missing plugin loaded";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::DEP_DISTRIBUTED_UNAVAILABLE);
    EXPECT_NE(std::string(e.what()).find("/nonexistent/libbp_collective_mpi.so"), std::string::npos) << e.what();
    EXPECT_NE(e.suggestion().find("openmpi"), std::string::npos) << e.suggestion();
  }
  const PluginAvailability a = mpi_plugin_availability("/nonexistent/libbp_collective_mpi.so");
  EXPECT_FALSE(a.available);
  EXPECT_NE(a.why.find("not found"), std::string::npos) << a.why;
}

// The plugin of this build loads (without starting MPI); where mpirun exists it must have been built.
TEST(Collective, BuiltPluginLoads) {
  if (mpirun_or_empty().empty()) GTEST_SKIP() << "mpirun is not installed (apt-get install openmpi-bin)";
  ASSERT_FALSE(mpi_plugin().empty()) << "mpirun is installed but this build has no MPI plugin (libopenmpi-dev?)";
  const PluginAvailability a = mpi_plugin_availability(mpi_plugin());
  EXPECT_TRUE(a.available) << a.why;
}

void all_reduce_is_the_rank_order_sum_on_every_rank(Collective* comm_);
void tensor_all_reduce_across_buckets(Collective* comm_);
void gather_any_broadcast_and_barrier(Collective* comm_);

// Two and three ranks (three: the order of the additions matters, (a+b)+c != a+(b+c) in f32). In
// the ranks (BP_COLLECTIVE_WORKER set) the same test runs the checks below.
TEST(Collective, DeterministicAllReduceUnderMpirun) {
  if (std::getenv("BP_COLLECTIVE_WORKER")) {
    Collective* comm = &process_collective("mpi", std::getenv("BP_COLLECTIVE_PLUGIN"));
    all_reduce_is_the_rank_order_sum_on_every_rank(comm);
    tensor_all_reduce_across_buckets(comm);
    gather_any_broadcast_and_barrier(comm);
    std::printf("rank %d of %d: checks done\n", comm->rank(), comm->world());
    return;
  }
  if (mpirun_or_empty().empty()) GTEST_SKIP() << "mpirun is not installed (apt-get install openmpi-bin)";
  ASSERT_FALSE(mpi_plugin().empty()) << "mpirun is installed but this build has no MPI plugin";
  for (int np : {2, 3}) {
    std::string out;
    const int rc = run_workers(np, &out);
    EXPECT_EQ(rc, 0) << out;
    // Every rank ran the checks and passed.
    EXPECT_EQ(count(out, ": checks done"), static_cast<size_t>(np)) << out;
    EXPECT_EQ(count(out, "[  PASSED  ] 1 test"), static_cast<size_t>(np)) << out;
    EXPECT_EQ(count(out, "[  FAILED  ]"), 0u) << out;
  }
}

// ---- the ranks' side (under mpirun only) -------------------------------------------------------

// MPI ends cleanly after the worker tests (mpirun counts a rank that exits without it as failed).
class FinalizeMpi : public ::testing::Environment {
 public:
  void TearDown() override {
    if (std::getenv("BP_COLLECTIVE_WORKER")) finalize_process_collective();
  }
};
const ::testing::Environment* const kFinalizeMpi = ::testing::AddGlobalTestEnvironment(new FinalizeMpi);

void all_reduce_is_the_rank_order_sum_on_every_rank(Collective* comm_) {
  const int w = comm_->world(), me = comm_->rank();
  ASSERT_GE(w, 2);
  EXPECT_EQ(launch_from_environment().world, w);
  EXPECT_EQ(launch_from_environment().rank, me);
  bool some_order_shows = false;
  // Odd sizes (fewer elements than ranks too), and segments smaller than the buffer.
  for (size_t n : {size_t{1}, size_t{2}, size_t{31}, size_t{32}, size_t{33}, size_t{257}, size_t{4099}})
    for (size_t segment : {size_t{7}, size_t{64}, kReduceSegmentFloats}) {
      std::vector<float> x = rank_input(me, n);
      comm_->all_reduce_sum(x.data(), n, segment);
      const std::vector<float> want = rank_order_sum(w, n);
      EXPECT_TRUE(bits_equal(x, want)) << "n " << n << " segment " << segment << " rank " << me;
      // The reduce-scatter (ZeRO-1): this rank's chunk of each segment, [m·me/W, m·(me+1)/W), has the
      // all-reduce's bits; every other value is this rank's own, untouched.
      std::vector<float> y = rank_input(me, n);
      const std::vector<float> own = y;
      comm_->reduce_scatter_sum(y.data(), n, segment);
      for (size_t seg = 0; seg < n; seg += segment) {
        const size_t m = std::min(segment, n - seg);
        const size_t b = seg + m * static_cast<size_t>(me) / static_cast<size_t>(w),
                     e = seg + m * static_cast<size_t>(me + 1) / static_cast<size_t>(w);
        for (size_t i = seg; i < seg + m; ++i) {
          const float expect = i >= b && i < e ? want[i] : own[i];
          ASSERT_EQ(std::memcmp(&y[i], &expect, 4), 0)
              << "reduce-scatter n " << n << " segment " << segment << " at " << i;
        }
      }
      // Within f32 rounding of the exact sum: (W-1) additions, each off by at most 2^-24 of its result.
      std::vector<double> exact(n, 0.0), mag(n, 0.0);
      for (int r = 0; r < w; ++r) {
        const std::vector<float> xr = rank_input(r, n);
        for (size_t i = 0; i < n; ++i) {
          exact[i] += xr[i];
          mag[i] += std::fabs(xr[i]);
        }
      }
      for (size_t i = 0; i < n; ++i)
        ASSERT_LE(std::fabs(x[i] - exact[i]), (w - 1) * std::ldexp(1.0, -24) * mag[i] + 1e-30) << i;
      // The opposite order gives other bits somewhere (with 3 ranks): the equality above is not vacuous.
      if (w >= 3) {
        std::vector<float> rev = rank_input(w - 1, n);
        for (int r = w - 2; r >= 0; --r) {
          const std::vector<float> xr = rank_input(r, n);
          for (size_t i = 0; i < n; ++i) rev[i] += xr[i];
        }
        some_order_shows = some_order_shows || !bits_equal(rev, want);
      }
      // Every rank holds the same bits: compare hashes of the result across ranks.
      uint64_t h = 0;
      for (size_t i = 0; i < n; ++i) {
        uint32_t b;
        std::memcpy(&b, &x[i], 4);
        h = h * 1000003u + b;
      }
      for (int64_t other : comm_->all_gather(static_cast<int64_t>(h))) EXPECT_EQ(other, static_cast<int64_t>(h));
    }
  if (w >= 3) {
    EXPECT_TRUE(some_order_shows);
  }
}

void tensor_all_reduce_across_buckets(Collective* comm_) {
  const int w = comm_->world(), me = comm_->rank();
  const std::vector<size_t> sizes = {5, 1, 40, 3, 129};
  std::vector<Tensor> ts;
  for (size_t k = 0; k < sizes.size(); ++k) {
    std::vector<float> v = rank_input(me, sizes[k] + 1000 * k);
    v.resize(sizes[k]);
    ts.push_back(Tensor::from_vector(v, Shape{static_cast<int64_t>(sizes[k])}));
  }
  std::vector<Tensor*> ptrs;
  for (auto& t : ts) ptrs.push_back(&t);
  comm_->all_reduce_sum(ptrs, 16);  // buckets of 16 floats: tensors split across them
  for (size_t k = 0; k < sizes.size(); ++k) {
    std::vector<float> want;
    for (int r = 0; r < w; ++r) {
      std::vector<float> v = rank_input(r, sizes[k] + 1000 * k);
      v.resize(sizes[k]);
      if (r == 0)
        want = v;
      else
        for (size_t i = 0; i < v.size(); ++i) want[i] += v[i];
    }
    EXPECT_TRUE(bits_equal(ts[k].to_vector(), want)) << "tensor " << k;
  }
  // reduce_part (the overlap's reduction, a few tensors at a time, in any order) in the same layout
  // of segments of 16: all-reduce, every value the whole reduction's bits; reduce-scatter, this
  // rank's chunks those of reduce_scatter_sum over all of them, the rest left as it was.
  for (const bool gather : {true, false}) {
    std::vector<Tensor> whole, part;
    for (size_t k = 0; k < sizes.size(); ++k) {
      std::vector<float> v = rank_input(me, sizes[k] + 1000 * k);
      v.resize(sizes[k]);
      whole.push_back(Tensor::from_vector(v, Shape{static_cast<int64_t>(sizes[k])}));
      part.push_back(Tensor::from_vector(v, Shape{static_cast<int64_t>(sizes[k])}));
    }
    std::vector<Tensor*> wp, pp;
    for (size_t k = 0; k < sizes.size(); ++k) {
      wp.push_back(&whole[k]);
      pp.push_back(&part[k]);
    }
    if (gather)
      comm_->all_reduce_sum(wp, 16);
    else
      comm_->reduce_scatter_sum(wp, 16);
    for (const std::vector<size_t>& which : {std::vector<size_t>{4, 2}, {0}, {3, 1}})
      comm_->reduce_part(pp, which, gather, 16);
    for (size_t k = 0; k < sizes.size(); ++k)
      EXPECT_TRUE(bits_equal(part[k].to_vector(), whole[k].to_vector())) << "tensor " << k << " gather " << gather;
  }
}

void gather_any_broadcast_and_barrier(Collective* comm_) {
  const int w = comm_->world(), me = comm_->rank();
  const std::vector<int64_t> ranks = comm_->all_gather(int64_t{me * 10});
  ASSERT_EQ(ranks.size(), static_cast<size_t>(w));
  for (int r = 0; r < w; ++r) EXPECT_EQ(ranks[static_cast<size_t>(r)], r * 10);
  double want = 0.1;
  for (int r = 1; r < w; ++r) want += 0.1 * (r + 1);
  EXPECT_EQ(comm_->sum_in_rank_order(0.1 * (me + 1)), want);
  EXPECT_TRUE(comm_->any(me == w - 1));
  EXPECT_FALSE(comm_->any(false));
  EXPECT_EQ(comm_->broadcast(me == 0 ? std::string("from rank 0") : std::string("x"), 0), "from rank 0");
  EXPECT_EQ(comm_->broadcast(me == 1 ? std::string(3000, 'q') : std::string(), 1), std::string(3000, 'q'));
  // Variable counts (rank r gives r values, rank 0 none), concatenated in rank order.
  std::vector<double> mine;
  for (int i = 0; i < me; ++i) mine.push_back(me + 0.25 * i);
  std::vector<double> expect;
  for (int r = 0; r < w; ++r)
    for (int i = 0; i < r; ++i) expect.push_back(r + 0.25 * i);
  EXPECT_EQ(comm_->all_gather_concat(mine), expect);
  comm_->barrier(60.0);
  EXPECT_FALSE(comm_->host_name().empty());
}

}  // namespace bp
