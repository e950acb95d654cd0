// Padding-free packing of samples into micro-batches (DESIGN.md "Batches are packed").
//
// A PackedBatch is one flat run of T tokens holding B samples back to back:
//   tokens[t]      token ids of all samples, concatenated
//   positions[t]   position within its own sample: 0, 1, ... restarting at every sample
//   cu_seqlens     B + 1 offsets: sample b occupies [cu_seqlens[b], cu_seqlens[b+1]); cu_seqlens[0] = 0,
//                  cu_seqlens[B] = T
//   labels[t]      the target predicted FROM position t: labels[t] = tokens[t + 1] when t + 1 is in
//                  the same sample and that token is a training target (loss_mask[t + 1] = 1);
//                  otherwise -100 (ignored). So the last token of every sample has label -100 and
//                  no label ever crosses a sample boundary. The model computes the loss of
//                  predicting labels[t] from the hidden state at position t (no further shift).
//   sample_ids     the Sample::id of each packed sequence (for logs, resume checks and OOM replay)
// A preference pair (Sample::is_pair) is two sequences, chosen then rejected, adjacent and with the
// same sample id, so a micro-batch never splits a pair; num_samples() counts sequences.
#pragma once

#include <cstdint>
#include <vector>

#include "ops/cross_entropy.h"  // kIgnoreLabel
#include "text/dataset.h"

namespace bp {

struct PackedBatch {
  std::vector<int32_t> tokens, positions, labels, cu_seqlens;
  std::vector<int64_t> sample_ids;

  int64_t num_tokens() const { return static_cast<int64_t>(tokens.size()); }
  int64_t num_samples() const { return static_cast<int64_t>(sample_ids.size()); }  // sequences
  int64_t num_loss_tokens() const;                                                 // labels != -100
};

// Packs the given samples, in order, into one batch (a pair as its two sequences).
PackedBatch pack_samples(const std::vector<const Sample*>& samples);
// The one packing step both packers share (pack_samples here, Batch::pack in model/ for explicit
// labels): appends a sequence with its labels; positions restart at 0; cu_seqlens grows by one.
void append_sequence(PackedBatch& b, const std::vector<int32_t>& tokens, const std::vector<int32_t>& labels,
                     int64_t sample_id);

}  // namespace bp
