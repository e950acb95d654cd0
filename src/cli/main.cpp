// backprop: the command-line entry point. Builds the CLI11 app from the command registry,
// runs the chosen subcommand and turns bp::Error into the printed message and exit code.
#include <cstdio>
#include <iostream>

#include "cli/command.h"
#include "core/error.h"

namespace bp::cli {

GlobalOptions& global_options() {
  static GlobalOptions g;
  return g;
}

std::vector<CommandSpec>& command_registry() {
  static std::vector<CommandSpec> r;
  return r;
}

static void print_error(const Error& e) {
  const auto& info = e.info();
  if (global_options().json) {
    nlohmann::json j = {{"code", info.name},
                        {"message", e.what()},
                        {"retryable", retryable_name(info.retryable)},
                        {"suggestion", e.suggestion()},
                        {"details", e.details()},
                        {"run_id", nullptr}};
    std::cout << j.dump(2) << std::endl;
    return;
  }
  std::fprintf(stderr, "[ERROR] [%s] %s\n", info.name, e.what());
  std::fprintf(stderr, "Suggestion: %s\n", e.suggestion().c_str());
}

}  // namespace bp::cli

int main(int argc, char** argv) {
  using namespace bp::cli;
  CLI::App app{"backprop: fine-tune Llama-family models on the machine you have"};
  app.require_subcommand(1);
  auto& g = global_options();
  app.add_flag("--json", g.json, "Machine-readable output (and a JSON error envelope)");
  app.add_option("--config", g.config_path, "TOML settings file");
  std::vector<std::pair<CLI::App*, RunFn>> runs;
  for (auto& spec : command_registry()) {
    CLI::App* sub = app.add_subcommand(spec.name, spec.help);
    runs.emplace_back(sub, spec.setup(*sub));
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 1;
  }
  try {
    for (auto& [sub, run] : runs)
      if (sub->parsed()) return run();
  } catch (const bp::Error& e) {
    print_error(e);
    return bp::exit_code_for(e.code());
  } catch (const std::exception& e) {
    print_error(bp::Error(bp::ErrorCode::RUNTIME_INTERNAL, e.what()));
    return 2;
  }
  return 0;
}
