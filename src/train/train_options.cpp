// TrainOptions from the settings table (core/settings.h): the one place where setting keys
// become trainer options, so every flag, TOML key and BACKPROPAGATE_* variable acts the same.
#include "train/train_options.h"

#include <cmath>

#include "core/settings.h"

namespace bp {

TrainOptions TrainOptions::from_settings(const Settings& s) {
  TrainOptions o;
  o.model_dir = s.get_string("model.path");
  o.init_from_config = s.get_string("training.init_from_config");
  o.data_path = s.get_string("data.path");
  o.data_format = s.get_string("data.format");
  o.eval_data_path = s.get_string("data.eval_path");
  // training.output is the runs folder; a run writes to <output>/<run id> unless resuming.
  o.output_root = s.get_string("training.output");
  o.resume = s.get_string("training.resume");
  o.steps = s.get_int("training.steps");
  double epochs = s.get_float("training.epochs");
  o.epochs = std::max<int64_t>(1, static_cast<int64_t>(std::ceil(epochs)));
  o.batch_size = s.get_int("training.batch_size");
  const std::string& mb = s.get_string("training.micro_batch_size");
  o.micro_batch_size = mb == "auto" ? 0 : std::stoll(mb);
  o.grad_accum = s.get_int("training.grad_accum");
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
      o.micro_batch_size = std::max<int64_t>(1, o.batch_size / o.grad_accum);
      o.batch_size = o.micro_batch_size * o.grad_accum;
    }
  }
  o.lr = s.get_float("training.lr");
  o.lr_scheduler = parse_lr_scheduler(s.get_string("training.lr_scheduler"));
  o.warmup_steps = s.get_int("training.warmup_steps");
  o.weight_decay = s.get_float("training.weight_decay");
  o.max_grad_norm = s.get_float("training.max_grad_norm");
  o.max_seq_length = s.get_int("training.max_seq_length");
  o.mode = s.get_string("training.mode") == "full" ? TrainMode::Full : TrainMode::Lora;
  o.lora.r = s.get_int("lora.r");
  o.lora.alpha = static_cast<float>(s.get_float("lora.alpha"));
  o.lora.dropout = static_cast<float>(s.get_float("lora.dropout"));
  o.lora.use_rslora = s.get_bool("lora.use_rslora");
  o.lora.target_modules = split_list(s.get_string("lora.target_modules"));
  if (const std::string& gc = s.get_string("training.gradient_checkpointing"); gc != "auto")
    o.gradient_checkpointing = gc == "true";
  o.seed = s.get_uint("training.seed");
  o.device = s.get_string("model.device");
  o.base_dtype = s.get_string("model.base_dtype");
  o.shuffle = s.get_bool("data.shuffle");
  o.max_bad_rows = s.get_int("data.max_errors");
  o.eval_every = s.get_int("training.eval_every");
  o.holdout = s.get_float("data.holdout");
  o.save_every = s.get_int("training.save_every");
  o.keep_checkpoints = static_cast<int>(s.get_int("training.keep_checkpoints"));
  const std::string& mm = s.get_string("training.max_memory");
  o.max_memory_bytes = (mm == "auto" || mm == "none") ? SIZE_MAX : parse_byte_size(mm, "training.max_memory");
  o.max_memory_auto = mm == "auto";
  o.monitor = MonitorOptions::from_settings(s);
  o.threads = static_cast<int>(s.get_int("training.threads"));
  o.oom_recovery = s.get_bool("training.oom_recovery");
  o.nan_max_consecutive = static_cast<int>(s.get_int("training.nan_guard_max_consecutive"));
  o.strict = s.get_bool("data.strict");
  o.train_on_all = s.get_bool("data.train_on_all");
  o.chat_template = s.get_string("data.chat_template");
  o.template_max_steps = s.get_int("data.template_max_steps");
  o.template_max_bytes = s.get_int("data.template_max_bytes");
  if (int64_t k = s.get_int("training.fault_inject_oom_step"); k > 0) {
    o.fault_oom_step = k - 1;  // options count steps done before the failing one
    o.fault_oom_repeat = s.get_int("training.fault_inject_oom_count");
  }
  if (int64_t k = s.get_int("training.fault_inject_nan_step"); k > 0)
    for (int64_t i = 0; i < s.get_int("training.fault_inject_nan_count"); ++i) o.fault_nan_steps.push_back(k + i);
  o.fault_crash_after_step = s.get_int("training.fault_inject_crash_step");
  o.fault_crash_at = s.get_string("training.fault_inject_crash_at");
  o.fault_enospc_after_bytes = s.get_int("training.fault_inject_enospc_after_bytes");
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
  o.lora.validate();
  o.resolved_settings = s.to_json();
  return o;
}

}  // namespace bp
