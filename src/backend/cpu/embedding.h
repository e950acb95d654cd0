// CPU kernels for embedding (contract: ops/embedding.h). ids are already range-checked.
#pragma once

#include <cstdint>

namespace bp::cpu {

// y[t, :] = table[ids[t], :]
void embedding_forward(const int32_t* ids, const float* table, float* y, int64_t T, int64_t D);
// dtable[ids[t], :] += dy[t, :]. Race-free and deterministic: threads split the D columns, and
// each walks the tokens in order, so the summation order never depends on the thread count.
void embedding_backward(const float* dy, const int32_t* ids, float* dtable, int64_t T, int64_t D);

}  // namespace bp::cpu
