// backprop: the command-line entry point. Builds the CLI11 app from the command registry, loads the
// settings (defaults < --config < BACKPROPAGATE_* < flags), starts logging, runs the chosen
// subcommand and turns bp::Error into the printed message and the exit code:
//   0 ok, 1 user error (config/input codes, bad command line), 2 runtime error, 3 partial success
//   (returned by commands), 130 interrupted (RUNTIME_TRAINING_ABORTED).
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>

#include "cli/command.h"
#include "cli/setting_flags.h"
#include "core/error.h"
#include "core/error_report.h"
#include "core/log.h"
#include "core/redact.h"
#include "core/sysinfo.h"
#include "core/threads.h"
#include "ops/cpu_kernels.h"

namespace bp::cli {

namespace {
void print_error(const Error& e) {
  std::string run_id = log::run_started() ? log::run_id() : "";
  if (global_options().json) {
    std::cout << render_error_json(e, run_id).dump(2) << std::endl;
    return;
  }
  std::fflush(stderr);
  std::cerr << render_error_text(e, run_id) << std::flush;
}

// The error on the console (or stdout with --json), and once in the --log-file (an error record
// `backprop doctor` reads; the console sink does not repeat it).
int fail(const Error& e) {
  print_error(e);
  log::record_error_in_files(render_error_json(e, log::run_started() ? log::run_id() : ""));
  return exit_code_for(e.code());
}
}  // namespace

}  // namespace bp::cli

// OpenMP threads that spin while waiting steal the CPU from each other and from BLAS on a busy
// or small machine (measured: 3 tiny training steps took 27 s spinning vs 3 s passive on 2 shared
// cores). libgomp reads OMP_WAIT_POLICY only when it loads, so when the user has not chosen a
// policy we set "passive" and start the program again, once.
//
// Debian's OpenBLAS 0.3.21 does not know some recent CPUs and falls back to SSE3 ("Prescott")
// kernels: sgemm 512x576x1536 on one core went from 19-30 to 150 GFLOP/s with the right core type
// (docs/benchmarks.md). core/sysinfo's openblas_core_type() decides from CPUID and the core
// OpenBLAS picked by itself (it is loaded already); BACKPROP_OPENBLAS_OWN_CORE keeps that pick for
// `backprop info`. Same rule: only when the user has not set OPENBLAS_CORETYPE.
// scripts/runtime_env.sh asks this binary (`backprop info --openblas-coretype`) for the test and
// benchmark binaries.
static void tune_runtime_environment(char** argv) {
  if (std::getenv("BACKPROP_ENV_TUNED") != nullptr) return;
  setenv("BACKPROP_ENV_TUNED", "1", 1);
  bool changed = false;
  if (std::getenv("OMP_WAIT_POLICY") == nullptr) changed = setenv("OMP_WAIT_POLICY", "passive", 0) == 0;
  if (std::getenv("OPENBLAS_CORETYPE") == nullptr) {
    const std::string own = bp::blas_core_name();
    const std::string core = bp::openblas_core_type(bp::cpu_isa(), own);
    if (!core.empty() && setenv("OPENBLAS_CORETYPE", core.c_str(), 0) == 0) {
      setenv("BACKPROP_OPENBLAS_OWN_CORE", own.c_str(), 1);
      changed = true;
    }
  }
  if (changed) execv("/proc/self/exe", argv);  // returns only on failure: carry on as we are
}

int main(int argc, char** argv) {
  tune_runtime_environment(argv);
  using namespace bp::cli;
  CLI::App app{"backprop: fine-tune Llama-family models on the machine you have"};
  app.require_subcommand(1);
  app.fallthrough();  // global options may follow the subcommand: `backprop info --json`
  auto& g = global_options();
  app.add_flag("--json", g.json, "Machine-readable output (and a JSON error envelope)");
  app.add_option("--config", g.config_path, "TOML settings file ([section] key = value; see info --env-vars)");
  bind_global_settings(app);
  std::vector<std::pair<CLI::App*, RunFn>> runs;
  for (auto& spec : command_registry()) {
    CLI::App* sub = app.add_subcommand(spec.name, spec.help);
    runs.emplace_back(sub, spec.setup(*sub));
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    for (int i = 1; i < argc; ++i)
      if (std::strcmp(argv[i], "--json") == 0) g.json = true;
    return fail(bp::Error(bp::ErrorCode::CONFIG_INVALID, std::string("[cli] ") + e.what())
                    .with_suggestion("Run `backprop --help` or `backprop <command> --help` for the accepted options."));
  }
  try {
    mutable_settings() = bp::Settings::load(g.config_path, bp::current_environment(), flag_overrides());
    const auto& s = settings();
    apply_global_settings(s);
    std::string cmdline;
    for (int i = 0; i < argc; ++i) cmdline += (i ? " " : "") + std::string(argv[i]);
    spdlog::debug("command line: {}", cmdline);
    int rc = 0;
    for (auto& [sub, run] : runs)
      if (sub->parsed()) rc = run();
    bp::log::flush();
    return rc;
  } catch (const bp::Error& e) {
    return fail(e);
  } catch (const std::filesystem::filesystem_error& e) {
    return fail(bp::error_from_filesystem(e));
  } catch (const std::bad_alloc& e) {
    return fail(bp::Error(bp::ErrorCode::RUNTIME_OOM_ADJACENT, std::string("[cli] std::bad_alloc: ") + e.what()));
  } catch (const std::exception& e) {
    return fail(bp::Error(bp::ErrorCode::RUNTIME_INTERNAL, std::string("[cli] ") + e.what()));
  }
}
