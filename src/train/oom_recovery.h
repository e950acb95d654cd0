// OOM recovery for one optimizer step (DESIGN.md "Trainer").
//
// An optimizer step covers a fixed number of sequences (the user's batch size). They are run in
// micro-batches of `micro_seqs` sequences; accumulation = ceil(batch / micro). When a micro-batch
// runs out of memory — an OutOfMemoryError from an allocator, or an error that is OOM in
// disguise (std::bad_alloc, CUBLAS_STATUS_ALLOC_FAILED, CUDNN_STATUS_NOT_INITIALIZED, "out of
// memory" from a library: RUNTIME_OOM_ADJACENT; the safety monitor's RUNTIME_MEMORY_PRESSURE when
// available memory runs low) — the step's partial gradients are dropped,
// caches emptied, a cheaper relief tried first when one is set (the trainer's: turn gradient
// checkpointing back on when "auto" had it off), else the micro-batch halved (so accumulation
// doubles and the effective batch never changes), and the same step is redone with the same
// samples. Three consecutive failures at one sequence per micro-batch end in
// RUNTIME_OOM_RECOVERY_EXHAUSTED. With recovery off the first OOM is fatal (RUNTIME_CPU_OOM, or
// RUNTIME_GPU_OOM on a card) with a memory snapshot.
#pragma once

#include <cstdint>
#include <exception>
#include <functional>
#include <string>

#include "core/allocator.h"

namespace bp {

enum class OomKind { None, OutOfMemory, Adjacent };
// Classifies an exception; `what` gets a one-line description.
OomKind classify_oom(const std::exception& e);

struct OomEvent {
  OomKind kind = OomKind::None;
  std::string message;  // the original error text
  int64_t micro_seqs_before = 0;
  int64_t micro_seqs_after = 0;
  int64_t accum_after = 0;
  std::string relief;  // non-empty: what the relief did instead of halving the micro-batch
  int consecutive_at_one = 0;
  MemoryStats memory;  // allocator snapshot at the failure
};

class OomRecovery {
 public:
  OomRecovery(int64_t batch_seqs, int64_t micro_seqs, bool enabled, Allocator& allocator, int max_failures_at_one = 3);

  int64_t micro_seqs() const { return micro_seqs_; }
  int64_t accumulation() const { return (batch_seqs_ + micro_seqs_ - 1) / micro_seqs_; }
  int64_t recoveries() const { return recoveries_; }
  // Restores the micro-batch size from a checkpoint (resume keeps the recovered size).
  void set_micro_seqs(int64_t m);
  // A cheaper remedy tried before halving (the trainer: turn gradient checkpointing back on). It
  // returns what it did, or "" when it has nothing left to give; then the micro-batch is halved.
  void set_relief(std::function<std::string()> relief) { relief_ = std::move(relief); }

  // Runs the step: run_micro(begin, end) over [0, n_seqs) in micro-batches. On OOM calls
  // reset() (drop the step's gradients), empties the allocator cache, tells on_event, halves and
  // starts the step again. Rethrows non-OOM errors unchanged.
  void run_step(int64_t n_seqs, const std::function<void(int64_t begin, int64_t end)>& run_micro,
                const std::function<void()>& reset, const std::function<void(const OomEvent&)>& on_event);

 private:
  int64_t batch_seqs_, micro_seqs_;
  bool enabled_;
  Allocator& allocator_;
  int max_failures_at_one_;
  int64_t recoveries_ = 0;
  std::function<std::string()> relief_;
};

}  // namespace bp
