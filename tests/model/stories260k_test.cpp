// The real stories260K model (../shared/models/stories260K, see its README) against its golden
// files: logits of "Once upon a time" (tolerance 1e-4, as the README advises for f32), the
// mean loss of the 193-token sequence, and llama2.c run.c's greedy continuations token for
// token, produced by our KV-cache decoder.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "model/generate.h"
#include "model/loader.h"
#include "model/transformer.h"
#include "support/test_util.h"

namespace bp::test {
namespace {

std::string model_dir() {
  return shared_dir() + "/models/stories260K";
}

nlohmann::json golden(const std::string& name) {
  std::ifstream f(model_dir() + "/golden/" + name);
  if (!f) ADD_FAILURE() << "missing golden file " << model_dir() << "/golden/" << name;
  return nlohmann::json::parse(f);
}

Model frozen_model() {
  return Model(load_model(model_dir()), ModelOptions{TrainMode::Frozen});
}

std::vector<int32_t> iota_i32(size_t n) {
  std::vector<int32_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<int32_t>(i);
  return v;
}

TEST(Stories260K, LogitsMatchGolden) {
  Model model = frozen_model();
  auto g = golden("logits.json");
  auto ids = g["input_ids"].get<std::vector<int32_t>>();
  const int64_t T = static_cast<int64_t>(ids.size());
  Tensor logits = model.logits(Tensor::from_vector(ids, {T}), Tensor::from_vector(iota_i32(ids.size()), {T}));
  ASSERT_EQ(logits.shape(), Shape({T, 512}));
  auto v = logits.to_vector();
  std::vector<float> last(v.end() - 512, v.end());
  EXPECT_TRUE(all_close(last, g["final_logits"].get<std::vector<float>>(), Tolerance{1e-4, 0}));
  auto first8 = g["first8_per_position"].get<std::vector<std::vector<float>>>();
  ASSERT_EQ(static_cast<int64_t>(first8.size()), T);
  for (int64_t t = 0; t < T; ++t) {
    std::vector<float> got(v.begin() + t * 512, v.begin() + t * 512 + 8);
    EXPECT_TRUE(all_close(got, first8[static_cast<size_t>(t)], Tolerance{1e-4, 0})) << "position " << t;
  }
}

TEST(Stories260K, LossMatchesGoldenAndPackingKeepsSamplesApart) {
  Model model = frozen_model();
  auto g = golden("loss.json");
  auto ids = g["input_ids"].get<std::vector<int32_t>>();
  CrossEntropyResult r = model.forward_loss(Batch::causal_lm({ids}));
  EXPECT_EQ(r.n_counted, static_cast<int64_t>(ids.size()) - 1);
  EXPECT_NEAR(r.mean(), g["loss"].get<double>(), 1e-5);

  // Per-sample losses (prompt + output of each greedy sample), alone and packed together: a
  // packed batch must give each sample exactly its own loss (no attention across samples).
  auto greedy = golden("greedy.json");
  std::vector<std::vector<int32_t>> samples;
  double sum_alone = 0;
  int64_t n_alone = 0;
  for (size_t s = 0; s < 3; ++s) {
    auto seq = greedy["samples"][s]["input_ids"].get<std::vector<int32_t>>();
    auto out = greedy["samples"][s]["output_ids"].get<std::vector<int32_t>>();
    seq.insert(seq.end(), out.begin(), out.end());
    CrossEntropyResult one = model.forward_loss(Batch::causal_lm({seq}));
    EXPECT_NEAR(one.mean(), g["per_sample_prompt_plus_output"][s]["loss"].get<double>(), 1e-5) << "sample " << s;
    sum_alone += one.loss_sum;
    n_alone += one.n_counted;
    samples.push_back(seq);
  }
  CrossEntropyResult packed = model.forward_loss(Batch::causal_lm(samples));
  EXPECT_EQ(packed.n_counted, n_alone);
  EXPECT_NEAR(packed.loss_sum, sum_alone, 1e-4);
}

TEST(Stories260K, GreedyContinuationsMatchRunC) {
  Model model = frozen_model();
  auto g = golden("greedy.json");
  ASSERT_EQ(g["samples"].size(), 3u);
  for (const auto& s : g["samples"]) {
    auto prompt = s["input_ids"].get<std::vector<int32_t>>();
    auto expected = s["output_ids"].get<std::vector<int32_t>>();
    GenerateOptions opts;
    opts.max_new_tokens = static_cast<int64_t>(expected.size());
    GenerateResult res = generate(model, prompt, opts);
    EXPECT_EQ(res.tokens, expected) << "prompt \"" << s["prompt"].get<std::string>() << "\"";
    EXPECT_FALSE(res.stopped);
  }
}

}  // namespace
}  // namespace bp::test
