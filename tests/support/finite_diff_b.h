// Test helpers for the attention, cross-entropy and optimizer tests:
//  * central finite differences in f64 of a scalar function (to check backward passes against
//    the forward definition), and
//  * raw-binary I/O with the PyTorch oracle tests/oracles/torch_ops.py (f32/i32 little-endian
//    files plus a JSON header), run with /usr/bin/python3. A missing interpreter or torch makes
//    the oracle call FAIL the test with a clear message; it never skips.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "support/test_util.h"

namespace bp::test {

// d f / d x_i by central differences: (f(x + h e_i) − f(x − h e_i)) / 2h, all in double.
inline std::vector<double> finite_diff_grad(const std::function<double(const std::vector<double>&)>& f,
                                            std::vector<double> x, double h = 1e-6) {
  std::vector<double> g(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double saved = x[i];
    x[i] = saved + h;
    const double plus = f(x);
    x[i] = saved - h;
    const double minus = f(x);
    x[i] = saved;
    g[i] = (plus - minus) / (2.0 * h);
  }
  return g;
}

inline std::vector<double> to_double(const std::vector<float>& v) {
  return {v.begin(), v.end()};
}
inline std::vector<float> to_float(const std::vector<double>& v) {
  std::vector<float> r(v.size());
  for (size_t i = 0; i < v.size(); ++i) r[i] = static_cast<float>(v[i]);
  return r;
}

template <class T>
void write_raw(const std::string& path, const std::vector<T>& v) {
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size() * sizeof(T)));
  ASSERT_TRUE(f.good()) << "cannot write " << path;
}

inline std::vector<float> read_raw_f32(const std::string& path) {
  std::ifstream f(path, std::ios::binary | std::ios::ate);
  if (!f) {
    ADD_FAILURE() << "oracle output missing: " << path;
    return {};
  }
  const auto bytes = static_cast<size_t>(f.tellg());
  std::vector<float> v(bytes / sizeof(float));
  f.seekg(0);
  f.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(bytes));
  return v;
}

// Runs `/usr/bin/python3 tests/oracles/<script> [op] <dir>` after writing dir/meta.json.
// Returns the oracle's JSON result (dir/result.json); fails the test when the oracle cannot run.
inline nlohmann::json run_python_oracle(const std::string& script_name, const std::string& op, const std::string& dir,
                                        const nlohmann::json& meta) {
  {
    std::ofstream f(dir + "/meta.json");
    f << meta.dump();
  }
  const std::string python = "/usr/bin/python3";
  if (!std::filesystem::exists(python)) {
    ADD_FAILURE() << "PyTorch oracle unavailable: " << python
                  << " does not exist (install Debian's python3 and python3-torch)";
    return nullptr;
  }
  const std::string script = source_dir() + "/tests/oracles/" + script_name;
  std::string out;
  const int rc = run_command(python + " " + script + (op.empty() ? "" : " " + op) + " " + dir, &out);
  if (rc != 0) {
    ADD_FAILURE() << "PyTorch oracle failed (exit " << rc << "); is python3-torch installed for " << python << "?\n"
                  << out;
    return nullptr;
  }
  std::ifstream f(dir + "/result.json");
  if (!f) {
    ADD_FAILURE() << "PyTorch oracle wrote no result.json\n" << out;
    return nullptr;
  }
  return nlohmann::json::parse(f);
}

// tests/oracles/torch_ops.py <op> <dir>.
inline nlohmann::json run_torch_oracle(const std::string& op, const std::string& dir, const nlohmann::json& meta) {
  return run_python_oracle("torch_ops.py", op, dir, meta);
}

}  // namespace bp::test
