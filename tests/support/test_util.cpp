#include "support/test_util.h"

#include <cstdio>
#include <cstdlib>
#include <filesystem>

namespace bp::test {

std::vector<float> random_vector(size_t n, uint64_t seed, float lo, float hi) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

Tensor random_tensor(Shape shape, uint64_t seed, float lo, float hi) {
  return Tensor::from_vector(random_vector(static_cast<size_t>(shape.numel()), seed, lo, hi), shape);
}

template <class T>
static ::testing::AssertionResult close_impl(const std::vector<T>& a, const std::vector<T>& e, Tolerance tol) {
  if (a.size() != e.size()) return ::testing::AssertionFailure() << "sizes differ: " << a.size() << " vs " << e.size();
  size_t bad = 0, first = 0;
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    double diff = std::fabs(static_cast<double>(a[i]) - static_cast<double>(e[i]));
    double allowed = tol.atol + tol.rtol * std::fabs(static_cast<double>(e[i]));
    if (!(diff <= allowed)) {
      if (!bad) first = i;
      ++bad;
      worst = std::max(worst, diff);
    }
  }
  if (!bad) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad << " of " << a.size() << " values differ; first at " << first << ": "
                                       << a[first] << " vs " << e[first] << " (worst |diff| " << worst << ", atol "
                                       << tol.atol << ", rtol " << tol.rtol << ")";
}

::testing::AssertionResult all_close(const std::vector<float>& a, const std::vector<float>& e, Tolerance tol) {
  return close_impl(a, e, tol);
}
::testing::AssertionResult all_close(const std::vector<double>& a, const std::vector<double>& e, Tolerance tol) {
  return close_impl(a, e, tol);
}

// BP_SOURCE_DIR in the environment wins over the path compiled in: a test binary carried to another
// machine (scripts/gpu_bundle.sh, run there by scripts/gpu_check.sh --prebuilt) reads the repository
// where it lies there. ctest sets it to the same path as the compiled-in one.
std::string source_dir() {
  const char* env = std::getenv("BP_SOURCE_DIR");
  if (env && *env) return env;
  return BP_SOURCE_DIR;
}
std::string binary_dir() {
  return BP_BINARY_DIR;
}
std::string backprop_exe() {
  return BP_BACKPROP_EXE;
}
std::string shared_dir() {
  const char* env = std::getenv("BP_SHARED_DIR");
  if (env && *env) return env;
  return (std::filesystem::path(source_dir()) / ".." / "shared").lexically_normal().string();
}

int run_command(const std::string& cmd, std::string* output) {
  std::string full = cmd + " 2>&1";
  FILE* p = popen(full.c_str(), "r");
  if (!p) return -1;
  char buf[4096];
  std::string out;
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  int status = pclose(p);
  if (output) *output = out;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

TempDir::TempDir() {
  std::string tmpl = (std::filesystem::temp_directory_path() / "bp_test_XXXXXX").string();
  char* p = mkdtemp(tmpl.data());
  path = p ? p : "";
}
TempDir::~TempDir() {
  std::error_code ec;
  if (!path.empty()) std::filesystem::remove_all(path, ec);
}

}  // namespace bp::test
