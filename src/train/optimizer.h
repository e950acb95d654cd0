// AdamW over the model's trainable parameters, with state that checkpoints round-trip exactly.
// The math is ops/optim.h (PyTorch's torch.optim.AdamW order); this class owns m and v (f32,
// from the CPU allocator, counted as the "optimizer state" group of the memory plan) and the
// step counter used for bias correction.
//
// ZeRO stage 1 (init_sharded; DeepSpeed's name): over N ranks of a data-parallel run each rank keeps
// m and v for 1/N of the trainable values only. The values are seen as one flat vector, the
// parameters in trainable_parameters() order, cut into segments of kReduceSegmentFloats; in a
// segment of m values rank q owns [m·q/N, m·(q+1)/N), the chunk it sums in the gradient
// reduction (core/collective.h). The step's gradients are reduce-scattered, not all-reduced: each
// rank receives only its chunks' sum (the bits the all-reduce would give them), and the norm that
// clipping and the NaN guard read is the chunks' sums of squares added in rank order (the trainer's
// gradient_norm); each rank updates its own chunks with the
// same elementwise kernel, then the parameters are all-gathered: every rank copies the owner's bits,
// so the ranks agree bit for bit, and each value is the unsharded update's (the kernel is
// elementwise, and any split gives the same values: backend/cpu/optim.cpp). Checkpoints hold the
// whole m and v, streamed to rank 0 segment by segment as it writes the file (stream_state: no rank
// holds the whole state), so a checkpoint is the same file sharded or not and resumes at any rank
// count: load_state keeps this rank's part.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "ops/optim.h"

namespace bp {

struct TrainableParam;
class Collective;

// The flat layout ZeRO-1 and the gradient reduction share (core/collective.h): the values of the
// tensors with `sizes` one after the other, cut into segments of kReduceSegmentFloats, each cut into
// `world` chunks, rank q's chunk of a segment of m values being [m·q/W, m·(q+1)/W). A FlatRun is one
// tensor's values inside one of a rank's chunks; rank_runs lists rank `rank`'s, segment by segment
// (chunk = the segment's index), in tensor order.
struct FlatRun {
  size_t param = 0;      // index in the tensor list
  int64_t offset = 0;    // first value in the tensor (flat)
  int64_t count = 0;     // values
  size_t chunk = 0;      // which of the rank's chunks (one per segment)
  int64_t chunk_at = 0;  // first value in that chunk
};
std::vector<FlatRun> rank_runs(const std::vector<int64_t>& sizes, int rank, int world);

class AdamW {
 public:
  AdamW() = default;
  // Allocates zeroed m and v for each parameter (same names and shapes).
  void init(const std::vector<TrainableParam>& params);
  // ZeRO-1: zeroed m and v for this rank's chunks only (the header's comment). `comm` outlives this.
  void init_sharded(const std::vector<TrainableParam>& params, Collective& comm);
  // One update of every parameter with its gradient at learning rate `lr`. Sharded: this rank's
  // chunks, then the parameters all-gathered (collective: every rank calls it).
  void step(const std::vector<TrainableParam>& params, const AdamWConfig& cfg);
  int64_t steps_taken() const { return step_; }
  bool sharded() const { return comm_ != nullptr; }
  // f32 values of m and v this rank holds (2 × trainable values, or this rank's share of them).
  int64_t state_values() const;
  // Sharded: where this rank's values lie (its chunks of the gradient reduce-scatter).
  const std::vector<FlatRun>& owned_runs() const { return pieces_; }

  // "<name>.exp_avg" tensors of every parameter, then their "<name>.exp_avg_sq", for checkpoints
  // (unsharded: this rank holds them all).
  std::vector<std::pair<std::string, Tensor>> state_tensors() const;
  // Sharded: the names and shapes of those tensors, in that order, and their values streamed in
  // that order to `write` on rank `root`, gathered from every rank segment by segment (collective:
  // every rank calls it; the others pass null). Nobody holds the whole state: rank 0 writes a
  // checkpoint's optimizer.safetensors from it (io/safetensors.h write_safetensors_streamed), the
  // same bytes as the unsharded state_tensors() give.
  std::vector<std::pair<std::string, Shape>> state_layout() const;
  void stream_state(int root, const std::function<void(const void*, size_t)>* write);
  // Restores from whole tensors (state_tensors() output); sharded, this rank's chunks of them.
  // Throws STATE_CHECKPOINT_INVALID on a missing or mis-shaped entry.
  void load_state(const std::vector<std::pair<std::string, Tensor>>& tensors, int64_t step);

 private:
  // Sharded: a run of one parameter's values inside one of this rank's chunks (m_ and v_ index).
  using Piece = FlatRun;
  // A segment of the flat vector and every rank's chunk of it (bytes, for the all-gather).
  struct Segment {
    int64_t begin = 0, size = 0;
    std::vector<size_t> chunk_bytes, chunk_offsets;
  };
  void reset(const std::vector<TrainableParam>& params);  // names and shapes; no state
  std::vector<Segment> segments() const;
  // The segment exchange of the step (parameters) and of a checkpoint (m and v): optimizer.cpp.
  void exchange(const std::function<void(size_t, float*)>& mine,
                const std::function<void(const Segment&, float*)>& whole);

  std::vector<std::string> names_;
  std::vector<Shape> shapes_;
  std::vector<int64_t> starts_;  // each parameter's first value in the flat vector
  int64_t total_ = 0;
  std::vector<Tensor> m_, v_;  // per parameter, or (sharded) per chunk of this rank
  std::vector<Piece> pieces_;
  Collective* comm_ = nullptr;
  int64_t step_ = 0;
};

}  // namespace bp
