// embedding: gather against a plain reference at odd sizes, scatter-add backward against a
// double reference and finite differences, += semantics with repeated ids, determinism across
// thread counts, and the id range error.
#include "ops/embedding.h"

#include <gtest/gtest.h>
#include <omp.h>

#include "op_test_util.h"
#include "support/finite_diff.h"
#include "support/test_util.h"

namespace bp {
namespace {

using test::all_close;
using test::random_tensor;
using test::to_double;

std::vector<int32_t> random_ids(size_t n, int32_t vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> d(0, vocab - 1);
  std::vector<int32_t> ids(n);
  for (auto& i : ids) i = d(rng);
  return ids;
}

struct Sizes {
  int64_t T, V, D;
};
const Sizes kSizes[] = {{1, 31, 33}, {31, 1, 32}, {33, 32, 257}, {257, 33, 31}, {32, 257, 1}};

TEST(Embedding, ForwardGathersRowsAtOddSizes) {
  uint64_t seed = 1;
  for (const Sizes& s : kSizes) {
    const auto ids = random_ids(static_cast<size_t>(s.T), static_cast<int32_t>(s.V), ++seed);
    Tensor table = random_tensor({s.V, s.D}, ++seed);
    Tensor y = embedding_forward(Tensor::from_vector(ids, {s.T}), table);
    ASSERT_EQ(y.shape(), (Shape{s.T, s.D}));
    const auto tv = table.to_vector(), yv = y.to_vector();
    std::vector<float> ref(static_cast<size_t>(s.T * s.D));
    for (int64_t t = 0; t < s.T; ++t)
      for (int64_t j = 0; j < s.D; ++j) ref[t * s.D + j] = tv[ids[t] * s.D + j];
    EXPECT_TRUE(all_close(yv, ref, {0, 0})) << "T=" << s.T << " V=" << s.V << " D=" << s.D;
  }
}

// Reference scatter-add in double; ids repeat (T > V in most cases) so rows collect several tokens.
TEST(Embedding, BackwardScatterAddsAndAccumulates) {
  uint64_t seed = 50;
  for (const Sizes& s : kSizes) {
    const auto ids = random_ids(static_cast<size_t>(s.T), static_cast<int32_t>(s.V), ++seed);
    Tensor dy = random_tensor({s.T, s.D}, ++seed);
    Tensor dtable = random_tensor({s.V, s.D}, ++seed);  // existing gradient: must be added to
    std::vector<double> ref = to_double(dtable.to_vector());
    const auto g = dy.to_vector();
    for (int64_t t = 0; t < s.T; ++t)
      for (int64_t j = 0; j < s.D; ++j) ref[ids[t] * s.D + j] += g[t * s.D + j];
    embedding_backward(dy, Tensor::from_vector(ids, {s.T}), dtable);
    EXPECT_TRUE(all_close(to_double(dtable.to_vector()), ref, {1e-5, 1e-5})) << "T=" << s.T << " V=" << s.V;
  }
}

TEST(Embedding, BackwardMatchesFiniteDifferences) {
  const int64_t T = 9, V = 4, D = 5;
  const auto ids = random_ids(T, V, 7);
  Tensor table = random_tensor({V, D}, 8), dy = random_tensor({T, D}, 9);
  Tensor dtable = Tensor::zeros({V, D});
  embedding_backward(dy, Tensor::from_vector(ids, {T}), dtable);
  std::vector<double> tab = to_double(table.to_vector());
  const std::vector<double> g = to_double(dy.to_vector());
  auto loss = [&] {
    double l = 0;
    for (int64_t t = 0; t < T; ++t)
      for (int64_t j = 0; j < D; ++j) l += g[t * D + j] * tab[ids[t] * D + j];
    return l;
  };
  EXPECT_TRUE(all_close(to_double(dtable.to_vector()), test::numeric_gradient(&tab, loss), {1e-6, 1e-6}));
}

TEST(Embedding, BackwardIsDeterministicAcrossThreadCounts) {
  const int64_t T = 2048, V = 7, D = 300;  // heavy id collisions, several column blocks
  const auto ids = random_ids(T, V, 11);
  Tensor dy = random_tensor({T, D}, 12);
  Tensor idt = Tensor::from_vector(ids, {T});
  const int saved = omp_get_max_threads();
  std::vector<std::vector<float>> results;
  for (int threads : {1, 2, 3}) {
    omp_set_num_threads(threads);
    Tensor dtable = Tensor::zeros({V, D});
    embedding_backward(dy, idt, dtable);
    results.push_back(dtable.to_vector());
  }
  omp_set_num_threads(saved);
  EXPECT_TRUE(all_close(results[1], results[0], {0, 0}));
  EXPECT_TRUE(all_close(results[2], results[0], {0, 0}));
}

TEST(Embedding, OutOfRangeIdsAreInputErrors) {
  Tensor table = random_tensor({10, 4}, 1);
  test::expect_op_error(
      [&] {
        embedding_forward(Tensor::from_vector(std::vector<int32_t>{1, 2, 10}, {3}), table);
      },
      ErrorCode::INPUT_VALIDATION_FAILED, {"[embedding]", "10", "position 2"});
  test::expect_op_error([&] { embedding_forward(Tensor::from_vector(std::vector<int32_t>{-1}, {1}), table); },
                        ErrorCode::INPUT_VALIDATION_FAILED, {"-1", "position 0"});
  Tensor dtable = Tensor::zeros({10, 4}), dy = random_tensor({1, 4}, 2);
  test::expect_op_error([&] { embedding_backward(dy, Tensor::from_vector(std::vector<int32_t>{12}, {1}), dtable); },
                        ErrorCode::INPUT_VALIDATION_FAILED, {"12"});
  Tensor dy_bad = random_tensor({1, 5}, 3);
  test::expect_op_error([&] { embedding_backward(dy_bad, Tensor::from_vector(std::vector<int32_t>{1}, {1}), dtable); },
                        ErrorCode::RUNTIME_INTERNAL, {"dy", "[1, 5]", "[1, 4]"});
}

}  // namespace
}  // namespace bp
