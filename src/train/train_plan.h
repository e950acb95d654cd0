// Choosing the micro-batch before step 1 (DESIGN.md "Memory plan", issue "Memory"): the largest
// number of sequences per micro-batch, up to the batch size, whose memory plan fits the limit
// (--max-memory; with no limit, the machine's RAM), sized for the longest samples so no step can
// need more. When even one sequence cannot fit, training does not start: RUNTIME_CPU_OOM
// (RUNTIME_GPU_OOM on a card) with the plan's breakdown and what to change.
// Gradient checkpointing "auto" (the default): the micro-batch is chosen as with checkpointing on;
// then checkpointing is turned off when that micro-batch also fits without it — within the limit
// when one is enforced, within 3/4 of the machine's RAM when not — because recomputing the forward
// costs ~30% more time for memory the run does not need.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "train/memory_plan.h"

namespace bp {

struct TrainOptions;
struct TrainData;
struct Sample;
class Model;

struct TrainPlan {
  int64_t micro_batch_size = 1;  // sequences
  int64_t micro_batch_tokens = 0;
  MemoryPlan plan;
  size_t limit_bytes = 0;
  bool gradient_checkpointing = true;  // resolved (TrainOptions: empty = auto)
  std::string description;             // the breakdown and the choice, for the log
};

// The most logits rows one cross-entropy window (ops/cross_entropy.h) can need in a micro-batch of
// k of these samples packed together, for MemorySettings::ce_window_tokens: exact when windows
// cannot reach from one sample into the next (every sample's first labelled token at least
// chunk − 1 tokens in, or k = 1), else the whole chunk.
int64_t max_cross_entropy_window(const std::vector<Sample>& samples, int64_t k, int64_t chunk);

TrainPlan plan_training(const TrainOptions& o, const Model& model, const TrainData& data, const Allocator& allocator);
// "weights 1.2 MiB, trainable ..., total 3.4 MiB" (one line).
std::string describe_memory_plan(const MemoryPlan& p);

}  // namespace bp
