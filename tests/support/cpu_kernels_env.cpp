// The CPU kernel variant every test binary starts with: BACKPROPAGATE_RUNTIME__CPU_KERNELS (the
// runtime.cpu_kernels setting's variable, which the backprop binary reads too) when it is set, so
// the numeric suites can be rerun with each variant forced (tests/CMakeLists.txt, numeric_under.sh);
// auto otherwise. Tests that force a variant themselves go back to this one (test_cpu_kernels()).
#include "support/cpu_kernels_env.h"

#include <cstdlib>

#include "backend/cpu/kernel_variants.h"

namespace bp::test {

std::string test_cpu_kernels() {
  const char* v = std::getenv("BACKPROPAGATE_RUNTIME__CPU_KERNELS");
  return v && *v ? v : "auto";
}

namespace {
const bool kForced = [] {
  cpu::select_cpu_kernels(test_cpu_kernels());
  return true;
}();
}  // namespace

}  // namespace bp::test
