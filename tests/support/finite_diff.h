// Finite-difference gradient checks for op tests (CONVENTIONS.md "Tests").
//
// Method: write the op's forward as a plain double-precision reference f(inputs) -> y, take the
// scalar loss L = Σ dy ⊙ y for a fixed random dy, and differentiate L with central differences
// in f64: ∂L/∂v_i ≈ (L(v + h·e_i) − L(v − h·e_i)) / 2h. Truncation error is O(h²·L''') and the
// rounding error O(ε_f64·|L|/h); h = 1e-5 keeps both below 1e-9 for the smooth ops here, far
// under the f32 tolerance the op's backward is held to.
#pragma once

#include <functional>
#include <vector>

namespace bp::test {

inline std::vector<double> to_double(const std::vector<float>& v) {
  return {v.begin(), v.end()};
}

inline double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0.0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// Central-difference gradient of loss() with respect to every element of *v. loss() must read
// *v (it is perturbed in place and restored exactly).
inline std::vector<double> numeric_gradient(std::vector<double>* v, const std::function<double()>& loss,
                                            double h = 1e-5) {
  std::vector<double> g(v->size());
  for (size_t i = 0; i < v->size(); ++i) {
    const double saved = (*v)[i];
    (*v)[i] = saved + h;
    const double plus = loss();
    (*v)[i] = saved - h;
    const double minus = loss();
    (*v)[i] = saved;
    g[i] = (plus - minus) / (2.0 * h);
  }
  return g;
}

}  // namespace bp::test
