// Overlap of the gradients' reduction with the backward pass (training.overlap_communication;
// docs/architecture.md "Data-parallel training"). On the step's last micro-batch, each layer's
// gradients are final as soon as its backward is done (Model::set_layer_backward_hook); a
// communication thread reduces them (Collective::reduce_part: the step's one reduction's layout,
// so every value gets the bits the whole reduction gives it) while the layers below still compute.
// What no layer owns (embeddings, the final norm, the head) is reduced at the end.
//
// Only this thread calls the collective while a round runs, and the trainer's thread calls it only
// after finish(): the MPI library must allow calls from several threads one at a time
// (MPI_THREAD_SERIALIZED, Collective::threads_may_communicate).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/collective.h"
#include "core/tensor.h"

namespace bp {

class GradientOverlap {
 public:
  // `grads` in the order of the step's reduction; `names` theirs (a layer's: "...layers.<l>."), of a
  // model of `layers` layers. gather: all-reduce (unsharded); else ZeRO-1's reduce-scatter.
  GradientOverlap(Collective& comm, std::vector<Tensor*> grads, const std::vector<std::string>& names, int64_t layers,
                  bool gather);
  ~GradientOverlap();
  GradientOverlap(const GradientOverlap&) = delete;
  GradientOverlap& operator=(const GradientOverlap&) = delete;

  // A step (an attempt at it: OOM recovery's agreement may redo it) begins.
  void begin_step();
  // The last micro-batch's pass starts: layer_done calls from now on reduce that layer's gradients.
  // Once per step: a pass redone after an OOM runs without it.
  void arm();
  // Layer l's backward is done (the model's hook; ignored unless armed); l = the layer count: the
  // head's backward is done (where the top layer's begins).
  void layer_done(int64_t layer);
  // After the step's passes: the rest reduced and every reduction waited for. True when the round
  // ran whole on this step's gradients (then they are reduced); false when no round ran or an OOM
  // spoiled it (then this rank still ran the round's collectives, once).
  bool finish();
  // An OOM in the middle of the round (OOM recovery's reset): what was not reduced yet is reduced
  // anyway (the other ranks run the same collectives) and the round is spoiled.
  void abandon();

  // The step's intervals (seconds since arm()): each layer's backward and each reduction, and the
  // time the two overlapped; the time finish() waited for the reductions.
  struct Interval {
    int64_t layer;  // -1: the rest
    double begin, end;
  };
  std::vector<Interval> backward, reductions;
  double overlap_s() const;
  double wait_s = 0;

 private:
  void submit(std::vector<size_t> which, int64_t layer);
  void drain();  // submits the rest, waits for every job
  void run();
  double now() const;
  Collective& comm_;
  std::vector<Tensor*> grads_;
  bool gather_;
  std::vector<std::vector<size_t>> by_layer_;  // grads of layer l
  std::vector<size_t> rest_;
  std::vector<bool> done_;
  bool armed_ = false, used_ = false, spoiled_ = false;
  double t0_ = 0, last_ = 0;
  std::mutex mu_;
  std::condition_variable cv_;
  struct Job {
    std::vector<size_t> which;
    int64_t layer;
  };
  std::deque<Job> queue_;
  int busy_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
  std::thread thread_;
};

}  // namespace bp
