// Elementwise front-ends: shape/dtype checks and dispatch (ops/dispatch.h).
// Contract: ops/elementwise.h.
#include "ops/elementwise.h"

#include "ops/op_checks.h"

namespace bp {

namespace {

void check_same(const char* name, const Tensor& y, const Tensor& x) {
  ops::require_tensor(name, "y", y, DType::F32, y.rank());
  ops::require_shape(name, "x", x, y.shape());
  ops::require_same_device(name, {&y, &x});
}

// [T, N] y with an [N] vector.
void check_rows(const char* name, const Tensor& y, const Tensor& b) {
  ops::require_tensor(name, "y", y, DType::F32, 2);
  ops::require_shape(name, "b", b, Shape{y.dim(1)});
  ops::require_same_device(name, {&y, &b});
}
}  // namespace

void add_inplace(Tensor& y, const Tensor& x) {
  check_same("add", y, x);
  ops::kernels(y).add_inplace(y.kernel_data<float>(), x.kernel_data<float>(), y.numel());
}

void axpy_inplace(Tensor& y, float a, const Tensor& x) {
  check_same("axpy", y, x);
  ops::kernels(y).axpy_inplace(y.kernel_data<float>(), a, x.kernel_data<float>(), y.numel());
}

void scale_inplace(Tensor& y, float a) {
  ops::require_tensor("scale", "y", y, DType::F32, y.rank());
  ops::kernels(y).scale_inplace(y.kernel_data<float>(), a, y.numel());
}

void add_bias_inplace(Tensor& y, const Tensor& b) {
  check_rows("add_bias", y, b);
  ops::kernels(y).add_bias_inplace(y.kernel_data<float>(), b.kernel_data<float>(), y.dim(0), y.dim(1));
}

void bias_grad_accumulate(const Tensor& dy, Tensor& db) {
  check_rows("bias_grad", dy, db);
  ops::kernels(dy).bias_grad_accumulate(dy.kernel_data<float>(), db.kernel_data<float>(), dy.dim(0), dy.dim(1));
}

void column_scale_add(Tensor& y, const Tensor& c, const Tensor& z) {
  check_rows("column_scale_add", y, c);
  check_same("column_scale_add", y, z);
  ops::kernels(y).column_scale_add(y.kernel_data<float>(), c.kernel_data<float>(), z.kernel_data<float>(), y.dim(0),
                                   y.dim(1));
}

void column_dot_accumulate(const Tensor& a, const Tensor& b, const Tensor* w, Tensor& acc) {
  check_rows("column_dot", a, acc);
  check_same("column_dot", a, b);
  if (w) check_rows("column_dot", a, *w);
  ops::kernels(a).column_dot_accumulate(a.kernel_data<float>(), b.kernel_data<float>(),
                                        w ? w->kernel_data<float>() : nullptr, acc.kernel_data<float>(), a.dim(0),
                                        a.dim(1));
}

void dora_column_scale(const Tensor& m, const Tensor& nsq, Tensor& c, Tensor& inv_n) {
  ops::require_tensor("dora_column_scale", "m", m, DType::F32, 1);
  for (const Tensor* t : {&nsq, static_cast<const Tensor*>(&c), static_cast<const Tensor*>(&inv_n)})
    check_same("dora_column_scale", m, *t);
  ops::kernels(m).dora_column_scale(m.kernel_data<float>(), nsq.kernel_data<float>(), c.kernel_data<float>(),
                                    inv_n.kernel_data<float>(), m.numel());
}

void round_to_bf16(const Tensor& src, Tensor& dst) {
  ops::require_tensor("round_to_bf16", "src", src, DType::F32, src.rank());
  ops::require_tensor("round_to_bf16", "dst", dst, DType::BF16, src.rank());
  ops::require_shape("round_to_bf16", "dst", dst, src.shape(), DType::BF16);
  ops::require_same_device("round_to_bf16", {&src, &dst});
  ops::kernels(src).round_to_bf16(src.kernel_data<float>(), dst.kernel_data<uint16_t>(), src.numel());
}

}  // namespace bp
