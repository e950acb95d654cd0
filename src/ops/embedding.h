// embedding: y[t] = table[ids[t]]   ids i32 [T], table [V, D] f32, y [T, D].
// Out-of-range ids throw INPUT_VALIDATION_FAILED naming the position and the id.
// Backward: dtable[ids[t]] += dy[t] (scatter-add, +=). Nothing is saved beyond ids.
#pragma once

#include "core/tensor.h"

namespace bp {

Tensor embedding_forward(const Tensor& ids, const Tensor& table);
void embedding_backward(const Tensor& dy, const Tensor& ids, Tensor& dtable);

}  // namespace bp
