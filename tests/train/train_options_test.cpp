// TrainOptions::from_settings is the settings table expanded a second time (the last column of each
// row of core/settings_registry.inc). These tests walk that table: every row of a section `train`
// reads says what training does with it, and every row that fills TrainOptions changes the options
// it produces when set to another value. A setting that is accepted but does nothing fails here.
#include "train/train_options.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/settings.h"

namespace bp {
namespace {

// The sections whose rows must all say what `train` does with them.
bool in_a_training_section(std::string_view key) {
  for (std::string_view section : {"model.", "lora.", "training.", "data.", "monitor."})
    if (key.starts_with(section)) return true;
  return false;
}

// A valid value other than the default, from the row's type and range.
std::string another_value(const SettingSpec& spec) {
  static const std::map<std::string, std::string> valid_for = {
      {"lora.target_modules", "q_proj,v_proj"},  // names the LoRA check accepts
      {"training.reference", "precomputed"},     // auto is adapter-off in LoRA mode
      {"lora.init_lora_weights", "pissa"},       // true, pissa or pissa_niter_N
  };
  if (auto it = valid_for.find(spec.key); it != valid_for.end()) return it->second;
  const std::string def = spec.default_value;
  switch (spec.type) {
    case SettingType::Bool: return def == "true" ? "false" : "true";
    case SettingType::Int: {
      const long long d = std::stoll(def);
      return std::to_string(static_cast<double>(d + 1) <= spec.max ? d + 1 : d - 1);
    }
    case SettingType::Float: {
      const double d = std::stod(def);
      for (double v : {d + 0.5, d / 2, (spec.min + spec.max) / 2})
        if (v >= spec.min && v <= spec.max && v != d) return std::to_string(v);
      return def;
    }
    case SettingType::Enum: {
      std::string_view choices = spec.choices;
      for (size_t at = 0; at <= choices.size();) {
        const size_t bar = std::min(choices.find('|', at), choices.size());
        std::string choice(choices.substr(at, bar - at));
        if (choice != def) return choice;
        at = bar + 1;
      }
      return def;
    }
    case SettingType::String:
      switch (spec.rule) {
        case StringRule::AutoOrPositiveInt: return "3";
        case StringRule::AutoOrBytes: return "1G";
        case StringRule::Device: return "cpu";
        case StringRule::JsonObject: return "{\"enable_thinking\": false}";
        default: return def + "changed";
      }
  }
  return def;
}

// Settings that only act together with another: set on both sides of the comparison.
const std::map<std::string, std::vector<std::pair<std::string, std::string>>>& companions() {
  static const std::map<std::string, std::vector<std::pair<std::string, std::string>>> c = {
      {"training.init_from_config", {{"training.mode", "full"}}},                      // from scratch needs full
      {"training.fault_inject_nan_count", {{"training.fault_inject_nan_step", "2"}}},  // steps from there
      {"training.matmul_dtype", {{"training.mode", "full"}}},                          // full mode's GEMMs
      // A preference method's setting, with a method that reads it (another's refuses it).
      {"training.beta", {{"training.method", "dpo"}}},
      {"training.dpo_loss", {{"training.method", "dpo"}}},
      {"training.label_smoothing", {{"training.method", "dpo"}}},
      {"training.reference", {{"training.method", "dpo"}}},
      {"training.orpo_lambda", {{"training.method", "orpo"}}},
      {"training.simpo_gamma", {{"training.method", "simpo"}}},
      {"training.kto_desirable_weight", {{"training.method", "kto"}}},
      {"training.kto_undesirable_weight", {{"training.method", "kto"}}},
  };
  return c;
}

TrainOptions options_with(const std::string& key, const std::string* value) {
  Settings s;
  s.set("model.path", "model-folder");
  s.set("data.path", "data.jsonl");
  if (auto it = companions().find(key); it != companions().end())
    for (const auto& [k, v] : it->second) s.set(k, v);
  if (value) s.set(key, *value);
  TrainOptions o = TrainOptions::from_settings(s);
  o.resolved_settings = nullptr;  // every setting shows there; the test is about what training uses
  return o;
}

TEST(TrainOptionsFromSettings, EveryRowOfATrainingSectionSaysWhatTrainingDoesWithIt) {
  int rows = 0;
  for (const SettingSpec& spec : settings_registry()) {
    if (!in_a_training_section(spec.key)) continue;
    ++rows;
    EXPECT_NE(train_use(spec.key), TrainUse::Unmarked)
        << spec.key << ": add BP_FILLS(member), BP_FILLS_WITH(function), BP_READ_BY_TRAIN_COMMAND or "
        << "BP_NOT_FOR_TRAIN to its row in src/core/settings_registry.inc";
  }
  EXPECT_GT(rows, 50);
  EXPECT_EQ(train_use("training.lr"), TrainUse::Fills);
  EXPECT_EQ(train_use("training.preset"), TrainUse::ReadByCommand);
  EXPECT_EQ(train_use("training.vram_gb"), TrainUse::NotTaken);
  EXPECT_EQ(train_use("export.format"), TrainUse::Unmarked);
  EXPECT_TRUE(train_takes_setting("monitor.enabled"));
  EXPECT_FALSE(train_takes_setting("training.vram_gb"));
}

// The "accepted but does nothing" check: each filling row, set to a value other than its default,
// gives different TrainOptions (compared member by member, TrainOptions::operator==).
TEST(TrainOptionsFromSettings, EveryFillingSettingChangesTheOptions) {
  int checked = 0;
  for (const SettingSpec& spec : settings_registry()) {
    if (train_use(spec.key) != TrainUse::Fills) continue;
    const std::string key = spec.key;
    const std::string value = another_value(spec);
    SCOPED_TRACE(key + " = " + value);
    const TrainOptions base = options_with(key, nullptr);
    const TrainOptions changed = options_with(key, &value);
    EXPECT_FALSE(base == changed) << key << " = " << value << " left TrainOptions unchanged";
    ++checked;
  }
  EXPECT_GT(checked, 45);
}

// The comparison itself sees a change (so the test above can fail) and the conversions are the
// ones training needs.
TEST(TrainOptionsFromSettings, ConversionsByMemberType) {
  const TrainOptions a = options_with("training.lr", nullptr);
  EXPECT_TRUE(a == options_with("training.lr", nullptr));
  EXPECT_EQ(a.micro_batch_size, 0) << "auto";
  EXPECT_FALSE(a.gradient_checkpointing.has_value()) << "auto";
  EXPECT_EQ(a.fault_oom_step, -1);
  EXPECT_TRUE(a.fault_nan_steps.empty());
  EXPECT_EQ(a.max_memory_bytes, SIZE_MAX);
  EXPECT_TRUE(a.max_memory_auto);
  EXPECT_TRUE(a.monitor.enabled);
  EXPECT_EQ(a.monitor.memory_headroom_bytes, -1);

  Settings s;
  s.set("model.path", "m");
  s.set("data.path", "d.jsonl");
  s.set("training.epochs", "1.2");
  s.set("training.micro_batch_size", "4");
  s.set("training.gradient_checkpointing", "false");
  s.set("training.fault_inject_oom_step", "3");
  s.set("training.fault_inject_nan_step", "5");
  s.set("training.fault_inject_nan_count", "2");
  s.set("training.max_memory", "2G");
  s.set("lora.target_modules", "q_proj, v_proj");
  s.set("monitor.memory_low", "none");
  const TrainOptions o = TrainOptions::from_settings(s);
  EXPECT_DOUBLE_EQ(o.epochs, 1.2) << "fractions are kept (total_optimizer_steps rounds the steps)";
  EXPECT_EQ(o.micro_batch_size, 4);
  EXPECT_EQ(o.gradient_checkpointing, std::optional<bool>(false));
  EXPECT_EQ(o.fault_oom_step, 2) << "steps done before the failing one";
  EXPECT_EQ(o.fault_nan_steps, (std::vector<int64_t>{5, 6}));
  EXPECT_EQ(o.max_memory_bytes, size_t{2} << 30);
  EXPECT_FALSE(o.max_memory_auto);
  EXPECT_EQ(o.lora.target_modules, (std::vector<std::string>{"q_proj", "v_proj"}));
  EXPECT_EQ(o.monitor.memory_low_bytes, 0);
}

// --matmul-dtype sets full fine-tuning's GEMMs: in a LoRA run only auto is accepted, as a flag that
// would do nothing there is refused with what to use instead.
TEST(TrainOptionsFromSettings, MatmulDtypeOutsideFullModeIsRefused) {
  Settings s;
  s.set("model.path", "m");
  s.set("data.path", "d.jsonl");
  s.set("training.matmul_dtype", "bf16");
  try {
    TrainOptions::from_settings(s);
    ADD_FAILURE() << "--matmul-dtype bf16 accepted in a LoRA run";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::CONFIG_INVALID_SETTING) << e.what();
    EXPECT_NE(e.suggestion().find("--base-dtype bf16"), std::string::npos) << e.suggestion();
  }
  s.set("training.mode", "full");
  EXPECT_EQ(TrainOptions::from_settings(s).matmul_dtype, "bf16");
}

// --epochs as Hugging Face's num_train_epochs: ceil(epochs x steps per epoch) optimizer steps, so a
// fraction of an epoch is that fraction of its steps, not a whole pass (QA: 0.5 ran 4 steps of 4).
TEST(TrainOptionsFromSettings, FractionalEpochsTakeThatShareOfTheSteps) {
  Settings s;
  s.set("model.path", "m");
  s.set("data.path", "d.jsonl");
  s.set("training.batch_size", "4");
  auto steps_for = [&](const char* epochs, int64_t samples) {
    s.set("training.epochs", epochs);
    return total_optimizer_steps(TrainOptions::from_settings(s), samples);
  };
  EXPECT_EQ(steps_for("1", 16), 4);
  EXPECT_EQ(steps_for("0.5", 16), 2);
  EXPECT_EQ(steps_for("1.5", 16), 6);
  EXPECT_EQ(steps_for("0.3", 16), 2) << "1.2 steps rounds up";
  EXPECT_EQ(steps_for("0.001", 16), 1) << "at least one step";
  EXPECT_EQ(steps_for("2", 13), 8) << "a partial last batch is a step of its epoch";
  EXPECT_EQ(steps_for("2.2", 100), 55) << "2.2 x 25 is 55.00000000000001 in doubles: 55 steps, not 56";
  s.set("training.steps", "3");
  EXPECT_EQ(steps_for("0.5", 16), 3) << "--steps wins over --epochs";
}

// A --grad-accum that does not divide --batch-size used to change the batch silently (8 / 3
// trained 6 a step, 8 / 16 trained 16): refused, with the divisors and the nearest batch sizes.
TEST(TrainOptionsFromSettings, GradAccumThatDoesNotDivideTheBatchIsRefused) {
  Settings s;
  s.set("model.path", "m");
  s.set("data.path", "d.jsonl");
  s.set("training.batch_size", "8");
  s.set("training.grad_accum", "4");
  TrainOptions o = TrainOptions::from_settings(s);
  EXPECT_EQ(o.batch_size, 8);
  EXPECT_EQ(o.micro_batch_size, 2);
  for (const char* accum : {"3", "16"}) {
    s.set("training.grad_accum", accum);
    try {
      o = TrainOptions::from_settings(s);
      ADD_FAILURE() << "--grad-accum " << accum << " accepted with --batch-size 8: trains "
                    << o.micro_batch_size * o.grad_accum << " a step";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::CONFIG_INVALID_SETTING) << e.what();
      EXPECT_NE(std::string(e.what()).find(fmt::format("--grad-accum {} does not divide --batch-size 8", accum)),
                std::string::npos)
          << e.what();
      EXPECT_NE(e.suggestion().find("(1, 2, 4, 8)"), std::string::npos) << e.suggestion();
      EXPECT_NE(e.suggestion().find(std::string(accum) == "3" ? "(6 or 9)" : "(16)"), std::string::npos)
          << e.suggestion();
    }
  }
  // With --micro-batch-size the batch is micro x accumulation (Hugging Face style): any accumulation.
  s.set("training.micro_batch_size", "2");
  s.set("training.batch_size", "6");
  s.set("training.grad_accum", "3");
  o = TrainOptions::from_settings(s);
  EXPECT_EQ(o.batch_size, 6);
}

}  // namespace
}  // namespace bp
