// The CPU kernel variant a test binary runs with (tests/support/cpu_kernels_env.cpp): auto, or the
// one BACKPROPAGATE_RUNTIME__CPU_KERNELS forces. Tests that force a variant go back to it after.
#pragma once

#include <string>

namespace bp::test {

std::string test_cpu_kernels();

}  // namespace bp::test
