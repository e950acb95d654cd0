// embedding front-end: shape/dtype checks, the id range check (user data: a tokenizer and a
// model that disagree on the vocabulary), dispatch to backend/cpu/embedding.cpp.
#include "ops/embedding.h"

#include "ops/op_checks.h"

namespace bp {

namespace {

constexpr const char* kOp = "embedding";

void check_ids(const Tensor& ids, int64_t vocab) {
  ops::require_tensor(kOp, "ids", ids, DType::I32, 1);
  std::vector<int32_t> staging;
  const int32_t* p = ops::host_ints(ids, staging);
  for (int64_t t = 0; t < ids.numel(); ++t)
    if (p[t] < 0 || p[t] >= vocab)
      throw Error(
          ErrorCode::INPUT_VALIDATION_FAILED,
          fmt::format("[embedding] token id {} at position {} is outside the vocabulary [0, {})", p[t], t, vocab),
          {{"position", t}, {"id", p[t]}, {"vocab_size", vocab}});
}

}  // namespace

Tensor embedding_forward(const Tensor& ids, const Tensor& table) {
  ops::require_tensor(kOp, "table", table, table.dtype() == DType::I32 ? DType::F32 : table.dtype(), 2);
  check_ids(ids, table.dim(0));
  ops::require_same_device(kOp, {&ids, &table});
  const int64_t T = ids.dim(0), D = table.dim(1);
  Tensor y = Tensor::empty({T, D}, DType::F32, table.device());
  if (table.dtype() == DType::F32)
    ops::kernels(table).embedding_forward(ids.kernel_data<int32_t>(), table.kernel_data<float>(),
                                          y.kernel_data<float>(), T, D);
  else  // a frozen table held in its stored type: each gathered row is dequantized
    ops::kernels(table).embedding_forward_held(ids.kernel_data<int32_t>(), ops::held_matrix(table),
                                               y.kernel_data<float>(), T);
  return y;
}

void embedding_backward(const Tensor& dy, const Tensor& ids, Tensor& dtable) {
  ops::require_tensor(kOp, "dtable", dtable, DType::F32, 2);
  check_ids(ids, dtable.dim(0));
  const int64_t T = ids.dim(0), D = dtable.dim(1);
  ops::require_shape(kOp, "dy", dy, Shape{T, D});
  ops::require_same_device(kOp, {&dy, &ids, &dtable});
  ops::kernels(dy).embedding_backward(dy.kernel_data<float>(), ids.kernel_data<int32_t>(), dtable.kernel_data<float>(),
                                      T, D);
}

}  // namespace bp
