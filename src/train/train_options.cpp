// TrainOptions from the settings table (core/settings.h): the rows of core/settings_registry.inc
// expanded a second time, each BP_FILLS(member) into a function that reads the setting into that
// member with the conversion its type calls for. So every flag, TOML key and BACKPROPAGATE_*
// variable acts the same, and a new setting is one row (plus its member in train_options.h).
#include "train/train_options.h"

#include <algorithm>
#include <cmath>

#include "core/settings.h"

namespace bp {

namespace {

// ---- conversions by member type ----------------------------------------------------------------

void read_into(std::string& v, const Settings& s, std::string_view k) {
  v = s.get_string(k);
}
void read_into(bool& v, const Settings& s, std::string_view k) {
  v = s.get_bool(k);
}
void read_into(double& v, const Settings& s, std::string_view k) {
  v = s.get_float(k);
}
void read_into(float& v, const Settings& s, std::string_view k) {
  v = static_cast<float>(s.get_float(k));
}
void read_into(uint64_t& v, const Settings& s, std::string_view k) {
  v = s.get_uint(k);
}
void read_into(int& v, const Settings& s, std::string_view k) {
  v = static_cast<int>(s.get_int(k));
}
// An Int setting, or "auto" | N (StringRule::AutoOrPositiveInt) with auto = 0.
void read_into(int64_t& v, const Settings& s, std::string_view k) {
  const SettingSpec* spec = find_setting(k);
  if (spec && spec->type == SettingType::String && spec->rule == StringRule::AutoOrPositiveInt) {
    const std::string& text = s.get_string(k);
    v = text == "auto" ? 0 : std::stoll(text);
  } else {
    v = s.get_int(k);
  }
}
void read_into(std::vector<std::string>& v, const Settings& s, std::string_view k) {
  v = split_list(s.get_string(k));
}
void read_into(std::optional<bool>& v, const Settings& s, std::string_view k) {  // auto|true|false
  const std::string& text = s.get_string(k);
  v = text == "auto" ? std::nullopt : std::optional<bool>(text == "true");
}
void read_into(LrScheduler& v, const Settings& s, std::string_view k) {
  v = parse_lr_scheduler(s.get_string(k));
}
void read_into(TrainMethod& v, const Settings& s, std::string_view k) {
  v = parse_train_method(s.get_string(k));
}
void read_into(DpoLoss& v, const Settings& s, std::string_view k) {
  v = parse_dpo_loss(s.get_string(k));
}
void read_into(ReferenceSource& v, const Settings& s, std::string_view k) {
  v = parse_reference_source(s.get_string(k));
}
void read_into(TrainMode& v, const Settings& s, std::string_view k) {
  v = s.get_string(k) == "full" ? TrainMode::Full : TrainMode::Lora;
}

// "auto" = -1, "none" = 0, else a size (monitor.memory_headroom, monitor.memory_low).
int64_t auto_none_or_bytes(const Settings& s, std::string_view k) {
  const std::string& v = s.get_string(k);
  if (v == "auto") return -1;
  if (v == "none") return 0;
  return static_cast<int64_t>(parse_byte_size(v, k));
}

// ---- the BP_FILLS_WITH functions ---------------------------------------------------------------

void fill_max_memory(TrainOptions& o, const Settings& s, std::string_view k) {
  const std::string& mm = s.get_string(k);
  o.max_memory_bytes = (mm == "auto" || mm == "none") ? SIZE_MAX : parse_byte_size(mm, k);
  o.max_memory_auto = mm == "auto";
}
void fill_monitor_headroom(TrainOptions& o, const Settings& s, std::string_view k) {
  o.monitor.memory_headroom_bytes = auto_none_or_bytes(s, k);
}
void fill_monitor_memory_low(TrainOptions& o, const Settings& s, std::string_view k) {
  o.monitor.memory_low_bytes = auto_none_or_bytes(s, k);
}
void fill_fault_oom_step(TrainOptions& o, const Settings& s, std::string_view k) {
  const int64_t step = s.get_int(k);
  o.fault_oom_step = step > 0 ? step - 1 : -1;  // options count the steps done before the failing one
}
// Rows fault_inject_nan_step and fault_inject_nan_count both: steps [step, step + count).
void fill_fault_nan_steps(TrainOptions& o, const Settings& s, std::string_view) {
  o.fault_nan_steps.clear();
  if (int64_t k = s.get_int("training.fault_inject_nan_step"); k > 0)
    for (int64_t i = 0; i < s.get_int("training.fault_inject_nan_count"); ++i) o.fault_nan_steps.push_back(k + i);
}

// ---- the rows ----------------------------------------------------------------------------------

using FillFn = void (*)(TrainOptions&, const Settings&, std::string_view key);
struct Use {
  TrainUse use = TrainUse::Unmarked;
  FillFn fill = nullptr;
};
struct TrainRow {
  const char* key;
  Use use;
  // Takes a row of settings_registry.inc as written, with or without its last (training) column.
  constexpr TrainRow(const char* k, SettingType, const char*, double, double, const char*, StringRule, const char*,
                     bool, const char*, Use u = {})
      : key(k), use(u) {}
};

using namespace setting_rows;
#define BP_FILLS(member)                                                                                           \
  Use {                                                                                                            \
    TrainUse::Fills, [](TrainOptions& o, const Settings& s, std::string_view key) { read_into(o.member, s, key); } \
  }
#define BP_FILLS_WITH(function) \
  Use {                         \
    TrainUse::Fills, function   \
  }
#define BP_READ_BY_TRAIN_COMMAND     \
  Use {                              \
    TrainUse::ReadByCommand, nullptr \
  }
#define BP_NOT_FOR_TRAIN        \
  Use {                         \
    TrainUse::NotTaken, nullptr \
  }
const TrainRow kTrainRows[] = {
#include "core/settings_registry.inc"
};

// --grad-accum without --micro-batch-size splits --batch-size into grad_accum equal micro-batches;
// one that does not divide it would change the batch (8 / 3 trains 6 a step, 8 / 16 trains 16).
void check_grad_accum_divides_batch(int64_t batch_size, int64_t grad_accum) {
  if (batch_size % grad_accum == 0) return;
  std::string divisors;
  for (int64_t d = 1, listed = 0; d <= batch_size && listed < 12; ++d)
    if (batch_size % d == 0) divisors += (listed++ ? ", " : "") + std::to_string(d);
  const int64_t lower = batch_size / grad_accum * grad_accum, upper = lower + grad_accum;
  const std::string batches = lower > 0 ? fmt::format("{} or {}", lower, upper) : std::to_string(upper);
  throw Error(ErrorCode::CONFIG_INVALID_SETTING,
              fmt::format("[train] --grad-accum {} does not divide --batch-size {}: the {} sequences of an optimizer "
                          "step cannot be split into {} equal micro-batches",
                          grad_accum, batch_size, batch_size, grad_accum))
      .with_suggestion(fmt::format(
          "Use a --grad-accum that divides {} ({}), or a --batch-size that is a multiple of {} ({}); or set "
          "--micro-batch-size too, which makes the batch micro-batch x accumulation.",
          batch_size, divisors, grad_accum, batches));
}

}  // namespace

int64_t total_optimizer_steps(const TrainOptions& o, int64_t train_samples) {
  if (o.steps > 0) return o.steps;
  const int64_t batch = std::max<int64_t>(1, o.batch_size);
  const int64_t steps_per_epoch = std::max<int64_t>(1, (train_samples + batch - 1) / batch);
  // The epsilon keeps a product that lands a rounding error above a whole number (0.7 x 10) on it.
  const double steps = std::ceil(o.epochs * static_cast<double>(steps_per_epoch) - 1e-9);
  return std::max<int64_t>(1, static_cast<int64_t>(steps));
}

TrainUse train_use(std::string_view key) {
  for (const TrainRow& row : kTrainRows)
    if (key == row.key) return row.use.use;
  return TrainUse::Unmarked;
}

bool train_takes_setting(std::string_view key) {
  const TrainUse use = train_use(key);
  return use == TrainUse::Fills || use == TrainUse::ReadByCommand;
}

void fill_train_options(TrainOptions& o, const Settings& s, std::string_view prefix) {
  for (const TrainRow& row : kTrainRows)
    if (row.use.fill && std::string_view(row.key).starts_with(prefix)) row.use.fill(o, s, row.key);
}

namespace {

// Whether the setting holds another value than its default (compared as its type, so "0.10" is
// the default 0.1).
bool differs_from_default(const Settings& s, const std::string& key) {
  const SettingSpec* spec = find_setting(key);
  if (!spec) return true;
  if (spec->type == SettingType::Float) return s.get_float(key) != std::stod(spec->default_value);
  return s.get_string(key) != spec->default_value;
}

// A preference setting belongs to the methods that read it: given another value than its default
// (by flag, TOML, environment or preset) to a run of another method it is refused, never ignored.
// Its default given explicitly changes nothing and passes: `replay` and a resumed run pass every
// saved setting, and the dashboard's form holds them all.
void check_method_settings(const TrainOptions& o, const Settings& s) {
  const std::vector<std::string> mine = method_setting_keys(o.method);
  for (const std::string& key : preference_setting_keys()) {
    if (s.source(key) == SettingSource::Default || !differs_from_default(s, key) ||
        std::find(mine.begin(), mine.end(), key) != mine.end())
      continue;
    std::string users;
    for (TrainMethod m : {TrainMethod::Dpo, TrainMethod::Orpo, TrainMethod::Simpo, TrainMethod::Kto}) {
      const auto keys = method_setting_keys(m);
      if (std::find(keys.begin(), keys.end(), key) != keys.end())
        users += (users.empty() ? "" : ", ") + std::string(train_method_name(m));
    }
    const SettingSpec* spec = find_setting(key);
    throw Error(ErrorCode::CONFIG_INVALID_SETTING,
                fmt::format("[train] {} is a setting of --method {}, and this run's method is {}; it would do nothing",
                            spec ? spec->flag : key, users, train_method_name(o.method)))
        .with_suggestion(fmt::format("Remove it ({} from {}), or pick one of those methods.", key,
                                     setting_source_name(s.source(key))));
  }
  // A preference loss is taken on completions only (the prompt is the condition, TRL's masking);
  // --train-on-all would be silently ignored there, so it is refused.
  if (o.method != TrainMethod::Sft && o.train_on_all)
    throw Error(ErrorCode::CONFIG_INVALID_SETTING,
                fmt::format("[train] --train-on-all takes the loss on every token; --method {} compares the "
                            "log-probabilities of completions only, so it would do nothing",
                            train_method_name(o.method)))
        .with_suggestion(fmt::format("Remove it (data.train_on_all from {}), or use --method sft.",
                                     setting_source_name(s.source("data.train_on_all"))));
  if (!o.init_adapter.empty() && o.mode != TrainMode::Lora)
    throw Error(ErrorCode::CONFIG_INVALID_SETTING,
                fmt::format("[train] --init-adapter {} starts a LoRA run from an adapter; --mode full trains the "
                            "weights themselves",
                            o.init_adapter))
        .with_suggestion(
            "Merge the adapter first (backprop export ADAPTER --format merged) and train that model "
            "with --mode full, or use --mode lora.");
  resolve_reference(o);  // refuses what cannot work; the trainer resolves again (multi-run sets init_adapter later)
}

}  // namespace

ReferenceSource resolve_reference(const TrainOptions& o) {
  if (!method_needs_reference(o.method)) return o.pref.reference;
  if (o.pref.reference_is_base)  // multi-run: the base without any adapter, switched off or precomputed
    return o.pref.reference == ReferenceSource::Auto ? ReferenceSource::AdapterOff : o.pref.reference;
  // The reference is the model the run starts from: with --init-adapter that includes the adapter,
  // which switching it off would lose.
  if (o.pref.reference == ReferenceSource::Auto)
    return o.mode == TrainMode::Lora && o.init_adapter.empty() ? ReferenceSource::AdapterOff
                                                               : ReferenceSource::Precomputed;
  if (o.pref.reference == ReferenceSource::AdapterOff && !o.init_adapter.empty())
    throw Error(ErrorCode::CONFIG_INVALID_SETTING,
                fmt::format("[train] --reference adapter-off would compare against the base without {}, not the model "
                            "this run starts from",
                            o.init_adapter))
        .with_suggestion(
            "Use --reference precomputed (what auto picks with --init-adapter): the starting model's "
            "log-probabilities, computed once before step 1.");
  if (o.pref.reference == ReferenceSource::AdapterOff && o.mode != TrainMode::Lora)
    throw Error(ErrorCode::CONFIG_INVALID_SETTING,
                "[train] --reference adapter-off needs a LoRA run (its reference is the base without the adapter); "
                "--mode full has no adapter to switch off")
        .with_suggestion("Use --reference precomputed (what auto picks in --mode full).");
  return o.pref.reference;
}

TrainOptions TrainOptions::from_settings(const Settings& s) {
  TrainOptions o;
  fill_train_options(o, s);
  if (o.grad_accum > 0) {
    // Hugging Face style: batch = micro-batch x accumulation when both are given.
    if (o.micro_batch_size > 0) {
      if (s.source("training.batch_size") != SettingSource::Default &&
          o.batch_size != o.micro_batch_size * o.grad_accum)
        throw Error(ErrorCode::CONFIG_INVALID,
                    fmt::format("[train] --batch-size {} disagrees with --micro-batch-size {} x --grad-accum {}",
                                o.batch_size, o.micro_batch_size, o.grad_accum));
      o.batch_size = o.micro_batch_size * o.grad_accum;
    } else {
      check_grad_accum_divides_batch(o.batch_size, o.grad_accum);
      o.micro_batch_size = o.batch_size / o.grad_accum;
    }
  }
  o.monitor.validate();
  if (o.model_dir.empty() && o.init_from_config.empty())
    throw Error(ErrorCode::CONFIG_INVALID,
                "[train] no model: pass --model DIR (a local Hugging Face folder) or "
                "--init-from-config config.json to train from scratch");
  if (o.data_path.empty())
    throw Error(ErrorCode::CONFIG_INVALID, "[train] no data: pass --data FILE (JSONL, JSON or .txt)");
  if (!o.init_from_config.empty() && o.mode != TrainMode::Full)
    throw Error(ErrorCode::CONFIG_INVALID,
                "[train] --init-from-config starts from random weights, which only makes sense with --mode full");
  if (o.mode == TrainMode::Full && o.base_dtype != "auto" && o.base_dtype != "f32")
    throw Error(ErrorCode::CONFIG_INVALID_SETTING,
                fmt::format("[train] --base-dtype {} holds the frozen weights narrower, but --mode full trains every "
                            "weight in f32: use --mode lora (QLoRA) or --base-dtype f32",
                            o.base_dtype));
  if (o.mode != TrainMode::Full && o.matmul_dtype != "auto")
    throw Error(ErrorCode::CONFIG_INVALID_SETTING,
                fmt::format("[train] --matmul-dtype {} sets the GEMMs of trained weights in --mode full; a LoRA run's "
                            "base GEMMs follow how the frozen base is held",
                            o.matmul_dtype))
        .with_suggestion(
            "Use --base-dtype bf16 for bf16 GEMMs against the frozen base (QLoRA: q8_0, q4_k), or "
            "--mode full.");
  o.lora.validate();
  check_method_settings(o, s);
  o.resolved_settings = s.to_json();
  return o;
}

DType resolve_matmul_dtype(std::string_view setting, TrainMode mode, DeviceType device, bool f16_card,
                           const std::string& device_name) {
  if (mode != TrainMode::Full || setting == "f32") return DType::F32;
  if (setting == "auto") return device == DeviceType::CUDA && !f16_card ? DType::BF16 : DType::F32;
  if (device == DeviceType::CUDA && f16_card)
    throw Error(ErrorCode::CONFIG_INVALID_SETTING,
                fmt::format("[train] --matmul-dtype bf16 needs bf16 tensor cores (compute capability 8.0+); {} "
                            "has none",
                            device_name))
        .with_suggestion(
            "Use --matmul-dtype f32 (what auto picks on this card), or LoRA over a bf16 base "
            "(--mode lora --base-dtype bf16), whose GEMMs this card runs in f16.");
  return DType::BF16;
}

}  // namespace bp
