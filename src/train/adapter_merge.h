// Merging one LoRA adapter into another, for multi-run training (train/multi_run.h).
//
// `merged` holds what earlier runs produced; `fresh` is the adapter the run with 1-based index i
// just trained (it started from `merged`). Every mode works per tensor (each layer's A and B of
// every adapted projection), element-wise unless said otherwise:
//
//   slao    A ← A_new;  B ← B + λ(i)·(B_new − B),  λ(i) = clamp(1/√i, 0.1, 1).
//           (Run 1 has λ = 1: the merge is the fresh adapter.) The next run's A starts from an
//           orthonormal basis of the merged A's row space (orthonormalize_rows below).
//   linear  A and B both ← X + (1/i)·(X_new − X): the running equal-weight mean of all runs.
//   ties    TIES-merging of the two task vectors τ₁ = X, τ₂ = X_new (for A and B alike):
//           trim — zero the `ties_trim` fraction of smallest-magnitude entries of each τ;
//           elect — γ = sign(τ₁ + τ₂) of the trimmed vectors;
//           merge — the mean of the trimmed entries whose sign is γ (0 where none).
//   dare    A ← A_new;  B ← B + λ(i)·DARE(B_new − B): each entry of the delta is dropped with
//           probability p = `dare_drop` and the kept ones are scaled by 1/(1−p). The mask comes
//           from splitmix64(seed ⊕ tensor index, element index), so it is reproducible (and the
//           NumPy oracle in tests/train computes the same one).
//
// Shapes of the two adapters must agree (same config, same targets): RUNTIME_INTERNAL otherwise.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "model/lora.h"

namespace bp {

enum class AdapterMergeMode { Slao, Linear, Ties, Dare };

AdapterMergeMode parse_adapter_merge_mode(std::string_view name);  // CONFIG_INVALID_SETTING if unknown
const char* adapter_merge_mode_name(AdapterMergeMode m);

struct AdapterMergeOptions {
  AdapterMergeMode mode = AdapterMergeMode::Slao;
  double ties_trim = 0.2;  // fraction of smallest |τ| entries zeroed per task vector
  double dare_drop = 0.5;  // DARE drop probability p in [0, 1)
  uint64_t seed = 42;
};

// splitmix64: the reproducible hash behind DARE's masks and multi-run's shuffles and replay draws
// (the NumPy oracle computes the same one).
uint64_t splitmix64(uint64_t x);

// λ(i) = clamp(1/√i, 0.1, 1) for the 1-based run index i.
double slao_lambda(int64_t run_index);

// Merges `fresh` into `merged` in place; `run_index` is 1-based. Returns the blend weight used
// (λ(i) for slao/dare, 1/i for linear, 1 for ties).
double merge_adapter(LoraAdapter& merged, const LoraAdapter& fresh, int64_t run_index, const AdapterMergeOptions& opt);

// Cosine similarity of all B tensors of `a` against those of `b`, taken as one long vector each.
// Returns 1 when both are zero, 0 when exactly one is.
double adapter_b_cosine(const LoraAdapter& a, const LoraAdapter& b);

// Replaces each A [r, in] by the orthonormal basis of its row space that modified Gram–Schmidt
// gives (rows processed in order, so R has a positive diagonal: the unique QR with that sign
// convention). A row that is (numerically) dependent on the earlier ones becomes zero.
void orthonormalize_rows(LoraAdapter& adapter);

// False when any A or B element is NaN or infinite.
bool adapter_is_finite(const LoraAdapter& adapter);

// A deep copy (fresh tensors from the CPU allocator).
LoraAdapter clone_adapter(const LoraAdapter& adapter);

}  // namespace bp
