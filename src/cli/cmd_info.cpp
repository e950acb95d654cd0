// `backprop info`: version, build, machine and feature matrix. (Expanded in issue 2.)
#include <iostream>

#include "build_info.h"
#include "cli/command.h"

namespace {
bp::cli::RunFn setup_info(CLI::App& sub) {
  return [] {
    std::cout << "backprop " << BP_VERSION << " (" << BP_BUILD_TYPE << ", " << BP_CXX_COMPILER << ")\n";
    return 0;
  };
}
}  // namespace

BP_REGISTER_COMMAND("info", "Version, build, hardware and available features", setup_info);
