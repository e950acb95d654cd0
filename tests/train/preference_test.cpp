// train/preference.h: each method's loss and its gradient in the sequences' log-probabilities
// (central differences in double), the reductions over a step, KTO's reference point, the metrics
// under TRL's names, and the settings a method refuses.
#include "train/preference.h"

#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/settings.h"
#include "train/train_options.h"

namespace bp {
namespace {

struct Variant {
  const char* name;
  TrainMethod method;
  PreferenceOptions o;
};

std::vector<Variant> variants() {
  std::vector<Variant> v;
  PreferenceOptions base;
  v.push_back({"dpo", TrainMethod::Dpo, base});
  PreferenceOptions ls = base;
  ls.label_smoothing = 0.3;
  v.push_back({"dpo_smoothed", TrainMethod::Dpo, ls});
  PreferenceOptions ipo = base;
  ipo.dpo_loss = DpoLoss::Ipo;
  v.push_back({"ipo", TrainMethod::Dpo, ipo});
  PreferenceOptions hinge = base;
  hinge.dpo_loss = DpoLoss::Hinge;
  v.push_back({"hinge", TrainMethod::Dpo, hinge});
  PreferenceOptions orpo = base;
  orpo.orpo_lambda = 0.7;
  v.push_back({"orpo", TrainMethod::Orpo, orpo});
  PreferenceOptions simpo = base;
  simpo.beta = 2.0;
  simpo.simpo_gamma = 0.8;
  simpo.label_smoothing = 0.1;
  v.push_back({"simpo", TrainMethod::Simpo, simpo});
  PreferenceOptions kto = base;
  kto.kto_desirable_weight = 1.3;
  kto.kto_undesirable_weight = 0.6;
  v.push_back({"kto", TrainMethod::Kto, kto});
  return v;
}

TEST(Preference, GradientsAreTheDerivativesOfTheLosses) {
  const StepNorms norms{4, 37, 0.3};
  for (const Variant& v : variants()) {
    for (int k = 0; k < 6; ++k) {
      PreferenceExample e;
      e.logp_c = -9.0 - 2.5 * k;
      e.logp_r = -12.0 + 1.7 * k;
      e.n_c = 5 + k;
      e.n_r = 7 - k;
      e.ref_c = -10.0 + 0.9 * k;
      e.ref_r = -11.5 + 0.4 * k;
      e.desirable = k % 2 == 0;
      const PreferenceTerm t = preference_term(v.method, v.o, e, norms);
      const double h = 1e-5;
      auto loss_at = [&](double dc, double dr) {
        PreferenceExample x = e;
        x.logp_c += dc;
        x.logp_r += dr;
        return preference_term(v.method, v.o, x, norms).loss;
      };
      const double fd_c = (loss_at(h, 0) - loss_at(-h, 0)) / (2 * h);
      const double fd_r = (loss_at(0, h) - loss_at(0, -h)) / (2 * h);
      EXPECT_NEAR(t.dlogp_c, fd_c, 1e-6 + 1e-5 * std::fabs(fd_c)) << v.name << " example " << k;
      EXPECT_NEAR(t.dlogp_r, fd_r, 1e-6 + 1e-5 * std::fabs(fd_r)) << v.name << " example " << k;
      EXPECT_TRUE(std::isfinite(t.loss)) << v.name;
    }
  }
}

TEST(Preference, DpoSigmoidIsThePapersFormula) {
  PreferenceExample e;
  e.logp_c = -10;
  e.logp_r = -14;
  e.ref_c = -11;
  e.ref_r = -12;
  const PreferenceTerm t = preference_term(TrainMethod::Dpo, PreferenceOptions{}, e, StepNorms{2, 0, 0});
  const double h = (-10 - -11) - (-14 - -12);  // 3
  EXPECT_NEAR(t.loss, std::log1p(std::exp(-0.1 * h)) / 2, 1e-15);
  EXPECT_NEAR(t.reward_c, 0.1, 1e-15);
  EXPECT_NEAR(t.reward_r, -0.2, 1e-15);
}

TEST(Preference, OrpoAddsTheChosenNllAsAMeanOverTheStepsChosenTokens) {
  PreferenceExample e;
  e.logp_c = -6;
  e.logp_r = -9;
  e.n_c = 3;
  e.n_r = 3;
  PreferenceOptions o;
  o.orpo_lambda = 0;  // the odds-ratio term off: the NLL alone
  const PreferenceTerm t = preference_term(TrainMethod::Orpo, o, e, StepNorms{2, 12, 0});
  EXPECT_NEAR(t.loss, 6.0 / 12.0, 1e-15);
  EXPECT_NEAR(t.dlogp_c, -1.0 / 12.0, 1e-15);
  EXPECT_EQ(t.dlogp_r, 0.0);
}

TEST(Preference, KtoReferencePointIsTheClampedMeanOfTheKlDifferences) {
  EXPECT_DOUBLE_EQ(kto_reference_point({-10, -12}, {-11, -12.5}), 0.75);
  EXPECT_DOUBLE_EQ(kto_reference_point({-10, -12}, {-9, -11}), 0.0);  // clamped at 0
  EXPECT_DOUBLE_EQ(kto_reference_point({}, {}), 0.0);
}

TEST(Preference, MetricsUseTrlsNames) {
  PreferenceMetrics m;
  PreferenceExample e;
  e.logp_c = -3;
  e.logp_r = -5;
  PreferenceTerm t;
  t.reward_c = 0.4;
  t.reward_r = 0.1;
  m.add(e, t);
  t.reward_c = -0.2;
  t.reward_r = 0.2;
  m.add(e, t);
  nlohmann::json j;
  m.write(j, "eval_");
  EXPECT_DOUBLE_EQ(j["eval_rewards/chosen"].get<double>(), 0.1);
  EXPECT_DOUBLE_EQ(j["eval_rewards/rejected"].get<double>(), 0.15);
  EXPECT_DOUBLE_EQ(j["eval_rewards/accuracies"].get<double>(), 0.5);
  EXPECT_DOUBLE_EQ(j["eval_rewards/margins"].get<double>(), -0.05);
  EXPECT_DOUBLE_EQ(j["eval_logps/chosen"].get<double>(), -3);
  EXPECT_DOUBLE_EQ(j["eval_logps/rejected"].get<double>(), -5);
}

Settings base_settings() {
  Settings s;
  s.set("model.path", "m");
  s.set("data.path", "d.jsonl");
  return s;
}

TEST(Preference, ASettingOfAnotherMethodIsRefusedNotIgnored) {
  Settings s = base_settings();
  s.set("training.method", "orpo");
  s.set("training.beta", "0.5");
  try {
    TrainOptions::from_settings(s);
    FAIL() << "--beta with --method orpo was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::CONFIG_INVALID_SETTING);
    EXPECT_NE(std::string(e.what()).find("--beta"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("orpo"), std::string::npos) << e.what();
  }
  Settings sft = base_settings();
  sft.set("training.dpo_loss", "ipo");
  EXPECT_THROW(TrainOptions::from_settings(sft), Error);
  // Its default given explicitly (a replayed or resumed run's saved settings) changes nothing.
  Settings replayed = base_settings();
  replayed.set("training.beta", "0.10");
  replayed.set("training.dpo_loss", "sigmoid");
  EXPECT_NO_THROW(TrainOptions::from_settings(replayed));
  Settings ok = base_settings();
  ok.set("training.method", "dpo");
  ok.set("training.beta", "0.5");
  ok.set("training.dpo_loss", "hinge");
  const TrainOptions o = TrainOptions::from_settings(ok);
  EXPECT_EQ(o.method, TrainMethod::Dpo);
  EXPECT_EQ(o.pref.beta, 0.5);
  EXPECT_EQ(o.pref.dpo_loss, DpoLoss::Hinge);
  EXPECT_EQ(resolve_reference(o), ReferenceSource::AdapterOff);  // auto in LoRA mode
}

// Preference losses read completions only: --train-on-all with them is refused, not ignored; its
// default (false) given explicitly passes.
TEST(Preference, TrainOnAllIsRefusedForAPreferenceMethod) {
  for (const char* method : {"dpo", "orpo", "simpo", "kto"}) {
    Settings s = base_settings();
    s.set("training.method", method);
    s.set("data.train_on_all", "true");
    try {
      TrainOptions::from_settings(s);
      ADD_FAILURE() << "--train-on-all with --method " << method << " was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::CONFIG_INVALID_SETTING);
      EXPECT_NE(std::string(e.what()).find("--train-on-all"), std::string::npos) << e.what();
    }
    s.set("data.train_on_all", "false");
    EXPECT_NO_THROW(TrainOptions::from_settings(s));
  }
  Settings sft = base_settings();
  sft.set("data.train_on_all", "true");
  EXPECT_TRUE(TrainOptions::from_settings(sft).train_on_all);
}

TEST(Preference, ReferenceResolvesByModeAndAdapterOffNeedsLora) {
  Settings full = base_settings();
  full.set("training.method", "kto");
  full.set("training.mode", "full");
  EXPECT_EQ(resolve_reference(TrainOptions::from_settings(full)), ReferenceSource::Precomputed);
  full.set("training.reference", "adapter-off");
  try {
    TrainOptions::from_settings(full);
    FAIL() << "adapter-off in full mode was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::CONFIG_INVALID_SETTING);
  }
}

TEST(Preference, TheReferenceOfARunFromAnAdapterIsThatModelNotTheBase) {
  Settings s = base_settings();
  s.set("training.method", "dpo");
  s.set("training.init_adapter", "sft-adapter");
  EXPECT_EQ(resolve_reference(TrainOptions::from_settings(s)), ReferenceSource::Precomputed);
  s.set("training.reference", "adapter-off");
  EXPECT_THROW(TrainOptions::from_settings(s), Error);
}

TEST(Preference, UnknownMethodIsAnErrorWithTheChoices) {
  Settings s = base_settings();
  EXPECT_THROW(s.set("training.method", "rlhf"), Error);
  EXPECT_THROW(parse_train_method("rlhf"), Error);
}

}  // namespace
}  // namespace bp
