// The preference losses against an independent oracle: tests/oracles/torch_llama.py's
// preference_loss writes each loss from its formula (DPO sigmoid / IPO / hinge with label
// smoothing, ORPO, SimPO, KTO) over PyTorch autograd in float64; the C++ side is
// train/preference.h's terms seeding Model::forward_backward_sequences. On tiny models of two
// architectures, LoRA and full fine-tuning, a micro-batch of three pairs (or four KTO examples)
// sharing prompts: the loss and every trainable gradient agree within the parity tolerances of
// tests/model/parity_test.cpp (f32 against f64). If /usr/bin/python3 or torch is missing these
// tests FAIL (never skip).
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <memory>

#include "model/model_test_helpers.h"
#include "train/preference.h"

namespace bp::test {
namespace {

struct PrefCase {
  std::string name;
  TrainMethod method = TrainMethod::Dpo;
  TrainMode mode = TrainMode::Lora;
  DpoLoss dpo_loss = DpoLoss::Sigmoid;
  double label_smoothing = 0.0;
  bool qwen2 = false;  // untied head (trainable in full mode), q/k/v bias
  uint64_t seed = 1;
};

struct Built {
  std::unique_ptr<Model> model;
  std::unique_ptr<TinyLora> lora;
  Batch batch;
  std::vector<PreferenceExample> examples;  // policy fields filled by the C++ pass
  StepNorms norms;
};

PreferenceOptions options_of(const PrefCase& pc) {
  PreferenceOptions o;
  o.beta = pc.method == TrainMethod::Simpo ? 2.0 : 0.1;
  o.dpo_loss = pc.dpo_loss;
  o.label_smoothing = pc.label_smoothing;
  o.orpo_lambda = 0.2;
  o.simpo_gamma = 0.5;
  o.kto_desirable_weight = 1.0;
  o.kto_undesirable_weight = 1.5;
  return o;
}

bool pairwise(const PrefCase& pc) {
  return method_is_pairwise(pc.method);
}

// Pairs: three prompts (3, 2, 4 tokens) each with a chosen and a rejected completion of different
// lengths, packed chosen, rejected, chosen, ...; KTO: four prompt + completion sequences. Labels:
// the completion only (the prompt's positions are −100, as pack_samples makes them).
Built build(const PrefCase& pc) {
  Built b;
  TinySpec spec;
  if (pc.qwen2) {
    spec.arch = Arch::Qwen2;
    spec.bias = true;
    spec.tied = false;
    spec.kv_heads = 1;
  }
  ModelConfig cfg = tiny_config(spec);
  b.model = std::make_unique<Model>(tiny_weights(cfg, pc.seed * 100), ModelOptions{pc.mode, true});
  if (pc.mode == TrainMode::Lora) {
    b.lora = std::make_unique<TinyLora>();
    make_tiny_lora(*b.lora, cfg, 4, 8.0f, false, all_roles(), 0.0f, pc.seed * 100 + 50);
    b.model->attach_lora(b.lora->view);
  }
  std::mt19937_64 rng(pc.seed);
  std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(cfg.vocab_size - 1));
  std::vector<std::vector<int32_t>> ids, labels;
  auto add = [&](const std::vector<int32_t>& prompt, int completion) {
    std::vector<int32_t> s = prompt;
    for (int i = 0; i < completion; ++i) s.push_back(tok(rng));
    std::vector<int32_t> l(s.size(), kIgnoreLabel);
    for (size_t t = prompt.size() - 1; t + 1 < s.size(); ++t) l[t] = s[t + 1];
    ids.push_back(s);
    labels.push_back(l);
  };
  auto prompt = [&](int n) {
    std::vector<int32_t> p;
    for (int i = 0; i < n; ++i) p.push_back(tok(rng));
    return p;
  };
  if (pairwise(pc)) {
    const int prompts[3] = {3, 2, 4}, chosen[3] = {4, 3, 5}, rejected[3] = {2, 5, 3};
    for (int i = 0; i < 3; ++i) {
      const auto p = prompt(prompts[i]);
      add(p, chosen[i]);
      add(p, rejected[i]);
      PreferenceExample e;
      e.ref_c = -20.5 - i;  // as if precomputed; exact in f32 and f64
      e.ref_r = -21.25 + 0.5 * i;
      b.examples.push_back(e);
      b.norms.chosen_tokens += chosen[i];
    }
  } else {
    const int prompts[4] = {3, 2, 4, 2}, completions[4] = {4, 3, 5, 2};
    for (int i = 0; i < 4; ++i) {
      add(prompt(prompts[i]), completions[i]);
      PreferenceExample e;
      e.ref_c = -15.5 - i;
      e.desirable = i % 2 == 0;
      b.examples.push_back(e);
    }
    b.norms.kto_z = 0.25;
  }
  b.norms.examples = static_cast<int64_t>(b.examples.size());
  b.batch = Batch::pack(ids, labels);
  return b;
}

// The oracle's spec: the model case of parity_test.cpp plus the method's settings and references.
void write_case(const std::string& dir, const PrefCase& pc) {
  Built b = build(pc);
  write_oracle_case(dir, *b.model, b.lora.get(), b.batch, OracleAdamW{});
  nlohmann::json spec = nlohmann::json::parse(std::ifstream(dir + "/spec.json"));
  const PreferenceOptions o = options_of(pc);
  nlohmann::json p = {{"method", train_method_name(pc.method)},
                      {"beta", o.beta},
                      {"dpo_loss", dpo_loss_name(o.dpo_loss)},
                      {"label_smoothing", o.label_smoothing},
                      {"orpo_lambda", o.orpo_lambda},
                      {"simpo_gamma", o.simpo_gamma},
                      {"kto_desirable_weight", o.kto_desirable_weight},
                      {"kto_undesirable_weight", o.kto_undesirable_weight},
                      {"kto_z", b.norms.kto_z},
                      {"n_examples", b.norms.examples},
                      {"chosen_tokens", b.norms.chosen_tokens}};
  for (const auto& e : b.examples) {
    p["ref_c"].push_back(e.ref_c);
    p["ref_r"].push_back(e.ref_r);
    p["desirable"].push_back(e.desirable);
  }
  spec["preference"] = p;
  std::ofstream(dir + "/spec.json") << spec.dump();
}

std::vector<PrefCase> cases() {
  std::vector<PrefCase> v;
  uint64_t seed = 1;
  for (TrainMode mode : {TrainMode::Lora, TrainMode::Full}) {
    const std::string m = mode == TrainMode::Lora ? "lora_" : "full_";
    v.push_back({m + "dpo_sigmoid", TrainMethod::Dpo, mode, DpoLoss::Sigmoid, 0.0, false, seed++});
    v.push_back({m + "dpo_ipo", TrainMethod::Dpo, mode, DpoLoss::Ipo, 0.0, true, seed++});
    v.push_back({m + "orpo", TrainMethod::Orpo, mode, DpoLoss::Sigmoid, 0.0, mode == TrainMode::Full, seed++});
    v.push_back({m + "simpo", TrainMethod::Simpo, mode, DpoLoss::Sigmoid, 0.0, false, seed++});
    v.push_back({m + "kto", TrainMethod::Kto, mode, DpoLoss::Sigmoid, 0.0, mode == TrainMode::Full, seed++});
  }
  v.push_back({"lora_dpo_hinge", TrainMethod::Dpo, TrainMode::Lora, DpoLoss::Hinge, 0.0, false, seed++});
  v.push_back({"full_dpo_smoothed", TrainMethod::Dpo, TrainMode::Full, DpoLoss::Sigmoid, 0.2, true, seed++});
  v.push_back({"lora_simpo_smoothed", TrainMethod::Simpo, TrainMode::Lora, DpoLoss::Sigmoid, 0.1, true, seed++});
  return v;
}

const std::map<std::string, OracleResult>& oracle_results(std::string* error) {
  static std::string err;
  static TempDir dir;
  static const std::map<std::string, OracleResult> results = [] {
    std::map<std::string, OracleResult> r;
    std::vector<std::string> dirs;
    const auto all = cases();
    for (const auto& c : all) {
      dirs.push_back(dir.path + "/" + c.name);
      write_case(dirs.back(), c);
    }
    if (run_torch_oracle(dirs, &err))
      for (size_t i = 0; i < all.size(); ++i) r[all[i].name] = read_oracle_result(dirs[i] + "/out");
    return r;
  }();
  *error = err;
  return results;
}

TEST(PreferenceParity, LossesAndEveryTrainableGradientMatchTorch) {
  std::string error;
  const auto& results = oracle_results(&error);
  ASSERT_TRUE(error.empty()) << error;
  for (const PrefCase& pc : cases()) {
    SCOPED_TRACE(pc.name);
    const auto it = results.find(pc.name);
    ASSERT_NE(it, results.end());
    const OracleResult& ref = it->second;
    Built b = build(pc);
    const PreferenceOptions o = options_of(pc);
    double loss = 0;
    b.model->zero_grads();
    b.model->forward_backward_sequences(
        b.batch,
        [&](const Model::SequenceLosses& l) {
          std::vector<float> g(l.loss_sum.size());
          size_t at = 0;
          for (auto& e : b.examples) {
            e.logp_c = -l.loss_sum[at];
            e.n_c = l.n_counted[at];
            const size_t ic = at++;
            size_t ir = ic;
            if (pairwise(pc)) {
              ir = at++;
              e.logp_r = -l.loss_sum[ir];
              e.n_r = l.n_counted[ir];
            }
            const PreferenceTerm t = preference_term(pc.method, o, e, b.norms);
            loss += t.loss;
            g[ic] = static_cast<float>(-t.dlogp_c);
            if (pairwise(pc)) g[ir] = static_cast<float>(-t.dlogp_r);
          }
          EXPECT_EQ(at, l.loss_sum.size());
          return g;
        },
        0);
    EXPECT_NEAR(loss, ref.loss, kParityLossRel * std::fabs(ref.loss) + 1e-7) << "loss";
    const auto params = b.model->trainable_parameters();
    ASSERT_FALSE(params.empty());
    for (const auto& p : params) {
      const auto g = ref.arrays.find("grad:" + p.name);
      ASSERT_NE(g, ref.arrays.end()) << "the oracle has no gradient for " << p.name;
      const double scale = max_abs(g->second);
      if (scale == 0.0) continue;  // e.g. an embedding row no token uses
      EXPECT_TRUE(all_close(to_double(*p.grad), g->second, Tolerance{kParityGradOfMax * scale, kParityGradRel}))
          << p.name << " (max|ref| " << scale << ")";
    }
  }
}

// The per-sequence pass with every sequence's scale 1/N_labels is the plain SFT pass: the same
// loss and the same gradients (frozen head: dx scaled after; trainable head: a second pass).
TEST(PreferenceParity, SequenceScalesOfOneOverLabelsReproduceTheSftPass) {
  for (TrainMode mode : {TrainMode::Lora, TrainMode::Full}) {
    PrefCase pc{"sft", TrainMethod::Dpo, mode, DpoLoss::Sigmoid, 0.0, true, 7};
    Built a = build(pc), b = build(pc);
    const int64_t n = a.batch.num_label_tokens();
    a.model->zero_grads();
    const auto r = a.model->forward_backward(a.batch, 1.0f / static_cast<float>(n), 0);
    b.model->zero_grads();
    const auto l = b.model->forward_backward_sequences(
        b.batch, [&](const Model::SequenceLosses& s) { return std::vector<float>(s.loss_sum.size(), 1.0f / n); }, 0);
    double sum = 0;
    for (double x : l.loss_sum) sum += x;
    EXPECT_NEAR(sum, r.loss_sum, 1e-5 * r.loss_sum);
    const auto pa = a.model->trainable_parameters(), pb = b.model->trainable_parameters();
    ASSERT_EQ(pa.size(), pb.size());
    for (size_t i = 0; i < pa.size(); ++i) {
      const auto ga = to_double(*pa[i].grad), gb = to_double(*pb[i].grad);
      const double scale = max_abs(ga);
      EXPECT_TRUE(all_close(gb, ga, Tolerance{1e-5 * scale + 1e-12, 1e-4})) << pa[i].name;
    }
  }
}

// The adapter switched off runs the base alone: the same per-sequence losses as a model without
// LoRA, and switched on again, the adapter's.
TEST(PreferenceParity, AdapterOffIsTheBaseModel) {
  PrefCase pc{"off", TrainMethod::Dpo, TrainMode::Lora, DpoLoss::Sigmoid, 0.0, false, 3};
  Built b = build(pc);
  ModelConfig cfg = tiny_config(TinySpec{});
  Model base(tiny_weights(cfg, pc.seed * 100), ModelOptions{TrainMode::Frozen, true});
  const auto with = b.model->sequence_losses(b.batch);
  b.model->set_lora_enabled(false);
  EXPECT_FALSE(b.model->lora_enabled());
  const auto off = b.model->sequence_losses(b.batch);
  const auto plain = base.sequence_losses(b.batch);
  b.model->set_lora_enabled(true);
  const auto again = b.model->sequence_losses(b.batch);
  ASSERT_EQ(off.loss_sum.size(), plain.loss_sum.size());
  for (size_t i = 0; i < off.loss_sum.size(); ++i) {
    EXPECT_EQ(off.loss_sum[i], plain.loss_sum[i]) << i;
    EXPECT_EQ(again.loss_sum[i], with.loss_sum[i]) << i;
    EXPECT_NE(off.loss_sum[i], with.loss_sum[i]) << i;  // the adapter (B random here) changes the loss
  }
}

}  // namespace
}  // namespace bp::test
