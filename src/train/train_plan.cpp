#include "train/train_plan.h"

#include <algorithm>
#include <functional>

#include "core/error.h"
#include "core/sysinfo.h"
#include "model/held_weights.h"
#include "ops/cross_entropy.h"
#include "ops/device_compute.h"
#include "train/train_data.h"
#include "train/train_options.h"

namespace bp {

std::string describe_memory_plan(const MemoryPlan& p) {
  const std::string gemm_workspace =
      p.gemm_workspace ? fmt::format(", GEMM workspace (cuBLASLt) {}", format_bytes(p.gemm_workspace)) : "";
  return fmt::format(
      "weights {}, trainable {}, gradients {}, optimizer {}{}, saved activations {}, recompute {}, cross-entropy "
      "chunk {}, workspace {} = total {}",
      format_bytes(p.weights), format_bytes(p.trainable), format_bytes(p.gradients), format_bytes(p.optimizer_state),
      gemm_workspace, format_bytes(p.saved_activations), format_bytes(p.recompute_buffers),
      format_bytes(p.cross_entropy_chunk), format_bytes(p.workspace), format_bytes(p.total()));
}

// A cross-entropy window starts at a labelled token and ends at most `chunk` rows later, trimmed after its
// last labelled row, so it reaches into the next packed sample only when that sample's first
// labelled token lies within `chunk − 1` rows of its start (the prompt is short). When no sample
// has such a short prompt (or k = 1), windows stay inside one sample and the bound is exact: the
// longest window of any sample alone. Otherwise a window can fill the whole chunk.
int64_t max_cross_entropy_window(const std::vector<Sample>& samples, int64_t k, int64_t chunk) {
  int64_t most = 0;
  bool can_cross = false;
  std::vector<int32_t> labels;
  for (const Sample& s : samples) {
    const auto n = static_cast<int64_t>(s.ids.size());
    labels.assign(static_cast<size_t>(n), kIgnoreLabel);  // as pack_samples: token t predicts t + 1
    for (int64_t t = 0; t + 1 < n; ++t)
      if (s.loss_mask[static_cast<size_t>(t + 1)]) labels[static_cast<size_t>(t)] = 0;
    int64_t prefix = 0;
    while (prefix < n && labels[static_cast<size_t>(prefix)] < 0) ++prefix;
    can_cross = can_cross || prefix < chunk - 1;
    most = std::max(most, linear_cross_entropy_workspace_rows(labels.data(), n, chunk));
  }
  return k > 1 && can_cross ? chunk : most;
}

TrainPlan plan_training(const TrainOptions& o, const Model& model, const TrainData& data, const Allocator& alloc) {
  MemorySettings ms;
  ms.mode = o.mode;
  ms.lora = o.lora;
  ms.weights_bytes = resident_weight_bytes(model.weights());  // the held types as loaded
  ms.device = alloc.device().type;
  ms.gemm_workspace_bytes = ops::device_gemm_workspace_bytes(ms.device);                     // the card's own size
  if (!model.weights().layers.empty()) ms.base_dtype = model.weights().layers[0].q.dtype();  // how they are held
  ms.head_dtype = model.weights().output_weight().dtype();
  ms.matmul_dtype = model.options().matmul_dtype;  // full mode's bf16 GEMM copies, made already
  ms.frozen_f32_panels = !frozen_weights_outside_f16(model.weights()).empty();  // cached since the upload
  ms.gradient_checkpointing = o.gradient_checkpointing.value_or(true);
  ms.threads = o.threads;
  ms.optimizer_shards = o.optimizer_shards;
  // Tokens of the k longest samples: the worst micro-batch of k sequences.
  std::vector<int64_t> lens;
  for (const auto& s : data.train) lens.push_back(sample_tokens(s));  // a pair: both its sequences
  std::sort(lens.begin(), lens.end(), std::greater<>());
  auto tokens_for = [&](int64_t k) {
    int64_t t = 0;
    for (int64_t i = 0; i < std::min<int64_t>(k, static_cast<int64_t>(lens.size())); ++i)
      t += lens[static_cast<size_t>(i)];
    return std::max<int64_t>(t, 1);
  };
  const int64_t window_one = max_cross_entropy_window(data.train, 1, ms.ce_chunk_tokens);
  const int64_t window_more = max_cross_entropy_window(data.train, 2, ms.ce_chunk_tokens);
  auto plan_for = [&](int64_t k) {
    ms.micro_batch_tokens = tokens_for(k);
    ms.ce_window_tokens = std::max<int64_t>(1, k > 1 ? window_more : window_one);
    return plan_memory(model.config(), ms);
  };
  size_t limit = alloc.limit();
  bool enforced = limit != kNoLimit;
  if (!enforced) limit = alloc.stats().bytes_total;  // plan against RAM when no budget is set

  TrainPlan tp;
  tp.limit_bytes = limit;
  MemoryPlan one = plan_for(1);
  if (enforced && one.total() > limit) {
    // The CPU's budget is host memory: its code and advice name no card (a quantized base is the big saving).
    const bool cpu = ms.device == DeviceType::CPU;
    std::string what = fmt::format("one sequence of {} tokens needs {} but the {} limit is {}", tokens_for(1),
                                   format_bytes(one.total()), cpu ? "CPU memory" : "GPU memory", format_bytes(limit));
    throw Error(
        out_of_memory_code(cpu),
        fmt::format("[train] the run cannot fit before the first step: {}. Plan: {}", what, describe_memory_plan(one)),
        {{"plan", one.to_json()}, {"limit_bytes", limit}, {"tokens", tokens_for(1)}})
        .with_suggestion(fmt::format(
            "{} (at least {}), shorten --max-seq-length (now {}), keep --gradient-checkpointing on, "
            "use --mode lora or a lower --lora-r{}; `backprop estimate-vram{}` shows what fits.",
            cpu ? "Raise --max-memory if the machine has the RAM" : "Raise --max-memory", format_bytes(one.total()),
            o.max_seq_length, cpu ? ", or hold the base quantized (--base-dtype q8_0 or q4_k)" : "",
            cpu ? " --device cpu" : ""));
  }
  int64_t k;
  if (o.micro_batch_size > 0) {
    k = std::min(o.micro_batch_size, o.batch_size);
  } else {
    k = 1;
    for (int64_t c = o.batch_size; c >= 1; c = (c == 1 ? 0 : std::max<int64_t>(1, c / 2))) {
      if (plan_for(c).total() <= limit) {
        k = c;
        break;
      }
      if (c == 1) break;
    }
  }
  tp.micro_batch_size = k;
  tp.micro_batch_tokens = tokens_for(k);
  tp.plan = plan_for(k);
  tp.gradient_checkpointing = ms.gradient_checkpointing;
  // What the process holds outside the allocator (code, libraries, tokenizer, data) right now.
  const size_t rss = process_resident_bytes(), in_use = alloc.stats().bytes_in_use;
  const size_t process = rss > in_use ? rss - in_use : 0;
  tp.plan.process = process;
  std::string ckpt_why = o.gradient_checkpointing ? "set" : "auto";
  if (!o.gradient_checkpointing) {
    MemorySettings off = ms;
    off.gradient_checkpointing = false;
    off.micro_batch_tokens = tp.micro_batch_tokens;
    MemoryPlan p_off = plan_memory(model.config(), off);
    const size_t budget = enforced ? limit : limit / 4 * 3;
    if (p_off.total() <= budget) {
      tp.gradient_checkpointing = false;
      tp.plan = p_off;
      tp.plan.process = process;
      ckpt_why = fmt::format("auto: every layer's activations fit, {} of {}", format_bytes(p_off.total()),
                             format_bytes(budget));
    } else {
      ckpt_why = fmt::format("auto: without it the micro-batch needs {}, over {}", format_bytes(p_off.total()),
                             format_bytes(budget));
    }
  }
  int64_t accum = (o.batch_size + k - 1) / k;
  tp.description = fmt::format(
      "memory plan for {} {} per micro-batch (up to {} tokens): {}; with the process's own {} (code, "
      "libraries, tokenizer, data): resident {}; limit {}{}; micro-batch {} x accumulation {} = batch {}; gradient "
      "checkpointing {} ({})",
      k, method_is_pairwise(o.method) ? "pairs (2 sequences each)" : "sequences", tp.micro_batch_tokens,
      describe_memory_plan(tp.plan), format_bytes(tp.plan.process), format_bytes(tp.plan.resident()),
      format_bytes(limit),
      enforced                                 ? ""
      : alloc.device().type == DeviceType::CPU ? " (machine RAM, not enforced)"
                                               : " (the device's memory, not enforced)",
      k, accum, o.batch_size, tp.gradient_checkpointing ? "on" : "off", ckpt_why);
  return tp;
}

}  // namespace bp
